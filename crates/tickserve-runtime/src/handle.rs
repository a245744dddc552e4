//! The handle a request is served through: one ready model version, what it
//! is ([`Loaded`]) and its replicas, each a membership in a family on one
//! device.
//!
//! The edge looks a model up once per request ([`crate::Runtime::model`],
//! or the split's and fallback's routing) and calls [`ModelHandle::prepare`]
//! (validation against the signature, the Monte Carlo plan, the priority
//! level, a stateful model's turn in its sequence). Then one of two ways:
//! [`ModelHandle::run_now`] answers a plain request on the caller's thread
//! when an executor of its replica is idle and nothing is queued; otherwise
//! [`ModelHandle::run_held`] (or [`ModelHandle::run`], which keeps the new
//! state at once) waits for the sequence's turn, runs the request on the
//! replica with the shortest queue (its family's [`Family::submit`], or
//! parked with the other requests of the front-end round it carries:
//! [`crate::gather`]), expands and summarizes Monte Carlo around the run,
//! and hands back a sequence's new state ([`HeldState`]) for the caller to
//! keep once the answer may go.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tickserve_core::durations;
use tickserve_core::priority::TimeoutAction;
use tickserve_core::sequence::{SequenceControl, Warmup};
use tickserve_core::validate::{NanPolicy, ValidRequest, first_non_finite, validate_for};
use tickserve_core::{Clock, Device, Error, InferResponse, ModelRequest, Name, Signature, Timing};

use crate::admission::ModelQueue;
use crate::family::Family;
use crate::gather::{Parking, Round};
use crate::job::Submission;
use crate::member::Member;
use crate::monte_carlo::{self, Plan};
use crate::sequences::{Entry, HeldState, Purpose, Sequences, take_state, tick_row_of, with_state};
use crate::settings::ModelSettings;
use crate::stats::ModelStats;

/// Where one replica of a model version runs, and on which engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// Its device.
    pub device: Device,
    /// Its engine's Triton platform name (`onnxruntime_onnx`).
    pub platform: &'static str,
    /// Its engine's Triton backend name (`onnxruntime`).
    pub backend: &'static str,
}

/// What a model version is, once loaded.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The full signature.
    pub signature: Signature,
    /// The effective settings.
    pub settings: ModelSettings,
    /// The family key: equal for models that differ only in weight values.
    pub family_key: String,
    /// True when it shares its family's compiled graph (weights bound per run).
    pub shares_graph: bool,
    /// Where its replicas run (`cpu`, `gpu:0,gpu:1`).
    pub device: String,
    /// Each replica's device and engine, in placement order.
    pub placements: Vec<ReplicaInfo>,
    /// Why a replica whose preference allowed the compiled CPU engine runs
    /// on ONNX Runtime (the first such replica's reason).
    pub engine_note: Option<String>,
    /// For a model whose `gpu_mode` is `resident` or `auto`: whether its
    /// ticks run resident on a GPU, and if not why (the first replica's).
    pub gpu_note: Option<String>,
    /// Time from reading its file to ready (a family's first member includes
    /// the compilation; a later member only its weights).
    pub load_time: Duration,
    /// The model's statistics, shared with the front ends.
    pub stats: Arc<ModelStats>,
    /// Its rows waiting in the queues.
    pub queue: Arc<ModelQueue>,
    /// The SHA-256 of the `model.onnx` it was loaded from, in hex: which
    /// weights answered (the journal records it).
    pub digest: String,
}

/// A model version that is ready to serve.
#[derive(Debug)]
pub struct ModelHandle {
    /// The model's name.
    pub name: String,
    /// The version, as the protocol spells it.
    pub version: String,
    /// What it is: signature, settings, family, device, load time,
    /// statistics (also reached through `Deref`).
    pub loaded: Loaded,
    /// Its replicas, one per placement entry.
    replicas: Vec<Replica>,
    /// Where the next search for the shortest queue starts (round robin
    /// among equals).
    next_replica: AtomicUsize,
    /// `tickserve_split_requests_total` for this version, made on first use.
    routed: std::sync::OnceLock<metrics::Counter>,
    /// A stateful model's sequences (shared by its replicas: state lives in
    /// host memory and any replica can run any sequence's next tick).
    sequences: Option<Arc<Sequences>>,
}

/// Monte Carlo runs whose noise has more elements than this draw it on a
/// blocking thread, not on the async worker that serves connections.
const NOISE_IN_PLACE_ELEMENTS: usize = 64 * 1024;

/// A request validated and placed, waiting to run ([`ModelHandle::prepare`]).
#[derive(Debug)]
pub struct Prepared {
    submission: Submission,
    monte_carlo: Option<Plan>,
    sequence: Option<SequenceTick>,
    held_bytes: usize,
    keep_state: bool,
    /// The front-end round it parks in, until the round runs.
    round: Option<Round>,
}

impl Prepared {
    /// The sequence a tick continues, if it is one.
    pub fn sequence(&self) -> Option<&tickserve_core::sequence::SequenceId> {
        self.sequence.as_ref().map(|tick| &tick.control.id)
    }

    /// A copy of the validated request for a shadow version (inputs shared,
    /// not copied); `None` for a sequence's tick or a Monte Carlo request,
    /// which no shadow mirrors (neither may touch state or draw noise twice).
    pub fn mirror(&self) -> Option<ValidRequest> {
        (self.sequence.is_none() && self.monte_carlo.is_none())
            .then(|| self.submission.request.clone())
    }

    /// The validated inputs, in signature order, and their rows (before any
    /// Monte Carlo expansion).
    pub fn inputs(&self) -> (&[bytes::Bytes], usize) {
        (
            &self.submission.request.inputs,
            self.submission.request.rows,
        )
    }

    /// The Monte Carlo seed its noise is drawn from (the request's, or the
    /// one drawn for it); `None` without Monte Carlo.
    pub fn monte_carlo_seed(&self) -> Option<u64> {
        self.monte_carlo.as_ref().map(Plan::seed)
    }

    /// Parks its run in `round` (see [`crate::gather`]) while the round is
    /// open, to run with the round's other requests.
    pub fn gather_in(&mut self, round: &Round) {
        self.round = Some(round.clone());
    }

    /// Asks the run to report the state rows it read
    /// ([`InferResponse::state_read`]), for the journal.
    pub fn keep_state(&mut self) {
        self.keep_state = true;
    }

    /// Runs it in the bucket of `rows` rows or larger (a replay reruns a
    /// record in the bucket it ran in).
    pub fn pin_bucket(&mut self, rows: usize) {
        self.submission.request.bucket_rows = rows;
    }

    /// The bytes its run will hold beyond the request's own: with Monte
    /// Carlo, the noisy copies of its inputs and their answer before it is
    /// summarized (the edge holds them in `server.max_inflight_bytes`).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}

/// A request's place in its sequence.
#[derive(Debug)]
struct SequenceTick {
    control: SequenceControl,
    entry: Entry,
}

/// How a prepared request runs, beside its submission.
#[derive(Clone, Copy)]
struct Run<'a> {
    /// The front-end round it parks in.
    round: Option<&'a Round>,
    /// Which row of a Monte Carlo tick's answer is its clean row.
    tick_row: Option<usize>,
    /// Report the state rows it read.
    keep_state: bool,
}

/// One replica of a model version.
#[derive(Debug)]
pub struct Replica {
    /// Its membership in its family; queued jobs hold it too, so its weights
    /// stay until the last of its requests is answered.
    pub member: Arc<Member>,
    /// The compiled family that runs it: its queue and executors.
    pub family: Arc<Family>,
}

impl ModelHandle {
    /// A handle over `replicas` (at least one); its sequences (if any) age
    /// on `clock`.
    pub fn new(
        name: &str,
        version: &str,
        loaded: Loaded,
        replicas: Vec<Replica>,
        clock: &Clock,
    ) -> ModelHandle {
        ModelHandle {
            name: name.to_string(),
            version: version.to_string(),
            sequences: loaded
                .settings
                .sequence
                .as_ref()
                .map(|spec| Arc::new(Sequences::new(name, Arc::clone(spec), clock.clone()))),
            loaded,
            replicas,
            next_replica: AtomicUsize::new(0),
            routed: std::sync::OnceLock::new(),
        }
    }

    /// Counts a request that named no version and was sent here by the
    /// model's `[split]`.
    pub fn count_routed(&self) {
        self.routed
            .get_or_init(|| {
                metrics::counter!(tickserve_core::metrics::SPLIT_REQUESTS,
                    "model" => self.name.clone(), "version" => self.version.clone())
            })
            .increment(1);
    }

    /// Each replica's device and the bucket runs its family made so far
    /// (members of one family share the count).
    pub fn replica_runs(&self) -> Vec<(String, u64)> {
        self.replicas
            .iter()
            .map(|r| (r.family.device.to_string(), r.family.runs()))
            .collect()
    }

    /// Why it cannot serve, when none of its replicas' families can run.
    pub fn failure(&self) -> Option<String> {
        let failures: Vec<&str> = self
            .replicas
            .iter()
            .map(|r| r.family.failure())
            .collect::<Option<Vec<&str>>>()?;
        Some(failures.join("; "))
    }

    /// True while at least one replica can run.
    pub fn is_ready(&self) -> bool {
        self.failure().is_none()
    }

    /// Validates `request` against this version, and answers it on the
    /// replica with the shortest queue.
    pub async fn infer(&self, request: ModelRequest) -> Result<InferResponse, Error> {
        let prepared = self.prepare(request)?;
        self.run(prepared).await
    }

    /// The synchronous half of [`ModelHandle::infer`]: validates `request`,
    /// plans its Monte Carlo expansion, places it in its priority level and,
    /// for a stateful model, queues it for its sequence's turn. Requests
    /// prepared one after another run in that order within a sequence (a
    /// stream prepares its messages in order, then runs them concurrently).
    /// This handle is the version it runs on, and its name is the one errors
    /// give.
    #[allow(clippy::disallowed_methods)] // a request's admission instant (its wait and deadline) is the machine's time
    pub fn prepare(&self, request: ModelRequest) -> Result<Prepared, Error> {
        let valid = validate_for(&self.name, &request, &self.signature, &self.settings.limits)?;
        let sequence = match (&self.sequences, request.sequence) {
            (None, None) => None,
            (None, Some(control)) => {
                return Err(Error::request(
                    &self.name,
                    format!(
                        "the model keeps no sequence state (no [[sequence.state]] in its \
                         model.toml); got sequence_id {}",
                        control.id
                    ),
                ));
            }
            (Some(_), None) => {
                return Err(Error::request(
                    &self.name,
                    "the model keeps state per sequence: each request names its sequence \
                     (parameter sequence_id, with sequence_start = true on its first request)",
                ));
            }
            (Some(sequences), Some(control)) => {
                if valid.rows != 1 {
                    return Err(Error::request(
                        &self.name,
                        format!(
                            "a request of sequence {} carries one tick, 1 row; got {} rows",
                            control.id, valid.rows
                        ),
                    ));
                }
                let purpose = Purpose::Tick {
                    start: control.start,
                };
                let entry = sequences.enter(&sequences.key(&control.id, control.owner), purpose)?;
                Some((control, entry))
            }
        };
        // Monte Carlo: the request's rows, each as many noisy copies, run as
        // one request (a sequence's clean tick beside them); the answer is
        // their summary. The noise is drawn when it runs.
        let monte_carlo = match &request.monte_carlo {
            None => None,
            Some(mc) => Some(monte_carlo::plan(
                &self.settings.monte_carlo,
                &self.name,
                &self.signature,
                mc,
                valid.rows,
                usize::from(sequence.is_some()),
            )?),
        };
        let held_bytes = monte_carlo
            .as_ref()
            .map_or(0, |plan| plan.held_bytes(&self.signature, &valid.outputs));
        let admitted = Instant::now();
        let deadline = request.deadline.or_else(|| {
            self.settings
                .default_timeout
                .map(|t| durations::deadline_after(admitted, t))
        });
        // Its priority level; the level's timeout is a deadline (reject) or
        // the time it moves behind every other request (delay). A request's
        // own deadline always holds.
        let placement = self.settings.priorities.place(request.priority, admitted);
        let (deadline, delay_at) = match (placement.action, placement.timeout_at) {
            (_, None) => (deadline, None),
            (TimeoutAction::Reject, Some(at)) => (Some(deadline.map_or(at, |d| d.min(at))), None),
            (TimeoutAction::Delay, Some(at)) => (deadline, Some(at)),
        };
        Ok(Prepared {
            submission: Submission {
                request: valid,
                id: request.id,
                admitted,
                deadline,
                level: placement.level,
                delay_at,
            },
            monte_carlo,
            sequence: sequence.map(|(control, entry)| SequenceTick { control, entry }),
            held_bytes,
            keep_state: false,
            round: None,
        })
    }

    /// `valid`'s noisy copies for `plan`, drawn on a blocking thread when
    /// large; refused when the noise made a value non-finite and the model's
    /// `nan_policy` is `"reject"` (a huge `mc_noise_sigma`).
    async fn expand(&self, plan: &Plan, valid: &ValidRequest) -> Result<ValidRequest, Error> {
        let noisy = if plan.noise_elements(&self.signature) <= NOISE_IN_PLACE_ELEMENTS {
            plan.expand(valid, &self.signature)
        } else {
            let (plan, valid) = (plan.clone(), valid.clone());
            let signature = self.signature.clone();
            tokio::task::spawn_blocking(move || plan.expand(&valid, &signature))
                .await
                .map_err(|e| Error::Internal {
                    model: self.name.clone(),
                    message: format!("drawing the Monte Carlo noise failed: {e}"),
                })?
        };
        if self.settings.limits.nan_policy == NanPolicy::Reject {
            for (spec, data) in self.signature.inputs.iter().zip(&noisy.inputs) {
                if !spec.datatype.is_float() {
                    continue;
                }
                if let Some((index, value)) = first_non_finite(spec.datatype.size(), data) {
                    return Err(Error::input(
                        &self.name,
                        &spec.name,
                        "finite values after the Monte Carlo noise (the model's nan_policy is \
                         \"reject\"; lower mc_noise_sigma)",
                        format!("{value} at element {index} of the noisy copies"),
                    ));
                }
            }
        }
        Ok(noisy)
    }

    /// Runs the model once on this thread, on every replica that may run
    /// requests on their caller's thread (see `Family::warm_here`).
    pub fn warm_here(&self) {
        for replica in &self.replicas {
            replica.family.warm_here(&replica.member);
        }
    }

    /// [`ModelHandle::run`] without waiting, where it would not wait anyway:
    /// a request with no sequence and no Monte Carlo plan runs right here,
    /// on the caller's thread, when an executor of its replica is idle and
    /// nothing is queued (run at once, the first thing `run` tries), and its
    /// answer comes back. Else `None`, and `prepared` is as it was, for
    /// [`ModelHandle::run`]. Spares the common request the futures `run`
    /// builds to wait (a few hundred bytes of state moved through three of
    /// them); the request is borrowed, not moved in and out.
    pub fn run_now(&self, prepared: &mut Prepared) -> Option<Result<InferResponse, Error>> {
        // A request of an open round parks with the round's (`run`).
        if prepared.monte_carlo.is_some()
            || prepared.sequence.is_some()
            || prepared.round.as_ref().is_some_and(Round::open)
        {
            return None;
        }
        let replica = self.route()?;
        replica
            .family
            .run_at_once(&replica.member, &mut prepared.submission)
    }

    /// The asynchronous half of [`ModelHandle::infer`]: waits for the
    /// sequence's turn (a stateful model), runs the request on the replica
    /// with the shortest queue, keeps the new state, summarizes Monte Carlo.
    pub async fn run(&self, prepared: Prepared) -> Result<InferResponse, Error> {
        let (answer, held) = self.run_held(prepared).await?;
        if let Some(held) = held {
            held.apply();
        }
        Ok(answer)
    }

    /// [`ModelHandle::run`], but a sequence's tick hands back its new state
    /// instead of keeping it: the caller [applies](HeldState::apply) it once
    /// the answer may go (its record written, its outputs checked), or drops
    /// it, and the sequence stays as it was before the tick. The sequence's
    /// turn is held until then: its next tick waits.
    pub async fn run_held(
        &self,
        prepared: Prepared,
    ) -> Result<(InferResponse, Option<HeldState>), Error> {
        let Prepared {
            mut submission,
            monte_carlo,
            sequence,
            held_bytes: _,
            keep_state,
            round,
        } = prepared;
        let run = Run {
            round: round.as_ref(),
            tick_row: tick_row_of(&monte_carlo),
            keep_state,
        };
        // Monte Carlo around the run: its noisy copies in, its summaries
        // out. A sequence advances on its clean row only: kept for the run.
        let mut clean = None;
        if let Some(plan) = &monte_carlo {
            let noisy = self.expand(plan, &submission.request).await?;
            let valid = std::mem::replace(&mut submission.request, noisy);
            if sequence.is_some() {
                clean = Some(valid.inputs);
            }
        }
        let (answer, mut held) = match (sequence, &self.sequences) {
            (Some(tick), Some(sequences)) => {
                let (answer, held) = self.tick(sequences, tick, submission, clean, run).await?;
                (answer, Some(held))
            }
            _ => (self.submit(submission, run.round).await?, None),
        };
        // A warming-up tick has no outputs: its summary is the answer as it is.
        let answer = match monte_carlo {
            Some(plan) => plan.reduce(answer),
            None => answer,
        };
        if let Some(held) = held.as_mut() {
            held.remember(&answer, self.settings.guards.step_outputs());
        }
        Ok((answer, held))
    }

    /// One tick of sequence `tick` of `sequences`: its turn, its state
    /// gathered into the request (`clean`: a Monte Carlo tick's own rows,
    /// which its state advances on), the run (or none, while its windows
    /// warm up), the new state taken out of the answer and held, not kept.
    async fn tick(
        &self,
        sequences: &Sequences,
        tick: SequenceTick,
        mut submission: Submission,
        clean: Option<Vec<bytes::Bytes>>,
        run: Run<'_>,
    ) -> Result<(InferResponse, HeldState), Error> {
        let turn = tick.entry.turn(&self.name, submission.deadline).await?;
        let start = turn.begin(&tick.control)?;
        let spec = sequences.spec();
        let (request, windows) = with_state(spec, submission.request, clean, &start.state);
        submission.request = request;
        // The ticks its windows hold with this one.
        let seen = (!spec.windows.is_empty())
            .then(|| start.window_ticks.saturating_add(1).min(spec.full_after()));
        let waits = spec.warmup == Warmup::Wait && seen.is_some_and(|s| s < spec.full_after());
        let (mut answer, mut next) = if waits {
            // Warming up: the tick is kept, the model does not run, and the
            // state pairs stay as they were.
            let pairs = start.state.get(..spec.states.len()).unwrap_or_default();
            (self.unanswered(submission.id), pairs.to_vec())
        } else {
            let mut answer = self.submit(submission, run.round).await?;
            let next = take_state(spec, &mut answer, run.tick_row);
            (answer, next)
        };
        next.extend(windows);
        answer.window_ticks = seen;
        answer.sequence_restarted = start.restarted;
        if run.keep_state {
            answer.state_read = start.state;
        }
        let held = HeldState {
            turn,
            control: tick.control,
            next,
            window_ticks: seen.unwrap_or(0),
            previous: start.last_answer,
            answered: Vec::new(),
        };
        Ok((answer, held))
    }

    /// The answer of a tick that did not run (a window warming up with
    /// `window_warmup = "wait"`): no outputs.
    fn unanswered(&self, id: String) -> InferResponse {
        InferResponse {
            model: Name::from(&self.name),
            version: Name::from(&self.version),
            id,
            outputs: Vec::new(),
            timing: Timing::default(),
            sequence_restarted: false,
            bucket: 0,
            state_read: Vec::new(),
            window_ticks: None,
        }
    }

    /// Submits to the replica with the shortest queue, or parks in `round`.
    async fn submit(
        &self,
        submission: Submission,
        round: Option<&Round>,
    ) -> Result<InferResponse, Error> {
        let Some(replica) = self.route() else {
            return Err(Error::ModelNotReady {
                model: self.name.clone(),
                version: self.version.clone(),
                reason: match self.failure() {
                    Some(reason) => format!("its family stopped: {reason}; reload it"),
                    None => "it has no replica".to_string(),
                },
            });
        };
        // A front-end round runs it with the rest of its requests.
        let parking = match round {
            Some(round) => round.park(&replica.family, &replica.member, submission),
            None => Parking::No(submission),
        };
        match parking {
            Parking::Parked(answer) => answer.await.unwrap_or_else(|_| {
                Err(Error::Internal {
                    model: self.name.clone(),
                    message: "the gathered run dropped the request".to_string(),
                })
            }),
            Parking::Refused(error) => Err(error),
            Parking::No(submission) => replica.family.submit(&replica.member, submission).await,
        }
    }

    /// Runs `request` (a primary's [`Prepared::mirror`]) for this shadow
    /// version, only on capacity no request waits for: on an idle executor
    /// of a CPU family (on a blocking thread), or through an empty queue at
    /// the lowest level on a GPU; `None` when it would wait (dropped).
    #[allow(clippy::disallowed_methods)] // a request's admission instant (its wait and deadline) is the machine's time
    pub async fn shadow(&self, request: ValidRequest) -> Option<Result<InferResponse, Error>> {
        let replica = self.route()?;
        let submission = Submission {
            request,
            id: String::new(),
            admitted: Instant::now(),
            deadline: None,
            level: self.loaded.settings.priorities.lowest(),
            delay_at: None,
        };
        let (family, member) = (Arc::clone(&replica.family), Arc::clone(&replica.member));
        if family.device == Device::Cpu {
            tokio::task::spawn_blocking(move || family.run_if_idle(&member, submission))
                .await
                .ok()
                .flatten()
        } else if family.queued_rows() == 0 {
            Some(family.submit(&member, submission).await)
        } else {
            None
        }
    }

    /// The most rows a request of this version runs on its caller's thread
    /// (its first replica's family's; 0: every request goes to an
    /// executor's thread).
    pub fn inline_rows(&self) -> usize {
        self.replicas.first().map_or(0, |r| r.family.inline_rows())
    }

    /// The sequence table of a stateful model.
    pub fn sequences(&self) -> Option<&Arc<Sequences>> {
        self.sequences.as_ref()
    }

    /// Closes every replica's queue (shutdown).
    pub(crate) fn close(&self) {
        for replica in &self.replicas {
            replica.family.close();
        }
    }

    /// The replica with the shortest queue among those that can run, taking
    /// turns among equals.
    fn route(&self) -> Option<&Replica> {
        let count = self.replicas.len();
        let start = self.next_replica.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|i| &self.replicas[(start + i) % count])
            .filter(|r| r.family.failure().is_none())
            .min_by_key(|r| r.family.queued_rows())
    }
}

impl std::ops::Deref for ModelHandle {
    type Target = Loaded;

    fn deref(&self) -> &Loaded {
        &self.loaded
    }
}
