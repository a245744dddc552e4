//! The server's integration tests, one binary: real servers on loopback
//! driven by real clients (Triton's Python clients, the Rust shared-memory
//! client, raw sockets for the hostile ones), modules by axis:
//!
//! - [`front_ends`]: each protocol against its own clients;
//! - [`features`]: what a request can ask for and what a model can be
//!   (sequences, windows, Monte Carlo, the journal, shadows and splits,
//!   guards, the kill switch, priorities, keep-warm);
//! - [`operations`]: what an operator does and sees (live updates, the
//!   repository API, readiness, shutdown, supervision, metrics, `check`);
//! - [`limits`]: hostile input and every stated limit;
//! - [`support`]: the helpers they share.
//!
//! Tests run side by side in one process. The few whose measure belongs to the
//! process (a counter summed over every model, the peak resident memory, a
//! fault armed process-wide, the environment) run alone in a copy of this
//! binary: [`support::alone`].

#![allow(clippy::disallowed_methods)] // tests wait for servers on their own threads in the machine's time
#![allow(clippy::unwrap_used, missing_docs)]

mod features;
mod front_ends;
mod limits;
mod operations;
mod support;
