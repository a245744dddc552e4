//! Executors: one OS thread per model version that loads the model, compiles
//! it for every bucket, owns the compiled sessions, and runs requests.
//!
//! The loader calls [`spawn`]; the thread reports its load outcome once on the
//! returned channel, then serves [`Job`]s from the model's queue until every
//! sender is dropped. A job's rows are copied into the chosen bucket's input
//! buffers (zero-padded), run, and copied out of its output buffers; a request
//! larger than the largest bucket runs as several bucket runs. The caller gets
//! its answer on the job's oneshot channel; a caller that left is not an error.

use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tickserve_core::config::{ModelConfig, ModelDefaults};
use tickserve_core::validate::ValidRequest;
use tickserve_core::{
    CompiledModel, Error, InferResponse, OutputTensor, Signature, metrics as names,
};
use tickserve_engine_ort::{CompileRequest, OrtEngine};
use tickserve_onnx::OnnxModel;
use tokio::sync::oneshot;

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
    /// Where it runs (`cpu`).
    pub device: String,
    /// Time to parse, compile every bucket and warm up.
    pub load_time: Duration,
    /// The model's statistics, shared with the front ends.
    pub stats: Arc<ModelStats>,
}

/// Where an executor reports, once, whether its model loaded.
pub type LoadReport = Receiver<Result<(Loaded, Arc<Mutex<Executor>>), String>>;

/// The executor thread's loop: answers queued jobs until every sender is gone.
fn serve(executor: &Mutex<Executor>, queue: Receiver<Job>) {
    while let Ok(job) = queue.recv() {
        let mut executor = executor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        executor
            .stats
            .queued
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if job.reply.is_closed() {
            continue; // the caller left: nothing to compute for
        }
        let result = executor.answer(&job.request, job.id, job.admitted, job.deadline);
        drop(executor);
        let _ = job.reply.send(result);
    }
}

/// Starts the executor thread for `spec`. The thread loads the model and
/// reports on the returned receiver; on success it then serves `queue`.
pub fn spawn(
    spec: LoadSpec,
    engine: OrtEngine,
    queue: Receiver<Job>,
) -> std::io::Result<(JoinHandle<()>, LoadReport)> {
    let (report_tx, report_rx) = std::sync::mpsc::sync_channel(1);
    let thread_name = format!("exec-{}-{}", spec.name, spec.version);
    let handle = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            let started = Instant::now();
            match load(&spec, &engine) {
                Ok((model, settings)) => {
                    let stats = Arc::new(ModelStats::new(settings.buckets.sizes().len()));
                    let loaded = Loaded {
                        signature: model.signature().clone(),
                        settings,
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
                    serve(&executor, queue);
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
) -> Result<(Box<dyn CompiledModel>, ModelSettings), String> {
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
    Ok((Box::new(model), settings))
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

    /// Runs every row of `request` through the buckets and gathers the outputs asked for.
    fn run(
        &mut self,
        request: &ValidRequest,
        id: String,
        cost: &mut RequestCost,
    ) -> Result<InferResponse, Error> {
        let signature = self.model.signature();
        // One allocation per output per request: the response owns its bytes.
        let mut outputs: Vec<OutputTensor> = request
            .outputs
            .iter()
            .map(|&o| {
                let spec = &signature.outputs[o];
                OutputTensor {
                    name: spec.name.clone(),
                    datatype: spec.datatype,
                    shape: std::iter::once(request.rows as i64)
                        .chain(spec.dims.iter().map(|&d| d as i64))
                        .collect(),
                    data: Vec::with_capacity(request.rows * self.output_row_bytes[o]),
                }
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
        })
    }
}
