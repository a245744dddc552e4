//! The executor: a family's compiled graph on one device, and the bucket runs.
//!
//! An [`Executor`] owns one [`CompiledModel`] (every bucket's graph and
//! buffers). It answers a batch of one member's jobs ([`Executor::answer_batch`]):
//! their rows are copied one request after another into the chosen bucket's
//! input buffers (zero-padded), run with that member's weights, and copied
//! back out to each caller; a request larger than the largest bucket runs
//! alone, as several bucket runs ([`Executor::answer`]). A request whose
//! deadline passed is refused, never computed. The executor thread
//! ([`crate::worker`]) calls it for queued jobs, and a caller's own thread
//! calls [`Executor::answer`] when it finds the executor idle.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tickserve_core::validate::ValidRequest;
use tickserve_core::{
    Buckets, CompiledModel, EngineError, Error, InferResponse, MemberId, Name, OutputTensor,
    SOLE_MEMBER, TensorSpec, Weight, metrics as names,
};

use crate::job::{Job, Submission};
use crate::member::{Member, RetiredLog};
use crate::stats::RequestCost;

/// What the executors of one family share with it: read from the family
/// (members that left), written for it (runs, health), and its key for metrics.
#[derive(Debug, Clone)]
pub struct FamilyLinks {
    /// The family key, for the weight-swap metric.
    pub family_key: String,
    /// Members that left; each executor frees their weights.
    pub retired: Arc<RetiredLog>,
    /// Bucket runs by any executor of the family.
    pub runs: Arc<AtomicU64>,
    /// Whether the family can still run.
    pub health: Arc<FamilyHealth>,
}

/// Whether a family can run: set once, by the executor whose engine reported
/// its device lost; the family then takes no more requests, its models report
/// not ready, and a reload founds a new family instead of joining this one.
#[derive(Debug, Default)]
pub struct FamilyHealth {
    failure: OnceLock<String>,
}

impl FamilyHealth {
    /// Why the family cannot run, once it cannot.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    fn fail(&self, reason: String) {
        if self.failure.set(reason.clone()).is_ok() {
            tracing::error!(%reason, "a family stopped: its models are not ready until reloaded");
        }
    }
}

/// A family's compiled graph on one device and what running it needs.
pub struct Executor {
    model: Box<dyn CompiledModel>,
    /// The model's buckets (shared, so planning borrows neither the model nor self).
    buckets: Arc<Buckets>,
    /// Row sizes in bytes, per input and per output (fixed at load).
    input_row_bytes: Vec<usize>,
    output_row_bytes: Vec<usize>,
    /// The outputs' names, shared by every answer.
    output_names: Vec<Name>,
    retired: Arc<RetiredLog>,
    health: Arc<FamilyHealth>,
    /// How many retired ids this executor has already freed.
    retired_seen: usize,
    /// The member whose weights the last run bound.
    last_member: Option<MemberId>,
    /// A member whose weights are resident, for a warm run before any
    /// request ran (families that bind weights per member).
    resident_member: Option<MemberId>,
    weight_swaps: metrics::Counter,
    /// Runs that held rows of several members.
    mixed_runs: metrics::Counter,
    /// Each row's member in the run being prepared (reused run by run).
    row_members: Vec<MemberId>,
    /// Runs made to stay warm (`keep_warm`).
    warm_runs: metrics::Counter,
    runs: Arc<AtomicU64>,
    /// The family key, for messages.
    family_key: String,
    /// GPU time per bucket (CUDA events), for engines that measure it.
    device_compute: Vec<metrics::Histogram>,
    /// See [`Executor::inline_rows`].
    inline_rows: usize,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor over `model`, which runs requests up to `inline_rows`
    /// rows on a caller's thread (see [`Executor::inline_rows`]).
    pub fn new(model: Box<dyn CompiledModel>, links: FamilyLinks, inline_rows: usize) -> Self {
        let signature = model.signature();
        let input_row_bytes = signature.inputs.iter().map(|t| t.row_bytes()).collect();
        let output_row_bytes = signature.outputs.iter().map(|t| t.row_bytes()).collect();
        let output_names = signature
            .outputs
            .iter()
            .map(|t| Name::from(&t.name))
            .collect();
        let weight_swaps = metrics::counter!(names::WEIGHT_SWAPS,
            "family" => links.family_key.clone(), "device" => model.device().to_string());
        let mixed_runs = metrics::counter!(names::MIXED_MEMBER_RUNS,
            "family" => links.family_key.clone(), "device" => model.device().to_string());
        let warm_runs = metrics::counter!(names::KEEP_WARM_RUNS,
            "family" => links.family_key.clone(), "device" => model.device().to_string());
        let device_compute = if model.runs_on_any_thread() {
            Vec::new()
        } else {
            model
                .buckets()
                .sizes()
                .iter()
                .map(|size| {
                    metrics::histogram!(names::DEVICE_COMPUTE_DURATION,
                        "family" => links.family_key.clone(), "bucket" => size.to_string(),
                        "device" => model.device().to_string())
                })
                .collect()
        };
        Executor {
            buckets: Arc::new(model.buckets().clone()),
            model,
            input_row_bytes,
            output_row_bytes,
            output_names,
            retired: links.retired,
            health: links.health,
            retired_seen: 0,
            last_member: None,
            resident_member: None,
            weight_swaps,
            mixed_runs,
            row_members: Vec::new(),
            warm_runs,
            runs: links.runs,
            family_key: links.family_key.clone(),
            device_compute,
            inline_rows,
        }
    }

    /// The most rows a request may have to run on its caller's thread when
    /// this executor is idle: 0 when its model's work stays on its own thread
    /// ([`CompiledModel::runs_on_any_thread`]), else the largest bucket whose
    /// run, measured at load, fits in `runtime.inline_budget`.
    pub fn inline_rows(&self) -> usize {
        self.inline_rows
    }

    /// Runs the smallest bucket once, on whatever rows its buffers hold, with
    /// the weights the last run bound (the sole member's before any): keeps
    /// the engine's code and data, and this thread, warm for the next
    /// request (`keep_warm`). Not a request: no statistics, no bucket-run
    /// count, no answer; only `tickserve_keep_warm_runs_total`. A failure is
    /// logged and changes nothing.
    pub fn keep_warm(&mut self) {
        let member = self
            .last_member
            .or(self.resident_member)
            .unwrap_or(SOLE_MEMBER);
        match self.model.run(0, member) {
            Ok(()) => self.warm_runs.increment(1),
            Err(e) => {
                tracing::debug!(family = %self.family_key, error = %e, "keep-warm run failed")
            }
        }
    }

    /// Runs bucket `bucket` once with member `id`'s weights, on whatever rows
    /// its buffers hold, before the member takes a request: its first
    /// request then finds its weights bound and the run's pages touched. Not
    /// a request and not a keep-warm run: nothing is counted. A failure is
    /// the caller's (the member is not added).
    pub fn warm_member(&mut self, bucket: usize, id: MemberId) -> Result<(), EngineError> {
        self.model.run(bucket, id)
    }

    /// The buckets another thread may warm with [`Executor::warm_member`]:
    /// all of them, or none for a model whose work stays on its own thread
    /// (a GPU's), which its first request warms.
    pub fn warm_buckets(&self) -> usize {
        if self.model.runs_on_any_thread() {
            self.model.buckets().sizes().len()
        } else {
            0
        }
    }

    /// Makes `weights` resident as member `id`'s (see [`CompiledModel::add_member`]).
    pub fn add_member(&mut self, id: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        self.model.add_member(id, weights)?;
        self.resident_member.get_or_insert(id);
        Ok(())
    }

    /// Frees member `id`'s weights.
    pub fn remove_member(&mut self, id: MemberId) {
        self.model.remove_member(id);
        self.forgotten(id);
    }

    /// No warm run binds member `id` any more (a warm run that names a
    /// member gone since fails, harmlessly).
    fn forgotten(&mut self, id: MemberId) {
        if self.resident_member == Some(id) {
            self.resident_member = None;
        }
    }

    /// Frees the weights of members that left since the last call.
    pub fn forget_retired(&mut self) {
        if let Some(ids) = self.retired.since(self.retired_seen) {
            self.retired_seen += ids.len();
            for id in ids {
                self.model.remove_member(id);
                self.forgotten(id);
            }
        }
    }

    /// Runs bucket `bucket`, holding `rows` rows, with `member`'s weights
    /// (each row with its own member's, `self.row_members`, when they are
    /// not all `member`); records the run (time, rows, padding) and counts a
    /// weight swap when the previous run bound another member's.
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    fn run_bucket(
        &mut self,
        bucket: usize,
        rows: usize,
        member: &Member,
        started: Instant,
    ) -> Result<(Duration, Instant), Error> {
        let mixed = self.row_members.iter().any(|&m| m != member.id);
        if mixed {
            self.mixed_runs.increment(1);
        } else if self.last_member.is_some_and(|last| last != member.id) {
            self.weight_swaps.increment(1);
        }
        self.last_member = Some(member.id);
        if let Some(reason) = self.health.failure() {
            return Err(Error::ModelNotReady {
                model: member.name.to_string(),
                version: member.version.to_string(),
                reason: format!("its family stopped: {reason}"),
            });
        }
        // A panic inside the engine fails this run only: it is caught here,
        // so the executor thread goes on and no lock is poisoned (the run-at-
        // once path holds the executor's mutex).
        let (model, row_members) = (&mut self.model, &self.row_members);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if mixed {
                model.run_rows(bucket, rows, row_members)
            } else {
                model.run_rows(bucket, rows, std::slice::from_ref(&member.id))
            }
        }))
        .unwrap_or_else(|panic| {
            Err(EngineError::Internal(format!(
                "the engine panicked: {}",
                panic_message(panic.as_ref())
            )))
        });
        if let Err(e) = outcome {
            if let EngineError::DeviceLost(_) = &e {
                self.health
                    .fail(format!("{e} (family {})", self.family_key));
            }
            return Err(Error::Internal {
                model: member.name.to_string(),
                message: e.to_string(),
            });
        }
        let ended = Instant::now();
        let elapsed = ended.saturating_duration_since(started);
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let (Some(time), Some(histogram)) =
            (self.model.device_time(), self.device_compute.get(bucket))
        {
            histogram.record(time.as_secs_f64());
        }
        member.metrics.compute[bucket].record(elapsed.as_secs_f64());
        member.stats.record_run(bucket, elapsed);
        member.metrics.batch_rows.record(rows as f64);
        member
            .metrics
            .padded_rows
            .record((self.buckets.sizes()[bucket] - rows) as f64);
        Ok((elapsed, ended))
    }

    /// Answers one request for `member`: refuses it if its deadline passed
    /// while it waited, otherwise runs it. Called by the executor thread for
    /// queued jobs and by the caller's own thread when the executor was idle.
    /// The answer takes the submission's id (it is left empty).
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    pub fn answer(
        &mut self,
        member: &Member,
        submission: &mut Submission,
    ) -> Result<InferResponse, Error> {
        let started = Instant::now();
        let mut cost = RequestCost {
            waited: started - submission.admitted,
            rows: submission.request.rows,
            started: Some(started),
            ..RequestCost::default()
        };
        member.metrics.queue_wait.record(cost.waited.as_secs_f64());
        let result = if submission.deadline.is_some_and(|d| started >= d) {
            member.queue.expired(submission.level);
            Err(Error::DeadlineExceeded {
                model: member.name.to_string(),
                waited: cost.waited,
            })
        } else {
            let id = std::mem::take(&mut submission.id);
            self.run(member, &submission.request, id, &mut cost, started)
        };
        cost.ok = result.is_ok();
        // A computed request's total was taken with the last copy's clock
        // read; a refused one's is read here.
        if !cost.ok {
            cost.total = started.elapsed();
        }
        member.stats.record_request(&cost);
        result
    }

    /// Answers DEADLINE_EXCEEDED to a job whose deadline passed in the queue;
    /// it is never computed.
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    pub fn refuse_expired(&mut self, job: Job) {
        let waited = job.submission.admitted.elapsed();
        job.member.queue.expired(job.submission.level);
        job.member.stats.record_request(&RequestCost {
            waited,
            rows: job.submission.request.rows,
            ..RequestCost::default()
        });
        let _ = job.reply.send(Err(Error::DeadlineExceeded {
            model: job.member.name.to_string(),
            waited,
        }));
    }

    /// Answers a batch of queued jobs, emptying `jobs`: expired ones get
    /// DEADLINE_EXCEEDED without being computed; the rest run together in
    /// one bucket run (or, for a lone job larger than the largest bucket,
    /// split). The jobs are of one member, or of several where the family's
    /// engine gives each row its own member's weights (the batcher mixes
    /// members only then: every executor of a family runs one engine on one
    /// device).
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    pub fn answer_batch(&mut self, jobs: &mut Vec<Job>) {
        if jobs.len() <= 1 {
            if let Some(job) = jobs.pop() {
                self.answer_alone(job);
            }
            return;
        }
        let started = Instant::now();
        let mut costs: Vec<RequestCost> = Vec::with_capacity(jobs.len());
        let mut live: Vec<Job> = Vec::with_capacity(jobs.len());
        for job in jobs.drain(..) {
            // The deadline may pass between the queue's check and this run.
            if job.submission.deadline.is_some_and(|d| started >= d) {
                self.refuse_expired(job);
                continue;
            }
            let cost = RequestCost {
                waited: started - job.submission.admitted,
                rows: job.submission.request.rows,
                started: Some(started),
                ..RequestCost::default()
            };
            job.member
                .metrics
                .queue_wait
                .record(cost.waited.as_secs_f64());
            costs.push(cost);
            live.push(job);
        }
        let Some(member) = live.first().map(|job| Arc::clone(&job.member)) else {
            return;
        };
        let mut batch_cost = RequestCost::default();
        let result = {
            let requests: Vec<(&Member, &ValidRequest)> = live
                .iter()
                .map(|j| (j.member.as_ref(), &j.submission.request))
                .collect();
            self.run_together(&member, &requests, &mut batch_cost)
        };
        let mut bucket = 0;
        let answers: Vec<Result<Vec<OutputTensor>, Error>> = match result {
            Ok((outputs, ran_in)) => {
                bucket = ran_in;
                outputs.into_iter().map(Ok).collect()
            }
            Err(Error::Internal { .. }) if self.health.failure().is_none() => {
                // The run failed, the device did not: one request may be at
                // fault (a row that makes the engine panic, say). Each runs
                // alone, so the others get their predictions.
                for job in live {
                    self.answer_alone(job);
                }
                return;
            }
            Err(e) => vec![Err(e); live.len()],
        };
        for ((job, mut cost), outputs) in live.into_iter().zip(costs).zip(answers) {
            cost.input = batch_cost.input;
            cost.infer = batch_cost.infer;
            cost.output = batch_cost.output;
            cost.ok = outputs.is_ok();
            cost.total = started.elapsed();
            job.member.stats.record_request(&cost);
            let _ = job.reply.send(outputs.map(|outputs| InferResponse {
                model: job.member.name.clone(),
                version: job.member.version.clone(),
                id: job.submission.id,
                outputs,
                timing: cost.timing(),
                sequence_restarted: false,
                bucket,
                state_read: Vec::new(),
                window_ticks: None,
            }));
        }
    }

    /// Answers one queued job on its own (see [`Executor::answer`]).
    fn answer_alone(&mut self, mut job: Job) {
        let result = self.answer(&job.member, &mut job.submission);
        let _ = job.reply.send(result);
    }

    /// Runs several requests, each of its member, whose rows fit together
    /// in one bucket as one bucket run (`member`, the first's, names the
    /// run): their rows follow each other in the bucket's buffers, each with
    /// its request's member's weights, the rest is zero padding, and each
    /// gets back only its own output rows.
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    fn run_together(
        &mut self,
        member: &Member,
        requests: &[(&Member, &ValidRequest)],
        cost: &mut RequestCost,
    ) -> Result<(Vec<Vec<OutputTensor>>, usize), Error> {
        let total: usize = requests.iter().map(|(_, r)| r.rows).sum();
        let pinned = requests
            .iter()
            .map(|(_, r)| r.bucket_rows)
            .max()
            .unwrap_or(0);
        let bucket = self
            .buckets
            .index_for(total.max(pinned))
            .ok_or_else(|| Error::Internal {
                model: member.name.to_string(),
                message: format!("a batch of {total} rows does not fit the largest bucket"),
            })?;
        let copy_started = Instant::now();
        for input in 0..self.input_row_bytes.len() {
            let row_bytes = self.input_row_bytes[input];
            let buffer = self.model.input_mut(bucket, input);
            let mut at = 0;
            for (_, request) in requests {
                let data = &request.inputs[input];
                buffer[at..at + data.len()].copy_from_slice(data);
                at += data.len();
            }
            buffer[at..].fill(0);
            debug_assert_eq!(at, total * row_bytes);
        }
        self.row_members.clear();
        for (m, request) in requests {
            self.row_members
                .extend(std::iter::repeat_n(m.id, request.rows));
        }
        // One clock read between the steps: each ends where the next starts.
        let engine_started = Instant::now();
        cost.input = engine_started.saturating_duration_since(copy_started);
        let ran = self.run_bucket(bucket, total, member, engine_started);
        self.row_members.clear();
        let (infer, copy_started) = ran?;
        cost.infer = infer;
        let signature = self.model.signature();
        let mut first_row = 0;
        let mut all = Vec::with_capacity(requests.len());
        for (_, request) in requests {
            let outputs = request
                .outputs
                .iter()
                .map(|&o| {
                    let len = request.rows * self.output_row_bytes[o];
                    let from = first_row * self.output_row_bytes[o];
                    output_tensor(
                        &self.output_names[o],
                        &signature.outputs[o],
                        request.rows,
                        Bytes::copy_from_slice(&self.model.output(bucket, o)[from..from + len]),
                    )
                })
                .collect();
            all.push(outputs);
            first_row += request.rows;
        }
        cost.output = copy_started.elapsed();
        Ok((all, self.buckets.sizes()[bucket]))
    }

    /// Runs every row of `request` through the buckets with `member`'s
    /// weights and gathers the outputs asked for.
    #[allow(clippy::disallowed_methods)] // a run's costs and a request's wait are the machine's time
    fn run(
        &mut self,
        member: &Member,
        request: &ValidRequest,
        id: String,
        cost: &mut RequestCost,
        started: Instant,
    ) -> Result<InferResponse, Error> {
        // One buffer per output, filled bucket run by bucket run.
        let mut data: Vec<Vec<u8>> = request
            .outputs
            .iter()
            .map(|&o| Vec::with_capacity(request.rows * self.output_row_bytes[o]))
            .collect();
        let mut first_row = 0;
        let mut mark = started;
        let buckets = Arc::clone(&self.buckets);
        // A replay pins the bucket its record ran in.
        let pinned = buckets.index_for(request.bucket_rows).unwrap_or(0);
        let mut ran_in = 0;
        for (bucket, rows) in buckets.plan(request.rows) {
            let bucket = if request.bucket_rows > rows {
                bucket.max(pinned)
            } else {
                bucket
            };
            ran_in = ran_in.max(buckets.sizes()[bucket]);
            for (input, data) in request.inputs.iter().enumerate() {
                let row_bytes = self.input_row_bytes[input];
                let buffer = self.model.input_mut(bucket, input);
                let used = rows * row_bytes;
                let from = first_row * row_bytes;
                buffer[..used].copy_from_slice(&data[from..from + used]);
                buffer[used..].fill(0);
            }
            // One clock read between the steps: each ends where the next
            // starts (the first copy from the answer's start).
            let engine_started = Instant::now();
            cost.input += engine_started.saturating_duration_since(mark);
            let (infer, engine_ended) = self.run_bucket(bucket, rows, member, engine_started)?;
            cost.infer += infer;
            for (out, &o) in data.iter_mut().zip(&request.outputs) {
                let used = rows * self.output_row_bytes[o];
                out.extend_from_slice(&self.model.output(bucket, o)[..used]);
            }
            mark = Instant::now();
            cost.output += mark.saturating_duration_since(engine_ended);
            first_row += rows;
        }
        cost.total = mark.saturating_duration_since(started);
        let signature = self.model.signature();
        let outputs = data
            .into_iter()
            .zip(&request.outputs)
            .map(|(data, &o)| {
                output_tensor(
                    &self.output_names[o],
                    &signature.outputs[o],
                    request.rows,
                    data.into(),
                )
            })
            .collect();
        Ok(InferResponse {
            model: member.name.clone(),
            version: member.version.clone(),
            id,
            outputs,
            timing: cost.timing(),
            sequence_restarted: false,
            bucket: ran_in,
            state_read: Vec::new(),
            window_ticks: None,
        })
    }
}

/// The text of a caught panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The output tensor `name` of `rows` rows of `spec` holding `data`: one
/// allocation per output per request, shared from here on (the front end
/// encodes it, the journal records it).
fn output_tensor(name: &Name, spec: &TensorSpec, rows: usize, data: Bytes) -> OutputTensor {
    OutputTensor {
        name: name.clone(),
        datatype: spec.datatype,
        shape: spec.shape_of(rows),
        data,
    }
}
