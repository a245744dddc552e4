//! The prediction journal (docs/journal.md): every prediction of a
//! journaled model as a typed record — inputs, outputs, the model file's
//! digest, wall-clock times, parameters, the state a tick read — in Arrow
//! IPC stream files, written off the request path; read back to find gaps
//! and edits ([`verify`]) and to rerun each record bit for bit ([`replay`]).
//!
//! - [`record`]: what the edge hands over for one request;
//! - [`schema`]: one model version's columns;
//! - [`batch`]: records into a numbered, chained record batch;
//! - [`digest`]: the chain;
//! - [`drops`]: each run's count of records dropped;
//! - [`writer`]: the request path's [`Journal`] and the writer thread;
//! - [`read`], [`verify`], [`replay`]: reading a journal back.

pub mod batch;
pub mod digest;
pub mod drops;
pub mod read;
pub mod record;
pub mod replay;
pub mod schema;
pub mod verify;
pub mod writer;

pub use record::{MonteCarlo, Outputs, Record, RecordedParameters, Tensor};
pub use writer::Journal;
