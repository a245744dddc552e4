//! The CUDA engine: MLP-style and recurrent (LSTM, GRU) ONNX models
//! imported op by op into a [`plan::Plan`] (`tickserve-plan`), lowered to cuBLAS products and
//! NVRTC-compiled fused kernels, and captured as one CUDA graph per bucket at
//! load. A run is one
//! graph launch: copy in from pinned memory, the forward pass, copy out.
//! Members of a family keep their own weights in device memory; a run reaches
//! them through a device-side pointer table written with the batch, so a
//! weight swap is a pointer write, never a copy of weights.
//!
//! A family may instead run resident ([`ResidentModel`]): one kernel launched
//! at load, each run handed to it through mailboxes in mapped host memory
//! ([`resident`], [`mailbox`]), its graphs kept to fail over to.
//!
//! Builds on every machine (cudarc loads CUDA at run time); [`Gpus::probe`]
//! finds out, without panicking, whether there is anything to run on.

pub mod device;
pub mod engine;
pub mod kernels;
pub mod mailbox;
pub mod placement;
pub mod probe;
pub mod residency;
pub mod resident;

pub use tickserve_plan::{import, plan, reference};

pub use engine::{
    CudaCompileRequest, CudaEngine, CudaModel, CudaOptions, RESIDENT_TICK_BOUND, ResidentModel,
    ResidentOptions,
};
pub use probe::{GpuInfo, Gpus};
pub use tickserve_plan::{Imported, Unsupported, arrange};
