//! Owned CUDA objects over cudarc's driver and cuBLAS bindings: each frees
//! itself when dropped (memory as [`residency`] says, where a resident
//! kernel runs), and device memory is counted per device for the
//! `tickserve_device_memory_bytes` gauge.
//!
//! The engine uses the driver API directly rather than cudarc's safe layer:
//! that layer records events around every use of a buffer, which does not
//! belong inside a stream capture, and the engine's buffers never leave one
//! stream. Every call here needs the owning context current on the calling
//! thread; the engine makes it current at each entry.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Mutex;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result, sys};
use tickserve_core::{EngineError, metrics as names};

use crate::kernels::Compiled;
use crate::residency;

/// A driver error as an [`EngineError`] the runtime can act on: out of
/// memory, a device that is lost (a kernel fault, an uncorrectable ECC error,
/// a destroyed context: nothing more runs on it until it is reset), or
/// anything else; `what` says what was being done.
pub fn driver(what: &str) -> impl Fn(result::DriverError) -> EngineError + '_ {
    move |e| {
        use sys::cudaError_enum as E;
        let message = format!("{what}: {e:?}");
        match e.0 {
            E::CUDA_ERROR_OUT_OF_MEMORY => EngineError::OutOfMemory(message),
            E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | E::CUDA_ERROR_DEVICE_UNAVAILABLE
            | E::CUDA_ERROR_NO_DEVICE => EngineError::DeviceLost(message),
            _ => EngineError::Internal(message),
        }
    }
}

/// Bytes held per device ordinal.
static HELD: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

fn account(ordinal: usize, add: usize, remove: usize) {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let bytes = held
        .get_or_insert_with(HashMap::new)
        .entry(ordinal)
        .or_default();
    *bytes = (*bytes + add).saturating_sub(remove);
    let device = format!("gpu:{ordinal}");
    metrics::gauge!(names::DEVICE_MEMORY, "device" => device.clone()).set(*bytes as f64);
    // The device's own count, beside ours: it sees the driver's and cuBLAS's
    // allocations and other processes. Needs the owning context current, as
    // every allocation and free here has.
    if let Ok((free, total)) = result::mem_get_info() {
        metrics::gauge!(names::DEVICE_MEMORY_USED, "device" => device)
            .set(total.saturating_sub(free) as f64);
    }
}

/// Device memory, zeroed at allocation.
#[derive(Debug)]
pub struct DeviceMemory {
    /// Its device address.
    pub ptr: sys::CUdeviceptr,
    /// Its size in bytes.
    pub bytes: usize,
    ordinal: usize,
}

impl DeviceMemory {
    /// Allocates `bytes` (at least 1) on the current context's device `ordinal`.
    pub fn zeroed(bytes: usize, ordinal: usize) -> Result<DeviceMemory, EngineError> {
        let bytes = bytes.max(1);
        // SAFETY: a plain allocation in the current context, zeroed before use.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver("device allocation"))?;
        let memory = DeviceMemory {
            ptr,
            bytes,
            ordinal,
        };
        // SAFETY: `ptr` is `bytes` long, just allocated.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(driver("device memset"))?;
        account(ordinal, bytes, 0);
        Ok(memory)
    }

    /// Copies `data` to `offset` bytes into this memory, synchronously.
    pub fn write<T>(&self, offset: usize, data: &[T]) -> Result<(), EngineError> {
        if offset + std::mem::size_of_val(data) > self.bytes {
            return Err(EngineError::Internal(
                "write past the end of a device buffer".to_string(),
            ));
        }
        // SAFETY: the range was checked to lie inside this allocation.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }
            .map_err(driver("copy to the device"))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed` on its device, freed once; its
        // owner's work on it is done.
        unsafe { residency::free_device(self.ptr, self.ordinal) };
        account(self.ordinal, 0, self.bytes);
    }
}

/// Page-locked host memory, zeroed at allocation.
#[derive(Debug)]
pub struct PinnedMemory {
    ptr: *mut u8,
    bytes: usize,
}

impl PinnedMemory {
    /// Allocates `bytes`; `write_combined` for memory the CPU only writes
    /// (faster to copy to the device, slow for the CPU to read).
    pub fn zeroed(bytes: usize, write_combined: bool) -> Result<PinnedMemory, EngineError> {
        let bytes = bytes.max(1);
        let mut flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        if write_combined {
            flags |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        // SAFETY: a plain allocation, zeroed below before anything reads it.
        let ptr = unsafe { result::malloc_host(bytes, flags) }
            .map_err(driver("pinned host allocation"))?
            .cast::<u8>();
        // SAFETY: `ptr` is `bytes` long, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(PinnedMemory { ptr, bytes })
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `bytes` while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The whole buffer, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `bytes` while `self` lives; `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host`, freed once.
        unsafe { residency::free_host(self.ptr.cast::<c_void>()) };
    }
}

/// Page-locked host memory mapped into the device's address space: the host
/// and a running kernel read and write the same bytes (a mailbox), with no
/// copy call between them.
#[derive(Debug)]
pub struct MappedMemory {
    ptr: *mut u8,
    bytes: usize,
    /// The same bytes' device address.
    pub device: sys::CUdeviceptr,
}

impl MappedMemory {
    /// Allocates `bytes` (at least 1), zeroed, mapped into the current
    /// context's device.
    pub fn zeroed(bytes: usize) -> Result<MappedMemory, EngineError> {
        let bytes = bytes.max(1);
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a plain allocation, zeroed below before anything reads it.
        let ptr = unsafe { result::malloc_host(bytes, flags) }
            .map_err(driver("mapped host allocation"))?
            .cast::<u8>();
        // SAFETY: `ptr` is `bytes` long, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in the
        // current context.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast::<c_void>(), 0) }
                .result();
        if let Err(e) = mapped {
            // SAFETY: allocated above, freed once, never handed out.
            unsafe { residency::free_host(ptr.cast::<c_void>()) };
            return Err(driver("mapping host memory into the device")(e));
        }
        Ok(MappedMemory { ptr, bytes, device })
    }

    /// The host address of its first byte (the mapping is `bytes` long and
    /// lives as long as `self`).
    pub fn host(&self) -> *mut u8 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host`, freed once; the kernel that
        // read it has returned.
        unsafe { residency::free_host(self.ptr.cast::<c_void>()) };
    }
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream(pub sys::CUstream);

impl Stream {
    /// A new stream that does not synchronise with the default stream.
    pub fn new() -> Result<Stream, EngineError> {
        result::stream::create(result::stream::StreamKind::NonBlocking)
            .map(Stream)
            .map_err(driver("stream creation"))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), EngineError> {
        // SAFETY: the stream is alive.
        unsafe { result::stream::synchronize(self.0) }.map_err(driver("stream synchronize"))
    }

    /// Whether everything queued on the stream has finished, without
    /// waiting.
    pub fn finished(&self) -> Result<bool, EngineError> {
        // SAFETY: the stream is alive.
        match unsafe { sys::cuStreamQuery(self.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => other
                .result()
                .map(|()| true)
                .map_err(driver("stream query")),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

/// An event, for timing.
#[derive(Debug)]
pub struct Event(pub sys::CUevent);

impl Event {
    /// A new timing event.
    pub fn new() -> Result<Event, EngineError> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Event)
            .map_err(driver("event creation"))
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), EngineError> {
        // SAFETY: both are alive.
        unsafe { result::event::record(self.0, stream.0) }.map_err(driver("event record"))
    }

    /// Waits for the event.
    pub fn synchronize(&self) -> Result<(), EngineError> {
        // SAFETY: the event is alive.
        unsafe { result::event::synchronize(self.0) }.map_err(driver("event synchronize"))
    }

    /// Milliseconds from `self` to `end`, both complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, EngineError> {
        // SAFETY: both are alive and recorded.
        unsafe { result::event::elapsed(self.0, end.0) }.map_err(driver("event elapsed"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// An instantiated CUDA graph.
#[derive(Debug)]
pub struct GraphExec(pub sys::CUgraphExec);

impl GraphExec {
    /// Ends the capture on `stream` and instantiates what it recorded.
    pub fn end_capture(stream: &Stream) -> Result<GraphExec, EngineError> {
        // SAFETY: the stream is capturing (the caller began it).
        let graph = unsafe { result::stream::end_capture(stream.0) }
            .map_err(driver("end of the graph capture"))?;
        // SAFETY: `graph` is the captured graph; it is destroyed once instantiated.
        let exec = unsafe {
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec
        }
        .map_err(driver("graph instantiation"))?;
        let exec = GraphExec(exec);
        // SAFETY: both are alive.
        unsafe { result::graph::upload(exec.0, stream.0) }.map_err(driver("graph upload"))?;
        Ok(exec)
    }

    /// Launches the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), EngineError> {
        // SAFETY: both are alive; every buffer the graph touches lives as long as it.
        unsafe { result::graph::launch(self.0, stream.0) }.map_err(driver("graph launch"))
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: instantiated by `end_capture`, destroyed once.
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

/// A loaded module of kernels.
#[derive(Debug)]
pub struct Module(sys::CUmodule);

impl Module {
    /// Loads the family's kernels: the CUBIN (machine code for this device),
    /// else the PTX (the driver compiles it). Says which it loaded, and why
    /// not the CUBIN.
    pub fn load(compiled: &Compiled) -> Result<(Module, String), EngineError> {
        let refused = match &compiled.cubin {
            Some(cubin) => {
                // SAFETY: `cubin` is an ELF image NVRTC wrote and outlives the call.
                match unsafe { result::module::load_data(cubin.as_ptr().cast()) } {
                    Ok(module) => return Ok((Module(module), "CUBIN".to_string())),
                    Err(e) => format!("the driver refused the CUBIN ({e:?})"),
                }
            }
            None => "NVRTC wrote no CUBIN".to_string(),
        };
        let image = CString::new(compiled.ptx.as_str())
            .map_err(|_| EngineError::Internal("PTX holds a NUL byte".to_string()))?;
        // SAFETY: `image` is NUL-terminated PTX and outlives the call.
        unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map(|module| (Module(module), format!("PTX: {refused}")))
            .map_err(driver("loading the kernels"))
    }

    /// A kernel by name.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction, EngineError> {
        let c_name = CString::new(name)
            .map_err(|_| EngineError::Internal("kernel name holds a NUL byte".to_string()))?;
        // SAFETY: the module is loaded.
        unsafe { result::module::get_function(self.0, c_name) }.map_err(driver("finding a kernel"))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`, unloaded once.
        let _ = unsafe { result::module::unload(self.0) };
    }
}

/// A cuBLAS handle bound to one stream, with its own workspace (so a
/// captured product allocates nothing).
#[derive(Debug)]
pub struct Blas {
    /// The handle.
    pub handle: blas_sys::cublasHandle_t,
    _workspace: DeviceMemory,
}

/// cuBLAS workspace per handle.
const WORKSPACE_BYTES: usize = 4 << 20;

impl Blas {
    /// A handle on `stream`; `tf32` allows TF32 tensor-core products.
    pub fn new(stream: &Stream, tf32: bool, ordinal: usize) -> Result<Blas, EngineError> {
        let blas_error = |what: &'static str| {
            move |e: blas::CublasError| {
                let message = format!("{what}: {e:?}");
                if e.0 == blas_sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED {
                    EngineError::OutOfMemory(message)
                } else {
                    EngineError::Internal(message)
                }
            }
        };
        // SAFETY: only tries to dlopen libcublas; no symbol is called.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(EngineError::Unsupported(
                "cuBLAS (libcublas.so.13) cannot be loaded: put the CUDA toolkit's lib64, or the \
                 nvidia wheels' cu13/lib, on LD_LIBRARY_PATH"
                    .to_string(),
            ));
        }
        // cudarc panics when a symbol is missing (a cuBLAS older than its bindings).
        let handle = std::panic::catch_unwind(blas::create_handle)
            .map_err(|_| {
                EngineError::Unsupported("cuBLAS loads but lacks what the engine calls".to_string())
            })?
            .map_err(blas_error("cuBLAS handle"))?;
        let workspace = DeviceMemory::zeroed(WORKSPACE_BYTES, ordinal)?;
        let blas = Blas {
            handle,
            _workspace: workspace,
        };
        let mode = if tf32 {
            blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: the handle and stream are alive; the workspace lives as long as the handle.
        unsafe {
            blas::set_stream(handle, stream.0.cast()).map_err(blas_error("cuBLAS stream"))?;
            blas_sys::cublasSetMathMode(handle, mode)
                .result()
                .map_err(blas_error("cuBLAS math mode"))?;
            blas_sys::cublasSetWorkspace_v2(
                handle,
                blas._workspace.ptr as *mut c_void,
                WORKSPACE_BYTES,
            )
            .result()
            .map_err(blas_error("cuBLAS workspace"))?;
        }
        Ok(blas)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}
