//! The v2 HTTP path's speed-only codec, beside the library path it stands
//! in for and falling back to it: [`reader`] reads the binary extension's
//! JSON header of the common shape by hand, `None` for anything else, which
//! serde_json then reads ([`super::request_header::json_header`]).
//!
//! Its gain: a one-row `alpha_mlp` request with the binary extension costs
//! the server 60,394 instructions with it, 66,678 with every header read
//! by serde_json (−9.4 %; the v2 HTTP cases' run-to-run spread is ±4 %):
//! `scripts/bench_instructions.py --old OLD --new NEW --requests 300
//! --warmup 100`, OLD the same build with this reader's answer ignored,
//! 2-core development machine, 2026-11-27
//! (`bench/results/2026-11-27-fast-paths.md`). A hand writer of the
//! answer's header measured −2.2 % (binary) and +1.5 % (JSON) the same
//! way, within the spread, and was taken out: serde_json writes answers.
//!
//! Held to the library: its unit tests compare it with serde_json on real
//! headers and thousands of their mutations, and the `http_binary` fuzz
//! target asserts that whatever [`reader`] reads, serde_json reads alike.

pub(crate) mod reader;
