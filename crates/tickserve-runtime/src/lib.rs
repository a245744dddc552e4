//! The model runtime: loads the model repository into families, runs each
//! family's executors, answers inference requests for the front ends, and
//! loads and unloads models while serving (the repository extension).
//!
//! [`Runtime::load`] scans the repository (Triton layout) and loads every
//! version through the [`loader`]: models of one family share one compiled
//! graph per bucket, each with its own weights. A broken model is recorded
//! with its reason and the others serve. [`Runtime::infer`] validates a request
//! at the edge, runs it at once on an idle executor, or admits it to its
//! family's queue (a full queue answers at once) and awaits the answer.
//! [`Runtime::load_model`] and [`Runtime::unload_model`] change the set of
//! models while requests flow: a new member of a loaded family compiles
//! nothing, a failed load leaves the old version serving, and an unloaded
//! model's requests in flight are answered before its weights go.

pub mod executor;
pub mod family;
pub mod gather;
pub mod loader;
pub mod repository;
pub mod settings;
pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tickserve_core::config::ServerConfig;
use tickserve_core::validate::validate;
use tickserve_core::{DataType, Error, InferRequest, InferResponse, Signature, metrics as names};
use tickserve_engine_cuda::{CudaEngine, CudaOptions, Gpus};
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tokio::sync::oneshot;

use crate::executor::{Engines, Job};
use crate::family::{Family, Member};
use crate::loader::{Candidate, Loader};
pub use crate::settings::{Device, ModelSettings};
pub use crate::stats::ModelStats;

/// What a model version is, once loaded.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The full signature.
    pub signature: Signature,
    /// The effective settings.
    pub settings: ModelSettings,
    /// The family key: equal for models that differ only in weight values.
    pub family: String,
    /// True when it shares its family's compiled graph (weights bound per run).
    pub shared: bool,
    /// Where its replicas run (`cpu`, `gpu:0,gpu:1`).
    pub device: String,
    /// Time from reading its file to ready (a family's first member includes
    /// the compilation; a later member only its weights).
    pub load_time: Duration,
    /// The model's statistics, shared with the front ends.
    pub stats: Arc<ModelStats>,
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
    /// Its replicas, one per placement entry: each a membership in a
    /// family on one device.
    replicas: Vec<Replica>,
    /// Where the next search for the shortest queue starts (round robin
    /// among equals).
    next_replica: AtomicUsize,
}

/// One replica of a model version.
#[derive(Debug)]
struct Replica {
    /// Its membership in its family; queued jobs hold it too, so its weights
    /// stay until the last of its requests is answered.
    member: Arc<Member>,
    /// The compiled family that runs it: its queue and executors.
    family: Arc<Family>,
}

impl ModelHandle {
    /// Each replica's device and the bucket runs its family made so far
    /// (members of one family share the count).
    pub fn replica_runs(&self) -> Vec<(String, u64)> {
        self.replicas
            .iter()
            .map(|r| (r.family.device.clone(), r.family.runs()))
            .collect()
    }

    /// The replica with the shortest queue, taking turns among equals.
    fn route(&self) -> &Replica {
        let count = self.replicas.len();
        let start = self.next_replica.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|i| &self.replicas[(start + i) % count])
            .min_by_key(|r| r.family.queued_rows())
            .unwrap_or(&self.replicas[0])
    }
}

impl std::ops::Deref for ModelHandle {
    type Target = Loaded;

    fn deref(&self) -> &Loaded {
        &self.loaded
    }
}

/// The state of one model version.
#[derive(Debug, Clone)]
pub enum VersionState {
    /// Loaded and serving.
    Ready(Arc<ModelHandle>),
    /// Its load failed, for this reason.
    Failed(String),
}

/// Every version of one model, highest last.
#[derive(Debug, Clone, Default)]
pub struct ModelVersions {
    /// Version number → state.
    pub versions: BTreeMap<u64, VersionState>,
    /// A failure that concerns the model as a whole (no versions, unreadable model.toml).
    pub error: Option<String>,
}

impl ModelVersions {
    /// The default version: the highest.
    pub fn default_version(&self) -> Option<(u64, &VersionState)> {
        self.versions.iter().next_back().map(|(v, s)| (*v, s))
    }

    /// The versions that are ready, as the protocol spells them, ascending.
    pub fn ready_versions(&self) -> Vec<String> {
        self.versions
            .iter()
            .filter(|(_, s)| matches!(s, VersionState::Ready(_)))
            .map(|(v, _)| v.to_string())
            .collect()
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The model's name.
    pub name: String,
    /// The version, empty for a model with no loaded or failed version.
    pub version: String,
    /// `READY`, or `UNAVAILABLE` (with `reason`).
    pub state: &'static str,
    /// Why it is unavailable (`unloaded`, or its load failure).
    pub reason: String,
}

/// The loaded repository, its families and their executors.
pub struct Runtime {
    engines: Engines,
    /// The GPUs found at startup.
    gpus: Gpus,
    config: ServerConfig,
    models: RwLock<HashMap<String, ModelVersions>>,
    /// Live shared families by group key (see [`loader`]); a family dies with
    /// its last member.
    families: Mutex<HashMap<String, Weak<Family>>>,
    /// Every executor thread started; each stops when its family dies.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// One model control operation at a time.
    control: Mutex<()>,
}

impl Runtime {
    /// Loads ONNX Runtime, looks for GPUs (one log line), and loads every
    /// model of the repository in `config`. Fails when the engine cannot
    /// start, the repository cannot be read, or a model is placed on a GPU
    /// this machine does not have; other model failures are recorded per
    /// model.
    pub fn load(config: &ServerConfig) -> Result<Runtime, String> {
        let library = std::env::var_os("TICKSERVE_ONNXRUNTIME_LIBRARY")
            .map(Into::into)
            .unwrap_or_else(|| config.runtime.onnxruntime_library.clone());
        let engine = OrtEngine::new(
            &library,
            OrtOptions {
                intra_op_threads: config.runtime.intra_op_threads,
            },
        )?;
        let gpus = Gpus::probe();
        tracing::info!("devices: {}", gpus.describe());
        let engines = Engines {
            ort: engine,
            cuda: CudaEngine::new(CudaOptions {
                tf32: config.runtime.cuda_tf32,
            }),
        };
        settings::replicas(&config.model_defaults.devices, &gpus)
            .map_err(|e| format!("model_defaults.devices: {e}"))?;
        let runtime = Runtime {
            engines,
            gpus,
            config: config.clone(),
            models: RwLock::new(HashMap::new()),
            families: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            control: Mutex::new(()),
        };
        let found = repository::scan(&config.repository.path)?;
        // A model placed on a GPU that is not there stops the start: the
        // operator asked for hardware this machine lacks.
        let misplaced: Vec<String> = found
            .iter()
            .filter_map(|entry| {
                let config = entry.config.as_ref().ok()?;
                let devices = config.devices.as_ref()?;
                settings::replicas(devices, &runtime.gpus)
                    .err()
                    .map(|e| format!("model {}: {e}", entry.name))
            })
            .collect();
        if !misplaced.is_empty() {
            return Err(misplaced.join("; "));
        }
        let mut models: HashMap<String, ModelVersions> = HashMap::new();
        let mut candidates = Vec::new();
        for entry in found {
            let slot = models.entry(entry.name.clone()).or_default();
            match runtime.candidates_of(entry) {
                Ok(mut versions) => candidates.append(&mut versions),
                Err(reason) => slot.error = Some(reason),
            }
        }
        for ((name, version), state) in versions_of(runtime.loader().load(candidates)) {
            models
                .entry(name)
                .or_default()
                .versions
                .insert(version, state);
        }
        *runtime.write_models() = models;
        Ok(runtime)
    }

    fn loader(&self) -> Loader<'_> {
        Loader {
            engines: &self.engines,
            defaults: &self.config.model_defaults,
            families: &self.families,
            threads: &self.threads,
            inline_budget: self.config.runtime.inline_budget,
        }
    }

    fn read_models(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, ModelVersions>> {
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_models(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, ModelVersions>> {
        self.models.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Every model, by name (sorted), as it stands now.
    pub fn models(&self) -> BTreeMap<String, ModelVersions> {
        self.read_models()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every ready model version, by model name then version.
    pub fn ready_handles(&self) -> Vec<Arc<ModelHandle>> {
        self.models()
            .into_values()
            .flat_map(|m| {
                m.versions.into_values().filter_map(|s| match s {
                    VersionState::Ready(h) => Some(h),
                    VersionState::Failed(_) => None,
                })
            })
            .collect()
    }

    /// True when every model version loaded.
    pub fn all_ready(&self) -> bool {
        self.read_models().values().all(|m| {
            m.error.is_none()
                && m.versions
                    .values()
                    .all(|s| matches!(s, VersionState::Ready(_)))
        })
    }

    /// The model version asked for (`None`: the default), ready to serve.
    pub fn model(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        let not_found = |known: String| Error::ModelNotFound {
            model: name.to_string(),
            version: version.map(str::to_string),
            known,
        };
        let models = self.read_models();
        let entry = models.get(name).ok_or_else(|| not_found(String::new()))?;
        let found = match version {
            None | Some("") => entry.default_version(),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .and_then(|n| entry.versions.get_key_value(&n).map(|(k, s)| (*k, s))),
        };
        match found {
            Some((_, VersionState::Ready(handle))) => Ok(Arc::clone(handle)),
            Some((v, VersionState::Failed(reason))) => Err(Error::ModelNotReady {
                model: name.to_string(),
                version: v.to_string(),
                reason: format!("its load failed: {reason}"),
            }),
            None => match &entry.error {
                Some(reason) => Err(Error::ModelNotReady {
                    model: name.to_string(),
                    version: version.unwrap_or("default").to_string(),
                    reason: format!("its load failed: {reason}"),
                }),
                None => {
                    let versions: Vec<String> = entry.versions.keys().map(u64::to_string).collect();
                    Err(not_found(format!("versions: {}", versions.join(", "))))
                }
            },
        }
    }

    /// The metrics label for a model name: the name if such a model is
    /// loaded, `_unknown` otherwise (clients cannot grow label sets).
    pub fn model_label(&self, name: &str) -> String {
        if self.read_models().contains_key(name) {
            name.to_string()
        } else {
            "_unknown".to_string()
        }
    }

    /// The error for an input whose datatype string tickserve does not know
    /// (`FP16`, `BYTES`, a typo), naming the datatype the model expects.
    pub fn datatype_error(&self, model: &str, input: &str, got: &str) -> Error {
        let expected = self
            .model(model, None)
            .ok()
            .and_then(|h| {
                h.signature
                    .inputs
                    .iter()
                    .find(|t| t.name == input)
                    .map(|t| format!("datatype {}", t.datatype))
            })
            .unwrap_or_else(|| {
                let all: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
                format!("one of the datatypes tickserve serves ({})", all.join(", "))
            });
        Error::input(model, input, expected, got)
    }

    /// Validates `request`, runs it on an idle executor or queues it for its
    /// family's executors, and awaits the answer.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, Error> {
        let handle = self.model(&request.model, request.version.as_deref())?;
        let valid = validate(&request, &handle.signature, &handle.settings.limits)?;
        let admitted = Instant::now();
        let deadline = request
            .deadline
            .or_else(|| handle.settings.default_timeout.map(|t| admitted + t));
        let replica = handle.route();
        let family = &replica.family;
        // Latency first: an idle executor with nothing queued (for any member)
        // runs the request right here, on the caller's thread, with no thread
        // handoff (about 45 µs of wake-ups saved on loopback; README,
        // "Performance"). Queued requests keep their turn: with anything
        // queued, this one queues too. Only requests whose bucket ran within
        // the inline budget at load run here, so an async worker (serving
        // other connections meanwhile) is never held for long; GPU families
        // keep all their work on their executor threads.
        if valid.rows <= family.inline_rows && family.queued_rows() == 0 {
            for executor in &family.executors {
                if let Ok(mut executor) = executor.try_lock() {
                    executor.forget_retired();
                    return executor.answer(
                        &replica.member,
                        &valid,
                        request.id,
                        admitted,
                        deadline,
                    );
                }
            }
        }
        let rows = valid.rows;
        handle
            .stats
            .queue
            .admit(rows, handle.settings.max_queue_rows)
            .map_err(|queued| Error::QueueFull {
                model: handle.name.clone(),
                queued,
                rows,
                limit: handle.settings.max_queue_rows,
            })?;
        family.queued.fetch_add(rows, Ordering::AcqRel);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            member: Arc::clone(&replica.member),
            request: valid,
            id: request.id,
            admitted,
            deadline,
            reply,
        };
        // Admission bounded the queue; only a stopped executor refuses the send.
        if !family.send(job) {
            handle.stats.queue.leave(rows);
            family.queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::ModelNotReady {
                model: handle.name.clone(),
                version: handle.version.clone(),
                reason: "its executors have stopped".to_string(),
            });
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Internal {
                model: handle.name.clone(),
                message: "the executor dropped the request".to_string(),
            })
        })
    }

    /// The repository index: every model directory, and each loaded or
    /// failed version with its state.
    pub fn index(&self) -> Result<Vec<IndexEntry>, String> {
        let on_disk = repository::scan(&self.config.repository.path)?;
        let models = self.models();
        let mut index = Vec::new();
        let mut names: Vec<&str> = on_disk.iter().map(|m| m.name.as_str()).collect();
        names.extend(models.keys().map(String::as_str));
        names.sort_unstable();
        names.dedup();
        for name in names {
            let Some(model) = models.get(name) else {
                index.push(IndexEntry {
                    name: name.to_string(),
                    version: String::new(),
                    state: "UNAVAILABLE",
                    reason: "unloaded".to_string(),
                });
                continue;
            };
            if let Some(reason) = &model.error {
                index.push(IndexEntry {
                    name: name.to_string(),
                    version: String::new(),
                    state: "UNAVAILABLE",
                    reason: reason.clone(),
                });
            }
            for (version, state) in &model.versions {
                let (state, reason) = match state {
                    VersionState::Ready(_) => ("READY", String::new()),
                    VersionState::Failed(reason) => ("UNAVAILABLE", reason.clone()),
                };
                index.push(IndexEntry {
                    name: name.to_string(),
                    version: version.to_string(),
                    state,
                    reason,
                });
            }
        }
        Ok(index)
    }

    /// Loads (or reloads) model `name` from the repository while serving.
    /// A member of a loaded family compiles nothing. If any version fails, the
    /// versions that served before keep serving and the error says why.
    /// Blocking: call it off the async threads.
    pub fn load_model(&self, name: &str) -> Result<(), Error> {
        let _control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let failed = |reason: String| Error::LoadFailed {
            model: name.to_string(),
            reason,
        };
        let entry = repository::scan_one(&self.config.repository.path, name).ok_or_else(|| {
            Error::ModelNotFound {
                model: name.to_string(),
                version: None,
                known: format!(
                    "no directory {name} in the repository {}",
                    self.config.repository.path.display()
                ),
            }
        })?;
        let candidates = self.candidates_of(entry).map_err(failed)?;
        let outcomes = versions_of(self.loader().load(candidates));
        let failures: Vec<String> = outcomes
            .iter()
            .filter_map(|((_, version), state)| match state {
                VersionState::Failed(e) => Some(format!("version {version}: {e}")),
                VersionState::Ready(_) => None,
            })
            .collect();
        let mut versions = ModelVersions::default();
        let failed_load = !failures.is_empty();
        let mut models = self.write_models();
        if failed_load && models.contains_key(name) {
            // What loaded of the new versions drops with `outcomes`; what
            // served before stays.
            drop(models);
            drop(outcomes);
            tracing::warn!(model = name, failures = ?failures, "load failed; the loaded versions keep serving");
            return Err(failed(failures.join("; ")));
        }
        for ((_, version), state) in outcomes {
            versions.versions.insert(version, state);
        }
        let old = models.insert(name.to_string(), versions);
        drop(models);
        if let Some(old) = old {
            self.mark_gone(name, &old);
        }
        if failed_load {
            tracing::warn!(model = name, failures = ?failures, "load failed");
            return Err(failed(failures.join("; ")));
        }
        tracing::info!(model = name, "loaded");
        Ok(())
    }

    /// Unloads model `name`: it stops taking requests at once; requests
    /// already admitted are answered, then its weights (and, for its
    /// family's last member, the compiled graph) are freed.
    pub fn unload_model(&self, name: &str) -> Result<(), Error> {
        let _control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let removed = self.write_models().remove(name);
        match removed {
            Some(old) => {
                self.mark_gone(name, &old);
                tracing::info!(model = name, "unloaded");
                Ok(())
            }
            None if repository::scan_one(&self.config.repository.path, name).is_some() => Ok(()),
            None => Err(Error::ModelNotFound {
                model: name.to_string(),
                version: None,
                known: String::new(),
            }),
        }
    }

    /// Sets the readiness metrics of versions that left the map to 0, unless
    /// the same version serves again.
    fn mark_gone(&self, name: &str, old: &ModelVersions) {
        let now = self.read_models();
        for version in old.versions.keys() {
            let serving = now
                .get(name)
                .is_some_and(|m| matches!(m.versions.get(version), Some(VersionState::Ready(_))));
            if !serving {
                let v = version.to_string();
                metrics::gauge!(names::MODEL_READY, "model" => name.to_string(), "version" => v.clone())
                    .set(0.0);
                if let Some(VersionState::Ready(h)) = old.versions.get(version) {
                    metrics::gauge!(names::MODEL_INFO, "model" => name.to_string(),
                        "version" => v, "family" => h.family.clone())
                    .set(0.0);
                }
            }
        }
    }

    /// Stops every executor after it finishes its queue, and waits for them.
    /// Handles still held elsewhere answer UNAVAILABLE from then on.
    pub fn shutdown(self) {
        for handle in self.ready_handles() {
            for replica in &handle.replicas {
                replica.family.close();
            }
        }
        let Runtime {
            models,
            families,
            threads,
            ..
        } = self;
        drop(models);
        drop(families);
        let threads = threads.into_inner().unwrap_or_else(|p| p.into_inner());
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Runtime {
    /// The candidates for every version of one model directory: one per
    /// version and replica.
    fn candidates_of(&self, entry: repository::ModelDir) -> Result<Vec<Candidate>, String> {
        let config = entry.config?;
        if entry.versions.is_empty() {
            return Err(format!(
                "no version directories: expected {}/<version>/model.onnx",
                entry.dir.display()
            ));
        }
        let placements = config
            .devices
            .as_ref()
            .unwrap_or(&self.config.model_defaults.devices);
        let devices = settings::replicas(placements, &self.gpus)?;
        let mut candidates = Vec::with_capacity(entry.versions.len() * devices.len());
        for (version, onnx_path) in entry.versions {
            let stats = Arc::new(OnceLock::new());
            for (replica, &device) in devices.iter().enumerate() {
                candidates.push(Candidate {
                    name: entry.name.clone(),
                    version,
                    onnx_path: onnx_path.clone(),
                    config: config.clone(),
                    replica,
                    device,
                    stats: Arc::clone(&stats),
                });
            }
        }
        Ok(candidates)
    }
}

/// The loaded (or failed) versions from the outcomes of their replicas, by
/// model name and version, with their readiness metrics set. A version is
/// ready when every replica loaded.
fn versions_of(outcomes: Vec<loader::Outcome>) -> BTreeMap<(String, u64), VersionState> {
    let mut by_version: BTreeMap<(String, u64), Vec<loader::Outcome>> = BTreeMap::new();
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
            let state = version_state(&name, version, replicas);
            ((name, version), state)
        })
        .collect()
}

/// One version's state from its replicas' outcomes.
fn version_state(name: &str, version: u64, replicas: Vec<loader::Outcome>) -> VersionState {
    let version = version.to_string();
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
    let state = match (failure, joined.first()) {
        (None, Some(first)) => {
            let devices: Vec<String> = joined.iter().map(|j| j.family.device.clone()).collect();
            let loaded = Loaded {
                signature: first.signature.clone(),
                settings: first.settings.clone(),
                family: first.family.key.clone(),
                shared: first.family.shared,
                device: devices.join(","),
                load_time: joined.iter().map(|j| j.load_time).max().unwrap_or_default(),
                stats: Arc::clone(&first.member.stats),
            };
            metrics::gauge!(names::MODEL_INFO, "model" => name.to_string(),
                "version" => version.clone(), "family" => loaded.family.clone())
            .set(1.0);
            VersionState::Ready(Arc::new(ModelHandle {
                name: name.to_string(),
                version: version.clone(),
                loaded,
                replicas: joined
                    .into_iter()
                    .map(|j| Replica {
                        member: Arc::new(j.member),
                        family: j.family,
                    })
                    .collect(),
                next_replica: AtomicUsize::new(0),
            }))
        }
        (Some(reason), _) => VersionState::Failed(reason),
        (None, None) => VersionState::Failed("no replica loaded".to_string()),
    };
    let ready = matches!(state, VersionState::Ready(_));
    metrics::gauge!(names::MODEL_READY, "model" => name.to_string(), "version" => version)
        .set(if ready { 1.0 } else { 0.0 });
    state
}
