//! The inference pipeline, once for every front end: readiness, admission
//! (a slot, the request's bytes), the one model lookup, decoding (large
//! payloads on a blocking thread), the parameters, the runtime call, and the
//! request's metrics. A front end describes its request ([`Call`]) and hands
//! over its undecoded payload ([`Payload`]); it gets back the answer and
//! what it needs to encode it ([`Answer`]), or the error to word in its
//! protocol (the server's `transport::status`).
//!
//! [`Edge::admit_request`] is the synchronous-order half (a stream admits
//! its messages in the order they came, so one sequence's requests keep
//! their order) and [`Admitted::run`] the half that waits for the answer;
//! [`Edge::infer`] is both.

#![allow(clippy::disallowed_methods)] // a request's deadline is the machine's time

use std::sync::Arc;
use std::time::{Duration, Instant};

use tickserve_core::sequence::KeyId;
use tickserve_core::{Error, InferResponse, InputTensor, ModelRequest, durations};
use tickserve_runtime::ModelHandle;
use tickserve_runtime::{HeldState, Prepared};

use super::Edge;
use super::admission::{HeldBytes, Slot};
use super::breaker::Breakers;
use super::params::Parameters;
use super::sequence_key;
use crate::call::{Call, RequestBytes};
use crate::follow::Followers;

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

/// An admitted request, validated and in its place (its sequence's turn
/// included), holding its slot and bytes until it is answered.
pub struct Admitted<E> {
    /// The runtime's request.
    prepared: Prepared,
    /// Everything else, for after the run.
    after: AfterRun<E>,
}

/// What an admitted request needs once it has run: where its answer goes,
/// what it records, and what it holds until then.
struct AfterRun<E> {
    handle: Arc<ModelHandle>,
    encoding: E,
    /// The metrics, the journal's record, the shadows' copy.
    followers: Followers,
    /// The sequence a tick continues, for its answer's header.
    sequence: Option<String>,
    /// Where a guard trip is counted, for a model with a breaker.
    breakers: Option<Arc<Breakers>>,
    /// The request asked for a Monte Carlo answer (its outputs are
    /// summaries, which its guards read as such).
    monte_carlo: bool,
    slot: Slot,
    bytes: HeldBytes,
}

/// Where a request stands after `Edge::admit_now`.
// Each is moved once, straight into its match: no box for the larger.
#[allow(clippy::large_enum_variant)]
enum Admitting<P: Payload> {
    /// Admitted here, or refused.
    Done(Result<Admitted<P::Encoding>, Error>),
    /// Admitted so far; its payload decodes on a blocking thread
    /// ([`Decoding::decode_elsewhere`]).
    Decode(Decoding<P>),
}

/// Where an admitted request stands after [`Admitted::run_now`].
// Moved once, straight into its match, as the Result it replaces was.
#[allow(clippy::large_enum_variant)]
pub enum Running<E> {
    /// Answered here, on the caller's thread (or refused).
    Answered(Result<Answer<E>, Error>),
    /// Not run yet: [`Admitted::run`] runs it.
    Later(Admitted<E>),
}

impl Edge {
    /// Answers one inference request: [`Edge::admit_request`], then
    /// [`Admitted::run`]. A request that needs no other thread (decoded in
    /// place, run at once, no journal) builds no future of its own.
    pub async fn infer<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        payload: P,
    ) -> Result<Answer<P::Encoding>, Error> {
        // Boxed where they wait: each is several kilobytes of state, which
        // every future holding it inline would copy again as it moves.
        let admitted = match self.admit_now(call, payload) {
            Admitting::Done(admitted) => admitted?,
            Admitting::Decode(decoding) => Box::pin(decoding.decode_elsewhere(self)).await?,
        };
        match admitted.run_now() {
            Running::Answered(answer) => answer,
            Running::Later(admitted) => Box::pin(admitted.run()).await,
        }
    }

    /// Admits, looks up, decodes and prepares one request; a refusal is
    /// recorded here.
    pub async fn admit_request<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        payload: P,
    ) -> Result<Admitted<P::Encoding>, Error> {
        match self.admit_now(call, payload) {
            Admitting::Done(admitted) => admitted,
            Admitting::Decode(decoding) => decoding.decode_elsewhere(self).await,
        }
    }

    /// [`Edge::admit_request`] on this thread, or, for a payload that
    /// decodes on a blocking thread ([`DECODE_IN_PLACE_BYTES`]), the request
    /// admitted so far, to finish with [`Decoding::decode_elsewhere`].
    fn admit_now<P: Payload>(self: &Arc<Self>, call: Call<'_>, payload: P) -> Admitting<P> {
        // The one lookup of this request's model.
        let routed = self.runtime.route(call.model, call.version);
        let mut followers = Followers::new(self, &call, &routed);
        let sticky = routed.as_ref().is_ok_and(|r| r.sticky);
        let handle = routed.map(|r| r.handle);
        let (held, work) = match self.begin(call, handle, &payload, &mut followers) {
            Ok(begun) => begun,
            Err(error) => return Admitting::Done(Err(followers.refused(error))),
        };
        let admission = Admission {
            held,
            sticky,
            followers,
        };
        if work > DECODE_IN_PLACE_BYTES {
            return Admitting::Decode(Decoding { payload, admission });
        }
        let decoded = payload.decode(&admission.held.handle);
        Admitting::Done(self.finish(admission, decoded))
    }

    /// The checks before decoding: readiness, the journal's room, a slot,
    /// the request's bytes (and those its decoding makes), its model, its
    /// transport deadline. What the request holds so far, and the bytes
    /// decoding will work through.
    fn begin<P: Payload>(
        self: &Arc<Self>,
        call: Call<'_>,
        handle: Result<Arc<ModelHandle>, Error>,
        payload: &P,
        followers: &mut Followers,
    ) -> Result<(Held, usize), Error> {
        if !self.ready() {
            return Err(Error::ShuttingDown);
        }
        followers.admit()?;
        let slot = self.admit()?;
        let bytes = match call.bytes {
            RequestBytes::Held(held) => held,
            RequestBytes::Count(len) => self.admit_bytes(len)?,
        };
        let mut handle = handle?;
        let mut halted = None;
        if let Some(halt) = self.halts.check(&handle.name, &handle.version) {
            let Some(fallback) = self.fallback(&handle) else {
                return Err(halt.refusal(&handle));
            };
            halted = Some(std::mem::replace(&mut handle, fallback));
            followers.served_by(&handle);
        }
        let transport_timeout = call
            .timeout
            .map_err(|message| Error::request(&handle.name, message))?;
        let sequence_key = call
            .sequence_key
            .map_err(|message| Error::request(&handle.name, message))?;
        let expansion = payload.expansion(&handle)?;
        let bytes = bytes.join(self.admit_bytes(expansion)?);
        let work = payload.decode_bytes().saturating_add(expansion);
        let held = Held {
            handle,
            halted,
            key: call.key,
            transport_timeout,
            sequence_key,
            slot,
            bytes,
        };
        Ok((held, work))
    }

    /// What answers a halted version's requests: its breaker's `fallback`
    /// (a label or version of the same model), when it is there, has the
    /// same signature and is not halted itself.
    fn fallback(&self, halted: &Arc<ModelHandle>) -> Option<Arc<ModelHandle>> {
        let name = halted.settings.breaker.as_ref()?.fallback.as_deref()?;
        self.runtime
            .model(&halted.name, Some(name))
            .ok()
            .filter(|f| {
                !Arc::ptr_eq(f, halted)
                    && f.signature == halted.signature
                    && self.halts.check(&f.name, &f.version).is_none()
            })
    }

    /// The admission's steps after decoding (see [`Edge::prepare`]); a
    /// refusal is recorded here.
    fn finish<E>(
        self: &Arc<Self>,
        admission: Admission,
        decoded: Result<Decoded<E>, Error>,
    ) -> Result<Admitted<E>, Error> {
        let Admission {
            held,
            sticky,
            mut followers,
        } = admission;
        let Held {
            handle,
            halted,
            key,
            transport_timeout,
            sequence_key,
            slot,
            bytes,
        } = held;
        let routing = Routing {
            key,
            transport_timeout,
            sticky,
            halted,
        };
        let prepared = decoded.and_then(|mut decoded| {
            routing_key(&handle.name, sequence_key, &mut decoded.parameters)?;
            self.prepare(handle, &routing, decoded, &mut followers)
        });
        match prepared {
            Ok(Ready {
                handle,
                prepared,
                encoding,
                monte_carlo,
            }) => Ok(Admitted {
                after: AfterRun {
                    sequence: prepared.sequence().map(sequence_key::text),
                    monte_carlo: prepared.monte_carlo_seed().is_some(),
                    breakers: handle
                        .settings
                        .breaker
                        .is_some()
                        .then(|| Arc::clone(&self.breakers)),
                    handle,
                    encoding,
                    followers,
                    slot,
                    bytes: bytes.join(monte_carlo),
                },
                prepared,
            }),
            Err(error) => Err(followers.refused(error)),
        }
    }

    /// A decoded request's version (a sequence's), deadline and the
    /// runtime's checks; the bytes a Monte Carlo run holds besides.
    fn prepare<E>(
        self: &Arc<Self>,
        handle: Arc<ModelHandle>,
        routing: &Routing,
        mut decoded: Decoded<E>,
        followers: &mut Followers,
    ) -> Result<Ready<E>, Error> {
        let mut handle = handle;
        if let Some(sequence) = decoded.parameters.sequence.as_mut() {
            sequence.owner = routing.key;
            // A sequence stays on one version, the one it lives on, when
            // the request names none (a new version arrived, or a split).
            if routing.sticky
                && let Some(sticky) = self.runtime.model_for_sequence(&handle.name, sequence)
                && !Arc::ptr_eq(&sticky, &handle)
                && sticky.signature == handle.signature
            {
                // The version its state lives on answers, or nothing does:
                // a halted one refuses the tick (no other holds its state).
                if let Some(halt) = self.halts.check(&sticky.name, &sticky.version) {
                    return Err(halt.refusal(&sticky));
                }
                handle = sticky;
                followers.served_by(&handle);
            }
            // A halted version's sequence is refused as halted, never sent to
            // the fallback that does not hold its state.
            if let Some(halted) = &routing.halted
                && let Some(table) = halted.sequences()
                && let key = table.key(&sequence.id, sequence.owner)
                && (table.holds(&key)
                    || table.lives_on(&key).as_deref() == Some(halted.version.as_str()))
                && let Some(halt) = self.halts.check(&halted.name, &halted.version)
            {
                return Err(halt.refusal(halted));
            }
        }
        followers.asked(&handle, &decoded.id, &decoded.parameters);
        let deadline = [routing.transport_timeout, decoded.parameters.timeout]
            .into_iter()
            .flatten()
            .min()
            .map(|t| durations::deadline_after(Instant::now(), t));
        let (request, encoding) = decoded.into_request(deadline);
        let mut prepared = handle.prepare(request)?;
        followers.prepared(&handle, &mut prepared);
        // A Monte Carlo run's noisy copies and their answer are held too.
        let monte_carlo = self.admit_bytes(prepared.held_bytes())?;
        Ok(Ready {
            handle,
            prepared,
            encoding,
            monte_carlo,
        })
    }
}

/// What a request's transport and lookup say about where it runs.
struct Routing {
    /// The key it carried.
    key: Option<KeyId>,
    /// The transport's deadline.
    transport_timeout: Option<Duration>,
    /// It named no version of a model of several: a sequence's tick goes
    /// to the version its sequence lives on.
    sticky: bool,
    /// The halted version whose fallback took the request.
    halted: Option<Arc<ModelHandle>>,
}

/// A request prepared: the version that runs it, the runtime's request,
/// the front end's encoding, and the bytes a Monte Carlo run holds.
struct Ready<E> {
    handle: Arc<ModelHandle>,
    prepared: Prepared,
    encoding: E,
    monte_carlo: HeldBytes,
}

/// What an admitted request holds before it is decoded: its model, its
/// slot and bytes, what its transport carried.
struct Held {
    handle: Arc<ModelHandle>,
    /// The halted version `handle` stands in for, as its fallback.
    halted: Option<Arc<ModelHandle>>,
    key: Option<KeyId>,
    transport_timeout: Option<Duration>,
    /// The `tickserve-sequence-id` header.
    sequence_key: Option<String>,
    slot: Slot,
    bytes: HeldBytes,
}

/// A request admitted up to its decoding: what it holds, where it goes,
/// and what it records.
struct Admission {
    held: Held,
    sticky: bool,
    followers: Followers,
}

/// A request whose payload decodes on a blocking thread, admitted so far
/// ([`Edge::admit_now`]).
struct Decoding<P> {
    payload: P,
    admission: Admission,
}

impl<P: Payload> Decoding<P> {
    /// Decodes on a blocking thread, then finishes the admission; a refusal
    /// is recorded here.
    async fn decode_elsewhere(self, edge: &Arc<Edge>) -> Result<Admitted<P::Encoding>, Error> {
        let Decoding { payload, admission } = self;
        let handle = Arc::clone(&admission.held.handle);
        let decoded = tokio::task::spawn_blocking(move || payload.decode(&handle))
            .await
            .unwrap_or_else(|e| {
                Err(Error::Internal {
                    model: admission.held.handle.name.clone(),
                    message: format!("decoding the request failed: {e}"),
                })
            });
        edge.finish(admission, decoded)
    }
}

/// An answered request's slot and bytes, kept until its answer is sent (a
/// stream's answers wait for the client to read them).
pub struct Unsent {
    _slot: Slot,
    bytes: HeldBytes,
}

impl Unsent {
    /// Holds the answer's `bytes` too, until it is sent.
    pub fn hold_answer(&mut self, bytes: usize) {
        self.bytes.add_anyway(bytes);
    }
}

impl<E> Admitted<E> {
    /// Waits for the answer (the sequence's turn, the queue, the run); the
    /// outcome is recorded here.
    pub async fn run(self) -> Result<Answer<E>, Error> {
        self.run_unsent().await.0
    }

    /// [`Admitted::run`], and the request's slot and bytes, for the caller
    /// to keep until the answer is sent.
    pub async fn run_unsent(self) -> (Result<Answer<E>, Error>, Unsent) {
        let Admitted { prepared, after } = self;
        match after.handle.run_held(prepared).await {
            Ok((response, held)) => after.conclude(Ok(response), held).await,
            Err(error) => after.conclude(Err(error), None).await,
        }
    }

    /// [`Admitted::run`] without waiting, where it would not wait anyway:
    /// a request the runtime runs at once ([`ModelHandle::run_now`]) and no
    /// journal records. Else the request comes back for [`Admitted::run`].
    pub fn run_now(mut self) -> Running<E> {
        if self.after.followers.waits() {
            return Running::Later(self);
        }
        match self.after.handle.run_now(&mut self.prepared) {
            Some(result) => Running::Answered(self.after.answer(result)),
            None => Running::Later(self),
        }
    }
}

impl<E> AfterRun<E> {
    /// The followers told the model's answer, the output guards applied,
    /// the journal's record written (it waits for room), a sequence tick's
    /// new state kept only if the answer goes (not when the journal refuses
    /// it: a tick answered "not answered" has not moved its sequence): the
    /// answer, and what the request held.
    async fn conclude(
        mut self,
        result: Result<InferResponse, Error>,
        held: Option<HeldState>,
    ) -> (Result<Answer<E>, Error>, Unsent) {
        self.followers.ran(&result);
        let (result, withheld) = guard(
            &self.handle,
            result,
            (self.breakers.as_deref(), self.monte_carlo),
            held.as_ref(),
        );
        let AfterRun {
            handle,
            encoding,
            followers,
            slot,
            bytes,
            sequence,
            ..
        } = self;
        let result = followers.answered(result, withheld.as_ref()).await;
        if let (Ok(_), Some(held)) = (&result, held) {
            held.apply();
        }
        (
            into_answer(result, (handle, sequence), encoding),
            Unsent { _slot: slot, bytes },
        )
    }

    /// [`AfterRun::conclude`] for a request no follower waits for, answered
    /// before its slot and bytes go.
    fn answer(mut self, result: Result<InferResponse, Error>) -> Result<Answer<E>, Error> {
        self.followers.ran(&result);
        let (result, _) = guard(
            &self.handle,
            result,
            (self.breakers.as_deref(), self.monte_carlo),
            None,
        );
        let result = self.followers.answered_now(result);
        into_answer(result, (self.handle, self.sequence), self.encoding)
    }
}

/// A run's outcome with the model's output guards applied: an answer that
/// breaks one becomes [`Error::GuardTripped`] (counted and logged), and the
/// answer it withheld comes back beside it, for the journal; the trip counts
/// toward the model's breaker, if it has one. A sequence's tick that trips
/// leaves its state as it was ([`AfterRun::conclude`] keeps the new state
/// only with an answer).
fn guard(
    handle: &Arc<ModelHandle>,
    result: Result<InferResponse, Error>,
    (breakers, monte_carlo): (Option<&Breakers>, bool),
    held: Option<&HeldState>,
) -> (Result<InferResponse, Error>, Option<InferResponse>) {
    let guards = &handle.settings.guards;
    let trip = match &result {
        Ok(response) if !guards.is_empty() => guards.check(response, monte_carlo, |output| {
            held.and_then(|h| h.previous(output))
        }),
        _ => None,
    };
    let (Some(trip), Ok(response)) = (trip, &result) else {
        return (result, None);
    };
    metrics::counter!(tickserve_core::metrics::GUARD_TRIPS,
        "model" => handle.name.clone(), "version" => handle.version.clone(),
        "output" => trip.output.clone(), "guard" => trip.guard)
    .increment(1);
    let error = Error::GuardTripped(Box::new(tickserve_core::error::Withheld {
        model: handle.name.clone(),
        version: handle.version.clone(),
        output: trip.output,
        tensor: trip.tensor,
        bound: trip.bound,
        position: trip.position,
        value: trip.value.to_string(),
    }));
    tracing::warn!(model = %handle.name, version = %handle.version, "{error}");
    if let Some(breakers) = breakers {
        breakers.tripped(handle);
    }
    let withheld = response.clone();
    (Err(error), Some(withheld))
}

/// A run's outcome as the front end's answer (from `handle`, for
/// `sequence`).
fn into_answer<E>(
    result: Result<InferResponse, Error>,
    (handle, sequence): (Arc<ModelHandle>, Option<String>),
    encoding: E,
) -> Result<Answer<E>, Error> {
    result.map(|response| Answer {
        response,
        sequence,
        encoding,
        handle,
    })
}

/// The `tickserve-sequence-id` header `key` against the body's parameters:
/// both naming a sequence must agree; the header alone names the sequence
/// the request continues.
fn routing_key(
    model: &str,
    key: Option<String>,
    parameters: &mut super::params::Parameters,
) -> Result<(), Error> {
    let Some(key) = key else {
        return Ok(());
    };
    match &parameters.sequence {
        Some(named) if !sequence_key::agrees(&key, &named.id) => Err(Error::request(
            model,
            format!(
                "the header {} ({}) and the parameter sequence_id ({}) name different sequences",
                sequence_key::NAME,
                tickserve_core::text::quote(&key),
                named.id
            ),
        )),
        Some(_) => Ok(()),
        None => {
            parameters.sequence = Some(tickserve_core::sequence::SequenceControl {
                id: sequence_key::id(model, &key)?,
                start: false,
                end: false,
                owner: None,
            });
            Ok(())
        }
    }
}
