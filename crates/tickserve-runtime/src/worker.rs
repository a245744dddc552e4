//! The worker: an executor thread's life, from compiling its family's graph to
//! serving batches until its family's queue closes.
//!
//! The loader calls [`spawn`] once per executor of a family. Each thread
//! compiles the family's graph on the chosen engine ([`CompileInput`]), times
//! its buckets against `runtime.inline_budget` ([`inline_rows`]), reports once
//! on its [`LoadReport`], then takes batches from the family's [`Intake`]
//! (the batcher's channel half: the channel callers send admitted jobs to,
//! and the [`Batcher`] policy over what has arrived) until the channel closes
//! and the queue is empty. Jobs leave the queue counts (their tickets are
//! released) as they are taken out, before they run.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tickserve_core::config::MixedRows;
use tickserve_core::sequence::StateConfig;
use tickserve_core::{
    Buckets, CompileRequest, CompiledModel, DataType, Device, EngineError, ResidentRequest,
    SOLE_MEMBER, Signature, Weight,
};
use tickserve_onnx::ModelGraph;

use crate::batcher::{Batcher, Decision, Queued};
use crate::engines::SharedEngine;
use crate::executor::{Executor, FamilyLinks};
use crate::job::Job;

/// What an executor thread compiles: a family's graph for every bucket, on
/// the engine and device chosen for it.
#[derive(Debug)]
pub struct CompileInput {
    /// The family key, for metrics and messages.
    pub family_key: String,
    /// The graph: weights as constants, or as inputs when `weights` is given.
    pub graph: ModelGraph,
    /// The batch sizes to compile.
    pub buckets: Buckets,
    /// The first member's weights, for a graph that takes them as inputs.
    pub weights: Option<Vec<Weight>>,
    /// Where it runs.
    pub device: Device,
    /// The engine that compiles it.
    pub engine: SharedEngine,
    /// For a sequence model whose `gpu_mode` is `resident` or `auto`: it
    /// asks to run resident (`true`: required), its state pairs.
    pub resident: Option<(bool, Vec<StateConfig>)>,
}

impl CompileInput {
    fn compile(&self) -> Result<Box<dyn CompiledModel>, EngineError> {
        self.engine.compile(&CompileRequest {
            family: &self.family_key,
            graph: &self.graph,
            buckets: &self.buckets,
            weights: self.weights.as_deref(),
            device: self.device,
            check: false,
            resident: self
                .resident
                .as_ref()
                .map(|(required, state)| ResidentRequest {
                    required: *required,
                    state,
                }),
        })
    }
}

/// What an executor reports once it has compiled: the full signature and
/// the executor itself.
pub type Compiled = (Signature, Arc<Mutex<Executor>>);

/// Where an executor reports, once, whether its compile succeeded.
pub type LoadReport = Receiver<Result<Compiled, EngineError>>;

/// The batcher's channel half, shared by every executor thread of a family:
/// the channel callers send admitted jobs to, and the [`Batcher`] policy over
/// what has arrived. The executor that holds the lock is the one waiting for the
/// next batch; the others wait for the lock.
#[derive(Debug)]
pub struct Intake<J = Job> {
    channel: Receiver<J>,
    batcher: Batcher<J>,
    /// Set once every sender is gone: what is queued goes at once, then the
    /// executors stop.
    closing: bool,
    /// Set when a request reached this executor while it waited on an empty
    /// queue: it was idle, so the request runs at once, with whatever came
    /// along with it, instead of waiting `max_queue_delay` for company.
    woken_idle: bool,
    /// How long to poll an empty queue before parking (`runtime.spin`).
    spin: Duration,
    /// How long an idle executor waits before a warm run (`keep_warm`).
    keep_warm: Option<Duration>,
}

/// What an executor does next (see [`Intake::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Answer the batch (and refuse the expired jobs) just taken.
    Answer,
    /// Nothing came for `keep_warm`: run the smallest bucket to stay warm.
    Warm,
    /// The channel is closed and nothing is left: stop.
    Stop,
}

impl<J: Queued> Intake<J> {
    /// An intake over `channel` with the family's batching settings.
    pub fn new(channel: Receiver<J>, largest: usize, max_delay: Duration) -> Intake<J> {
        Intake {
            channel,
            batcher: Batcher::new(largest, max_delay),
            closing: false,
            woken_idle: false,
            spin: Duration::ZERO,
            keep_warm: None,
        }
    }

    /// Asks for a warm run whenever the queue stays empty this long (`keep_warm`).
    pub fn with_keep_warm(mut self, keep_warm: Option<Duration>) -> Intake<J> {
        self.keep_warm = keep_warm.filter(|k| !k.is_zero());
        self
    }

    /// Polls an empty queue for `spin` before parking (`runtime.spin`).
    pub fn with_spin(mut self, spin: Duration) -> Intake<J> {
        self.spin = spin;
        self
    }

    /// A job that arrives within `spin` (and within `keep_warm`, when set),
    /// polling: `Some(job)`, `None` when none did, `Err` once the channel is
    /// closed.
    #[allow(clippy::disallowed_methods)] // an executor's spin and run times are the machine's time
    fn poll_for_job(&mut self) -> Result<Option<J>, ()> {
        let limit = self.keep_warm.map_or(self.spin, |k| self.spin.min(k));
        if limit.is_zero() {
            return Ok(None);
        }
        let started = Instant::now();
        loop {
            match self.channel.try_recv() {
                Ok(job) => return Ok(Some(job)),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(()),
                Err(std::sync::mpsc::TryRecvError::Empty) if started.elapsed() >= limit => {
                    return Ok(None);
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }

    /// From now on every batch is one request (see [`Batcher::one_request_per_run`]).
    pub fn one_request_per_run(&mut self) {
        self.batcher.one_request_per_run();
    }

    /// From now on a batch may hold several members' requests (see
    /// [`Batcher::mix_members`]).
    pub fn mix_members(&mut self) {
        self.batcher.mix_members();
    }

    /// Waits until a batch is due and moves it into `batch`, and any expired
    /// jobs into `expired` ([`Step::Answer`]); with `keep_warm`, says when the
    /// queue stayed empty that long ([`Step::Warm`]); [`Step::Stop`] once the
    /// channel is closed and nothing is left.
    #[allow(clippy::disallowed_methods)] // an executor's spin and run times are the machine's time
    fn next(&mut self, batch: &mut Vec<J>, expired: &mut Vec<J>) -> Step {
        loop {
            while let Ok(job) = self.channel.try_recv() {
                self.batcher.push(job);
            }
            let now = Instant::now();
            self.batcher.take_expired(now, expired);
            self.batcher.delay_overdue(now);
            if !expired.is_empty() {
                return Step::Answer; // answer them now, then come back
            }
            match self.batcher.decide(now, self.closing || self.woken_idle) {
                Decision::Run(count) => {
                    self.batcher.take(count, batch);
                    self.woken_idle = false;
                    return Step::Answer;
                }
                Decision::WaitUntil(due) => {
                    match self
                        .channel
                        .recv_timeout(due.saturating_duration_since(now))
                    {
                        Ok(job) => self.batcher.push(job),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => self.closing = true,
                    }
                }
                Decision::Empty if self.closing => return Step::Stop,
                Decision::Empty => {
                    let job = match (self.poll_for_job(), self.keep_warm) {
                        (Ok(Some(job)), _) => Ok(job),
                        (Err(()), _) => Err(()),
                        // It polled the whole keep-warm interval (a spin as
                        // long or longer, the latency mode's for ever).
                        (Ok(None), Some(interval)) if self.spin >= interval => {
                            return Step::Warm;
                        }
                        (Ok(None), None) => self.channel.recv().map_err(drop),
                        (Ok(None), Some(interval)) => match self.channel.recv_timeout(interval) {
                            Ok(job) => Ok(job),
                            Err(RecvTimeoutError::Timeout) => return Step::Warm,
                            Err(RecvTimeoutError::Disconnected) => Err(()),
                        },
                    };
                    match job {
                        Ok(job) => {
                            self.batcher.push(job);
                            self.woken_idle = true;
                        }
                        Err(_) => self.closing = true,
                    }
                }
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
        let step = intake
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .next(&mut batch, &mut expired);
        let mut executor = executor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if step == Step::Warm {
            // The intake is free meanwhile: a request that comes now waits
            // for this one run of the smallest bucket at most.
            executor.keep_warm();
            continue;
        }
        for job in batch.iter_mut().chain(expired.iter_mut()) {
            job.ticket.release();
        }
        executor.forget_retired();
        for job in expired.drain(..) {
            executor.refuse_expired(job);
        }
        // A caller that left has nothing to compute for.
        batch.retain(|job| !job.reply.is_closed());
        executor.answer_batch(&mut batch);
        if step == Step::Stop {
            return;
        }
    }
}

/// Rows checked alone against their place in a full bucket.
const INDEPENDENCE_ROWS: usize = 3;

/// Whether a row's answer depends on the other rows of its run (a reduction
/// over the batch axis, say), which would let one client's rows change
/// another's answer: the largest bucket is filled with pseudo-random rows
/// and run, then its first rows run alone in the smallest bucket (the rest
/// zeros); each must get the same answer, within 1e-3 relative. `Some` says
/// which output and row differed. Floats are drawn in [-1, 1); integers and
/// booleans are 0 or 1.
fn rows_depend_on_each_other(model: &mut dyn CompiledModel) -> Result<Option<String>, EngineError> {
    let sizes = model.buckets().sizes().to_vec();
    let (Some(&smallest), Some(&largest)) = (sizes.first(), sizes.last()) else {
        return Ok(None);
    };
    if largest < 2 {
        return Ok(None);
    }
    let signature = model.signature().clone();
    let (small, large) = (0, sizes.len() - 1);
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: deterministic, no dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for (input, spec) in signature.inputs.iter().enumerate() {
        let size = spec.datatype.size();
        for element in model.input_mut(large, input).chunks_exact_mut(size) {
            let bits = next();
            match spec.datatype {
                DataType::Fp32 => {
                    let v = (bits >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                    element.copy_from_slice(&v.to_le_bytes());
                }
                DataType::Fp64 => {
                    let v = (bits >> 11) as f64 / (1u64 << 52) as f64 - 1.0;
                    element.copy_from_slice(&v.to_le_bytes());
                }
                _ => {
                    element.fill(0);
                    element[0] = (bits >> 63) as u8;
                }
            }
        }
    }
    model.run(large, SOLE_MEMBER)?;
    let together: Vec<Vec<u8>> = (0..signature.outputs.len())
        .map(|output| model.output(large, output).to_vec())
        .collect();
    for row in 0..INDEPENDENCE_ROWS.min(largest) {
        for (input, spec) in signature.inputs.iter().enumerate() {
            let bytes = spec.row_bytes();
            let source = model.input_mut(large, input)[row * bytes..(row + 1) * bytes].to_vec();
            let target = model.input_mut(small, input);
            target.fill(0);
            target[..bytes].copy_from_slice(&source);
        }
        model.run(small, SOLE_MEMBER)?;
        for (output, spec) in signature.outputs.iter().enumerate() {
            let bytes = spec.row_bytes();
            let alone = &model.output(small, output)[..bytes];
            let within = &together[output][row * bytes..(row + 1) * bytes];
            if !close(spec.datatype, alone, within) {
                return Ok(Some(format!(
                    "output '{}' of row {row} differs alone and among {largest} rows \
                     (buckets {smallest} and {largest})",
                    spec.name
                )));
            }
        }
    }
    Ok(None)
}

/// Whether two rows of `datatype` agree: floats within 1e-3 relative (engines'
/// kernels differ by a few ulps between bucket sizes), the rest exactly.
fn close(datatype: DataType, a: &[u8], b: &[u8]) -> bool {
    let near = |x: f64, y: f64| (x - y).abs() <= 1e-3 * x.abs().max(y.abs()).max(1.0);
    match datatype {
        DataType::Fp32 => a.chunks_exact(4).zip(b.chunks_exact(4)).all(|(x, y)| {
            near(
                f32::from_le_bytes([x[0], x[1], x[2], x[3]]).into(),
                f32::from_le_bytes([y[0], y[1], y[2], y[3]]).into(),
            )
        }),
        DataType::Fp64 => a.chunks_exact(8).zip(b.chunks_exact(8)).all(|(x, y)| {
            let x: [u8; 8] = x.try_into().unwrap_or_default();
            let y: [u8; 8] = y.try_into().unwrap_or_default();
            near(f64::from_le_bytes(x), f64::from_le_bytes(y))
        }),
        _ => a == b,
    }
}

/// What every executor thread of a family is started with besides its graph.
#[derive(Debug, Clone)]
pub struct WorkerStart {
    /// The family's queue.
    pub intake: Arc<Mutex<Intake>>,
    /// What the executors share with their family.
    pub links: FamilyLinks,
    /// `runtime.inline_budget`.
    pub inline_budget: Duration,
    /// What to do if the model's rows depend on each other.
    pub mixed_rows: MixedRows,
    /// `runtime.executor_cpus`: executor `index` is pinned to
    /// `cpus[(first_cpu + index) % len]`.
    pub cpus: Vec<usize>,
    /// Where this family's executors start in `cpus`.
    pub first_cpu: usize,
    /// Compile (and run the load-time checks) on a `SCHED_IDLE` thread
    /// (`runtime.compile_priority = "idle"`; CPU families only).
    pub compile_idle: bool,
}

/// Starts executor thread `index` of family `input.family_key`: it compiles the
/// graph, reports on the returned receiver, and on success serves batches
/// from the family's intake.
pub fn spawn(
    input: Arc<CompileInput>,
    start: WorkerStart,
    index: usize,
) -> std::io::Result<(JoinHandle<()>, LoadReport)> {
    let (report_tx, report_rx) = std::sync::mpsc::sync_channel(1);
    let thread_name = format!(
        "exec-{}-{index}",
        &input.family_key[..input.family_key.len().min(8)]
    );
    let handle = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            if !start.cpus.is_empty() {
                let cpu = start.cpus[(start.first_cpu + index) % start.cpus.len()];
                crate::affinity::pin_current_thread(cpu);
            }
            let family_key = input.family_key.clone();
            let idle = start.compile_idle && input.device == Device::Cpu;
            let (intake, mixed_rows) = (Arc::clone(&start.intake), start.mixed_rows);
            let load = move || {
                input.compile().and_then(|mut model| {
                    match rows_depend_on_each_other(model.as_mut())? {
                        None => {}
                        Some(evidence) if mixed_rows == MixedRows::Refuse => {
                            return Err(EngineError::InvalidModel(format!(
                                "its rows depend on each other ({evidence}), and its model.toml \
                             says mixed_rows = \"refuse\""
                            )));
                        }
                        Some(evidence) => {
                            tracing::warn!(
                                family = %family_key,
                                %evidence,
                                "the model's rows depend on each other: it is served one request \
                                 per run (a client's rows never meet another's)"
                            );
                            intake
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .one_request_per_run();
                        }
                    }
                    if model.mixes_members() {
                        // Rows of several members run in one launch (every
                        // executor of the family runs this engine).
                        intake
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .mix_members();
                    }
                    Ok(model)
                })
            };
            let compiled = if idle {
                compile_at_idle_priority(load)
            } else {
                load()
            };
            match compiled {
                Ok(mut model) => {
                    let signature = model.signature().clone();
                    let inline_rows = inline_rows(model.as_mut(), start.inline_budget);
                    let executor = Executor::new(model, start.links, inline_rows);
                    let executor = Arc::new(Mutex::new(executor));
                    let _ = report_tx.send(Ok((signature, Arc::clone(&executor))));
                    drop(report_tx);
                    serve(&executor, &start.intake);
                }
                Err(e) => {
                    let _ = report_tx.send(Err(e));
                }
            }
        })?;
    Ok((handle, report_rx))
}

/// Runs `load` (a compile and the checks that run the new graph) on a thread
/// of its own at `SCHED_IDLE` priority, and waits for it: the executor
/// thread itself keeps its priority for serving.
fn compile_at_idle_priority(
    load: impl FnOnce() -> Result<Box<dyn CompiledModel>, EngineError> + Send + 'static,
) -> Result<Box<dyn CompiledModel>, EngineError> {
    let helper = std::thread::Builder::new()
        .name("compile-idle".into())
        .spawn(move || {
            crate::affinity::idle_current_thread();
            load()
        });
    match helper.map(JoinHandle::join) {
        Ok(Ok(compiled)) => compiled,
        Ok(Err(_)) => Err(EngineError::InvalidModel(
            "the compile thread panicked".into(),
        )),
        Err(e) => Err(EngineError::InvalidModel(format!(
            "cannot start a compile thread: {e}"
        ))),
    }
}

/// The rows of the largest bucket whose run fits in `budget` (median of
/// five runs, after the engine's warm-up): requests up to that many rows may
/// run on their caller's thread (`runtime.inline_budget`). 0 for models whose
/// work must stay on their own thread, or whose smallest bucket is already
/// too slow.
#[allow(clippy::disallowed_methods)] // an executor's spin and run times are the machine's time
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

#[cfg(test)]
mod tests;
