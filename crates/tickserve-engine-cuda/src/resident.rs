//! A family's resident kernel on its device ([`kernels::resident`]'s CUDA
//! C): compiled, given its member's weights, launched once on a stream of
//! its own, then ticked through its mailbox in mapped host memory, with no
//! CUDA call on a tick's path; its sequence's state read back, its member
//! swapped between ticks, and stopped. Every wait is bounded: a tick the
//! kernel does not answer within the bound is an error (the device lost to
//! this family), never a hang.
//!
//! One kernel serves one sequence of one member here. Device memory is not
//! freed while it runs (a free waits for the device to be idle): a member
//! swapped out keeps its weights on the device until the kernel stops.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use cudarc::driver::{CudaContext, result};
use tickserve_core::EngineError;

use crate::device::{DeviceMemory, MappedMemory, Module, Stream, driver};
use crate::kernels::{self, ANSWERED_WORD, ASKED_WORD, DATA_WORD, RESIDENT_BLOCK, Resident};

/// What a running kernel reads: freed only once it has returned.
struct Held {
    _module: Module,
    stream: Stream,
    mailbox: MappedMemory,
    /// One device pointer per weight slot.
    table: DeviceMemory,
    /// The member's weights, one buffer per slot.
    weights: Vec<DeviceMemory>,
    /// Weights swapped out, freed only once the kernel has returned:
    /// freeing device memory waits for the device to be idle, which a
    /// resident kernel never leaves it.
    retired: Vec<Vec<DeviceMemory>>,
    state: DeviceMemory,
}

/// A resident kernel running on its device.
pub struct ResidentKernel {
    ctx: Arc<CudaContext>,
    layout: Resident,
    /// `None` once stopped, or leaked because it did not stop.
    held: Option<Held>,
    /// The last tick asked.
    asked: i32,
    bound: Duration,
    ordinal: usize,
}

impl ResidentKernel {
    /// Compiles `layout`'s kernel for `ctx`'s device, copies `weights` (one
    /// member's, one vector per slot) to it and launches the kernel; `bound`
    /// is the longest a tick or the stop may take.
    pub fn start(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        layout: Resident,
        weights: &[Vec<f32>],
        bound: Duration,
    ) -> Result<ResidentKernel, EngineError> {
        ctx.bind_to_thread()
            .map_err(driver("binding the context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let compiled = kernels::compile(&layout.source, &format!("sm_{major}{minor}"))?;
        let (module, _) = Module::load(&compiled)?;
        let function = module.function("resident")?;
        let weights = upload(weights, ordinal)?;
        let table = DeviceMemory::zeroed(weights.len() * 8, ordinal)?;
        table.write(0, &pointers(&weights))?;
        let state = DeviceMemory::zeroed(layout.state_floats * 4, ordinal)?;
        let mailbox = MappedMemory::zeroed((DATA_WORD + layout.mailbox_floats) * 4)?;
        let stream = Stream::new()?;
        let (mut boxed, mut table_ptr, mut state_ptr) = (mailbox.device, table.ptr, state.ptr);
        let mut params: [*mut c_void; 3] = [
            (&raw mut boxed).cast(),
            (&raw mut table_ptr).cast(),
            (&raw mut state_ptr).cast(),
        ];
        // SAFETY: the kernel's parameters are (int*, const u64*, float*):
        // the mapped mailbox, the table and the state, all alive until the
        // kernel has returned (`Held`).
        unsafe {
            result::launch_kernel(
                function,
                (1, 1, 1),
                (RESIDENT_BLOCK, 1, 1),
                0,
                stream.0,
                &mut params,
            )
        }
        .map_err(driver("resident kernel launch"))?;
        Ok(ResidentKernel {
            ctx: Arc::clone(ctx),
            layout,
            held: Some(Held {
                _module: module,
                stream,
                mailbox,
                table,
                weights,
                retired: Vec::new(),
                state,
            }),
            asked: 0,
            bound,
            ordinal,
        })
    }

    /// Where its tick's values go.
    pub fn layout(&self) -> &Resident {
        &self.layout
    }

    fn held(&self) -> Result<&Held, EngineError> {
        self.held.as_ref().ok_or_else(|| {
            EngineError::DeviceLost("the resident kernel is not running".to_string())
        })
    }

    fn flag(held: &Held, word: usize) -> &AtomicI32 {
        // SAFETY: an aligned word of the mapped mailbox, which lives as long
        // as `held`; the kernel reads and writes it with acquire and release
        // order at system scope.
        unsafe { AtomicI32::from_ptr(held.mailbox.host().cast::<i32>().add(word)) }
    }

    /// One tick: `inputs` (offset after [`DATA_WORD`], values) written to
    /// the mailbox, the tick asked, its answer awaited (spinning, within
    /// the bound): the mailbox's floats after it.
    #[allow(clippy::disallowed_methods)] // the watchdog's bound is the machine's time
    pub fn tick(&mut self, inputs: &[(usize, &[f32])]) -> Result<Vec<f32>, EngineError> {
        let floats = self.layout.mailbox_floats;
        let held = self.held()?;
        let data = held.mailbox.host().cast::<f32>().wrapping_add(DATA_WORD);
        for &(at, values) in inputs {
            if at.saturating_add(values.len()) > floats {
                return Err(EngineError::Internal(
                    "a resident tick's input past the mailbox".to_string(),
                ));
            }
            for (j, &x) in values.iter().enumerate() {
                // SAFETY: inside the mailbox (checked above); the kernel
                // reads it only after the asked tick is raised below.
                unsafe { data.add(at + j).write_volatile(x) };
            }
        }
        let asked = if self.asked == i32::MAX {
            1
        } else {
            self.asked + 1
        };
        Self::flag(held, ASKED_WORD).store(asked, Ordering::Release);
        let answered = Self::flag(held, ANSWERED_WORD);
        let bound = self.bound;
        let started = std::time::Instant::now();
        let mut spins = 0u32;
        while answered.load(Ordering::Acquire) != asked {
            spins = spins.wrapping_add(1);
            // Read the clock only now and then: the answer is microseconds.
            if spins.is_multiple_of(1024) && started.elapsed() > bound {
                return Err(EngineError::DeviceLost(format!(
                    "gpu:{}: the resident kernel did not answer tick {asked} within {bound:?}",
                    self.ordinal
                )));
            }
            std::hint::spin_loop();
        }
        self.asked = asked;
        // SAFETY: answered: the kernel writes nothing more until the next
        // tick is asked.
        Ok((0..floats)
            .map(|j| unsafe { data.add(j).read_volatile() })
            .collect())
    }

    /// Points the kernel at `weights` (another member's, one vector per
    /// slot), between two ticks.
    pub fn swap(&mut self, weights: &[Vec<f32>]) -> Result<(), EngineError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let uploaded = upload(weights, self.ordinal)?;
        let held = self.held.as_mut().ok_or_else(|| {
            EngineError::DeviceLost("the resident kernel is not running".to_string())
        })?;
        if uploaded.len() != held.weights.len() {
            return Err(EngineError::Internal(format!(
                "a member of {} weight slots for a kernel of {}",
                uploaded.len(),
                held.weights.len()
            )));
        }
        held.table.write(0, &pointers(&uploaded))?;
        // The kernel reads the table afresh at every tick (and weights
        // through L2), and no tick is running: the next reads `uploaded`.
        let old = std::mem::replace(&mut held.weights, uploaded);
        held.retired.push(old);
        Ok(())
    }

    /// The sequence's state as the kernel keeps it, between two ticks.
    pub fn state(&self) -> Result<Vec<f32>, EngineError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let held = self.held()?;
        let mut out = vec![0.0f32; self.layout.state_floats];
        if !out.is_empty() {
            // SAFETY: `out` is as long as the state buffer.
            unsafe { result::memcpy_dtoh_sync(&mut out, held.state.ptr) }
                .map_err(driver("reading the resident state"))?;
        }
        Ok(out)
    }

    /// Tells the kernel to return and waits for it, within the bound. A
    /// kernel that does not return keeps what it reads (leaked, never freed
    /// under it), and the error says so.
    #[allow(clippy::disallowed_methods)] // the watchdog's bound is the machine's time
    pub fn stop(&mut self) -> Result<(), EngineError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let _ = self.ctx.bind_to_thread();
        Self::flag(&held, ASKED_WORD).store(-1, Ordering::Release);
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

/// `weights` on device `ordinal`, one buffer per slot.
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

/// The device addresses of `buffers`: a weight table.
fn pointers(buffers: &[DeviceMemory]) -> Vec<u64> {
    buffers.iter().map(|b| b.ptr).collect()
}
