//! The journal crate's integration tests: one binary (`cargo test -p
//! tickserve-journal --test journal`), one module per part.
//!
//! - [`writer`]: the writer, driven as the edge drives it (records of a
//!   loaded model's versions, no server), its files read back with
//!   `verify` and `read`.

mod writer;
