//! The v2 HTTP path's speed-only codecs, each beside the library path it
//! stands in for and falling back to it:
//!
//! - [`reader`]: the binary extension's JSON header of the common shape,
//!   read by hand; `None` for anything else, which serde_json then reads
//!   ([`super::request_header::json_header`]).
//! - [`writer`]: an all-binary answer's JSON header, written by hand;
//!   `false` for anything else, which serde_json then writes
//!   ([`super::codec`]).
//!
//! Their gains, for a one-row `alpha_mlp` request with the binary
//! extension: 60,394 instructions with both, 66,678 with the header read by
//! serde_json (the reader: −9.4 %), 61,785 with the answer's header written
//! by serde_json (the writer: −2.2 %). The codec's own share (the
//! benchmark's `protocol` column, steady from run to run where the
//! transport's moves by a few percent) is 4,243 with both and 5,841 without
//! the writer. Measured with `scripts/bench/bench_instructions.py --old OLD --new
//! NEW --requests 300 --warmup 100`, OLD the same build with that path's
//! answer ignored, 2-core development machine, 2026-11-27
//! (`bench/results/2026-11-27-fast-paths.md`).
//!
//! Held to the library: their unit tests compare them with serde_json on
//! real headers and answers and thousands of their mutations, and the
//! `http_binary` fuzz target asserts that whatever [`reader`] reads,
//! serde_json reads alike.

pub(crate) mod reader;
pub(crate) mod writer;
