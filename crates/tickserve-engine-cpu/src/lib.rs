//! The compiled CPU engine: a model's [`Plan`](tickserve_plan::plan::Plan)
//! (MLPs, LSTM and GRU steps and windows, one-axis convolutions, as
//! `tickserve-plan` imports them), or its tree ensemble
//! ([`Forest`](tickserve_plan::forest::Forest)), run natively in place of
//! ONNX Runtime's general kernels, for the batch sizes of the model's
//! buckets.
//!
//! At load, each member's weights are packed for the kernels ([`packed`]):
//! every product's matrix in panels of 64 columns, each panel's rows
//! contiguous, a recurrent cell's biases summed. A run walks the plan's steps over buffers allocated
//! at load ([`run`]): products streamed through register-blocked AVX2/FMA
//! kernels where the CPU has them ([`kernels`]), a recurrent layer's input
//! product for every step at once and one fused gate loop per step
//! ([`recurrent`]), elementwise chains over whole rows. A forest is laid
//! out in one array of nodes walked eight trees at a time, without a
//! branch on the node's kind ([`forest`]). Nothing is compiled
//! or allocated after the model is ready; a weight swap is picking another
//! member's packed weights.
//!
//! The runtime chooses this engine per model (`runtime.cpu_engine`, a
//! model's `engine`) only after the model, run here and on ONNX Runtime on
//! the same rows, answers the same.

pub mod engine;
pub mod forest;
pub mod fuzzing;
pub mod kernels;
pub mod packed;
pub mod recurrent;
pub mod run;

pub use engine::{CpuEngine, CpuModel};
pub use kernels::Isa;
