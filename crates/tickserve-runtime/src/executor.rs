//! Executors: OS threads that each compile a family's graph for every bucket,
//! own the compiled sessions, and run batches of requests.
//!
//! The loader calls [`spawn`] once per executor of a family; each thread
//! reports its compile outcome once, then takes batches from the family's
//! shared [`Intake`] (the channel callers send to, and the [`BatchQueue`]
//! policy over it) until the channel closes and the queue is empty. Every
//! batch is one member's requests, run with that member's weights. A batch's rows are
//! copied one request after another into the chosen bucket's input buffers
//! (zero-padded), run, and copied back out to each caller; a request larger
//! than the largest bucket runs alone, as several bucket runs. Each caller gets
//! its answer on its job's oneshot channel; a caller that left is not an error.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tickserve_core::validate::ValidRequest;
use tickserve_core::{
    Buckets, CompiledModel, Error, InferResponse, MemberId, OutputTensor, Signature, TensorSpec,
    Weight, metrics as names,
};
use tickserve_engine_cuda::{CudaCompileRequest, CudaEngine, Imported};
use tickserve_engine_ort::{CompileRequest, OrtEngine};
use tickserve_onnx::{OnnxModel, PartialSignature};
use tokio::sync::oneshot;

use crate::family::{Member, RetiredLog};
use crate::gather::{BatchQueue, Decision, Queued};
use crate::stats::RequestCost;

/// One admitted request, queued for its family's executors.
#[derive(Debug)]
pub struct Job {
    /// The model version it is for: whose weights, statistics and metrics.
    pub member: Arc<Member>,
    /// The validated request.
    pub request: ValidRequest,
    /// The request id, echoed back.
    pub id: String,
    /// When the request was admitted.
    pub admitted: Instant,
    /// After this the request is answered DEADLINE_EXCEEDED instead of computed.
    pub deadline: Option<Instant>,
    /// Where the answer goes; the receiver may have been dropped.
    pub reply: oneshot::Sender<Result<InferResponse, Error>>,
}

/// The engines executors compile with.
#[derive(Debug, Clone)]
pub struct Engines {
    /// ONNX Runtime, for the CPU.
    pub ort: OrtEngine,
    /// The CUDA engine, for GPUs.
    pub cuda: CudaEngine,
}

/// Which engine compiles a family, and where.
#[derive(Debug)]
pub enum Target {
    /// ONNX Runtime on the CPU.
    Cpu,
    /// The CUDA engine on GPU `ordinal`, from the imported plan.
    Gpu {
        /// The GPU.
        ordinal: usize,
        /// The plan and the first member's weights.
        imported: Box<Imported>,
    },
}

/// What an executor compiles: a family's graph for every bucket.
#[derive(Debug)]
pub struct CompileInput {
    /// The family key, for metrics and messages.
    pub family: String,
    /// The graph: weights as constants, or as inputs when `weights` is given.
    pub graph: OnnxModel,
    /// The signature resolved from the file and `model.toml`.
    pub signature: PartialSignature,
    /// The batch sizes to compile.
    pub buckets: Buckets,
    /// The first member's weights, for a graph that takes them as inputs.
    pub weights: Option<Vec<Weight>>,
    /// The engine and device.
    pub target: Target,
}

impl CompileInput {
    /// Compiles on the target's engine.
    fn compile(&self, engines: &Engines) -> Result<Box<dyn CompiledModel>, String> {
        match &self.target {
            Target::Cpu => engines
                .ort
                .compile(&CompileRequest {
                    family: &self.family,
                    onnx: &self.graph,
                    signature: &self.signature,
                    buckets: &self.buckets,
                    weights: self.weights.as_deref(),
                })
                .map(|m| Box::new(m) as Box<dyn CompiledModel>),
            Target::Gpu { ordinal, imported } => engines
                .cuda
                .compile(&CudaCompileRequest {
                    family: &self.family,
                    imported,
                    signature: &self.signature,
                    buckets: &self.buckets,
                    ordinal: *ordinal,
                    first_member: tickserve_core::SOLE_MEMBER,
                })
                .map(|m| Box::new(m) as Box<dyn CompiledModel>),
        }
    }
}

/// What an executor reports once it has compiled: the full signature, its
/// device, and the executor itself.
pub type Compiled = (Signature, String, Arc<Mutex<Executor>>);

/// Where an executor reports, once, whether its compile succeeded.
pub type LoadReport = Receiver<Result<Compiled, String>>;

impl Queued for Job {
    fn rows(&self) -> usize {
        self.request.rows
    }
    fn admitted(&self) -> Instant {
        self.admitted
    }
    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    fn member(&self) -> MemberId {
        self.member.id
    }
}

/// The queue side that every executor thread of a model version shares: the
/// channel callers send admitted jobs to, and the batching policy over what
/// has arrived. The executor that holds the lock is the one waiting for the
/// next batch; the others wait for the lock.
#[derive(Debug)]
pub struct Intake<J = Job> {
    channel: Receiver<J>,
    queue: BatchQueue<J>,
    /// Set once every sender is gone: what is queued goes at once, then the
    /// executors stop.
    closing: bool,
    /// Set when a request reached this executor while it waited on an empty
    /// queue: it was idle, so the request runs at once, with whatever came
    /// along with it, instead of waiting `max_queue_delay` for company.
    woken_idle: bool,
}

impl<J: Queued> Intake<J> {
    /// An intake over `channel` with the model's batching settings.
    pub fn new(channel: Receiver<J>, largest: usize, max_delay: Duration) -> Intake<J> {
        Intake {
            channel,
            queue: BatchQueue::new(largest, max_delay),
            closing: false,
            woken_idle: false,
        }
    }

    /// Waits until a batch is due and moves it into `batch`, and any expired
    /// jobs into `expired`. Returns false once the channel is closed and
    /// nothing is left.
    fn next(&mut self, batch: &mut Vec<J>, expired: &mut Vec<J>) -> bool {
        loop {
            while let Ok(job) = self.channel.try_recv() {
                self.queue.push(job);
            }
            let now = Instant::now();
            self.queue.take_expired(now, expired);
            if !expired.is_empty() {
                return true; // answer them now, then come back
            }
            match self.queue.decide(now, self.closing || self.woken_idle) {
                Decision::Run(count) => {
                    self.queue.take(count, batch);
                    self.woken_idle = false;
                    return true;
                }
                Decision::WaitUntil(due) => {
                    match self
                        .channel
                        .recv_timeout(due.saturating_duration_since(now))
                    {
                        Ok(job) => self.queue.push(job),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => self.closing = true,
                    }
                }
                Decision::Empty if self.closing => return false,
                Decision::Empty => match self.channel.recv() {
                    Ok(job) => {
                        self.queue.push(job);
                        self.woken_idle = true;
                    }
                    Err(_) => self.closing = true,
                },
            }
        }
    }
}

/// An executor thread's loop: takes the next batch from the shared intake and
/// answers it, until the intake is closed and empty.
fn serve(executor: &Mutex<Executor>, intake: &Mutex<Intake>) {
    let mut batch: Vec<Job> = Vec::new();
    let mut expired: Vec<Job> = Vec::new();
    loop {
        let more = intake
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .next(&mut batch, &mut expired);
        let mut executor = executor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut leaving = 0;
        for job in batch.iter().chain(&expired) {
            job.member.stats.queue.leave(job.request.rows);
            leaving += job.request.rows;
        }
        executor.queued.fetch_sub(leaving, Ordering::AcqRel);
        executor.forget_retired();
        for job in expired.drain(..) {
            executor.refuse_expired(job);
        }
        // A caller that left has nothing to compute for.
        batch.retain(|job| !job.reply.is_closed());
        executor.answer_batch(&mut batch);
        if !more {
            return;
        }
    }
}

/// Starts executor thread `index` of family `input.family`: it compiles the
/// graph, reports on the returned receiver, and on success serves batches
/// from `intake`.
pub fn spawn(
    input: Arc<CompileInput>,
    engines: Engines,
    intake: Arc<Mutex<Intake>>,
    shared: ExecutorShared,
    index: usize,
) -> std::io::Result<(JoinHandle<()>, LoadReport)> {
    let (report_tx, report_rx) = std::sync::mpsc::sync_channel(1);
    let thread_name = format!(
        "exec-{}-{index}",
        &input.family[..input.family.len().min(8)]
    );
    let handle = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            let compiled = input.compile(&engines);
            drop(input);
            match compiled {
                Ok(mut model) => {
                    let signature = model.signature().clone();
                    let device = model.device().to_string();
                    let inline_rows = inline_rows(model.as_mut(), shared.inline_budget);
                    let executor = Arc::new(Mutex::new(Executor::new(model, shared, inline_rows)));
                    let report = (signature, device, Arc::clone(&executor));
                    let _ = report_tx.send(Ok(report));
                    drop(report_tx);
                    serve(&executor, &intake);
                }
                Err(e) => {
                    let _ = report_tx.send(Err(e));
                }
            }
        })?;
    Ok((handle, report_rx))
}

/// The rows of the largest bucket whose run fits in `budget` (median of
/// five runs, after the engine's warm-up): requests up to that many rows may
/// run on their caller's thread (`runtime.inline_budget`). 0 for models whose
/// work must stay on their own thread, or whose smallest bucket is already
/// too slow.
fn inline_rows(model: &mut dyn CompiledModel, budget: Duration) -> usize {
    if !model.runs_on_any_thread() || budget.is_zero() {
        return 0;
    }
    let sizes = model.buckets().sizes().to_vec();
    let mut rows = 0;
    for (bucket, size) in sizes.into_iter().enumerate() {
        let mut times = [Duration::ZERO; 5];
        for time in &mut times {
            let started = Instant::now();
            if model.run(bucket, tickserve_core::SOLE_MEMBER).is_err() {
                return rows;
            }
            *time = started.elapsed();
        }
        times.sort_unstable();
        if times[2] > budget {
            break;
        }
        rows = size;
    }
    rows
}

/// What every executor of a family shares with the family.
#[derive(Debug, Clone)]
pub struct ExecutorShared {
    /// The family key, for the weight-swap metric.
    pub family: String,
    /// Rows queued for any member.
    pub queued: Arc<AtomicUsize>,
    /// Members that left.
    pub retired: Arc<RetiredLog>,
    /// Bucket runs by any executor of the family.
    pub runs: Arc<AtomicU64>,
    /// `runtime.inline_budget`.
    pub inline_budget: Duration,
}

/// A family's compiled graph on one device and what running it needs.
pub struct Executor {
    model: Box<dyn CompiledModel>,
    /// The model's buckets (shared, so planning borrows neither the model nor self).
    buckets: Arc<Buckets>,
    /// Row sizes in bytes, per input and per output (fixed at load).
    input_row_bytes: Vec<usize>,
    output_row_bytes: Vec<usize>,
    queued: Arc<AtomicUsize>,
    retired: Arc<RetiredLog>,
    /// How many retired ids this executor has already freed.
    retired_seen: usize,
    /// The member whose weights the last run bound.
    last_member: Option<MemberId>,
    weight_swaps: metrics::Counter,
    runs: Arc<AtomicU64>,
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
    fn new(model: Box<dyn CompiledModel>, shared: ExecutorShared, inline_rows: usize) -> Self {
        let signature = model.signature();
        let input_row_bytes = signature.inputs.iter().map(|t| t.row_bytes()).collect();
        let output_row_bytes = signature.outputs.iter().map(|t| t.row_bytes()).collect();
        let weight_swaps = metrics::counter!(names::WEIGHT_SWAPS,
            "family" => shared.family.clone(), "device" => model.device().to_string());
        let device_compute = if model.runs_on_any_thread() {
            Vec::new()
        } else {
            model
                .buckets()
                .sizes()
                .iter()
                .map(|size| {
                    metrics::histogram!(names::DEVICE_COMPUTE_DURATION,
                        "family" => shared.family.clone(), "bucket" => size.to_string(),
                        "device" => model.device().to_string())
                })
                .collect()
        };
        Executor {
            buckets: Arc::new(model.buckets().clone()),
            model,
            input_row_bytes,
            output_row_bytes,
            queued: shared.queued,
            retired: shared.retired,
            retired_seen: 0,
            last_member: None,
            weight_swaps,
            runs: shared.runs,
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

    /// Makes `weights` resident as member `id`'s (see [`CompiledModel::add_member`]).
    pub fn add_member(&mut self, id: MemberId, weights: &[Weight]) -> Result<(), String> {
        self.model.add_member(id, weights)
    }

    /// Frees member `id`'s weights.
    pub fn remove_member(&mut self, id: MemberId) {
        self.model.remove_member(id);
    }

    /// Frees the weights of members that left since the last call.
    pub fn forget_retired(&mut self) {
        if let Some(ids) = self.retired.since(self.retired_seen) {
            self.retired_seen += ids.len();
            for id in ids {
                self.model.remove_member(id);
            }
        }
    }

    /// Runs bucket `bucket`, holding `rows` rows, with `member`'s weights;
    /// records the run (time, rows, padding) and counts a weight swap when
    /// the previous run bound another member's.
    fn run_bucket(
        &mut self,
        bucket: usize,
        rows: usize,
        member: &Member,
    ) -> Result<Duration, Error> {
        if self.last_member.is_some_and(|last| last != member.id) {
            self.weight_swaps.increment(1);
        }
        self.last_member = Some(member.id);
        let started = Instant::now();
        self.model
            .run(bucket, member.id)
            .map_err(|message| Error::Internal {
                model: member.name.clone(),
                message,
            })?;
        let elapsed = started.elapsed();
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
        Ok(elapsed)
    }

    /// Answers one request for `member`: refuses it if its deadline passed
    /// while it waited, otherwise runs it. Called by the executor thread for
    /// queued jobs and by the caller's own thread when the executor was idle.
    pub fn answer(
        &mut self,
        member: &Member,
        request: &ValidRequest,
        id: String,
        admitted: Instant,
        deadline: Option<Instant>,
    ) -> Result<InferResponse, Error> {
        let started = Instant::now();
        let mut cost = RequestCost {
            waited: started - admitted,
            rows: request.rows,
            ..RequestCost::default()
        };
        member.metrics.queue_wait.record(cost.waited.as_secs_f64());
        let result = if deadline.is_some_and(|d| started >= d) {
            member.stats.queue.expired();
            Err(Error::DeadlineExceeded {
                model: member.name.clone(),
                waited: cost.waited,
            })
        } else {
            self.run(member, request, id, &mut cost)
        };
        cost.ok = result.is_ok();
        cost.total = started.elapsed();
        member.stats.record_request(&cost);
        result
    }

    /// Answers DEADLINE_EXCEEDED to a job whose deadline passed in the queue;
    /// it is never computed.
    pub fn refuse_expired(&mut self, job: Job) {
        let waited = job.admitted.elapsed();
        job.member.stats.queue.expired();
        job.member.stats.record_request(&RequestCost {
            waited,
            rows: job.request.rows,
            ..RequestCost::default()
        });
        let _ = job.reply.send(Err(Error::DeadlineExceeded {
            model: job.member.name.clone(),
            waited,
        }));
    }

    /// Answers a batch of queued jobs of one member, emptying `jobs`: expired
    /// ones get DEADLINE_EXCEEDED without being computed; the rest run
    /// together in one bucket run (or, for a lone job larger than the largest
    /// bucket, split).
    pub fn answer_batch(&mut self, jobs: &mut Vec<Job>) {
        if jobs.len() <= 1 {
            if let Some(job) = jobs.pop() {
                let result = self.answer(
                    &job.member,
                    &job.request,
                    job.id,
                    job.admitted,
                    job.deadline,
                );
                let _ = job.reply.send(result);
            }
            return;
        }
        let started = Instant::now();
        let mut costs: Vec<RequestCost> = Vec::with_capacity(jobs.len());
        let mut live: Vec<Job> = Vec::with_capacity(jobs.len());
        for job in jobs.drain(..) {
            // The deadline may pass between the queue's check and this run.
            if job.deadline.is_some_and(|d| started >= d) {
                self.refuse_expired(job);
                continue;
            }
            let cost = RequestCost {
                waited: started - job.admitted,
                rows: job.request.rows,
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
            let requests: Vec<&ValidRequest> = live.iter().map(|j| &j.request).collect();
            self.run_together(&member, &requests, &mut batch_cost)
        };
        let answers: Vec<Result<Vec<OutputTensor>, Error>> = match result {
            Ok(outputs) => outputs.into_iter().map(Ok).collect(),
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
                id: job.id,
                outputs,
                timing: cost.timing(),
            }));
        }
    }

    /// Runs several requests of `member` whose rows fit together in one
    /// bucket as one bucket run: their rows follow each other in the bucket's
    /// buffers, the rest is zero padding, and each gets back only its own
    /// output rows.
    fn run_together(
        &mut self,
        member: &Member,
        requests: &[&ValidRequest],
        cost: &mut RequestCost,
    ) -> Result<Vec<Vec<OutputTensor>>, Error> {
        let total: usize = requests.iter().map(|r| r.rows).sum();
        let bucket = self
            .buckets
            .index_for(total)
            .ok_or_else(|| Error::Internal {
                model: member.name.clone(),
                message: format!("a batch of {total} rows does not fit the largest bucket"),
            })?;
        let copy_started = Instant::now();
        for input in 0..self.input_row_bytes.len() {
            let row_bytes = self.input_row_bytes[input];
            let buffer = self.model.input_mut(bucket, input);
            let mut at = 0;
            for request in requests {
                let data = &request.inputs[input];
                buffer[at..at + data.len()].copy_from_slice(data);
                at += data.len();
            }
            buffer[at..].fill(0);
            debug_assert_eq!(at, total * row_bytes);
        }
        cost.input = copy_started.elapsed();
        cost.infer = self.run_bucket(bucket, total, member)?;
        let copy_started = Instant::now();
        let signature = self.model.signature();
        let mut first_row = 0;
        let mut all = Vec::with_capacity(requests.len());
        for request in requests {
            let outputs = request
                .outputs
                .iter()
                .map(|&o| {
                    let len = request.rows * self.output_row_bytes[o];
                    let from = first_row * self.output_row_bytes[o];
                    let mut tensor = output_tensor(&signature.outputs[o], request.rows, len);
                    tensor
                        .data
                        .extend_from_slice(&self.model.output(bucket, o)[from..from + len]);
                    tensor
                })
                .collect();
            all.push(outputs);
            first_row += request.rows;
        }
        cost.output = copy_started.elapsed();
        Ok(all)
    }

    /// Runs every row of `request` through the buckets with `member`'s
    /// weights and gathers the outputs asked for.
    fn run(
        &mut self,
        member: &Member,
        request: &ValidRequest,
        id: String,
        cost: &mut RequestCost,
    ) -> Result<InferResponse, Error> {
        let mut outputs: Vec<OutputTensor> = {
            let signature = self.model.signature();
            request
                .outputs
                .iter()
                .map(|&o| {
                    output_tensor(
                        &signature.outputs[o],
                        request.rows,
                        request.rows * self.output_row_bytes[o],
                    )
                })
                .collect()
        };
        let mut first_row = 0;
        let buckets = Arc::clone(&self.buckets);
        for (bucket, rows) in buckets.plan(request.rows) {
            let copy_started = Instant::now();
            for (input, data) in request.inputs.iter().enumerate() {
                let row_bytes = self.input_row_bytes[input];
                let buffer = self.model.input_mut(bucket, input);
                let used = rows * row_bytes;
                let from = first_row * row_bytes;
                buffer[..used].copy_from_slice(&data[from..from + used]);
                buffer[used..].fill(0);
            }
            cost.input += copy_started.elapsed();
            cost.infer += self.run_bucket(bucket, rows, member)?;
            let copy_started = Instant::now();
            for (out, &o) in outputs.iter_mut().zip(&request.outputs) {
                let used = rows * self.output_row_bytes[o];
                out.data
                    .extend_from_slice(&self.model.output(bucket, o)[..used]);
            }
            cost.output += copy_started.elapsed();
            first_row += rows;
        }
        Ok(InferResponse {
            model: member.name.clone(),
            version: member.version.clone(),
            id,
            outputs,
            timing: cost.timing(),
        })
    }
}

/// An empty output tensor for `rows` rows of `spec`, with room for `bytes`.
/// One allocation per output per request: the response owns its bytes.
fn output_tensor(spec: &TensorSpec, rows: usize, bytes: usize) -> OutputTensor {
    OutputTensor {
        name: spec.name.clone(),
        datatype: spec.datatype,
        shape: std::iter::once(rows as i64)
            .chain(spec.dims.iter().map(|&d| d as i64))
            .collect(),
        data: Vec::with_capacity(bytes),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tickserve_core::{Buckets, Signature};

    const BUDGET: Duration = Duration::from_micros(100);

    /// A compiled model whose runs take nothing below bucket `slow_from` and
    /// at least three budgets from it on.
    struct Paced {
        signature: Signature,
        buckets: Buckets,
        slow_from: usize,
        any_thread: bool,
    }

    impl Paced {
        fn new(slow_from: usize, any_thread: bool) -> Paced {
            Paced {
                signature: Signature {
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                },
                buckets: Buckets::new(&[1, 2, 4, 8], None).unwrap(),
                slow_from,
                any_thread,
            }
        }
    }

    impl CompiledModel for Paced {
        fn signature(&self) -> &Signature {
            &self.signature
        }
        fn buckets(&self) -> &Buckets {
            &self.buckets
        }
        fn device(&self) -> &str {
            "cpu"
        }
        fn input_mut(&mut self, _: usize, _: usize) -> &mut [u8] {
            &mut []
        }
        fn run(&mut self, bucket: usize, _: MemberId) -> Result<(), String> {
            if bucket >= self.slow_from {
                std::thread::sleep(3 * BUDGET);
            }
            Ok(())
        }
        fn output(&self, _: usize, _: usize) -> &[u8] {
            &[]
        }
        fn add_member(&mut self, _: MemberId, _: &[Weight]) -> Result<(), String> {
            Ok(())
        }
        fn remove_member(&mut self, _: MemberId) {}
        fn runs_on_any_thread(&self) -> bool {
            self.any_thread
        }
    }

    #[test]
    fn requests_run_inline_up_to_the_largest_bucket_within_the_budget() {
        assert_eq!(inline_rows(&mut Paced::new(2, true), BUDGET), 2);
        assert_eq!(inline_rows(&mut Paced::new(4, true), BUDGET), 8);
    }

    #[test]
    fn nothing_runs_inline_when_the_smallest_bucket_is_too_slow() {
        assert_eq!(inline_rows(&mut Paced::new(0, true), BUDGET), 0);
    }

    #[test]
    fn a_zero_budget_runs_nothing_inline() {
        assert_eq!(inline_rows(&mut Paced::new(4, true), Duration::ZERO), 0);
    }

    /// A queued request of one row, admitted when it was made.
    #[derive(Debug)]
    struct Row(Instant);

    impl Queued for Row {
        fn rows(&self) -> usize {
            1
        }
        fn admitted(&self) -> Instant {
            self.0
        }
        fn deadline(&self) -> Option<Instant> {
            None
        }
        fn member(&self) -> MemberId {
            tickserve_core::SOLE_MEMBER
        }
    }

    /// An intake with a long `max_queue_delay`, and its sender.
    fn patient_intake(delay: Duration) -> (std::sync::mpsc::Sender<Row>, Intake<Row>) {
        let (sender, channel) = std::sync::mpsc::channel();
        (sender, Intake::new(channel, 64, delay))
    }

    #[test]
    fn a_request_reaching_an_idle_executor_runs_without_waiting_for_company() {
        let (sender, mut intake) = patient_intake(Duration::from_secs(3600));
        let (done, batches) = std::sync::mpsc::channel();
        // The executor waits on the empty queue...
        let executor = std::thread::spawn(move || {
            let (mut batch, mut expired) = (Vec::new(), Vec::new());
            intake.next(&mut batch, &mut expired);
            done.send(batch.len()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(20));
        // ...and a request comes: it goes now, not after the hour's delay.
        sender.send(Row(Instant::now())).unwrap();
        let sent = batches.recv_timeout(Duration::from_secs(60));
        assert_eq!(sent, Ok(1), "the idle executor waited for company");
        executor.join().unwrap();
    }

    #[test]
    fn requests_that_came_while_the_executor_was_busy_wait_for_company() {
        let delay = Duration::from_millis(30);
        let (sender, mut intake) = patient_intake(delay);
        // Queued while the executor was running something else.
        let admitted = Instant::now();
        sender.send(Row(admitted)).unwrap();
        sender.send(Row(admitted)).unwrap();
        let (mut batch, mut expired) = (Vec::new(), Vec::new());
        assert!(intake.next(&mut batch, &mut expired));
        assert_eq!(batch.len(), 2);
        assert!(admitted.elapsed() >= delay, "went before max_queue_delay");
    }

    #[test]
    fn models_bound_to_their_thread_never_run_inline() {
        assert_eq!(inline_rows(&mut Paced::new(4, false), BUDGET), 0);
    }
}
