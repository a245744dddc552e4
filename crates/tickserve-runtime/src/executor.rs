//! Executors: OS threads that each load a model version, compile it for every
//! bucket, own the compiled sessions, and run batches of requests.
//!
//! The loader calls [`spawn`] once per executor of a model version; each thread
//! reports its load outcome once, then takes batches from the model's shared
//! [`Intake`] (the channel callers send to, and the [`BatchQueue`] policy over
//! it) until the channel closes and the queue is empty. A batch's rows are
//! copied one request after another into the chosen bucket's input buffers
//! (zero-padded), run, and copied back out to each caller; a request larger
//! than the largest bucket runs alone, as several bucket runs. Each caller gets
//! its answer on its job's oneshot channel; a caller that left is not an error.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tickserve_core::config::{ModelConfig, ModelDefaults};
use tickserve_core::validate::ValidRequest;
use tickserve_core::{
    CompiledModel, Error, InferResponse, OutputTensor, Signature, TensorSpec, metrics as names,
};
use tickserve_engine_ort::{CompileRequest, OrtEngine};
use tickserve_onnx::OnnxModel;
use tokio::sync::oneshot;

use crate::gather::{BatchQueue, Decision, Queued};
use crate::settings::ModelSettings;
use crate::stats::{ModelStats, RequestCost};

/// One admitted request, queued for its model's executor.
#[derive(Debug)]
pub struct Job {
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

/// What an executor needs to load its model.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The model's name.
    pub name: String,
    /// The version number.
    pub version: u64,
    /// Path of the version's `model.onnx`.
    pub onnx_path: PathBuf,
    /// The model's `model.toml`.
    pub config: ModelConfig,
    /// The server's model defaults.
    pub defaults: ModelDefaults,
}

/// A model that loaded, as its executor reports it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The full signature.
    pub signature: Signature,
    /// The effective settings.
    pub settings: ModelSettings,
    /// The family key: equal for models that differ only in weight values.
    pub family: String,
    /// Where it runs (`cpu`).
    pub device: String,
    /// Time to parse, compile every bucket and warm up.
    pub load_time: Duration,
    /// The model's statistics, shared with the front ends.
    pub stats: Arc<ModelStats>,
}

/// Where an executor reports, once, whether its model loaded.
pub type LoadReport = Receiver<Result<(Loaded, Arc<Mutex<Executor>>), String>>;

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
}

/// The queue side that every executor thread of a model version shares: the
/// channel callers send admitted jobs to, and the batching policy over what
/// has arrived. The executor that holds the lock is the one waiting for the
/// next batch; the others wait for the lock.
#[derive(Debug)]
pub struct Intake {
    channel: Receiver<Job>,
    queue: BatchQueue<Job>,
    /// Set once every sender is gone: what is queued goes at once, then the
    /// executors stop.
    closing: bool,
}

impl Intake {
    /// An intake over `channel` with the model's batching settings.
    pub fn new(channel: Receiver<Job>, largest: usize, max_delay: Duration) -> Intake {
        Intake {
            channel,
            queue: BatchQueue::new(largest, max_delay),
            closing: false,
        }
    }

    /// Waits until a batch is due and moves it into `batch`, and any expired
    /// jobs into `expired`. Returns false once the channel is closed and
    /// nothing is left.
    fn next(&mut self, batch: &mut Vec<Job>, expired: &mut Vec<Job>) -> bool {
        loop {
            while let Ok(job) = self.channel.try_recv() {
                self.queue.push(job);
            }
            let now = Instant::now();
            self.queue.take_expired(now, expired);
            if !expired.is_empty() {
                return true; // answer them now, then come back
            }
            match self.queue.decide(now, self.closing) {
                Decision::Run(count) => {
                    self.queue.take(count, batch);
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
                    Ok(job) => self.queue.push(job),
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
        let leaving = batch
            .iter()
            .chain(&expired)
            .map(|job| job.request.rows)
            .sum();
        executor.stats.queue.leave(leaving);
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

/// Starts an executor thread for `spec`: it loads and compiles the model,
/// reports on the returned receiver, and on success serves batches from
/// `intake`, recording into `stats`.
pub fn spawn(
    spec: LoadSpec,
    engine: OrtEngine,
    stats: Arc<ModelStats>,
    intake: Arc<Mutex<Intake>>,
    index: usize,
) -> std::io::Result<(JoinHandle<()>, LoadReport)> {
    let (report_tx, report_rx) = std::sync::mpsc::sync_channel(1);
    let thread_name = format!("exec-{}-{}-{index}", spec.name, spec.version);
    let handle = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            let started = Instant::now();
            match load(&spec, &engine) {
                Ok((model, settings, family)) => {
                    let loaded = Loaded {
                        signature: model.signature().clone(),
                        settings,
                        family,
                        device: model.device().to_string(),
                        load_time: started.elapsed(),
                        stats: Arc::clone(&stats),
                    };
                    let executor = Arc::new(Mutex::new(Executor::new(
                        spec.name,
                        spec.version.to_string(),
                        model,
                        stats,
                    )));
                    let _ = report_tx.send(Ok((loaded, Arc::clone(&executor))));
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

fn load(
    spec: &LoadSpec,
    engine: &OrtEngine,
) -> Result<(Box<dyn CompiledModel>, ModelSettings, String), String> {
    let bytes = std::fs::read(&spec.onnx_path)
        .map_err(|e| format!("cannot read {}: {e}", spec.onnx_path.display()))?;
    let onnx = OnnxModel::parse(&bytes)?;
    let settings = ModelSettings::resolve(&spec.config, &spec.defaults, onnx.is_tree_ensemble())?;
    let signature = onnx.signature(&spec.config)?;
    let model = engine.compile(&CompileRequest {
        model: &spec.name,
        onnx: &onnx,
        signature: &signature,
        buckets: &settings.buckets,
    })?;
    Ok((Box::new(model), settings, onnx.family_key()))
}

/// A loaded model and what serving it needs: its compiled buckets, its
/// statistics and its metric handles.
pub struct Executor {
    name: String,
    version: String,
    model: Box<dyn CompiledModel>,
    /// The model's buckets (a copy, so planning does not borrow the model).
    buckets: tickserve_core::Buckets,
    stats: Arc<ModelStats>,
    /// Row sizes in bytes, per input and per output (fixed at load).
    input_row_bytes: Vec<usize>,
    output_row_bytes: Vec<usize>,
    /// Metric handles, made once: `compute[bucket]`.
    compute: Vec<metrics::Histogram>,
    queue_wait: metrics::Histogram,
    batch_rows: metrics::Histogram,
    padded_rows: metrics::Histogram,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("model", &self.name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Executor {
    fn new(
        name: String,
        version: String,
        model: Box<dyn CompiledModel>,
        stats: Arc<ModelStats>,
    ) -> Self {
        let signature = model.signature();
        let input_row_bytes = signature.inputs.iter().map(|t| t.row_bytes()).collect();
        let output_row_bytes = signature.outputs.iter().map(|t| t.row_bytes()).collect();
        let compute = model
            .buckets()
            .sizes()
            .iter()
            .map(|size| {
                metrics::histogram!(names::COMPUTE_DURATION, "model" => name.clone(),
                    "bucket" => size.to_string(), "device" => model.device().to_string())
            })
            .collect();
        let queue_wait = metrics::histogram!(names::QUEUE_DURATION, "model" => name.clone());
        let batch_rows = metrics::histogram!(names::BATCH_ROWS, "model" => name.clone());
        let padded_rows = metrics::histogram!(names::PADDED_ROWS, "model" => name.clone());
        Executor {
            name,
            version,
            buckets: model.buckets().clone(),
            model,
            stats,
            input_row_bytes,
            output_row_bytes,
            compute,
            queue_wait,
            batch_rows,
            padded_rows,
        }
    }

    /// Answers one request: refuses it if its deadline passed while it
    /// waited, otherwise runs it. Called by the executor thread for queued
    /// jobs and by the caller's own thread when the executor was idle.
    pub fn answer(
        &mut self,
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
        self.queue_wait.record(cost.waited.as_secs_f64());
        let result = if deadline.is_some_and(|d| started >= d) {
            self.stats.queue.expired();
            Err(Error::DeadlineExceeded {
                model: self.name.clone(),
                waited: cost.waited,
            })
        } else {
            self.run(request, id, &mut cost)
        };
        cost.ok = result.is_ok();
        cost.total = started.elapsed();
        self.stats.record_request(&cost);
        result
    }

    /// Answers DEADLINE_EXCEEDED to a job whose deadline passed in the queue;
    /// it is never computed.
    pub fn refuse_expired(&mut self, job: Job) {
        let waited = job.admitted.elapsed();
        self.stats.queue.expired();
        self.stats.record_request(&RequestCost {
            waited,
            rows: job.request.rows,
            ..RequestCost::default()
        });
        let _ = job.reply.send(Err(Error::DeadlineExceeded {
            model: self.name.clone(),
            waited,
        }));
    }

    /// Answers a batch of queued jobs, emptying `jobs`: expired ones get
    /// DEADLINE_EXCEEDED without being computed; the rest run together in one
    /// bucket run (or, for a lone job larger than the largest bucket, split).
    pub fn answer_batch(&mut self, jobs: &mut Vec<Job>) {
        if jobs.len() <= 1 {
            if let Some(job) = jobs.pop() {
                let result = self.answer(&job.request, job.id, job.admitted, job.deadline);
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
            self.queue_wait.record(cost.waited.as_secs_f64());
            costs.push(cost);
            live.push(job);
        }
        if live.is_empty() {
            return;
        }
        let mut batch_cost = RequestCost::default();
        let result = {
            let requests: Vec<&ValidRequest> = live.iter().map(|j| &j.request).collect();
            self.run_together(&requests, &mut batch_cost)
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
            self.stats.record_request(&cost);
            let _ = job.reply.send(outputs.map(|outputs| InferResponse {
                model: self.name.clone(),
                version: self.version.clone(),
                id: job.id,
                outputs,
                timing: cost.timing(),
            }));
        }
    }

    /// Runs several requests whose rows fit together in one bucket as one
    /// bucket run: their rows follow each other in the bucket's buffers, the
    /// rest is zero padding, and each gets back only its own output rows.
    fn run_together(
        &mut self,
        requests: &[&ValidRequest],
        cost: &mut RequestCost,
    ) -> Result<Vec<Vec<OutputTensor>>, Error> {
        let total: usize = requests.iter().map(|r| r.rows).sum();
        let bucket = self
            .buckets
            .index_for(total)
            .ok_or_else(|| Error::Internal {
                model: self.name.clone(),
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
        let run_started = Instant::now();
        self.model.run(bucket).map_err(|message| Error::Internal {
            model: self.name.clone(),
            message,
        })?;
        cost.infer = run_started.elapsed();
        self.compute[bucket].record(cost.infer.as_secs_f64());
        self.stats.record_run(bucket, cost.infer);
        self.batch_rows.record(total as f64);
        self.padded_rows
            .record((self.buckets.sizes()[bucket] - total) as f64);
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

    /// Runs every row of `request` through the buckets and gathers the outputs asked for.
    fn run(
        &mut self,
        request: &ValidRequest,
        id: String,
        cost: &mut RequestCost,
    ) -> Result<InferResponse, Error> {
        let signature = self.model.signature();
        let mut outputs: Vec<OutputTensor> = request
            .outputs
            .iter()
            .map(|&o| {
                output_tensor(
                    &signature.outputs[o],
                    request.rows,
                    request.rows * self.output_row_bytes[o],
                )
            })
            .collect();
        let mut first_row = 0;
        for (bucket, rows) in self.buckets.plan(request.rows) {
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
            let run_started = Instant::now();
            self.model.run(bucket).map_err(|message| Error::Internal {
                model: self.name.clone(),
                message,
            })?;
            let run_time = run_started.elapsed();
            self.compute[bucket].record(run_time.as_secs_f64());
            cost.infer += run_time;
            self.stats.record_run(bucket, run_time);
            self.batch_rows.record(rows as f64);
            self.padded_rows
                .record((self.buckets.sizes()[bucket] - rows) as f64);
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
            model: self.name.clone(),
            version: self.version.clone(),
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
