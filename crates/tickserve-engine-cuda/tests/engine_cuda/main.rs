//! The CUDA engine's integration tests, one binary: the importer against ONNX
//! Runtime ([`import`]), the generated kernels compiled by NVRTC
//! ([`kernels`]) and run on the CPU by the host's C++ compiler behind an
//! emulation of CUDA's threads ([`emulated`]), the resident kernel ticked
//! through its mailbox on the CPU ([`resident`]), and, on a GPU only, the engine
//! itself ([`gpu`]: ignored elsewhere, run with `--ignored gpu::`).

#![allow(clippy::unwrap_used, missing_docs, unsafe_code)]

mod emulated;
mod gpu;
mod import;
mod kernels;
mod resident;
mod support;
