//! The edge's half of the prediction journal: a request of a journaled
//! model collects its record as it goes (what came, what it asked, what it
//! got) and hands it to the journal when answered; in `refuse` mode the
//! answer waits until the record is written.
//!
//! The record's `received` is the wall clock (`CLOCK_REALTIME`) at the
//! moment the front end took the request (its monotonic `started`, moved
//! onto the wall clock once, when the edge admits it); `answered` is the
//! wall clock when the runtime's answer (or the error) reached the edge,
//! before the front end encodes it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tickserve_core::monte_carlo::Summary;
use tickserve_core::sequence::KeyId;
use tickserve_core::{Error, InferResponse};
use tickserve_journal::{Journal, MonteCarlo, Outputs, Record, RecordedParameters, Tensor};
use tickserve_runtime::{ModelHandle, Prepared};

use super::params;

/// A record handed over in `refuse` mode, until the journal has written it.
pub(crate) struct Written {
    written: tokio::sync::oneshot::Receiver<bool>,
    handle: Arc<ModelHandle>,
}

impl Written {
    /// `result` once the record is written; an answer whose record could
    /// not be written becomes an error.
    pub(crate) async fn confirm(
        self,
        result: Result<InferResponse, Error>,
    ) -> Result<InferResponse, Error> {
        match self.written.await {
            Ok(true) => result,
            _ => {
                metrics::counter!(tickserve_core::metrics::JOURNAL_REFUSED,
                    "reason" => "unwritten")
                .increment(1);
                Err(Error::JournalUnavailable {
                    model: self.handle.name.clone(),
                    reason: "its record could not be written".to_string(),
                })
            }
        }
    }
}

/// `bytes` in lower-case hex, in one allocation.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A journaled request's record, filled in as the request goes.
pub(crate) struct Pending {
    journal: Arc<Journal>,
    record: Record,
}

impl Pending {
    /// The record of a request to `handle` that came over `protocol` at
    /// `started`, with `key` and `traceparent`.
    #[allow(clippy::disallowed_methods)] // a record's receive and answer times are the wall clock
    pub(crate) fn new(
        journal: &Arc<Journal>,
        handle: &Arc<ModelHandle>,
        protocol: &'static str,
        started: Instant,
        key: Option<KeyId>,
        traceparent: Option<String>,
    ) -> Pending {
        let now = SystemTime::now();
        let received = now.checked_sub(started.elapsed()).unwrap_or(now);
        Pending {
            journal: Arc::clone(journal),
            record: Record {
                handle: Arc::clone(handle),
                received,
                answered: received,
                queue: Duration::ZERO,
                compute: Duration::ZERO,
                protocol,
                id: String::new(),
                traceparent,
                key: key.map(|k| hex(&k.0)),
                bucket: None,
                status: "ok",
                error: None,
                parameters: RecordedParameters::default(),
                inputs: None,
                outputs: Outputs::Model(Vec::new()),
                state: Vec::new(),
                window_ticks: None,
            },
        }
    }

    /// The request goes to `handle` instead of the version it was looked up
    /// as (a split model's sequence); the record names it.
    pub(crate) fn served_by(&mut self, handle: &Arc<ModelHandle>) {
        self.record.handle = Arc::clone(handle);
    }

    /// The record of this request's copy for `shadow` (protocol `shadow`,
    /// the same id, parameters and inputs), if the journal takes the shadow's
    /// model; call after [`Pending::prepared`].
    pub(crate) fn for_shadow(&self, shadow: &Arc<ModelHandle>) -> Option<Pending> {
        if !self.journal.wants(shadow) {
            return None;
        }
        let r = &self.record;
        Some(Pending {
            journal: Arc::clone(&self.journal),
            record: Record {
                handle: Arc::clone(shadow),
                received: r.received,
                answered: r.received,
                queue: Duration::ZERO,
                compute: Duration::ZERO,
                protocol: "shadow",
                id: r.id.clone(),
                traceparent: r.traceparent.clone(),
                key: r.key.clone(),
                bucket: None,
                status: "ok",
                error: None,
                parameters: r.parameters.clone(),
                inputs: r.inputs.clone(),
                outputs: Outputs::Model(Vec::new()),
                state: Vec::new(),
                window_ticks: None,
            },
        })
    }

    /// In `refuse` mode, whether the request may run (see [`Journal::admit`]).
    pub(crate) fn admit(&self) -> Result<(), Error> {
        self.journal.admit(&self.record.handle.name)
    }

    /// What the request asked: its id and parameters.
    pub(crate) fn asked(&mut self, id: &str, parameters: &params::Parameters) {
        self.record.id = id.to_string();
        self.record.parameters = RecordedParameters {
            priority: parameters.priority,
            sequence: parameters
                .sequence
                .as_ref()
                .map(|s| (s.id.to_string(), s.start, s.end)),
            monte_carlo: parameters.monte_carlo.as_ref().map(|mc| MonteCarlo {
                samples: u32::try_from(mc.samples).unwrap_or(u32::MAX),
                sigma: mc.sigma,
                seed: mc.seed.unwrap_or(0),
                output: match &mc.summary {
                    Summary::Moments => "moments",
                    Summary::Quantiles(_) => "quantiles",
                    Summary::Samples => "samples",
                }
                .to_string(),
                quantiles: match &mc.summary {
                    Summary::Quantiles(q) => Some(
                        q.iter()
                            .map(|q| q.to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                    ),
                    _ => None,
                },
            }),
        };
    }

    /// The validated request: its inputs, the seed its Monte Carlo noise is
    /// drawn from, and, for a stateful model, a run that reports the state it
    /// read.
    ///
    /// The inputs are copied into one buffer of their own: shared, they would
    /// be slices of the front end's receive buffer (an HTTP body, an HTTP/2
    /// frame), which would then live until the writer thread wrote the record
    /// and be freed there, so that every request's connection took a fresh
    /// buffer. A copy of the rows is cheaper than that churn.
    pub(crate) fn prepared(&mut self, prepared: &mut Prepared) {
        let (inputs, rows) = prepared.inputs();
        let total = inputs.iter().map(|i| i.len()).sum();
        let mut owned = bytes::BytesMut::with_capacity(total);
        for input in inputs {
            owned.extend_from_slice(input);
        }
        let mut owned = owned.freeze();
        let inputs = inputs.iter().map(|i| owned.split_to(i.len())).collect();
        self.record.inputs = Some((inputs, rows));
        if let (Some(mc), Some(seed)) = (
            self.record.parameters.monte_carlo.as_mut(),
            prepared.monte_carlo_seed(),
        ) {
            mc.seed = seed;
        }
        if self.record.handle.sequences().is_some() {
            prepared.keep_state();
        }
    }

    /// Hands the record of a request refused before it ran to the journal.
    pub(crate) fn refused(mut self, error: &Error) {
        self.failed(error);
        let _ = self.journal.submit(self.record);
    }

    #[allow(clippy::disallowed_methods)] // a record's receive and answer times are the wall clock
    fn failed(&mut self, error: &Error) {
        self.record.answered = SystemTime::now();
        self.record.status = error.kind().as_str();
        self.record.error = Some(error.client_message());
    }

    /// Hands the record of an answered request to the journal. `withheld`
    /// is the answer a guard withheld (`result` is then its error): the
    /// record holds what the model said, and why it went no further. In
    /// `refuse` mode the answer must wait for the record: [`Written`] says
    /// when it is written.
    pub(crate) fn answered(
        mut self,
        result: &Result<InferResponse, Error>,
        withheld: Option<&InferResponse>,
    ) -> Option<Written> {
        match (result, withheld) {
            (Ok(response), _) => self.took(response),
            (Err(error), Some(response)) => {
                self.took(response);
                self.failed(error);
            }
            (Err(error), None) => self.failed(error),
        }
        let handle = Arc::clone(&self.record.handle);
        self.journal
            .submit(self.record)
            .map(|written| Written { written, handle })
    }

    /// What the model answered, into the record.
    #[allow(clippy::disallowed_methods)] // a record's receive and answer times are the wall clock
    fn took(&mut self, response: &InferResponse) {
        self.record.answered = SystemTime::now();
        self.record.queue = response.timing.queue;
        self.record.compute = response.timing.compute;
        self.record.bucket = u32::try_from(response.bucket).ok();
        self.record.outputs = if self.record.parameters.monte_carlo.is_some() {
            Outputs::MonteCarlo(
                response
                    .outputs
                    .iter()
                    .map(|o| Tensor {
                        name: o.name.to_string(),
                        datatype: o.datatype,
                        shape: o.shape.clone(),
                        data: o.data.clone(),
                    })
                    .collect(),
            )
        } else {
            // The model's own outputs, by their place in its
            // signature: the data is shared, nothing else is copied.
            let signature = &self.record.handle.signature.outputs;
            Outputs::Model(
                response
                    .outputs
                    .iter()
                    .filter_map(|o| {
                        let index = signature.iter().position(|s| s.name == o.name)?;
                        Some((index, o.data.clone()))
                    })
                    .collect(),
            )
        };
        self.record.state = response.state_read.clone();
        self.record.window_ticks = response
            .window_ticks
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX));
    }
}

/// A halt or resume of `handle`'s version as a record of its stream, over
/// `protocol` (`http`, `grpc`, `breaker`): status `status` (`halted`,
/// `resumed`), `words` as its error, no inputs or outputs. Not waited for.
#[allow(clippy::disallowed_methods)] // a record's receive time and latency are the machine's time
pub(crate) fn event(
    journal: &Arc<Journal>,
    handle: &Arc<ModelHandle>,
    protocol: &'static str,
    status: &'static str,
    words: String,
) {
    let mut pending = Pending::new(journal, handle, protocol, Instant::now(), None, None);
    pending.record.status = status;
    pending.record.error = Some(words);
    let _ = pending.journal.submit(pending.record);
}
