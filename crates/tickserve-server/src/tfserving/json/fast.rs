//! TF Serving REST's speed-only reading, beside the general reading it
//! stands in for ([`super::decode`]) and falling back to it:
//! [`one_pass`] reads the common `:predict` body in one pass, `None` for
//! anything else.
//!
//! Its gain: a one-row `alpha_mlp` `:predict` body costs the server 101,172
//! instructions with it, 157,202 through the general reading alone
//! (−35.6 %): `scripts/bench/bench_instructions.py --old OLD --new NEW --requests
//! 300 --warmup 100`, OLD the same build with [`one_pass`]'s answer
//! ignored, 2-core development machine, 2026-11-27
//! (`bench/results/2026-11-27-fast-paths.md`).
//!
//! Held to the general reading: a unit test decodes the common bodies both
//! ways, and the `tf_json` fuzz target asserts that whatever [`one_pass`]
//! reads, the general reading reads alike (`check_one_pass`).

pub(super) mod one_pass;
