//! The request and response types the front ends decode into and encode from.
//!
//! Tensor data is little-endian bytes in row-major order. Input data is a
//! [`bytes::Bytes`] so that gRPC `raw_input_contents` arrive without a copy and
//! are copied once, into the bucket buffer.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::{DataType, Name};

/// The most dimensions one tensor's shape may have, on every front end:
/// each reader of a request (HTTP JSON and binary, gRPC, TF Serving's JSON
/// and protobuf, shared memory) refuses a deeper shape before it reads it.
pub const MAX_RANK: usize = 16;

/// One input tensor as the client sent it, before validation.
#[derive(Debug, Clone)]
pub struct InputTensor {
    /// The input's name.
    pub name: String,
    /// The datatype the client declared.
    pub datatype: DataType,
    /// The shape the client declared (may hold zero or negative dims: validation refuses them).
    pub shape: Vec<i64>,
    /// Little-endian element data.
    pub data: Bytes,
}

/// The longest request id, in bytes, over every protocol (an id is echoed in
/// the answer and in logs).
pub const MAX_ID_BYTES: usize = 1024;

/// An inference request addressed to a model by name: what the runtime's
/// `infer` looks up and answers.
#[derive(Debug, Clone)]
pub struct InferRequest {
    /// The model's name.
    pub model: String,
    /// The version asked for; `None` is the default (highest) version.
    pub version: Option<String>,
    /// What it asks of that model.
    pub request: ModelRequest,
}

/// What a request asks of one model, once the model is known (a front end
/// has looked it up; a model handle validates and runs it).
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// The request id, echoed in the response.
    pub id: String,
    /// The inputs.
    pub inputs: Vec<InputTensor>,
    /// The outputs asked for, by name; `None` asks for every output.
    pub outputs: Option<Vec<String>>,
    /// When the answer stops being useful; `None` for no deadline.
    pub deadline: Option<Instant>,
    /// Monte Carlo input noise (`mc_samples` and friends), if asked for.
    pub monte_carlo: Option<crate::monte_carlo::MonteCarlo>,
    /// The `priority` parameter: 1 is the highest level; 0 (or a level the
    /// model does not have) is the model's default level.
    pub priority: u64,
    /// Which sequence the request continues (`sequence_id` and its start
    /// and end flags), for a stateful model.
    pub sequence: Option<crate::sequence::SequenceControl>,
}

/// One output tensor of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTensor {
    /// The output's name.
    pub name: Name,
    /// Its datatype.
    pub datatype: DataType,
    /// Its shape, batch first.
    pub shape: Vec<i64>,
    /// Little-endian element data (shared, not copied, by the front end
    /// that encodes it and the journal that records it).
    pub data: Bytes,
}

/// A prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// The model that answered.
    pub model: Name,
    /// Its version.
    pub version: Name,
    /// The request's id.
    pub id: String,
    /// The outputs asked for, in the order asked (model order when all).
    pub outputs: Vec<OutputTensor>,
    /// Where the time went, reported back to the client.
    pub timing: Timing,
    /// True when the request's sequence had sat idle past the model's
    /// `max_sequence_idle` and started afresh (`idle_action = "restart"`):
    /// the response parameter `sequence_restarted`.
    pub sequence_restarted: bool,
    /// The bucket it ran in, in rows (the largest, for a request split
    /// across runs).
    pub bucket: usize,
    /// A stateful model's state rows the request read, in `model.toml`
    /// order (state pairs, then windows); empty unless its run was asked to
    /// keep them (the journal).
    pub state_read: Vec<Bytes>,
    /// A windowed sequence model's tick: how many ticks its window held,
    /// this one included (the longest window's, at most its length): the
    /// response parameter `sequence_window_ticks`. With `window_warmup =
    /// "wait"`, an answer whose windows are not yet full has no outputs.
    pub window_ticks: Option<u64>,
}

/// Time a request spent in the server, by stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Waiting in the model's queue.
    pub queue: Duration,
    /// Copying rows in, running the engine, copying rows out.
    pub compute: Duration,
}
