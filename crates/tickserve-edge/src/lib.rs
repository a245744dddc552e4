//! The edge: the one request path every front end calls.
//!
//! A front end turns its bytes into the edge's request ([`Call`]) and the
//! edge's answer into its bytes; nothing else. Everything between is here,
//! once, and knows no wire (no HTTP, gRPC or shared-memory type: the
//! server's `transport` holds what reads them):
//!
//! - `call`: a request as its front end describes it, before decoding
//!   ([`Call`]);
//! - `admission`: a slot and the request's bytes in the server-wide budget;
//! - [`params`]: the one parameter reader, and the parameters' names;
//! - `payload`: what a front end hands the pipeline and gets back
//!   ([`Payload`], [`Decoded`], [`Answer`]);
//! - `infer`: the pipeline, one envelope from admission to the one exit:
//!   admit, route (the deciders on where a request goes), decode, prepare,
//!   run, verdict (the decider on whether its answer goes), finish;
//! - `follow`: what follows a request at the pipeline's four points (its
//!   metrics, the journal's record, the shadows' copy, the split's count);
//! - `journal`: a journaled request's record, handed to the journal when
//!   it is answered;
//! - `shadow`: a request's copy for its version's shadows, sent once it is
//!   answered;
//! - `halts` and `breaker`: the kill switch ([`Halts`]) and the breakers
//!   that halt a version;
//! - [`sequence_key`]: what the sequence-id header names;
//! - [`observe`]: the metrics every request records.
//!
//! The modules are private but for three namespaces of names ([`params`],
//! [`sequence_key`], [`observe`]): what a front end uses is re-exported
//! here, and nothing else is reachable (`unreachable_pub`).

#![warn(unreachable_pub)]

mod admission;
mod breaker;
mod call;
mod follow;
mod halts;
mod infer;
mod journal;
pub mod observe;
pub mod params;
mod payload;
pub mod sequence_key;
mod shadow;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::sync::Arc;

use tickserve_core::config::{ModelControlMode, ServerConfig};
use tickserve_journal::Journal;
use tickserve_runtime::Runtime;

pub use admission::{BodyBytes, ConnectionBudget, HeldBytes};
pub use breaker::Breakers;
pub use call::{Call, RequestBytes};
pub use halts::{Halt, Halts, MAX_REASON_BYTES, RiskAccess, RiskAsk, version_of};
pub use infer::{Admitted, Unsent};
pub use payload::{Answer, DECODE_IN_PLACE_BYTES, Decoded, Payload};

/// The most inputs, and the most outputs, one request may name (every JSON
/// front end).
pub const MAX_TENSORS: usize = 64;

/// How long a sequence-state operation (read, write, drop; either port) may
/// wait for its sequence's turn.
pub const STATE_TURN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// When a state-API call stops waiting for its sequence's turn: now and
/// [`STATE_TURN_TIMEOUT`].
#[allow(clippy::disallowed_methods)] // a state call's deadline is the machine's time
pub fn state_turn_deadline() -> Option<std::time::Instant> {
    Some(tickserve_core::durations::deadline_after(
        std::time::Instant::now(),
        STATE_TURN_TIMEOUT,
    ))
}

/// What every front end shares: the models, readiness and the server-wide
/// limits.
pub struct Edge {
    /// The loaded models.
    pub runtime: Runtime,
    /// True between load and shutdown: readiness endpoints report it.
    accepting: AtomicBool,
    /// Largest request body or message, in bytes (`server.max_request_bytes`).
    pub max_request_bytes: usize,
    /// Whether v2 answers carry their timing headers (`server.timing_headers`).
    pub timing_headers: bool,
    /// Inference requests being answered now, every front end together.
    inflight: AtomicUsize,
    /// The most requests in flight (0: no limit).
    max_inflight: usize,
    /// `server.strict_readiness`.
    strict_readiness: bool,
    /// Bytes of inference requests held now, every front end together.
    inflight_bytes: AtomicUsize,
    /// `server.max_inflight_bytes`.
    max_inflight_bytes: usize,
    /// `security.model_control_mode`: whether clients may load and unload.
    pub model_control_mode: ModelControlMode,
    /// Front-end threads down now (after a panic, until they restart).
    threads_down: AtomicUsize,
    /// The prediction journal, when `[journal]` is on.
    pub journal: Option<Arc<Journal>>,
    /// Halted versions (the kill switch and the breakers).
    pub halts: Arc<halts::Halts>,
    /// The breakers' trip counts; they halt through `halts`.
    pub breakers: Arc<breaker::Breakers>,
    /// Who may halt and resume.
    pub risk: halts::RiskAccess,
    /// What breakers read their windows on.
    clock: tickserve_core::Clock,
}

impl Edge {
    /// The edge over `runtime`, with `config`'s limits, accepting requests.
    pub fn new(runtime: Runtime, config: &ServerConfig) -> Edge {
        let halts = Arc::new(halts::Halts::in_memory());
        Edge {
            runtime,
            accepting: AtomicBool::new(true),
            max_request_bytes: config.server.max_request_bytes,
            timing_headers: config.server.timing_headers,
            inflight: AtomicUsize::new(0),
            max_inflight: config.server.max_inflight,
            strict_readiness: config.server.strict_readiness,
            inflight_bytes: AtomicUsize::new(0),
            max_inflight_bytes: config.server.max_inflight_bytes,
            model_control_mode: config.security.model_control_mode,
            threads_down: AtomicUsize::new(0),
            journal: None,
            halts: Arc::clone(&halts),
            breakers: Arc::new(breaker::Breakers::new(halts, config.clock.clone())),
            risk: halts::RiskAccess::of(config),
            clock: config.clock.clone(),
        }
    }

    /// Whether `handle`'s version serves: the server is ready, the version
    /// is, and it is not halted.
    pub fn model_ready(&self, handle: &tickserve_runtime::ModelHandle) -> bool {
        self.ready()
            && handle.is_ready()
            && self.halts.check(&handle.name, &handle.version).is_none()
    }

    /// The edge, with `halts` (read from `[risk] halts_file`), journaled in
    /// the edge's journal (call after [`Edge::with_journal`]).
    pub fn with_halts(mut self, halts: halts::Halts) -> Edge {
        self.halts = Arc::new(halts.with_journal(self.journal.clone()));
        self.breakers = Arc::new(breaker::Breakers::new(
            Arc::clone(&self.halts),
            self.clock.clone(),
        ));
        self
    }

    /// The edge, recording predictions in `journal`.
    pub fn with_journal(mut self, journal: Option<Arc<Journal>>) -> Edge {
        self.journal = journal;
        self
    }

    /// A front-end thread went down (it panicked): the server reports not
    /// ready until [`Edge::thread_up`].
    pub fn thread_down(&self) {
        self.threads_down.fetch_add(1, Ordering::AcqRel);
    }

    /// A front-end thread that went down serves again.
    pub fn thread_up(&self) {
        let _ = self
            .threads_down
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// A request refused before the request path took it (a body over the
    /// limit, a wrong verb, a message that cannot be read, no model named):
    /// counted once, as every request is, under its model where there is
    /// one (`_unknown` otherwise); handed back for the front end to answer.
    pub fn refuse(
        &self,
        protocol: crate::observe::Protocol,
        model: &str,
        started: std::time::Instant,
        error: tickserve_core::Error,
    ) -> tickserve_core::Error {
        let label = self.runtime.model_label(model);
        crate::observe::record_request(protocol, &label, started, Some(&error));
        error
    }

    /// The version of `model` asked for, which must keep sequences, and
    /// its sequences (the state API's lookup, over HTTP and gRPC alike).
    pub fn stateful(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<
        (
            std::sync::Arc<tickserve_runtime::ModelHandle>,
            std::sync::Arc<tickserve_runtime::Sequences>,
        ),
        tickserve_core::Error,
    > {
        let handle = self.runtime.model(model, version)?;
        let sequences = handle.sequences().cloned().ok_or_else(|| {
            tickserve_core::Error::request(
                &handle.name,
                "the model keeps no sequence state (no [[sequence.state]] in its model.toml)",
            )
        })?;
        Ok((handle, sequences))
    }

    /// Accepting requests (between load and shutdown).
    pub fn ready(&self) -> bool {
        self.accepting.load(Ordering::Relaxed)
    }

    /// Stops accepting requests: readiness turns false and new inference
    /// requests are answered UNAVAILABLE.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// What the server readiness endpoints answer: accepting requests, every
    /// front-end thread up and, with `server.strict_readiness`, every model
    /// serving.
    pub fn server_ready(&self) -> bool {
        self.ready()
            && self.threads_down.load(Ordering::Acquire) == 0
            && (!self.strict_readiness || self.runtime.all_ready())
    }
}
