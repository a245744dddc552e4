//! What follows a request through the pipeline, each feature a field of
//! [`Followers`]: its metrics, the journal's record, its shadows' copy, the
//! canary split's count. The pipeline ([`crate::infer`]) calls their points
//! in a fixed order and names no feature:
//!
//! 1. [`Followers::admit`]: a feature that may refuse before the request
//!    costs anything (the journal in `refuse` mode, when it cannot keep a
//!    record);
//! 2. [`Followers::served_by`]: the request goes to another version than it
//!    was looked up as (a halted version's fallback, a sequence's version);
//! 3. [`Followers::asked`]: decoded, on its final version;
//! 4. [`Followers::prepared`]: validated and in its place;
//! 5. [`Followers::ran`]: the model answered (before the output guards);
//! 6. [`Followers::answered`] or [`Followers::refused`]: the outcome, once.
//!
//! Static dispatch, one struct per request: a request that no feature
//! follows (no journal, no shadows, no split) allocates nothing here. A new
//! feature is a field and a line at each point it needs.

use std::sync::Arc;
use std::time::Instant;

use tickserve_core::{Error, InferResponse};
use tickserve_runtime::{ModelHandle, Prepared, Routed, ShadowPlan};

use crate::Edge;
use crate::call::Call;
use crate::journal::Pending;
use crate::observe::{self, Protocol};
use crate::params::Parameters;
use crate::shadow::Mirror;

/// The features that follow one request.
pub(crate) struct Followers {
    /// Every request's metrics.
    metrics: Metrics,
    /// A journaled model's record, filled in as the request goes. Boxed,
    /// as the mirror: most requests have neither, and an admitted request
    /// moves several times on its way to the run.
    journal: Option<Box<Pending>>,
    /// The version's shadows, until the request is prepared.
    shadows: Option<Arc<Vec<ShadowPlan>>>,
    /// The copy the shadows get, once prepared.
    mirror: Option<Box<Mirror>>,
    /// The canary split drew the version (the request named none).
    drawn: bool,
}

/// What a request's metrics are recorded under.
struct Metrics {
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

impl Metrics {
    fn outcome(&self, error: Option<&Error>) {
        let label = match &self.label {
            Label::Model(handle) => handle.name.as_str(),
            Label::Other(label) => label.as_str(),
        };
        observe::record_request(self.protocol, label, self.started, error);
    }
}

impl Followers {
    /// The followers of `call`, looked up as `routed`.
    pub(crate) fn new(edge: &Edge, call: &Call<'_>, routed: &Result<Routed, Error>) -> Followers {
        let (label, journal, shadows, drawn) = match routed {
            Ok(r) => (
                Label::Model(Arc::clone(&r.handle)),
                edge.journal
                    .as_ref()
                    .filter(|journal| journal.wants(&r.handle))
                    .map(|journal| {
                        Box::new(Pending::new(
                            journal,
                            &r.handle,
                            call.protocol.label(),
                            call.started,
                            call.key,
                            call.traceparent.clone(),
                        ))
                    }),
                r.shadows.clone(),
                r.drawn,
            ),
            Err(_) => (
                Label::Other(edge.runtime.model_label(call.model)),
                None,
                None,
                false,
            ),
        };
        Followers {
            metrics: Metrics {
                protocol: call.protocol,
                label,
                started: call.started,
            },
            journal,
            shadows,
            mirror: None,
            drawn,
        }
    }

    /// Whether a feature refuses the request before it costs anything.
    pub(crate) fn admit(&self) -> Result<(), Error> {
        match &self.journal {
            Some(pending) => pending.admit(),
            None => Ok(()),
        }
    }

    /// The request goes to `handle` instead of the version it was looked up as.
    pub(crate) fn served_by(&mut self, handle: &Arc<ModelHandle>) {
        if let Some(pending) = self.journal.as_mut() {
            pending.served_by(handle);
        }
    }

    /// Decoded, on its final version `handle`: its id and parameters.
    pub(crate) fn asked(&mut self, handle: &ModelHandle, id: &str, parameters: &Parameters) {
        if self.drawn {
            handle.count_routed();
        }
        if let Some(pending) = self.journal.as_mut() {
            pending.asked(id, parameters);
        }
    }

    /// Validated and in its place on `handle`.
    pub(crate) fn prepared(&mut self, handle: &ModelHandle, prepared: &mut Prepared) {
        if let Some(pending) = self.journal.as_mut() {
            pending.prepared(prepared);
        }
        self.mirror = self
            .shadows
            .take()
            .and_then(|plans| Mirror::of(plans, handle, prepared, self.journal.as_deref()))
            .map(Box::new);
    }

    /// Whether the answer must wait for a feature ([`Followers::answered`]
    /// awaits the journal's record in `refuse` mode): such a request is
    /// never answered on the caller's thread without a future.
    pub(crate) fn waits(&self) -> bool {
        self.journal.is_some()
    }

    /// The model answered `result` (before the output guards): the shadows
    /// get their copy of the request, to compare with it.
    pub(crate) fn ran(&mut self, result: &Result<InferResponse, Error>) {
        if let (Some(mirror), Ok(response)) = (self.mirror.take(), result) {
            mirror.send(response);
        }
    }

    /// The outcome: the journal's record handed over (in `refuse` mode, an
    /// answer whose record could not be written becomes an error), the
    /// metrics recorded. `withheld` is the answer a guard withheld (`result`
    /// is then its error).
    pub(crate) async fn answered(
        mut self,
        result: Result<InferResponse, Error>,
        withheld: Option<&InferResponse>,
    ) -> Result<InferResponse, Error> {
        let result = match self.journal.take() {
            Some(pending) => (*pending).answered(result, withheld).await,
            None => result,
        };
        self.metrics.outcome(result.as_ref().err());
        result
    }

    /// [`Followers::answered`] for a request no feature waits for
    /// ([`Followers::waits`] is false).
    pub(crate) fn answered_now(
        self,
        result: Result<InferResponse, Error>,
    ) -> Result<InferResponse, Error> {
        self.metrics.outcome(result.as_ref().err());
        result
    }

    /// Refused before it ran: the metrics recorded, the journal's record
    /// handed over (none for a request the journal itself refused).
    pub(crate) fn refused(self, error: Error) -> Error {
        self.metrics.outcome(Some(&error));
        if let Some(pending) = self.journal
            && !matches!(error, Error::JournalUnavailable { .. })
        {
            (*pending).refused(&error);
        }
        error
    }
}
