//! A family's resident kernel on its device ([`kernels::resident`]'s CUDA
//! C): compiled, given its members' weights, launched once (one block per
//! slot) on a stream of its own, then ticked slot by slot through mailboxes
//! in mapped host memory, with no CUDA call on a tick's path; a slot's
//! state read back and its member swapped between its ticks; stopped. Every
//! wait is bounded: a tick not answered within the bound is an error (the
//! device lost to this family), never a hang.
//!
//! Device memory is not freed while the kernel runs (a free waits for the
//! device to be idle, which a resident kernel never leaves it): a member
//! swapped out keeps its weights on the device until the kernel stops.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, result, sys};
use tickserve_core::EngineError;

use crate::device::{DeviceMemory, MappedMemory, Module, Stream, driver};
use crate::kernels::{self, RESIDENT_BLOCK, Resident};
use crate::mailbox::Mailboxes;

/// What a running kernel reads: freed only once it has returned.
struct Held {
    _module: Module,
    stream: Stream,
    /// Every slot's mailbox, `mailbox_words` apart (read and written
    /// through `ResidentKernel::mailboxes`).
    _mailbox: MappedMemory,
    /// One device pointer per slot and weight slot, slot-major.
    table: DeviceMemory,
    /// Every member's weights uploaded, the first at start and then each
    /// swapped in: freed only once the kernel has returned.
    weights: Vec<Vec<DeviceMemory>>,
    /// Every slot's state, `state_floats` apart.
    state: DeviceMemory,
}

/// A resident kernel running on its device.
pub struct ResidentKernel {
    ctx: Arc<CudaContext>,
    layout: Resident,
    /// `None` once stopped, or leaked because it did not stop.
    held: Option<Held>,
    /// The slots' mailboxes, over `held`'s mapped memory.
    mailboxes: Mailboxes,
    bound: Duration,
    ordinal: usize,
}

impl ResidentKernel {
    /// Compiles `layout`'s kernel for `ctx`'s device, copies `weights` (one
    /// member's, one vector per weight slot) to it and launches the kernel
    /// with `slots` slots, each on that member with a zero state; `bound` is
    /// the longest a tick or the stop may take.
    pub fn start(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        layout: Resident,
        weights: &[Vec<f32>],
        slots: usize,
        bound: Duration,
    ) -> Result<ResidentKernel, EngineError> {
        let grid = u32::try_from(slots)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| EngineError::Internal(format!("a resident kernel of {slots} slots")))?;
        ctx.bind_to_thread()
            .map_err(driver("binding the context"))?;
        // Every block polls for ever: one that is never scheduled would
        // leave its slot unanswered. One block a multiprocessor is sure to
        // be resident.
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("multiprocessor count"))?;
        if slots > usize::try_from(sms).unwrap_or(0) {
            return Err(EngineError::Unsupported(format!(
                "gpu:{ordinal}: {slots} resident slots, and the device has {sms} \
                 multiprocessors (a resident block holds one for as long as it runs)"
            )));
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let compiled = kernels::compile(&layout.source, &format!("sm_{major}{minor}"))?;
        let (module, _) = Module::load(&compiled)?;
        let function = module.function("resident")?;
        let member = upload(weights, ordinal)?;
        let row = pointers(&member);
        let table = DeviceMemory::zeroed(slots * row.len() * 8, ordinal)?;
        for slot in 0..slots {
            table.write(slot * row.len() * 8, &row)?;
        }
        let state = DeviceMemory::zeroed(slots * layout.state_floats * 4, ordinal)?;
        let mailbox = MappedMemory::zeroed(slots * layout.mailbox_words * 4)?;
        let stream = Stream::new()?;
        let (mut boxed, mut table_ptr, mut state_ptr) = (mailbox.device, table.ptr, state.ptr);
        let mut params: [*mut c_void; 3] = [
            (&raw mut boxed).cast(),
            (&raw mut table_ptr).cast(),
            (&raw mut state_ptr).cast(),
        ];
        // SAFETY: the kernel's parameters are (int*, const u64*, float*):
        // the mapped mailboxes, the table and the states, each sized for
        // `slots` blocks, all alive until the kernel has returned (`Held`).
        unsafe {
            result::launch_kernel(
                function,
                (grid, 1, 1),
                (RESIDENT_BLOCK, 1, 1),
                0,
                stream.0,
                &mut params,
            )
        }
        .map_err(driver("resident kernel launch"))?;
        // SAFETY: the mapped memory holds `slots` mailboxes of the layout's
        // words, lives in `held` as long as the kernel (and so `mailboxes`)
        // does, and only the kernel's blocks touch it besides.
        let mailboxes =
            unsafe { Mailboxes::new(mailbox.host().cast::<i32>(), &layout, slots, bound) };
        Ok(ResidentKernel {
            ctx: Arc::clone(ctx),
            layout,
            mailboxes,
            held: Some(Held {
                _module: module,
                stream,
                _mailbox: mailbox,
                table,
                weights: vec![member],
                state,
            }),
            bound,
            ordinal,
        })
    }

    /// Where its tick's values go.
    pub fn layout(&self) -> &Resident {
        &self.layout
    }

    /// How many slots it runs.
    pub fn slots(&self) -> usize {
        self.mailboxes.slots()
    }

    fn held(&self) -> Result<&Held, EngineError> {
        self.held.as_ref().ok_or_else(|| {
            EngineError::DeviceLost("the resident kernel is not running".to_string())
        })
    }

    fn slot_of(&self, slot: usize) -> Result<(), EngineError> {
        if slot < self.slots() {
            Ok(())
        } else {
            Err(EngineError::Internal(format!(
                "slot {slot} of a resident kernel of {}",
                self.slots()
            )))
        }
    }

    /// Asks slot `slot` for a tick ([`Mailboxes::ask`]). No CUDA call.
    pub fn ask(&mut self, slot: usize, inputs: &[(usize, &[f32])]) -> Result<(), EngineError> {
        self.held()?;
        self.mailboxes.ask(slot, inputs)
    }

    /// Waits for slot `slot`'s answer ([`Mailboxes::wait`]), within the
    /// bound: its mailbox's floats.
    pub fn wait(&self, slot: usize) -> Result<Vec<f32>, EngineError> {
        self.held()?;
        self.mailboxes.wait(slot).map_err(|e| match e {
            EngineError::DeviceLost(m) => {
                EngineError::DeviceLost(format!("gpu:{}: {m}", self.ordinal))
            }
            other => other,
        })
    }

    /// One tick of slot `slot`: [`ResidentKernel::ask`], then
    /// [`ResidentKernel::wait`].
    pub fn tick(
        &mut self,
        slot: usize,
        inputs: &[(usize, &[f32])],
    ) -> Result<Vec<f32>, EngineError> {
        self.ask(slot, inputs)?;
        self.wait(slot)
    }

    /// Points slot `slot` at `weights` (another member's, one vector per
    /// weight slot), between two of its ticks.
    pub fn swap(&mut self, slot: usize, weights: &[Vec<f32>]) -> Result<(), EngineError> {
        self.slot_of(slot)?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let member = upload(weights, self.ordinal)?;
        let row = pointers(&member);
        let held = self.held.as_mut().ok_or_else(|| {
            EngineError::DeviceLost("the resident kernel is not running".to_string())
        })?;
        if held.weights.first().is_some_and(|w| w.len() != row.len()) {
            return Err(EngineError::Internal(format!(
                "a member of {} weight slots for a kernel of {}",
                row.len(),
                held.weights[0].len()
            )));
        }
        // The block reads its table row afresh at every tick (and weights
        // through L2), and its slot has no tick running: the next reads
        // `member`.
        held.table.write(slot * row.len() * 8, &row)?;
        held.weights.push(member);
        Ok(())
    }

    /// Slot `slot`'s state as the kernel keeps it, between two of its ticks.
    pub fn state(&self, slot: usize) -> Result<Vec<f32>, EngineError> {
        self.slot_of(slot)?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let held = self.held()?;
        let floats = self.layout.state_floats;
        let mut out = vec![0.0f32; floats];
        if !out.is_empty() {
            let at = held.state.ptr + (slot * floats * 4) as u64;
            // SAFETY: `out` is as long as one slot's state, which lies
            // inside the state buffer (`slot` checked above).
            unsafe { result::memcpy_dtoh_sync(&mut out, at) }
                .map_err(driver("reading the resident state"))?;
        }
        Ok(out)
    }

    /// Tells every block to return and waits for the kernel, within the
    /// bound. A kernel that does not return keeps what it reads (leaked,
    /// never freed under it), and the error says so.
    #[allow(clippy::disallowed_methods)] // the watchdog's bound is the machine's time
    pub fn stop(&mut self) -> Result<(), EngineError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let _ = self.ctx.bind_to_thread();
        self.mailboxes.stop_all();
        let started = std::time::Instant::now();
        loop {
            match held.stream.finished() {
                Ok(true) => return Ok(()),
                Ok(false) if started.elapsed() <= self.bound => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                other => {
                    std::mem::forget(held);
                    return Err(EngineError::DeviceLost(format!(
                        "gpu:{}: the resident kernel did not return within {:?} ({other:?}); \
                         its buffers are kept",
                        self.ordinal, self.bound
                    )));
                }
            }
        }
    }
}

impl Drop for ResidentKernel {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!("{e}");
        }
    }
}

/// `weights` on device `ordinal`, one buffer per weight slot.
fn upload(weights: &[Vec<f32>], ordinal: usize) -> Result<Vec<DeviceMemory>, EngineError> {
    weights
        .iter()
        .map(|w| {
            let memory = DeviceMemory::zeroed(w.len() * 4, ordinal)?;
            memory.write(0, w)?;
            Ok(memory)
        })
        .collect()
}

/// The device addresses of `buffers`: a row of the weight table.
fn pointers(buffers: &[DeviceMemory]) -> Vec<u64> {
    buffers.iter().map(|b| b.ptr).collect()
}
