//! One prediction's record, as the edge hands it to the journal.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tickserve_core::DataType;
use tickserve_runtime::ModelHandle;

/// What one request was and what it got: everything a record holds, before
/// the writer numbers and chains it. Tensors are the request's and the
/// answer's own buffers (reference counted), never copies.
#[derive(Debug)]
pub struct Record {
    /// The model version the request reached.
    pub handle: Arc<ModelHandle>,
    /// When the edge took the request (UTC wall clock).
    pub received: SystemTime,
    /// When its answer (or error) was ready for the front end to encode.
    pub answered: SystemTime,
    /// Time waiting in the model's queue.
    pub queue: Duration,
    /// Time copying rows in, running, copying rows out.
    pub compute: Duration,
    /// The front end (`http`, `grpc`, `grpc_stream`, `shm`, `tfs_rest`,
    /// `tfs_grpc`).
    pub protocol: &'static str,
    /// The request id the client gave (empty when none).
    pub id: String,
    /// The W3C `traceparent` the client sent, if any.
    pub traceparent: Option<String>,
    /// The key the request carried, where keys guard inference: the first 8
    /// bytes of its SHA-256, in hex (the key itself is never written).
    pub key: Option<String>,
    /// The bucket it ran in, in rows; `None` when it did not run.
    pub bucket: Option<u32>,
    /// `ok`, or the failure's kind (`invalid_argument`, `deadline_exceeded`).
    pub status: &'static str,
    /// A failed request's error text, as the client got it.
    pub error: Option<String>,
    /// The request's parameters.
    pub parameters: RecordedParameters,
    /// The validated inputs in signature order and their rows; `None` for a
    /// request refused before it was validated.
    pub inputs: Option<(Vec<Bytes>, usize)>,
    /// The outputs the client got.
    pub outputs: Outputs,
    /// A stateful model's state rows the request read (one per state pair,
    /// then one window per window, `model.toml` order); empty otherwise.
    pub state: Vec<Bytes>,
    /// A windowed model's tick: the ticks its window held, this one included.
    pub window_ticks: Option<u32>,
}

/// A request's parameters, as a replay needs them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedParameters {
    /// `priority` (0: the model's default level).
    pub priority: u64,
    /// `sequence_id` (a number, or a string in double quotes), and its flags.
    pub sequence: Option<(String, bool, bool)>,
    /// Monte Carlo, when asked for.
    pub monte_carlo: Option<MonteCarlo>,
}

/// A Monte Carlo request's parameters, the seed always filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct MonteCarlo {
    /// `mc_samples`.
    pub samples: u32,
    /// `mc_noise_sigma`, when the request gave one.
    pub sigma: Option<f64>,
    /// The seed the noise was drawn from: the request's, or the one the
    /// server drew for it.
    pub seed: u64,
    /// `mc_output`: `moments`, `quantiles` or `samples`.
    pub output: String,
    /// `mc_quantiles`, for `quantiles`.
    pub quantiles: Option<String>,
}

/// The outputs of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Outputs {
    /// The model's own outputs: each its index among the signature's
    /// outputs and its data (names and shapes follow from the signature).
    Model(Vec<(usize, Bytes)>),
    /// A Monte Carlo answer's summaries (names and shapes depend on the
    /// request's `mc_output`).
    MonteCarlo(Vec<Tensor>),
}

impl Outputs {
    /// Bytes of tensor data.
    pub fn bytes(&self) -> usize {
        match self {
            Outputs::Model(outputs) => outputs.iter().map(|(_, d)| d.len()).sum(),
            Outputs::MonteCarlo(outputs) => outputs.iter().map(|t| t.data.len()).sum(),
        }
    }
}

/// One output tensor of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its shape, rows first.
    pub shape: Vec<i64>,
    /// Its little-endian elements.
    pub data: Bytes,
}

impl Record {
    /// The bytes it holds in the journal's queue: its tensors and a fixed
    /// allowance for the rest.
    pub fn queued_bytes(&self) -> usize {
        let inputs: usize = self
            .inputs
            .as_ref()
            .map_or(0, |(inputs, _)| inputs.iter().map(Bytes::len).sum());
        let outputs = self.outputs.bytes();
        let state: usize = self.state.iter().map(Bytes::len).sum();
        inputs + outputs + state + self.id.len() + self.error.as_ref().map_or(0, String::len) + 512
    }
}
