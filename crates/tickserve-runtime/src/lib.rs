//! The model runtime: loads the model repository into families, runs each
//! family's executors, answers inference requests for the front ends, and
//! loads and unloads models while serving (the repository extension).
//!
//! The crate is a ladder; each module uses only those below it:
//!
//! | module | its one job |
//! | --- | --- |
//! | `stats` | Triton-style statistics per model version |
//! | `affinity` | pinning a thread to a CPU |
//! | `admission` | rows waiting per model version and per family, and each request's ticket |
//! | `member` | a model version inside a family: identity, stats, metrics, retirement |
//! | `batcher` | the batching policy, a plain struct tested on explicit instants |
//! | `job` | one admitted request's envelope |
//! | `executor` | a compiled model on one device, and the bucket runs |
//! | `settings` | a model's effective settings |
//! | `engines` | the engines, and the choice of one per replica (the only code serving with ONNX Runtime or CUDA) |
//! | `error` | what the facade answers when it cannot start, read its repository or write its sequence snapshot (`RuntimeError`) |
//! | `worker` | an executor thread: compile, time the inline budget, serve batches from the intake |
//! | `family` | a compiled graph on its executors and its queue; `submit` runs at once or admits |
//! | `gather` | a front-end thread's round, passed with its requests: they park in it as the thread polls them, then run together on an idle executor on that thread |
//! | `repository` | the repository on disk |
//! | `monte_carlo` | a request's Monte Carlo plan, its noisy copies and the answer's summary |
//! | `sequences` | a stateful model's sequences: their table and turns, the state gathered into a tick and scattered back (`state`), the snapshot written at shutdown and read back at start (`snapshot`), a tick's new state held until its answer may go (`held`), the table's place in a fleet of replicas: ownership and hand-over through its store (`fleet`) |
//! | `shadow` | a shadow version: which requests it mirrors, its runs on idle capacity, the comparison |
//! | `handle` | the handle a request is served through: `prepare` and `run` |
//! | `registry` | every model's versions and their states, the index |
//! | `loader` | loading many versions into families in parallel |
//! | `poll` | the repository poll: what changed on disk, once two reads agree |
//! | `update` | changing a model while it serves: load and warm, switch, retire; its labels |
//! | `cuda_reference` | `tickserve check --cuda-reference`: the CUDA importer's plan against ONNX Runtime, model by model |
//! | this file | the [`Runtime`] facade |
//!
//! A request's way: the edge looks its model up once ([`Runtime::model`]),
//! then [`ModelHandle::prepare`] validates it and [`ModelHandle::run`] picks the replica with the
//! shortest queue and calls `Family::submit`, which runs it at once on an
//! idle executor or admits it to the family's queue; an executor thread
//! (`worker`) takes it out in a batch and its `Executor` answers. The
//! modules are private; what other crates use is re-exported here.

mod admission;
mod affinity;
mod batcher;
pub mod cuda_reference;
mod draw;
pub mod engine_check;
mod engines;
#[doc(hidden)]
pub use engines::fuzz_import;
mod error;
mod executor;
mod family;
pub mod gather;
mod handle;
mod job;
mod loader;
mod member;
mod monte_carlo;
mod poll;
mod registry;
mod repository;
mod sequences;
mod settings;
mod shadow;
mod stats;
mod update;
mod worker;

pub use crate::admission::ModelQueue;
pub use crate::affinity::{first_unavailable_cpu, pin_current_thread};
pub use crate::engines::Engines;
pub use crate::poll::{Poller, Prints};
pub use crate::sequences::{SequenceState, SequenceSummary, Sequences};
pub use crate::stats::Stat;

/// The runtime's inner parts, for its own integration tests (a test engine
/// wrapped around ONNX Runtime drives an executor by hand); not an API.
#[doc(hidden)]
pub mod testing {
    pub use crate::admission::{FamilyRows, Ticket};
    pub use crate::executor::{Executor, FamilyLinks};
    pub use crate::job::{Job, Submission};
    pub use crate::member::{Member, RetiredLog, Version};
    pub use crate::sequences::snapshot::read_for_fuzzing as read_snapshot;
}

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use tickserve_core::config::{Labels, ModelConfig, ServerConfig};
use tickserve_core::{Error, InferRequest, InferResponse};

pub use crate::error::RuntimeError;
use crate::family::Family;
pub use crate::handle::{Loaded, ModelHandle, Prepared, ReplicaInfo};
use crate::loader::{Candidate, Loader, versions_of};
pub use crate::registry::{IndexEntry, ModelVersions, Models, Routed, Split, VersionState};
pub use crate::sequences::HeldState;
pub use crate::settings::ModelSettings;
pub use crate::shadow::{Compared, ShadowPlan, compare};
pub use crate::stats::ModelStats;
use crate::update::Reload;
pub use tickserve_core::Device;

/// The loaded repository, its families and their executors.
pub struct Runtime {
    engines: Engines,
    config: ServerConfig,
    models: Models,
    /// Live shared families by group key (see [`loader`]); a family dies with
    /// its last member.
    families: Mutex<HashMap<String, Weak<Family>>>,
    /// Every executor thread started; each stops when its family dies.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// One model control operation at a time.
    control: Mutex<()>,
    /// Executor threads started, for `runtime.executor_cpus`.
    executors_started: std::sync::atomic::AtomicUsize,
    /// The repository as it was read for the first load (for the poll).
    loaded_from: Prints,
}

/// The stateful models among `handles`, as a sequence snapshot files them.
fn held(handles: &[Arc<ModelHandle>]) -> Vec<sequences::snapshot::Held<'_>> {
    handles
        .iter()
        .filter_map(|h| {
            h.sequences().map(|s| sequences::snapshot::Held {
                name: &h.name,
                version: &h.version,
                sequences: s,
            })
        })
        .collect()
}

/// Moves a reloaded model's sequences from its old versions into the new
/// ones whose state pairs and windows are unchanged, so that a reload does not end them.
/// (A tick that was running on the old version as it was replaced finishes
/// there: its state change is not carried.)
fn carry_sequences(old: &ModelVersions, new: &ModelVersions) {
    for (version, state) in &old.versions {
        let (VersionState::Ready(before), Some(VersionState::Ready(after))) =
            (state, new.versions.get(version))
        else {
            continue;
        };
        if let (Some(from), Some(to)) = (before.sequences(), after.sequences())
            && from.spec().states == to.spec().states
            && from.spec().windows == to.spec().windows
        {
            let carried = to.restore(from.snapshot());
            if carried > 0 {
                tracing::info!(model = %after.name, version = %after.version, sequences = carried,
                    "sequences carried over the reload");
            }
        }
    }
}

impl Runtime {
    /// Starts the engines (loads ONNX Runtime, looks for GPUs) and loads
    /// every model of the repository in `config`. Fails when an engine cannot
    /// start, the repository cannot be read, or a model is placed on a GPU
    /// this machine does not have; other model failures are recorded per
    /// model.
    pub fn load(config: &ServerConfig) -> Result<Runtime, RuntimeError> {
        let engines = Engines::start(config).map_err(RuntimeError::Engine)?;
        Runtime::load_with(config, engines)
    }

    /// [`Runtime::load`] on engines of the caller's choosing (tests wrap an
    /// engine to inject faults).
    pub fn load_with(config: &ServerConfig, engines: Engines) -> Result<Runtime, RuntimeError> {
        engines
            .replicas(&config.model_defaults.devices)
            .map_err(|e| RuntimeError::Placement(format!("model_defaults.devices: {e}")))?;
        let runtime = Runtime {
            engines,
            config: config.clone(),
            models: Models::default(),
            families: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            control: Mutex::new(()),
            executors_started: std::sync::atomic::AtomicUsize::new(0),
            loaded_from: poll::prints(&config.repository),
        };
        let found = repository::scan(&config.repository).map_err(RuntimeError::Repository)?;
        // A model placed on a GPU that is not there stops the start: the
        // operator asked for hardware this machine lacks.
        let misplaced: Vec<String> = found
            .iter()
            .filter_map(|entry| {
                let config = entry.config.as_ref().ok()?;
                let devices = config.devices.as_ref()?;
                runtime
                    .engines
                    .replicas(devices)
                    .err()
                    .map(|e| format!("model {}: {e}", entry.name))
            })
            .collect();
        if !misplaced.is_empty() {
            return Err(RuntimeError::Placement(misplaced.join("; ")));
        }
        let mut models: HashMap<String, ModelVersions> = HashMap::new();
        let mut candidates = Vec::new();
        for entry in &found {
            let slot = models.entry(entry.name.clone()).or_default();
            let chosen = entry.config.as_ref().map_err(String::clone).and_then(|c| {
                let versions = update::wanted(entry, c)?;
                runtime.candidates_of(&entry.name, &entry.dir, c, versions)
            });
            match chosen {
                Ok(mut versions) => candidates.append(&mut versions),
                Err(reason) => slot.error = Some(reason),
            }
        }
        let loaded = runtime.linked(versions_of(
            runtime.loader().load(candidates),
            &runtime.config.clock,
        ));
        for ((name, version), state) in loaded {
            models
                .entry(name)
                .or_default()
                .versions
                .insert(version, state);
        }
        for entry in &found {
            if let (Ok(config), Some(model)) = (&entry.config, models.get_mut(&entry.name)) {
                update::settle_names(&entry.name, config, &entry.labels, &Labels::new(), model);
            }
        }
        runtime.models.set_all(models);
        if let Some(path) = &runtime.config.runtime.sequence_snapshot {
            let handles = runtime.models.ready_handles();
            match sequences::snapshot::restore(path, &held(&handles)) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(sequences = n, file = %path.display(), "sequences restored")
                }
                Err(e) => tracing::warn!(error = %e, "sequence snapshot not restored"),
            }
        }
        Ok(runtime)
    }

    /// `states` with every stateful version's sequences linked to the fleet
    /// the process joined, if it did; a version whose state the fleet's
    /// store cannot carry fails, saying so.
    fn linked(
        &self,
        states: BTreeMap<(String, u64), VersionState>,
    ) -> BTreeMap<(String, u64), VersionState> {
        let Some(fleet) = &self.config.joined else {
            return states;
        };
        let wait = self
            .config
            .fleet
            .as_ref()
            .map_or(Duration::from_secs(5), |f| f.handoff_wait);
        states
            .into_iter()
            .map(|(at, state)| {
                let joined = match &state {
                    VersionState::Ready(handle) => handle.sequences().map(|sequences| {
                        sequences.join_fleet(Arc::clone(fleet), &handle.version, wait)
                    }),
                    VersionState::Failed(_) => None,
                };
                match joined {
                    Some(Err(reason)) => (at, VersionState::Failed(reason)),
                    _ => (at, state),
                }
            })
            .collect()
    }

    /// Answers another replica's request for sequence `key` of version
    /// `version` (see `tickserve_fleet`): hands it over once its earlier
    /// requests are answered. True if handed over.
    pub async fn hand_over_asked(
        &self,
        key: &tickserve_core::fleet::FleetKey,
        version: &str,
    ) -> bool {
        let Ok(handle) = self
            .models
            .route(&key.model, Some(version))
            .map(|r| r.handle)
        else {
            return false;
        };
        let (Some(sequences), Some(sequence)) =
            (handle.sequences(), sequences::parse_key_text(&key.key))
        else {
            return false;
        };
        match sequences.hand_over_asked(&sequence).await {
            Ok(handed) => handed,
            Err(e) => {
                tracing::warn!(model = key.model, error = %e, "a sequence asked for was not handed over");
                false
            }
        }
    }

    /// Hands every sequence over, model by model (at a drain, once no new
    /// request is admitted); returns how many.
    pub async fn hand_over_all(&self) -> usize {
        let mut handed = 0;
        for handle in self.models.ready_handles() {
            if let Some(sequences) = handle.sequences() {
                handed += sequences.hand_over_all().await;
            }
        }
        handed
    }

    /// Writes every stateful model's sequences to `runtime.sequence_snapshot`,
    /// if set (call it once no request runs: after the drain). Returns how
    /// many sequences it wrote.
    pub fn write_sequence_snapshot(&self) -> Result<usize, RuntimeError> {
        match &self.config.runtime.sequence_snapshot {
            None => Ok(0),
            Some(path) => sequences::snapshot::write(path, &held(&self.models.ready_handles()))
                .map_err(RuntimeError::Snapshot),
        }
    }

    /// A repository poll that starts from what the first load read
    /// (`security.model_control_mode = "poll"`; see [`Runtime::poll_repository`]).
    pub fn poller(&self) -> Poller {
        Poller::new(self.loaded_from.clone())
    }

    fn loader(&self) -> Loader<'_> {
        Loader {
            engines: &self.engines,
            defaults: &self.config.model_defaults,
            families: &self.families,
            threads: &self.threads,
            inline_budget: self.config.runtime.inline_budget,
            spin: self.config.runtime.spin,
            cpu_engine: self.config.runtime.cpu_engine,
            gpu_mode: self.config.runtime.gpu_mode,
            executor_cpus: &self.config.runtime.executor_cpus,
            compile_idle: self.config.runtime.compile_priority
                == tickserve_core::config::CompilePriority::Idle,
            executors_started: &self.executors_started,
        }
    }

    /// Every model, by name (sorted), as it stands now.
    pub fn models(&self) -> BTreeMap<String, ModelVersions> {
        self.models.all()
    }

    /// Every ready model version, by model name then version.
    pub fn ready_handles(&self) -> Vec<Arc<ModelHandle>> {
        self.models.ready_handles()
    }

    /// Runs every ready model once on this thread (see
    /// [`ModelHandle::warm_here`]).
    pub fn warm_here(&self) {
        for handle in self.ready_handles() {
            handle.warm_here();
        }
    }

    /// True when every model version loaded and can run.
    pub fn all_ready(&self) -> bool {
        self.models.all_ready()
    }

    /// Brings `tickserve_model_ready` up to date with the families' health,
    /// and ends every sequence idle past its model's `max_sequence_idle`
    /// (called before each metrics scrape).
    pub fn refresh_readiness(&self) {
        self.models.refresh_readiness();
    }

    /// The model version asked for (`None`: the default), ready to serve:
    /// the one lookup a request makes.
    pub fn model(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        self.models.get(name, version)
    }

    /// [`Runtime::model`], whether the model's `[split]` drew the version
    /// (count it with [`ModelHandle::count_routed`] once the request is sent
    /// there), and the version's shadows.
    pub fn route(&self, name: &str, version: Option<&str>) -> Result<Routed, Error> {
        self.models.route(name, version)
    }

    /// For a request of `sequence` that named no version: the version that
    /// serves the sequence (see `Models::for_sequence`); `None` when the
    /// version looked up serves it.
    pub fn model_for_sequence(
        &self,
        name: &str,
        sequence: &tickserve_core::sequence::SequenceControl,
    ) -> Option<Arc<ModelHandle>> {
        self.models.for_sequence(name, sequence)
    }

    /// The metrics label for a model name: the name if such a model is
    /// known, `_unknown` otherwise (clients cannot grow label sets).
    pub fn model_label(&self, name: &str) -> String {
        if self.models.contains(name) {
            name.to_string()
        } else {
            "_unknown".to_string()
        }
    }

    /// Looks `request`'s model up and answers it (see [`ModelHandle::infer`];
    /// front ends that have the handle already call that).
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, Error> {
        let handle = self.model(&request.model, request.version.as_deref())?;
        handle.infer(request.request).await
    }

    /// [`Runtime::infer`], run with the requests of front-end round `round`
    /// while it is open ([`gather`]).
    pub async fn infer_in(
        &self,
        request: InferRequest,
        round: &gather::Round,
    ) -> Result<InferResponse, Error> {
        let handle = self.model(&request.model, request.version.as_deref())?;
        let mut prepared = handle.prepare(request.request)?;
        prepared.gather_in(round);
        handle.run(prepared).await
    }

    /// The repository index: every model directory, and each loaded or
    /// failed version with its state.
    pub fn index(&self) -> Result<Vec<IndexEntry>, RuntimeError> {
        let on_disk =
            repository::scan(&self.config.repository).map_err(RuntimeError::Repository)?;
        Ok(self.models.index(&on_disk))
    }

    /// Loads (or reloads) model `name` from the repository while serving.
    /// A member of a loaded family compiles nothing. If any version fails, the
    /// versions that served before keep serving and the error says why.
    /// Blocking: call it off the async threads.
    pub fn load_model(&self, name: &str) -> Result<(), Error> {
        let _control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let dir = repository::scan_one(&self.config.repository, name).ok_or_else(|| {
            Error::ModelNotFound {
                model: name.to_string(),
                version: None,
                known: format!("no directory {name} in the model repository"),
            }
        })?;
        self.update_model(dir, &Reload::All)
    }

    /// Unloads model `name`: it stops taking requests at once; requests
    /// already admitted are answered, then its weights (and, for its
    /// family's last member, the compiled graph) are freed.
    pub fn unload_model(&self, name: &str) -> Result<(), Error> {
        let _control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        self.unload_locked(name)
    }

    /// [`Runtime::unload_model`], the control lock held.
    fn unload_locked(&self, name: &str) -> Result<(), Error> {
        match self.models.remove(name) {
            Some(old) => {
                let gone = self.models.mark_gone(name, &old);
                metrics::counter!(tickserve_core::metrics::MODEL_UNLOADS, "model" => name.to_string())
                    .increment(gone);
                tracing::info!(model = name, "unloaded");
                Ok(())
            }
            None if repository::scan_one(&self.config.repository, name).is_some() => Ok(()),
            None => Err(Error::ModelNotFound {
                model: name.to_string(),
                version: None,
                known: String::new(),
            }),
        }
    }

    /// What this process computes predictions on ([`Engines::machine`]).
    pub fn machine(&self) -> std::collections::BTreeMap<String, String> {
        self.engines.machine(self.config.runtime.intra_op_threads)
    }

    /// Stops every executor after it finishes its queue, and waits for them.
    /// Handles still held elsewhere answer UNAVAILABLE from then on.
    pub fn shutdown(self) {
        self.models.close_all();
        let Runtime {
            families, threads, ..
        } = self;
        drop(families);
        let threads = threads.into_inner().unwrap_or_else(|p| p.into_inner());
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// The candidates for `versions` of model `name`: one per version and
    /// replica.
    fn candidates_of(
        &self,
        name: &str,
        dir: &std::path::Path,
        config: &ModelConfig,
        versions: Vec<(u64, PathBuf)>,
    ) -> Result<Vec<Candidate>, String> {
        let placements = config
            .devices
            .as_ref()
            .unwrap_or(&self.config.model_defaults.devices);
        let devices = self.engines.replicas(placements)?;
        let mut candidates = Vec::with_capacity(versions.len() * devices.len());
        for (version, onnx_path) in versions {
            let shared_by_replicas = Arc::new(OnceLock::new());
            for (replica, placed) in devices.iter().enumerate() {
                candidates.push(Candidate {
                    name: name.to_string(),
                    version,
                    model_dir: dir.to_path_buf(),
                    onnx_path: onnx_path.clone(),
                    config: config.clone(),
                    replica,
                    device: placed.device,
                    auto: placed.auto,
                    shared_by_replicas: Arc::clone(&shared_by_replicas),
                });
            }
        }
        Ok(candidates)
    }
}
