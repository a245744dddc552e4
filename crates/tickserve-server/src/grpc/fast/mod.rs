//! The v2 gRPC path's speed-only codec, beside the library path it stands
//! in for and falling back to it:
//!
//! - [`answer`]: a unary answer with raw contents and no response
//!   parameters, written from the core's response straight into tonic's
//!   buffer; any other answer is built as the generated message and
//!   encoded by prost ([`super::convert::encode`]).
//!
//! Its gain, for a one-row `alpha_mlp` request over gRPC unary: 102,867
//! instructions against 104,051 with prost (−1.1 %), measured with
//! `scripts/bench/bench_instructions.py --old OLD --new NEW`, OLD the build
//! before it, 2-core development machine, 2026-11-25.
//!
//! Held to the library: its unit tests compare its bytes with prost's for
//! raw and typed answers, empty names, shapes and contents, long names,
//! negative and large dimensions, and the `grpc_answer` fuzz target asserts
//! that for any answer it writes prost's bytes.

pub mod answer;
