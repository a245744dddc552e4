//! Loading model versions into families, many at once.
//!
//! [`Loader::load`] reads and parses every ONNX file in parallel, sorts the
//! versions into families (a live family whose key and compile-shaping
//! settings match, or a new one), compiles each new family once on its
//! executors (families in parallel, each on its own threads), then adds every
//! other member to its family in parallel. Adding a member compiles nothing,
//! and only a founding family's engine is chosen (a member joining a live
//! family is never imported again). Progress goes to the log: n of total, and
//! the rate. [`versions_of`] turns the outcomes into each version's state: a
//! [`ModelHandle`] over its replicas, or why it failed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tickserve_core::Clock;
use tickserve_core::config::{ModelConfig, ModelDefaults};
use tickserve_core::{Device, Signature, Weight, metrics as names};
use tickserve_onnx::{ModelGraph, OnnxModel};

use crate::admission::ModelQueue;
use crate::engines::Engines;
use crate::executor::FamilyLinks;
use crate::family::{Family, FamilyParts};
use crate::handle::{Loaded, ModelHandle, Replica, ReplicaInfo};
use crate::job::Job;
use crate::member::{Member, RetiredLog, Version};
use crate::registry::VersionState;
use crate::settings::ModelSettings;
use crate::stats::ModelStats;
use crate::worker::{self, CompileInput, Intake, LoadReport, WorkerStart};
use tickserve_core::sequence::SequenceSpec;

/// A model version to load.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The model's name.
    pub name: String,
    /// The version number.
    pub version: u64,
    /// The model's directory: every file of the model is read inside it.
    pub model_dir: PathBuf,
    /// Its `model.onnx` (inside `model_dir`).
    pub onnx_path: PathBuf,
    /// Its `model.toml`.
    pub config: ModelConfig,
    /// Which of the version's replicas this is (0 for the first).
    pub replica: usize,
    /// Where this replica is placed (it runs on the CPU instead when its
    /// GPU's engine lacks an op).
    pub device: Device,
    /// `auto` placed it: where its GPU fails to compile it, it runs on the
    /// CPU instead (a GPU the configuration names fails the load).
    pub auto: bool,
    /// The version's statistics and queue count, shared by its replicas
    /// (made by the first replica to load).
    pub shared_by_replicas: Arc<OnceLock<Version>>,
}

impl Candidate {
    /// The version's statistics and queue count, for a model with `settings`.
    fn version(&self, settings: &ModelSettings) -> Version {
        self.shared_by_replicas
            .get_or_init(|| Version {
                name: self.name.clone(),
                version: self.version.to_string(),
                stats: Arc::new(ModelStats::new(settings.buckets.sizes().len())),
                queue: Arc::new(ModelQueue::new(
                    &self.name,
                    settings.max_queue_rows,
                    settings.max_queue_bytes,
                    &settings.priorities,
                )),
            })
            .clone()
    }
}

/// A model version that loaded: its family, its membership, and what it took.
#[derive(Debug)]
pub struct Joined {
    /// The family that serves it.
    pub family: Arc<Family>,
    /// Its membership (weights in the family's executors, statistics, metrics).
    pub member: Member,
    /// Its own settings (equal to the family's in what shapes the graph).
    pub settings: ModelSettings,
    /// The full signature.
    pub signature: Signature,
    /// Time from reading its file to being ready.
    pub load_time: Duration,
    /// The SHA-256 of its `model.onnx`, in hex.
    pub digest: String,
}

/// A parsed version, ready to found a family or join one.
struct Parsed {
    candidate: Candidate,
    started: Instant,
    settings: ModelSettings,
    family: String,
    /// Families with equal group keys share one compiled graph.
    group: String,
    graph: ModelGraph,
    weights: Option<Vec<Weight>>,
    digest: String,
}

/// A family's first member, while the family compiles.
struct First {
    candidate: Candidate,
    started: Instant,
    settings: ModelSettings,
    digest: String,
}

/// A family whose executors are compiling.
struct Founding {
    group: String,
    family: String,
    shares_graph: bool,
    settings: ModelSettings,
    device: Device,
    engine: (&'static str, &'static str),
    /// Why the compiled CPU engine was not chosen, where it was allowed.
    engine_note: Option<String>,
    /// Whether its ticks run resident on a GPU, and if not why.
    gpu_note: Option<String>,
    queue: Sender<Job>,
    lane: Option<Sender<Job>>,
    links: FamilyLinks,
    reports: Vec<LoadReport>,
    spawn_error: Option<String>,
    /// What the executors compile: kept to compile again on the CPU when a
    /// GPU that `auto` chose fails.
    input: Arc<CompileInput>,
}

/// Loads versions into the runtime's families.
pub struct Loader<'a> {
    /// The engines, and the choice of one per replica.
    pub engines: &'a Engines,
    /// The server's model defaults.
    pub defaults: &'a ModelDefaults,
    /// Live families by group key; new ones are added.
    pub families: &'a Mutex<HashMap<String, Weak<Family>>>,
    /// Executor threads, joined at shutdown; new ones are added.
    pub threads: &'a Mutex<Vec<JoinHandle<()>>>,
    /// `runtime.inline_budget`.
    pub inline_budget: Duration,
    /// `runtime.spin`: how long executors poll an empty queue.
    pub spin: Duration,
    /// `runtime.cpu_engine`: which engine runs a model on the CPU, unless
    /// its `engine` says.
    pub cpu_engine: tickserve_core::config::CpuEngineChoice,
    /// `runtime.gpu_mode`: how a GPU runs a sequence model's ticks, unless
    /// its `model.toml` says.
    pub gpu_mode: tickserve_core::config::GpuMode,
    /// `runtime.executor_cpus`.
    pub executor_cpus: &'a [usize],
    /// `runtime.compile_priority = "idle"`: compile on `SCHED_IDLE` threads.
    pub compile_idle: bool,
    /// Executors started so far: where the next family's start in `executor_cpus`.
    pub executors_started: &'a std::sync::atomic::AtomicUsize,
}

/// Where a parsed version goes.
enum Destination {
    /// A family that was live before this load.
    Live(Arc<Family>),
    /// The family this load founds at this index.
    Founding(usize),
}

/// The outcome of one candidate.
pub type Outcome = (Candidate, Result<Joined, String>);

impl Loader<'_> {
    /// Loads every candidate; the outcomes come back in the candidates' order.
    #[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
    pub fn load(&self, candidates: Vec<Candidate>) -> Vec<Outcome> {
        let total = candidates.len();
        let started = Instant::now();
        let parse_progress = Progress::new("models read", total);
        let parsed = parallel(candidates, |c| {
            let outcome = parse(c, self.defaults);
            parse_progress.tick();
            outcome
        });

        // Sort into families: join a live one, found a new one, or join the
        // one this load founds.
        let mut outcomes: Vec<Option<Outcome>> = (0..total).map(|_| None).collect();
        let mut founding: Vec<(usize, Founding, First)> = Vec::new();
        let mut joining: Vec<(usize, Parsed, Destination)> = Vec::new();
        {
            let mut by_group: HashMap<String, usize> = HashMap::new();
            let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
            families.retain(|_, f| f.strong_count() > 0);
            for (index, outcome) in parsed.into_iter().enumerate() {
                let p = match outcome {
                    Ok(p) => p,
                    Err(failed) => {
                        let (candidate, reason) = *failed;
                        outcomes[index] = Some((candidate, Err(reason)));
                        continue;
                    }
                };
                let sharing = p.weights.is_some();
                // A family that stopped (its device lost) takes no new
                // members: the version founds a new family instead.
                let live = families
                    .get(&p.group)
                    .and_then(Weak::upgrade)
                    .filter(|f| f.failure().is_none());
                if let Some(family) = live.filter(|_| sharing) {
                    joining.push((index, p, Destination::Live(family)));
                } else if let Some(&at) = by_group.get(&p.group).filter(|_| sharing) {
                    joining.push((index, p, Destination::Founding(at)));
                } else {
                    if sharing {
                        by_group.insert(p.group.clone(), founding.len());
                    }
                    let (f, first) = self.found(p);
                    founding.push((index, f, first));
                }
            }
        }
        let families_to_compile = founding.len();

        // Each new family compiles on its own executor threads, in parallel;
        // wait for them all.
        let mut founded: Vec<Result<Arc<Family>, String>> = Vec::with_capacity(founding.len());
        for (index, f, first) in founding {
            let group = f.group.clone();
            let shares_graph = f.shares_graph;
            let outcome = self.finish(f, first);
            founded.push(match &outcome.1 {
                Ok(joined) => Ok(Arc::clone(&joined.family)),
                Err(e) => Err(format!("its family failed to compile: {e}")),
            });
            if let (true, Ok(joined)) = (shares_graph, &outcome.1) {
                self.families
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(group, Arc::downgrade(&joined.family));
            }
            outcomes[index] = Some(outcome);
        }

        // Every other member joins its family: no compilation.
        let join_progress = Progress::new("members joined", joining.len());
        let joined = parallel(joining, |(index, p, target)| {
            let family = match target {
                Destination::Live(family) => Ok(family),
                Destination::Founding(at) => founded[at].clone(),
            };
            let outcome = family.and_then(|family| join(family, &p));
            join_progress.tick();
            (index, (p.candidate, outcome))
        });
        for (index, outcome) in joined {
            outcomes[index] = Some(outcome);
        }
        if total > 1 {
            tracing::info!(
                models = total,
                families_compiled = families_to_compile,
                elapsed = ?started.elapsed(),
                "load finished"
            );
        }
        outcomes.into_iter().flatten().collect()
    }

    /// Starts compiling a new family from `first` on its executor threads.
    fn found(&self, first: Parsed) -> (Founding, First) {
        let settings = &first.settings;
        let intake = |channel| {
            Arc::new(Mutex::new(
                Intake::new(
                    channel,
                    settings.buckets.largest(),
                    settings.max_queue_delay,
                )
                .with_spin(self.spin)
                .with_keep_warm(settings.keep_warm),
            ))
        };
        let (queue, channel) = std::sync::mpsc::channel();
        let shared_intake = intake(channel);
        // Executors reserved for level 1 take their jobs from a lane of their own.
        let reserved = settings.priorities.reserved_executors;
        let (lane, lane_intake) = if reserved > 0 {
            let (lane, channel) = std::sync::mpsc::channel();
            (Some(lane), Some(intake(channel)))
        } else {
            (None, None)
        };
        let links = FamilyLinks {
            family_key: first.family.clone(),
            retired: Arc::new(RetiredLog::default()),
            runs: Arc::new(AtomicU64::new(0)),
            health: Arc::default(),
        };
        let preference = settings.engine.unwrap_or(self.cpu_engine);
        let (choice, refused) = match self.engines.choose(
            &first.candidate.name,
            first.candidate.device,
            &first.graph,
            first.weights.as_deref(),
            preference,
        ) {
            Ok(choice) => (choice, None),
            // Nothing compiles: the family fails with the reason.
            Err(reason) => (self.engines.onnxruntime_choice(), Some(reason)),
        };
        let engine = (choice.engine.platform(), choice.engine.backend());
        let engine_note = choice.note.clone();
        let gpu_mode = settings.gpu_mode.unwrap_or(self.gpu_mode);
        let gpu_note = self.engines.resident_note(
            gpu_mode,
            choice.device,
            &first.graph,
            first.weights.as_deref(),
            &settings.state_pairs,
        );
        let input = Arc::new(CompileInput {
            family_key: first.family.clone(),
            graph: first.graph,
            buckets: settings.buckets.clone(),
            weights: first.weights,
            device: choice.device,
            engine: choice.engine,
            resident: resident_request(gpu_mode, &settings.state_pairs),
        });
        let shares_graph = input.weights.is_some();
        let start = WorkerStart {
            intake: shared_intake,
            links: links.clone(),
            inline_budget: self.inline_budget,
            mixed_rows: settings.mixed_rows,
            cpus: self.executor_cpus.to_vec(),
            compile_idle: self.compile_idle,
            first_cpu: self
                .executors_started
                .fetch_add(settings.executors, std::sync::atomic::Ordering::Relaxed),
        };
        let mut reports = Vec::with_capacity(settings.executors);
        let spawned = if refused.is_some() {
            0
        } else {
            settings.executors
        };
        let mut spawn_error = refused;
        let shared = settings.executors.saturating_sub(reserved);
        for index in 0..spawned {
            let mut start = start.clone();
            if index >= shared
                && let Some(lane) = &lane_intake
            {
                start.intake = Arc::clone(lane);
            }
            match worker::spawn(Arc::clone(&input), start, index) {
                Ok((thread, report)) => {
                    let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                    // Threads of families that died have ended: forget them,
                    // so reloads do not grow the list.
                    threads.retain(|t| !t.is_finished());
                    threads.push(thread);
                    reports.push(report);
                }
                Err(e) => spawn_error = Some(format!("cannot start an executor thread: {e}")),
            }
        }
        let founding = Founding {
            group: first.group,
            family: first.family,
            shares_graph,
            settings: first.settings.clone(),
            device: choice.device,
            engine,
            engine_note,
            gpu_note,
            queue,
            lane,
            links,
            reports,
            spawn_error,
            input,
        };
        let first = First {
            candidate: first.candidate,
            started: first.started,
            settings: first.settings,
            digest: first.digest,
        };
        (founding, first)
    }

    /// Waits for a founding family's executors; on success `first` is its
    /// first member. On failure the queue drops here and the executors that
    /// did compile stop.
    #[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
    fn finish(&self, f: Founding, first: First) -> Outcome {
        let mut executors = Vec::with_capacity(f.reports.len());
        let mut failure = f.spawn_error;
        let mut compiled = None;
        for report in f.reports {
            match report.recv() {
                Ok(Ok((signature, executor))) => {
                    executors.push(executor);
                    compiled.get_or_insert(signature);
                }
                Ok(Err(reason)) => failure = Some(reason.to_string()),
                Err(_) => failure = Some("an executor thread stopped while compiling".into()),
            }
        }
        let outcome = match (failure, compiled) {
            (None, Some(signature)) => {
                let family = Arc::new(Family::new(FamilyParts {
                    key: f.family,
                    shares_graph: f.shares_graph,
                    signature: signature.clone(),
                    settings: f.settings,
                    device: f.device,
                    engine: f.engine,
                    engine_note: f.engine_note,
                    gpu_note: f.gpu_note,
                    queue: f.queue,
                    lane: f.lane,
                    executors,
                    links: f.links,
                }));
                tracing::debug!(
                    model = %first.candidate.name,
                    family = %family.key,
                    device = %family.device,
                    inline_rows = family.inline_rows(),
                    "requests up to inline_rows rows run on their caller's thread when an executor is idle"
                );
                let member = family.first_member(first.candidate.version(&first.settings));
                Ok(Joined {
                    family,
                    member,
                    settings: first.settings,
                    signature,
                    load_time: first.started.elapsed(),
                    digest: first.digest,
                })
            }
            (Some(reason), _) if first.candidate.auto && f.device != Device::Cpu => {
                return self.fall_back(f.input, f.group, f.family, first, &reason);
            }
            (Some(reason), _) => Err(reason),
            (None, None) => Err("no executor compiled".to_string()),
        };
        (first.candidate, outcome)
    }

    /// Founds the family again on the CPU, after the GPU that `auto` chose
    /// failed to compile it with `reason`.
    fn fall_back(
        &self,
        input: Arc<CompileInput>,
        group: String,
        family: String,
        mut first: First,
        reason: &str,
    ) -> Outcome {
        tracing::warn!(
            model = %first.candidate.name,
            device = %first.candidate.device,
            "runs on the CPU instead: compiling on the GPU failed: {reason}"
        );
        first.candidate.device = Device::Cpu;
        let input = Arc::try_unwrap(input).unwrap_or_else(|shared| CompileInput {
            family_key: shared.family_key.clone(),
            graph: shared.graph.clone(),
            buckets: shared.buckets.clone(),
            weights: shared.weights.clone(),
            device: shared.device,
            engine: Arc::clone(&shared.engine),
            resident: shared.resident.clone(),
        });
        let parsed = Parsed {
            candidate: first.candidate,
            started: first.started,
            settings: first.settings,
            family,
            group,
            graph: input.graph,
            weights: input.weights,
            digest: first.digest,
        };
        let (founding, first) = self.found(parsed);
        self.finish(founding, first)
    }
}

/// Adds `p` to `family` as a new member.
#[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
fn join(family: Arc<Family>, p: &Parsed) -> Result<Joined, String> {
    let weights = p.weights.as_deref().unwrap_or_default();
    let member = family
        .add_member(p.candidate.version(&p.settings), weights)
        .map_err(|e| e.to_string())?;
    Ok(Joined {
        signature: family.signature.clone(),
        family,
        member,
        settings: p.settings.clone(),
        load_time: p.started.elapsed(),
        digest: p.digest.clone(),
    })
}

/// Reads and parses one candidate; with sharing on, takes its weights out of
/// the graph.
#[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
fn parse(
    candidate: Candidate,
    defaults: &ModelDefaults,
) -> Result<Parsed, Box<(Candidate, String)>> {
    let started = Instant::now();
    let read = || -> Result<_, String> {
        let relative = candidate
            .onnx_path
            .strip_prefix(&candidate.model_dir)
            .ok()
            .and_then(Path::to_str)
            .unwrap_or("model.onnx");
        let shown = format!("{}/{relative}", candidate.name);
        let bytes = tickserve_core::files::read(
            &candidate.model_dir,
            relative,
            &shown,
            tickserve_core::files::MAX_ONNX_BYTES,
        )?
        .ok_or_else(|| format!("{shown}: gone before it was read"))?;
        let digest = hex(&Sha256::digest(&bytes));
        let onnx = OnnxModel::parse(&bytes)?;
        let signature = onnx.signature(&candidate.config)?;
        let outputs: Vec<(&str, tickserve_core::DataType)> = signature
            .outputs
            .iter()
            .map(|(name, datatype, _)| (name.as_str(), *datatype))
            .collect();
        let settings = ModelSettings::resolve(
            &candidate.config,
            defaults,
            &signature.inputs,
            onnx.is_tree_ensemble(),
        )?
        .with_guards(&candidate.config, &outputs)?;
        let family = onnx.family_key();
        let share = candidate
            .config
            .share_weights
            .unwrap_or(defaults.share_weights);
        let (graph, weights) = if share {
            match onnx.with_weights_as_inputs() {
                Ok((graph, weights)) => (graph, Some(weights)),
                Err(reason) => {
                    tracing::warn!(model = candidate.name, %reason,
                        "cannot take the weights out of the graph; compiling it alone with constant weights");
                    (onnx, None)
                }
            }
        } else {
            (onnx, None)
        };
        // Members share a queue and compiled buckets, so whatever shapes
        // those must be equal too; a model that does not share gets a group
        // of its own. Each replica is a family of its own where it is placed.
        let replica = format!("device={}#{}", candidate.device, candidate.replica);
        let group = if weights.is_some() {
            format!(
                "{family} {replica} buckets={:?} executors={} reserved={} delay={:?} mixed_rows={:?} signature={:?}",
                settings.buckets.sizes(),
                settings.executors,
                settings.priorities.reserved_executors,
                settings.max_queue_delay,
                settings.mixed_rows,
                signature
            )
        } else {
            format!(
                "{family} {replica} alone {}/{}",
                candidate.name, candidate.version
            )
        };
        let graph = ModelGraph {
            onnx: graph,
            signature,
        };
        Ok((settings, family, group, graph, weights, digest))
    };
    match read() {
        Ok((settings, family, group, graph, weights, digest)) => Ok(Parsed {
            candidate,
            started,
            settings,
            family,
            group,
            graph,
            weights,
            digest,
        }),
        Err(reason) => {
            let reason = without_server_paths(reason, &candidate);
            Err(Box::new((candidate, reason)))
        }
    }
}

/// `bytes` in lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `reason` with the server's paths of `candidate`'s directories written as
/// the repository names them (`name/version`, `name`): a load failure is
/// shown to clients (readiness, the repository index, TF Serving's status),
/// and the server's file system is not theirs to see.
fn without_server_paths(reason: String, candidate: &Candidate) -> String {
    let version_dir = candidate.onnx_path.parent();
    let model_dir = version_dir.and_then(Path::parent);
    let mut reason = reason;
    for (dir, shown) in [
        (
            version_dir,
            format!("{}/{}", candidate.name, candidate.version),
        ),
        (model_dir, candidate.name.clone()),
    ] {
        if let Some(dir) = dir.filter(|d| d.is_absolute()) {
            reason = reason.replace(&dir.display().to_string(), &shown);
        }
    }
    reason
}

/// Maps `items` through `f` on as many threads as there are cores, keeping
/// their order.
fn parallel<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let count = items.len();
    let workers = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
        .min(count);
    if workers <= 1 {
        return items.into_iter().map(f).collect();
    }
    let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slot) = items.get(index) else { break };
                    let item = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(item) = item {
                        let result = f(item);
                        *results[index].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .filter_map(|r| r.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

/// Logs how far a load has come, at most once a second and at the end.
struct Progress {
    what: &'static str,
    total: usize,
    done: AtomicUsize,
    started: Instant,
    last_log: Mutex<Instant>,
}

impl Progress {
    #[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
    fn new(what: &'static str, total: usize) -> Progress {
        let now = Instant::now();
        Progress {
            what,
            total,
            done: AtomicUsize::new(0),
            started: now,
            last_log: Mutex::new(now),
        }
    }

    #[allow(clippy::disallowed_methods)] // load times and progress logs are the machine's time
    fn tick(&self) {
        let done = self.done.fetch_add(1, Ordering::AcqRel) + 1;
        let Ok(mut last) = self.last_log.try_lock() else {
            return;
        };
        if done == self.total || last.elapsed() >= Duration::from_secs(1) {
            *last = Instant::now();
            let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
            if self.total > 1 {
                tracing::info!(
                    "{}: {done} of {} ({:.0}/s)",
                    self.what,
                    self.total,
                    done as f64 / seconds
                );
            }
        }
    }
}

/// The loaded (or failed) versions from the outcomes of their replicas, by
/// model name and version, with their readiness metrics set. A version is
/// ready when every replica loaded.
pub fn versions_of(outcomes: Vec<Outcome>, clock: &Clock) -> BTreeMap<(String, u64), VersionState> {
    let mut by_version: BTreeMap<(String, u64), Vec<Outcome>> = BTreeMap::new();
    for (candidate, outcome) in outcomes {
        by_version
            .entry((candidate.name.clone(), candidate.version))
            .or_default()
            .push((candidate, outcome));
    }
    by_version
        .into_iter()
        .map(|((name, version), mut replicas)| {
            replicas.sort_by_key(|(c, _)| c.replica);
            let state = version_state(&name, version, replicas, clock);
            ((name, version), state)
        })
        .collect()
}

/// One version's state from its replicas' outcomes.
fn version_state(name: &str, version: u64, replicas: Vec<Outcome>, clock: &Clock) -> VersionState {
    let version = version.to_string();
    let sequence_of = replicas
        .first()
        .map(|(c, _)| (c.config.sequence.clone(), c.model_dir.clone()));
    let mut joined = Vec::with_capacity(replicas.len());
    let mut failure = None;
    for (candidate, outcome) in replicas {
        match outcome {
            Ok(j) => joined.push(j),
            Err(reason) if failure.is_none() => {
                failure = Some(
                    if candidate.replica == 0 && candidate.device == Device::Cpu {
                        reason
                    } else {
                        format!("replica on {}: {reason}", candidate.device)
                    },
                );
            }
            Err(_) => {}
        }
    }
    // A stateful model's state pairs, against the full signature (its
    // outputs are known once compiled).
    let sequence = match (&sequence_of, joined.first()) {
        (Some((config, model_dir)), Some(first)) => {
            SequenceSpec::resolve(config, &first.signature, model_dir).map(|s| s.map(Arc::new))
        }
        _ => Ok(None),
    };
    let (failure, sequence) = match sequence {
        Ok(sequence) => (failure, sequence),
        Err(reason) => (failure.or(Some(reason)), None),
    };
    if let Some(first) = joined.first_mut() {
        first.settings.sequence = sequence;
    }
    let state = match (failure, joined.first()) {
        (None, Some(first)) => {
            let devices: Vec<String> = joined.iter().map(|j| j.family.device.to_string()).collect();
            // A stateful model's clients see its signature without the state.
            let signature = match &first.settings.sequence {
                Some(sequence) => sequence.public.clone(),
                None => first.signature.clone(),
            };
            let loaded = Loaded {
                signature,
                settings: first.settings.clone(),
                family_key: first.family.key.clone(),
                shares_graph: first.family.shares_graph,
                device: devices.join(","),
                placements: joined
                    .iter()
                    .map(|j| ReplicaInfo {
                        device: j.family.device,
                        platform: j.family.engine.0,
                        backend: j.family.engine.1,
                    })
                    .collect(),
                engine_note: joined.iter().find_map(|j| j.family.engine_note.clone()),
                gpu_note: joined.iter().find_map(|j| j.family.gpu_note.clone()),
                load_time: joined.iter().map(|j| j.load_time).max().unwrap_or_default(),
                stats: Arc::clone(&first.member.stats),
                queue: Arc::clone(&first.member.queue),
                digest: first.digest.clone(),
            };
            metrics::gauge!(names::MODEL_INFO, "model" => name.to_string(),
                "version" => version.clone(), "family" => loaded.family_key.clone())
            .set(1.0);
            let replicas = joined
                .into_iter()
                .map(|j| Replica {
                    member: Arc::new(j.member),
                    family: j.family,
                })
                .collect();
            VersionState::Ready(Arc::new(ModelHandle::new(
                name, &version, loaded, replicas, clock,
            )))
        }
        (Some(reason), _) => VersionState::Failed(reason),
        (None, None) => VersionState::Failed("no replica loaded".to_string()),
    };
    let ready = matches!(state, VersionState::Ready(_));
    metrics::gauge!(names::MODEL_READY, "model" => name.to_string(), "version" => version)
        .set(if ready { 1.0 } else { 0.0 });
    metrics::counter!(names::MODEL_LOADS, "model" => name.to_string(),
        "outcome" => if ready { "loaded" } else { "failed" })
    .increment(1);
    state
}

/// What a family asks of a GPU engine's resident mode: nothing for
/// `graphs`; for `resident` (required) and `auto`, its state pairs.
fn resident_request(
    mode: tickserve_core::config::GpuMode,
    state: &[tickserve_core::sequence::StateConfig],
) -> Option<(bool, Vec<tickserve_core::sequence::StateConfig>)> {
    use tickserve_core::config::GpuMode;
    match mode {
        GpuMode::Graphs => None,
        GpuMode::Resident => Some((true, state.to_vec())),
        GpuMode::Auto => Some((false, state.to_vec())),
    }
}
