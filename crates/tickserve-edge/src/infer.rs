//! The inference pipeline, once for every front end. A front end describes
//! its request ([`Call`]) and hands over its undecoded payload
//! ([`Payload`]); it gets back the answer and what it needs to encode it
//! ([`Answer`]), or the error to word in its protocol (the server's
//! `transport::status`).
//!
//! Admission makes one value, the request's [`Envelope`]: what it holds (a
//! slot, its bytes), where it goes (its model version), what follows it
//! (`follow`'s `Followers`). Every later stage is a method on it, in the
//! order the pipeline runs:
//!
//! 1. admit (`Envelope::admit`): readiness, the followers' `begin`, a
//!    slot, the request's bytes, the one model lookup;
//! 2. route (`route`): the deciders on where it goes: a halted version's
//!    fallback, the sequence-id header, a sequence's version;
//! 3. decode: in place, or on a blocking thread past
//!    [`DECODE_IN_PLACE_BYTES`];
//! 4. prepare: the deadline, the runtime's checks, the Monte Carlo bytes;
//! 5. run: the runtime's call ([`Admitted::run`]);
//! 6. verdict (`verdict`): the decider on whether the answer goes (output
//!    guards, breaker trips);
//! 7. finish (`Envelope::finish`), the one exit: the followers told, a
//!    sequence's new state kept only with an answer that goes.
//!
//! A follower observes, or refuses before anything runs; a decider changes
//! where the request goes or whether its answer goes. A new decider (a rate
//! limit, a routing rule) is a method in `route` or `verdict`.
//!
//! [`Edge::admit_request`] is the synchronous-order half (a stream admits
//! its messages in the order they came, so one sequence's requests keep
//! their order) and [`Admitted::run`] the half that waits for the answer;
//! [`Edge::infer`] is both.

mod route;
mod verdict;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tickserve_core::sequence::KeyId;
use tickserve_core::{Error, InferResponse, durations};
use tickserve_runtime::ModelHandle;
use tickserve_runtime::gather::Round;
use tickserve_runtime::{HeldState, Prepared};

use super::Edge;
use super::admission::{HeldBytes, Slot};
use super::sequence_key;
use crate::call::{Call, RequestBytes};
use crate::follow::{Followers, Told};
use crate::payload::{Answer, DECODE_IN_PLACE_BYTES, Decoded, Payload};

/// A request from its admission to its answer: what it holds, where it
/// goes, what follows it.
pub(crate) struct Envelope {
    edge: Arc<Edge>,
    /// The version that answers it.
    handle: Arc<ModelHandle>,
    /// The halted version `handle` stands in for, as its fallback.
    halted: Option<Arc<ModelHandle>>,
    /// It named no version of a model of several: a sequence's tick goes
    /// to the version its sequence lives on.
    sticky: bool,
    /// The key it carried.
    key: Option<KeyId>,
    /// The transport's deadline.
    transport_timeout: Option<Duration>,
    /// The `tickserve-sequence-id` header.
    sequence_key: Option<String>,
    /// The front-end round its run parks in.
    round: Option<Round>,
    /// The sequence a tick continues, for its answer's header.
    sequence: Option<String>,
    /// It asked for a Monte Carlo answer (its outputs are summaries, which
    /// its guards read as such).
    monte_carlo: bool,
    followers: Followers,
    slot: Slot,
    bytes: HeldBytes,
}

/// An admitted request, validated and in its place (its sequence's turn
/// included), holding its slot and bytes until it is answered.
pub struct Admitted<E> {
    envelope: Envelope,
    /// The runtime's request.
    prepared: Prepared,
    encoding: E,
}

/// Where a request stands after `Edge::admit_now`.
// Each is moved once, straight into its match: no box for the larger.
#[allow(clippy::large_enum_variant)]
enum Admitting<P: Payload> {
    /// Admitted here, or refused.
    Done(Result<Admitted<P::Encoding>, Error>),
    /// Admitted so far; its payload decodes on a blocking thread.
    Decode(P, Envelope),
}

/// Where an admitted request stands after [`Admitted::run_now`].
// Moved once, straight into its match.
#[allow(clippy::large_enum_variant)]
enum Running<E> {
    /// Run here, on the caller's thread.
    Ran(Exit<E>),
    /// Not run yet.
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
            Admitting::Decode(payload, envelope) => Box::pin(envelope.decode(payload)).await?,
        };
        let exit = match admitted.run_now() {
            Running::Ran(exit) => exit,
            Running::Later(admitted) => Box::pin(admitted.run_to_exit()).await,
        };
        exit.sent().await.0
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
            Admitting::Decode(payload, envelope) => envelope.decode(payload).await,
        }
    }

    /// [`Edge::admit_request`] on this thread, or, for a payload that
    /// decodes on a blocking thread, the request admitted so far.
    fn admit_now<P: Payload>(self: &Arc<Self>, call: Call<'_>, payload: P) -> Admitting<P> {
        let (envelope, work) = match Envelope::admit(self, call, &payload) {
            Ok(admitted) => admitted,
            Err(refused) => return Admitting::Done(Err(refused)),
        };
        if work > DECODE_IN_PLACE_BYTES {
            return Admitting::Decode(payload, envelope);
        }
        let decoded = payload.decode(&envelope.handle);
        Admitting::Done(envelope.prepare(decoded))
    }
}

impl Envelope {
    /// The checks before decoding: readiness, the followers' `begin`, a
    /// slot, the request's bytes (and those its decoding makes), its model
    /// (the one lookup) and where it goes, its transport deadline. The
    /// envelope and the bytes decoding will work through; a refusal is
    /// recorded here.
    fn admit<P: Payload>(
        edge: &Arc<Edge>,
        mut call: Call<'_>,
        payload: &P,
    ) -> Result<(Envelope, usize), Error> {
        let routed = edge.runtime.route(call.model, call.version);
        let followers = Followers::new(edge, &call, &routed);
        let bytes = std::mem::replace(&mut call.bytes, RequestBytes::Count(0));
        let held = (|| {
            if !edge.ready() {
                return Err(Error::ShuttingDown);
            }
            followers.begin()?;
            let slot = edge.admit()?;
            let bytes = match bytes {
                RequestBytes::Held(held) => held,
                RequestBytes::Count(len) => edge.admit_bytes(len)?,
            };
            Ok((slot, bytes, routed?))
        })();
        let (slot, bytes, routed) = match held {
            Ok(held) => held,
            Err(error) => return Err(followers.refused(None, error)),
        };
        let mut envelope = Envelope {
            edge: Arc::clone(edge),
            handle: routed.handle,
            halted: None,
            sticky: routed.sticky,
            key: call.key,
            transport_timeout: None,
            sequence_key: None,
            round: call.round.take(),
            sequence: None,
            monte_carlo: false,
            followers,
            slot,
            bytes,
        };
        match envelope.take(call, payload) {
            Ok(work) => Ok((envelope, work)),
            Err(error) => Err(envelope.refuse(error)),
        }
    }

    /// Routes the request, then takes what its transport carried and holds
    /// the bytes its decoding makes: the bytes decoding works through.
    fn take<P: Payload>(&mut self, call: Call<'_>, payload: &P) -> Result<usize, Error> {
        self.route()?;
        let name = &self.handle.name;
        self.transport_timeout = call.timeout.map_err(|m| Error::request(name, m))?;
        self.sequence_key = call.sequence_key.map_err(|m| Error::request(name, m))?;
        let expansion = payload.expansion(&self.handle)?;
        self.bytes.join(self.edge.admit_bytes(expansion)?);
        Ok(payload.decode_bytes().saturating_add(expansion))
    }

    /// Decodes `payload` on a blocking thread, then prepares the request.
    async fn decode<P: Payload>(self, payload: P) -> Result<Admitted<P::Encoding>, Error> {
        let handle = Arc::clone(&self.handle);
        let decoded = tokio::task::spawn_blocking(move || payload.decode(&handle))
            .await
            .unwrap_or_else(|e| {
                Err(Error::Internal {
                    model: self.handle.name.clone(),
                    message: format!("decoding the request failed: {e}"),
                })
            });
        self.prepare(decoded)
    }

    /// The stages after decoding: the sequence's routing, the followers'
    /// `asked`, the deadline, the runtime's checks, the followers'
    /// `prepared`, the bytes a Monte Carlo run holds besides; a refusal is
    /// recorded here.
    fn prepare<E>(mut self, decoded: Result<Decoded<E>, Error>) -> Result<Admitted<E>, Error> {
        match decoded.and_then(|decoded| self.prepare_decoded(decoded)) {
            Ok((prepared, encoding)) => Ok(Admitted {
                envelope: self,
                prepared,
                encoding,
            }),
            Err(error) => Err(self.refuse(error)),
        }
    }

    #[allow(clippy::disallowed_methods)] // a request's deadline is the machine's time
    fn prepare_decoded<E>(&mut self, mut decoded: Decoded<E>) -> Result<(Prepared, E), Error> {
        self.route_sequence(&mut decoded.parameters)?;
        self.followers
            .asked(&self.handle, &decoded.id, &decoded.parameters);
        let deadline = [self.transport_timeout, decoded.parameters.timeout]
            .into_iter()
            .flatten()
            .min()
            .map(|t| durations::deadline_after(Instant::now(), t));
        let (request, encoding) = decoded.into_request(deadline);
        let mut prepared = self.handle.prepare(request)?;
        if let Some(round) = &self.round {
            prepared.gather_in(round);
        }
        self.followers.prepared(&self.handle, &mut prepared);
        // A Monte Carlo run's noisy copies and their answer are held too.
        self.bytes
            .join(self.edge.admit_bytes(prepared.held_bytes())?);
        self.sequence = prepared.sequence().map(sequence_key::text);
        self.monte_carlo = prepared.monte_carlo_seed().is_some();
        Ok((prepared, encoding))
    }

    /// Refused before it ran: recorded, and handed back.
    fn refuse(self, error: Error) -> Error {
        self.followers.refused(Some(&self.handle), error)
    }

    /// The one exit, for every request that ran: the verdict on the
    /// model's `result` (its output guards, its breaker), the followers
    /// told; the answer goes once they have it ([`Exit::sent`]), with the
    /// sequence's new state (`held`) kept only then.
    fn finish<E>(
        self,
        result: Result<InferResponse, Error>,
        held: Option<HeldState>,
        encoding: E,
    ) -> Exit<E> {
        let (result, withheld) = verdict::of(
            &self.edge.breakers,
            &self.handle,
            result,
            self.monte_carlo,
            held.as_ref(),
        );
        Exit {
            told: self.followers.finished(result, withheld),
            held,
            handle: self.handle,
            sequence: self.sequence,
            encoding,
            unsent: Unsent {
                _slot: self.slot,
                bytes: self.bytes,
            },
        }
    }
}

/// A request past its verdict, its answer on the way out.
struct Exit<E> {
    told: Told,
    held: Option<HeldState>,
    handle: Arc<ModelHandle>,
    sequence: Option<String>,
    encoding: E,
    unsent: Unsent,
}

impl<E> Exit<E> {
    /// The answer, once the followers are done with it (the journal's
    /// record written, in `refuse` mode), and the sequence's new state
    /// kept only if the answer goes (a tick answered "not answered" has not
    /// moved its sequence); and what the request held.
    async fn sent(self) -> (Result<Answer<E>, Error>, Unsent) {
        let result = self.told.outcome().await;
        if let (Ok(_), Some(held)) = (&result, self.held) {
            held.apply();
        }
        let answer = result.map(|response| Answer {
            response,
            sequence: self.sequence,
            encoding: self.encoding,
            handle: self.handle,
        });
        (answer, self.unsent)
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
        self.run_to_exit().await.sent().await
    }

    /// The run, to the exit.
    async fn run_to_exit(self) -> Exit<E> {
        let Admitted {
            envelope,
            prepared,
            encoding,
        } = self;
        match envelope.handle.run_held(prepared).await {
            Ok((response, held)) => envelope.finish(Ok(response), held, encoding),
            Err(error) => envelope.finish(Err(error), None, encoding),
        }
    }

    /// The run without waiting, where it would not wait anyway: a request
    /// the runtime runs at once ([`ModelHandle::run_now`]) and no follower
    /// waits for. Else the request comes back, for [`Admitted::run`].
    fn run_now(mut self) -> Running<E> {
        if self.envelope.followers.waits() {
            return Running::Later(self);
        }
        match self.envelope.handle.run_now(&mut self.prepared) {
            Some(result) => Running::Ran(self.envelope.finish(result, None, self.encoding)),
            None => Running::Later(self),
        }
    }
}
