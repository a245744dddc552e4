//! A model's forward pass as a [`plan::Plan`]: products, recurrent layers,
//! one-axis convolutions and row operations, each followed by a fused chain
//! of elementwise operations, over batch-first fp32 activations.
//!
//! [`import`] turns the ONNX graphs of MLP-style, recurrent (LSTM, GRU) and
//! convolutional trading models into a plan, naming the first node it cannot
//! take. [`reference`] evaluates a plan one element at a time in plain Rust:
//! the meaning both engines that run plans are checked against, the compiled
//! CPU engine (`tickserve-engine-cpu`) and the CUDA engine
//! (`tickserve-engine-cuda`).

pub mod forest;
pub mod import;
pub mod plan;
pub mod reference;

pub use import::{Imported, Unsupported, arrange, import};
