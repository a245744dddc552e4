//! What follows a request through the pipeline, each feature a field of
//! [`Followers`]: its metrics, the journal's record, its shadows' copy, the
//! canary split's count. A follower observes the request, or refuses it
//! before anything runs; it never changes where the request goes or what
//! its answer says (the deciders do: `infer`'s `route` and `verdict`). The
//! pipeline ([`crate::infer`]) calls four points, in this order, and names
//! no feature:
//!
//! 1. [`Followers::begin`]: before the request costs anything, a feature
//!    may refuse it (the journal in `refuse` mode, when it cannot keep a
//!    record);
//! 2. [`Followers::asked`]: decoded, on the version that will answer it;
//! 3. [`Followers::prepared`]: validated and in its place;
//! 4. [`Followers::finished`]: the verdict on the model's answer (or
//!    [`Followers::refused`], for a request that never ran), once.
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
use crate::journal::{Pending, Written};
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
    pub(crate) fn begin(&self) -> Result<(), Error> {
        match &self.journal {
            Some(pending) => pending.admit(),
            None => Ok(()),
        }
    }

    /// Decoded, on `handle`, the version that answers it (a halted
    /// version's fallback, a sequence's version, or the one looked up): its
    /// id and parameters.
    pub(crate) fn asked(&mut self, handle: &Arc<ModelHandle>, id: &str, parameters: &Parameters) {
        if self.drawn {
            handle.count_routed();
        }
        if let Some(pending) = self.journal.as_mut() {
            pending.served_by(handle);
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

    /// Whether the outcome may have to wait for a feature (the journal's
    /// record, in `refuse` mode): such a request is never run on the
    /// caller's thread without a future.
    pub(crate) fn waits(&self) -> bool {
        self.journal.is_some()
    }

    /// The verdict on a run: `result`, and the model's answer a guard
    /// `withheld` (`result` is then its error). The shadows get their copy
    /// of the request with the model's answer, the journal its record; the
    /// metrics are recorded once the outcome is final.
    pub(crate) fn finished(
        mut self,
        result: Result<InferResponse, Error>,
        withheld: Option<InferResponse>,
    ) -> Told {
        let answered = result.as_ref().ok().or(withheld.as_ref());
        if let (Some(mirror), Some(response)) = (self.mirror.take(), answered) {
            mirror.send(response);
        }
        let written = self
            .journal
            .take()
            .and_then(|pending| (*pending).answered(&result, withheld.as_ref()));
        match written {
            None => {
                self.metrics.outcome(result.as_ref().err());
                Told::Final(result)
            }
            Some(written) => Told::Writing(Writing {
                written,
                metrics: self.metrics,
                result,
            }),
        }
    }

    /// Refused before it ran, on `handle` where it had come that far: the
    /// metrics recorded, the journal's record handed over (none for a
    /// request the journal itself refused).
    pub(crate) fn refused(self, handle: Option<&Arc<ModelHandle>>, error: Error) -> Error {
        self.metrics.outcome(Some(&error));
        if let Some(mut pending) = self.journal
            && !matches!(error, Error::JournalUnavailable { .. })
        {
            if let Some(handle) = handle {
                pending.served_by(handle);
            }
            (*pending).refused(&error);
        }
        error
    }
}

/// A run's outcome once the followers have it.
pub(crate) enum Told {
    /// Final: nothing waits.
    Final(Result<InferResponse, Error>),
    /// Final once the journal has written its record.
    Writing(Writing),
}

/// An outcome waiting for its journal record (`refuse` mode).
pub(crate) struct Writing {
    written: Written,
    metrics: Metrics,
    result: Result<InferResponse, Error>,
}

impl Told {
    /// The outcome, once final: an answer whose record could not be written
    /// becomes an error; the metrics recorded.
    pub(crate) async fn outcome(self) -> Result<InferResponse, Error> {
        match self {
            Told::Final(result) => result,
            Told::Writing(Writing {
                written,
                metrics,
                result,
            }) => {
                let result = written.confirm(result).await;
                metrics.outcome(result.as_ref().err());
                result
            }
        }
    }
}
