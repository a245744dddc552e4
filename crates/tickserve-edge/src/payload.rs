//! What a front end hands the edge and gets back: its undecoded request
//! ([`Payload`]), decoded against the model the edge looked up
//! ([`Decoded`]), and the answer with what the front end needs to encode it
//! ([`Answer`]).

use std::sync::Arc;
use std::time::Instant;

use tickserve_core::{Error, InferResponse, InputTensor, ModelRequest};
use tickserve_runtime::ModelHandle;

use crate::params::Parameters;

/// Payloads that decode in more than this many bytes go to a blocking
/// thread, so that they do not hold up every other connection meanwhile.
pub const DECODE_IN_PLACE_BYTES: usize = 256 * 1024;

/// A front end's undecoded request: decoded by the edge against the model it
/// names, in place or on a blocking thread.
pub trait Payload: Send + 'static {
    /// What the front end needs back to encode the answer (which outputs go
    /// back binary, say).
    type Encoding: Send + 'static;

    /// The bytes decoding will read; over [`DECODE_IN_PLACE_BYTES`] it runs
    /// on a blocking thread. 0 for a payload already decoded by its
    /// transport (gRPC's messages).
    fn decode_bytes(&self) -> usize;

    /// The bytes decoding will make beyond the request's own (a one-element
    /// typed list that fills a large shape, say), checked against `handle`'s
    /// model before anything is made: they are held in
    /// `server.max_inflight_bytes` beside the request's bytes, and count
    /// towards decoding on a blocking thread.
    fn expansion(&self, handle: &ModelHandle) -> Result<usize, Error> {
        let _ = handle;
        Ok(0)
    }

    /// Decodes the payload for `handle`'s model; the parameters are read
    /// with [`Parameters::read`].
    fn decode(self, handle: &ModelHandle) -> Result<Decoded<Self::Encoding>, Error>;
}

/// A decoded request, in the core's terms.
pub struct Decoded<E> {
    /// The request id, echoed in the answer.
    pub id: String,
    /// The inputs.
    pub inputs: Vec<InputTensor>,
    /// The outputs asked for, by name; `None` for every output.
    pub outputs: Option<Vec<String>>,
    /// What the request's parameters set.
    pub parameters: Parameters,
    /// What the front end needs to encode the answer.
    pub encoding: E,
}

impl<E> Decoded<E> {
    /// What the request asks of the model the edge has looked up, answered
    /// by `deadline`, and what the front end keeps for the encoding.
    pub fn into_request(self, deadline: Option<Instant>) -> (ModelRequest, E) {
        let Decoded {
            id,
            inputs,
            outputs,
            parameters,
            encoding,
        } = self;
        let request = ModelRequest {
            id,
            inputs,
            outputs,
            deadline,
            monte_carlo: parameters.monte_carlo,
            priority: parameters.priority,
            sequence: parameters.sequence,
        };
        (request, encoding)
    }
}

/// A prediction and what its front end needs to encode it.
pub struct Answer<E> {
    /// The prediction.
    pub response: InferResponse,
    /// The sequence a tick continued, as the `tickserve-sequence-id` header
    /// writes it: answers carry it back.
    pub sequence: Option<String>,
    /// What the front end decoded for the encoding.
    pub encoding: E,
    /// The model version that answered.
    pub handle: Arc<ModelHandle>,
}
