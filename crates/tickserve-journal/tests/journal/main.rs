//! The journal crate's integration tests: one binary (`cargo test -p
//! tickserve-journal --test journal`), one module per part.
//!
//! - [`writer`]: the writer, driven as the edge drives it (records of a
//!   loaded model's versions, no server), its files read back with
//!   `verify` and `read`;
//! - [`verify`]: what `journal verify` finds in a journal the writer wrote,
//!   then damaged as a crash, a lost file or an edit would.

mod support;
mod verify;
mod writer;
