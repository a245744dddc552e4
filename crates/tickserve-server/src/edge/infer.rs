//! The inference pipeline, once for every front end: readiness, admission
//! (a slot, the request's bytes), the one model lookup, decoding (large
//! payloads on a blocking thread), the parameters, the runtime call, and the
//! request's metrics. A front end describes its request ([`Call`]) and hands
//! over its undecoded payload ([`Payload`]); it gets back the answer and
//! what it needs to encode it ([`Answer`]), or the error to word in its
//! protocol ([`super::status`]).
//!
//! [`Edge::admit_request`] is the synchronous-order half (a stream admits
//! its messages in the order they came, so one sequence's requests keep
//! their order) and [`Admitted::run`] the half that waits for the answer;
//! [`Edge::infer`] is both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tickserve_core::sequence::KeyId;
use tickserve_core::{Error, InferRequest, InferResponse, InputTensor, durations};
use tickserve_runtime::ModelHandle;
use tickserve_runtime::Prepared;

use super::Edge;
use super::admission::{BodyBytes, HeldBytes, Slot};
use super::journal::Pending;
use super::params::Parameters;
use super::shadow::Mirror;
use crate::observe::{self, Protocol};

/// Payloads that decode in more than this many bytes go to a blocking
/// thread, so that they do not hold up every other connection meanwhile.
pub const DECODE_IN_PLACE_BYTES: usize = 256 * 1024;

/// One inference request as its front end describes it, before decoding.
pub struct Call<'a> {
    /// The front end, for metrics.
    pub protocol: Protocol,
    /// The model asked for.
    pub model: &'a str,
    /// The version asked for (`None`: the default version).
    pub version: Option<&'a str>,
    /// The request's bytes as they came, held in `server.max_inflight_bytes`
    /// until it is answered.
    pub bytes: RequestBytes,
    /// The deadline the transport carried (`grpc-timeout`,
    /// `tickserve-timeout`), or the words for a malformed one.
    pub timeout: Result<Option<Duration>, String>,
    /// When the request came.
    pub started: Instant,
    /// The key it carried, where keys guard inference (a model with
    /// `bind_to_key` keeps its sequences apart by key).
    pub key: Option<KeyId>,
    /// The W3C `traceparent` it carried ([`super::trace`]), for the journal.
    pub traceparent: Option<String>,
}

/// A request's bytes in `server.max_inflight_bytes`.
pub enum RequestBytes {
    /// Held already, as they arrived (an HTTP body, a gRPC message).
    Held(HeldBytes),
    /// Not held yet (shared memory): admitted with the request.
    Count(usize),
}

impl RequestBytes {
    /// What the body of the request with `extensions` holds, taken from it
    /// (the listener counts every body as it arrives); for a request that
    /// came another way, its `len` bytes to admit.
    pub fn of(extensions: &http::Extensions, len: usize) -> RequestBytes {
        match extensions.get::<Arc<BodyBytes>>() {
            Some(body) => RequestBytes::Held(body.take()),
            None => RequestBytes::Count(len),
        }
    }
}

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
    /// The core's request for version `version` of `model`, answered by
    /// `deadline`, and what the front end keeps for the encoding.
    pub fn into_request(
        self,
        model: &str,
        version: Option<String>,
        deadline: Option<Instant>,
    ) -> (InferRequest, E) {
        let Decoded {
            id,
            inputs,
            outputs,
            parameters,
            encoding,
        } = self;
        let request = InferRequest {
            model: model.to_string(),
            version,
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
    /// What the front end decoded for the encoding.
    pub encoding: E,
    /// The model version that answered.
    pub handle: Arc<ModelHandle>,
}

/// An admitted request, validated and in its place (its sequence's turn
/// included), holding its slot and bytes until it is answered.
pub struct Admitted<E> {
    handle: Arc<ModelHandle>,
    /// The copy its shadows get, if it has any that want it.
    mirror: Option<Mirror>,
    prepared: Prepared,
    encoding: E,
    record: Record,
    journal: Option<Pending>,
    _slot: Slot,
    _bytes: HeldBytes,
}

/// What the request's metrics are recorded under.
struct Record {
    protocol: Protocol,
    label: Label,
    started: Instant,
}

/// The `model` label: the model's name, or what stands for a model the
/// server does not have.
enum Label {
    Model(Arc<ModelHandle>),
    Other(String),
}

impl Record {
    fn outcome(&self, error: Option<&Error>) {
        let label = match &self.label {
            Label::Model(handle) => handle.name.as_str(),
            Label::Other(label) => label.as_str(),
        };
        observe::record_request(self.protocol, label, self.started, error);
    }
}

impl Edge {
    /// Answers one inference request: [`Edge::admit_request`], then
    /// [`Admitted::run`].
    pub async fn infer<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        payload: P,
    ) -> Result<Answer<P::Encoding>, Error> {
        // Boxed: each is several kilobytes of state, which every future
        // holding it inline would copy again as it moves.
        let admitted = Box::pin(self.admit_request(call, payload)).await?;
        Box::pin(admitted.run()).await
    }

    /// Admits, looks up, decodes and prepares one request; a refusal is
    /// recorded here.
    pub async fn admit_request<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        payload: P,
    ) -> Result<Admitted<P::Encoding>, Error> {
        // The one lookup of this request's model.
        let routed = self.runtime.route(call.model, call.version);
        let (drawn, sticky, shadows) = match &routed {
            Ok(r) => (r.drawn, r.sticky, r.shadows.clone()),
            Err(_) => (false, false, None),
        };
        let handle = routed.map(|r| r.handle);
        let record = Record {
            protocol: call.protocol,
            label: match &handle {
                Ok(h) => Label::Model(Arc::clone(h)),
                Err(_) => Label::Other(self.runtime.model_label(call.model)),
            },
            started: call.started,
        };
        // A journaled model's request collects its record as it goes.
        let mut journal = match (&self.journal, &handle) {
            (Some(journal), Ok(h)) if journal.wants(h) => Some(Pending::new(
                journal,
                h,
                call.protocol.label(),
                call.started,
                call.key,
                call.traceparent.clone(),
            )),
            _ => None,
        };
        let admitted = self
            .admit_inner(call, handle, (drawn, sticky), payload, &mut journal)
            .await;
        match admitted {
            Ok((handle, prepared, encoding, slot, bytes)) => Ok(Admitted {
                mirror: shadows
                    .and_then(|plans| Mirror::of(plans, &handle, &prepared, journal.as_ref())),
                handle,
                prepared,
                encoding,
                record,
                journal,
                _slot: slot,
                _bytes: bytes,
            }),
            Err(error) => {
                record.outcome(Some(&error));
                if let Some(pending) = journal {
                    // A request the journal itself refused has no record.
                    if !matches!(error, Error::JournalUnavailable { .. }) {
                        pending.refused(&error);
                    }
                }
                Err(error)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    async fn admit_inner<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        handle: Result<Arc<ModelHandle>, Error>,
        (drawn, sticky): (bool, bool),
        payload: P,
        journal: &mut Option<Pending>,
    ) -> Result<(Arc<ModelHandle>, Prepared, P::Encoding, Slot, HeldBytes), Error> {
        if !self.ready() {
            return Err(Error::ShuttingDown);
        }
        if let Some(pending) = journal {
            pending.admit()?;
        }
        let slot = self.admit()?;
        let bytes = match call.bytes {
            RequestBytes::Held(held) => held,
            RequestBytes::Count(len) => self.admit_bytes(len)?,
        };
        let handle = handle?;
        let transport_timeout = call
            .timeout
            .map_err(|message| Error::request(&handle.name, message))?;
        let expansion = payload.expansion(&handle)?;
        let bytes = bytes.join(self.admit_bytes(expansion)?);
        let work = payload.decode_bytes().saturating_add(expansion);
        let decoded = if work <= DECODE_IN_PLACE_BYTES {
            payload.decode(&handle)?
        } else {
            let decoding = Arc::clone(&handle);
            tokio::task::spawn_blocking(move || payload.decode(&decoding))
                .await
                .map_err(|e| Error::Internal {
                    model: handle.name.clone(),
                    message: format!("decoding the request failed: {e}"),
                })??
        };
        let mut decoded = decoded;
        let mut handle = handle;
        if let Some(sequence) = decoded.parameters.sequence.as_mut() {
            sequence.owner = call.key;
            // A sequence stays on one version, the one it lives on, when
            // the request names none (a new version arrived, or a split).
            if sticky
                && let Some(sticky) = self.runtime.model_for_sequence(&handle.name, sequence)
                && !Arc::ptr_eq(&sticky, &handle)
                && sticky.signature == handle.signature
            {
                handle = sticky;
                if let Some(pending) = journal.as_mut() {
                    pending.served_by(&handle);
                }
            }
        }
        if drawn {
            handle.count_routed();
        }
        if let Some(pending) = journal.as_mut() {
            pending.asked(&decoded.id, &decoded.parameters);
        }
        let deadline = [transport_timeout, decoded.parameters.timeout]
            .into_iter()
            .flatten()
            .min()
            .map(|t| durations::deadline_after(Instant::now(), t));
        let (request, encoding) =
            decoded.into_request(&handle.name, Some(handle.version.clone()), deadline);
        let mut prepared = handle.prepare(request)?;
        if let Some(pending) = journal.as_mut() {
            pending.prepared(&mut prepared);
        }
        // A Monte Carlo run's noisy copies and their answer are held too.
        let bytes = bytes.join(self.admit_bytes(prepared.held_bytes())?);
        Ok((handle, prepared, encoding, slot, bytes))
    }
}

/// An answered request's slot and bytes, kept until its answer is sent (a
/// stream's answers wait for the client to read them).
pub struct Kept {
    _slot: Slot,
    bytes: HeldBytes,
}

impl Kept {
    /// Holds the answer's `bytes` too, until it is sent.
    pub fn hold_answer(&mut self, bytes: usize) {
        self.bytes.add_anyway(bytes);
    }
}

impl<E> Admitted<E> {
    /// Waits for the answer (the sequence's turn, the queue, the run); the
    /// outcome is recorded here.
    pub async fn run(self) -> Result<Answer<E>, Error> {
        self.run_kept().await.0
    }

    /// [`Admitted::run`], and the request's slot and bytes, for the caller
    /// to keep until the answer is sent.
    pub async fn run_kept(self) -> (Result<Answer<E>, Error>, Kept) {
        let Admitted {
            handle,
            mirror,
            prepared,
            encoding,
            record,
            journal,
            _slot,
            _bytes,
        } = self;
        let result = handle.run(prepared).await;
        if let (Some(mirror), Ok(response)) = (mirror, &result) {
            mirror.send(response);
        }
        let result = match journal {
            Some(pending) => pending.answered(result).await,
            None => result,
        };
        record.outcome(result.as_ref().err());
        let answer = result.map(|response| Answer {
            response,
            encoding,
            handle,
        });
        (
            answer,
            Kept {
                _slot,
                bytes: _bytes,
            },
        )
    }
}
