//! The compiled CPU engine's integration tests, one binary: every model the
//! plan importer takes (the sample models, the op-set fixtures, the
//! per-tick benchmark's, the sequence models PyTorch's and tf2onnx's
//! exporters wrote), compiled by the engine with each of its kernel sets
//! and run beside ONNX Runtime on the same rows ([`against_onnx_runtime`]);
//! random tree ensembles of every shape the forest reader takes beside
//! ONNX Runtime ([`random_forests`]); the forest fuzzing corpus and seeded
//! forests against the plain walk ([`fuzz_corpus`]).

#![allow(clippy::unwrap_used, missing_docs)]

mod against_onnx_runtime;
mod fuzz_corpus;
mod random_forests;
mod random_plans;
