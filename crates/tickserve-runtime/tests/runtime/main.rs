//! The runtime's integration tests, one binary: the runtime on the real ONNX
//! Runtime engine and the sample repository (rows batched, padded and split;
//! rows that depend on each other; warm-up; the repository poll), faults
//! injected through a test engine wrapped around it (supervision, a GPU that
//! cannot compile, shedding and reserved executors at a gate), a front-end
//! thread's round gathered into one run, and the
//! process's own threads (pinning, reloads). Those last two read every thread
//! of the process, so they run alone in a copy of this binary
//! ([`support::alone`]).

#![allow(clippy::disallowed_methods)] // tests wait for executors on their own threads in the machine's time
#![allow(clippy::panic, clippy::unwrap_used, missing_docs)]

mod against_onnx_runtime;
mod cpu_engine;
mod gather;
mod gpu_fallback;
mod mixed_rows;
mod padding;
mod pinning;
mod poll;
mod reload_threads;
mod reserved_executors;
mod runtime;
mod shedding;
mod supervision;
mod support;
mod versions;
mod warm_here;
