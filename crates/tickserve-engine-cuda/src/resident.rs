//! A family's resident kernel on its device ([`kernels::resident`]'s CUDA
//! C): compiled, given its first member's weights, launched once (one
//! block per slot) on a stream of its own, then ticked slot by slot through
//! mailboxes in mapped host memory, each tick naming its member, with no
//! CUDA call on a tick's path; members added or replaced while it runs (a
//! row of the weight table written); a slot's state read back between its
//! ticks; stopped. Every wait is bounded: a tick not answered within the
//! bound is an error (the device lost to this family), never a hang.
//!
//! A member replaced has its old weights freed once the row names the new
//! ones (in stream order, [`crate::residency`]): no tick runs while a row
//! is written, and the next reads the row afresh; its version, raised by
//! every write, tells blocks holding weights on chip to load them again.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, result, sys};
use tickserve_core::EngineError;

use crate::device::{DeviceMemory, MappedMemory, Module, Stream, driver};
use crate::kernels::{self, RESIDENT_BLOCK, Resident};
use crate::mailbox::Mailboxes;
use crate::residency::Reservation;

/// What a running kernel reads: freed only once it has returned.
struct Held {
    _module: Module,
    stream: Stream,
    /// Every slot's mailbox, `mailbox_words` apart (read and written
    /// through `ResidentKernel::mailboxes`).
    _mailbox: MappedMemory,
    /// Per member, member-major: a device pointer per weight slot, then the
    /// row's version.
    table: DeviceMemory,
    /// Each row's weights, as uploaded.
    weights: Vec<Vec<DeviceMemory>>,
    /// Every block's copy of its slot's state, `state_floats` apart.
    state: DeviceMemory,
    /// Its blocks' multiprocessors.
    _blocks: Reservation,
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
    /// Rows of the table: the most members.
    capacity: usize,
    /// Rows written.
    members: usize,
    /// Rows' writes so far: the version of the last.
    versions: u64,
}

impl ResidentKernel {
    /// Compiles `layout`'s kernel for `ctx`'s device, makes room for
    /// `capacity` members, copies `weights` (the first member's, one vector
    /// per weight slot) to it as member 0 and launches the kernel with
    /// `slots` slots, each with a zero state; `bound` is the longest a tick
    /// or the stop may take.
    pub fn start(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        layout: Resident,
        weights: &[Vec<f32>],
        capacity: usize,
        slots: usize,
        bound: Duration,
    ) -> Result<ResidentKernel, EngineError> {
        let split = layout.split.max(1);
        let grid = slots
            .checked_mul(split)
            .and_then(|blocks| u32::try_from(blocks).ok())
            .filter(|&b| b >= 1)
            .ok_or_else(|| EngineError::Internal(format!("a resident kernel of {slots} slots")))?;
        ctx.bind_to_thread()
            .map_err(driver("binding the context"))?;
        // Every block polls for ever: one that is never scheduled would
        // leave its slot unanswered. One block a multiprocessor, across
        // every resident kernel on the device, is sure to be resident.
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("multiprocessor count"))?;
        let blocks = Reservation::take(ordinal, grid as usize, usize::try_from(sms).unwrap_or(0))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let compiled = kernels::compile(&layout.source, &format!("sm_{major}{minor}"))?;
        let (module, _) = Module::load(&compiled)?;
        let function = module.function("resident")?;
        let shared = u32::try_from(layout.on_chip_bytes).map_err(|_| {
            EngineError::Unsupported(format!(
                "{} bytes of weights on chip a block",
                layout.on_chip_bytes
            ))
        })?;
        if shared > 48 * 1024 {
            // Past 48 KiB a block's dynamic shared memory is asked for.
            let bytes = i32::try_from(shared).unwrap_or(i32::MAX);
            // SAFETY: `function` is a loaded kernel.
            unsafe {
                sys::cuFuncSetAttribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes,
                )
            }
            .result()
            .map_err(driver("the resident kernel's shared memory"))?;
        }
        clusters_fit(function, (grid, split, shared))?;
        if weights.len() != layout.weight_slots {
            return Err(EngineError::Internal(format!(
                "a member of {} weight slots for a kernel of {}",
                weights.len(),
                layout.weight_slots
            )));
        }
        let member = upload(weights, ordinal)?;
        let capacity = capacity.max(1);
        let table = DeviceMemory::zeroed(capacity * (layout.weight_slots + 1) * 8, ordinal)?;
        table.write(0, &row_of(&member, 1))?;
        // A copy of its slot's state a block.
        let state = DeviceMemory::zeroed(grid as usize * layout.state_floats * 4, ordinal)?;
        let mailbox = MappedMemory::zeroed(slots * layout.mailbox_words * 4)?;
        let stream = Stream::new()?;
        let (mut boxed, mut table_ptr, mut state_ptr) = (mailbox.device, table.ptr, state.ptr);
        let mut params: [*mut c_void; 3] = [
            (&raw mut boxed).cast(),
            (&raw mut table_ptr).cast(),
            (&raw mut state_ptr).cast(),
        ];
        launch(function, (grid, split, shared), &stream, &mut params)?;
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
                _blocks: blocks,
            }),
            bound,
            ordinal,
            capacity,
            members: 1,
            versions: 1,
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

    /// The slot each of `rows` rows ticks in ([`Mailboxes::place`]).
    pub fn place<'a>(
        &mut self,
        rows: usize,
        inputs: impl Fn(usize, usize) -> &'a [u8],
        out: &mut Vec<usize>,
    ) -> Result<(), EngineError> {
        self.held()?;
        self.mailboxes.place(rows, inputs, out)
    }

    /// Asks slot `slot` for a tick of member `member` ([`Mailboxes::ask`]).
    /// No CUDA call.
    pub fn ask<'a>(
        &mut self,
        slot: usize,
        member: usize,
        inputs: impl Fn(usize) -> &'a [u8],
    ) -> Result<(), EngineError> {
        self.held()?;
        if member >= self.members {
            return Err(EngineError::Internal(format!(
                "resident member {member} of {}",
                self.members
            )));
        }
        self.mailboxes.ask(slot, member, inputs)
    }

    /// Waits for slot `slot`'s answer ([`Mailboxes::wait`]), within the
    /// bound, handing `read` each output's bytes.
    pub fn wait(&mut self, slot: usize, read: impl FnMut(usize, &[u8])) -> Result<(), EngineError> {
        self.held()?;
        let ordinal = self.ordinal;
        self.mailboxes.wait(slot, read).map_err(|e| match e {
            EngineError::DeviceLost(m) => EngineError::DeviceLost(format!("gpu:{ordinal}: {m}")),
            other => other,
        })
    }

    /// The slots' mailboxes (how many ticks brought their state).
    pub fn mailboxes(&self) -> &Mailboxes {
        &self.mailboxes
    }

    /// Writes `weights` (a member's, one vector per weight slot) as member
    /// `member` (a row of the table: the next one to add a member, an
    /// earlier one to replace it), while the kernel runs: ticks asked from
    /// then on read it. The caller asks no tick of `member` meanwhile.
    pub fn put(&mut self, member: usize, weights: &[Vec<f32>]) -> Result<(), EngineError> {
        if member > self.members || member >= self.capacity {
            return Err(EngineError::Unsupported(format!(
                "gpu:{}: the resident kernel holds {} members",
                self.ordinal, self.capacity
            )));
        }
        if weights.len() != self.layout.weight_slots {
            return Err(EngineError::Internal(format!(
                "a member of {} weight slots for a kernel of {}",
                weights.len(),
                self.layout.weight_slots
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let uploaded = upload(weights, self.ordinal)?;
        self.versions += 1;
        let row = row_of(&uploaded, self.versions);
        let held = self.held.as_mut().ok_or_else(|| {
            EngineError::DeviceLost("the resident kernel is not running".to_string())
        })?;
        // A synchronous copy on the legacy stream, which the kernel's
        // non-blocking stream does not wait for, nor it for the kernel.
        held.table.write(member * row.len() * 8, &row)?;
        // The row's old weights: no tick reads them any more.
        match held.weights.get_mut(member) {
            Some(old) => *old = uploaded,
            None => held.weights.push(uploaded),
        }
        self.members = self.members.max(member + 1);
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
            // The copy of the slot's first block.
            let block = slot * self.layout.split.max(1);
            let at = held.state.ptr + (block * floats * 4) as u64;
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

// SAFETY: the raw CUDA handles and the mapped mailboxes inside are used by
// one thread at a time (its owner's `&mut`, the executor's mutex), every
// entry point that calls CUDA makes the context current on the calling
// thread first, and the mailboxes are host memory, valid on any thread.
unsafe impl Send for ResidentKernel {}

impl Drop for ResidentKernel {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!("{e}");
        }
    }
}

/// Calls `with` on the launch configuration of `grid` blocks of
/// [`RESIDENT_BLOCK`] threads in clusters of `split`, with `shared` bytes of
/// dynamic shared memory each, on `stream` (its one attribute alive for
/// the call).
fn with_cluster<T>(
    (grid, split, shared): (u32, usize, u32),
    stream: sys::CUstream,
    with: impl FnOnce(&sys::CUlaunchConfig) -> T,
) -> T {
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
                x: u32::try_from(split).unwrap_or(u32::MAX),
                y: 1,
                z: 1,
            },
        },
    };
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: RESIDENT_BLOCK,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream,
        attrs: &raw mut attribute,
        numAttrs: 1,
    };
    with(&config)
}

/// Whether the device holds every cluster of `shape` (grid, blocks a
/// cluster, dynamic shared bytes) of `function` at once (a cluster never
/// scheduled would leave its slot unanswered): asked before anything is
/// allocated, so a refusal frees nothing while other resident kernels run.
fn clusters_fit(function: sys::CUfunction, shape: (u32, usize, u32)) -> Result<(), EngineError> {
    let (grid, split, _) = shape;
    if split <= 1 {
        return Ok(());
    }
    let mut most = 0;
    with_cluster(shape, std::ptr::null_mut(), |config| {
        // SAFETY: `config` and its attribute are alive for the call;
        // `function` is a loaded kernel.
        unsafe { sys::cuOccupancyMaxActiveClusters(&raw mut most, function, config) }.result()
    })
    .map_err(driver("resident clusters"))?;
    let clusters = grid / u32::try_from(split).unwrap_or(u32::MAX);
    if u32::try_from(most).unwrap_or(0) < clusters {
        return Err(EngineError::Unsupported(format!(
            "{clusters} resident slots on clusters of {split} blocks, and the device holds \
             {most} such clusters at once"
        )));
    }
    Ok(())
}

/// Launches the resident kernel `function` on `stream` in `shape` (grid,
/// blocks a cluster, dynamic shared bytes; [`clusters_fit`] first).
/// `params` are the kernel's (int*, const u64*, float*): the mapped
/// mailboxes, the table and the states, sized for the grid's blocks and
/// alive until the kernel has returned.
fn launch(
    function: sys::CUfunction,
    shape: (u32, usize, u32),
    stream: &Stream,
    params: &mut [*mut c_void; 3],
) -> Result<(), EngineError> {
    let (grid, split, shared) = shape;
    if split <= 1 {
        // SAFETY: `params` as this function's contract says; a tick names
        // only a member written.
        return unsafe {
            result::launch_kernel(
                function,
                (grid, 1, 1),
                (RESIDENT_BLOCK, 1, 1),
                shared,
                stream.0,
                params,
            )
        }
        .map_err(driver("resident kernel launch"));
    }
    with_cluster(shape, stream.0, |config| {
        // SAFETY: `config` alive for the call, and `params` as this
        // function's contract says.
        unsafe {
            sys::cuLaunchKernelEx(config, function, params.as_mut_ptr(), std::ptr::null_mut())
        }
        .result()
    })
    .map_err(driver("resident kernel launch"))
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

/// A row of the weight table: the device addresses of `buffers`, then
/// `version`.
fn row_of(buffers: &[DeviceMemory], version: u64) -> Vec<u64> {
    (buffers.iter().map(|b| b.ptr))
        .chain(std::iter::once(version))
        .collect()
}
