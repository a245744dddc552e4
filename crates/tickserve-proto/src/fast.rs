//! The speed-only reading of the server's unary inference, beside the
//! library path it stands in for (prost behind [`crate::bounded`]) and
//! falling back to it: [`view`] reads a `ModelInferRequest` of the common
//! shape in place, `None` for anything else.
//!
//! Its gain: a one-row `alpha_mlp` unary `ModelInfer` costs the server
//! 102,926 instructions with it, 106,886 decoded by prost (−3.7 %; the
//! gRPC cases' run-to-run spread is ±2 %): the server's
//! `scripts/bench/bench_instructions.py --old OLD --new NEW --requests 300
//! --warmup 100`, OLD the same build with [`view`]'s answer ignored,
//! 2-core development machine, 2026-11-27
//! (`bench/results/2026-11-27-fast-paths.md`).
//!
//! Held to prost: its unit tests decode real messages and their mutations
//! both ways, and the server's `grpc_request` fuzz target asserts that
//! whatever [`view`] reads, prost decodes alike, field by field.

pub mod view;
