//! The model runtime: loads the model repository, runs one executor per model
//! version, and answers inference requests for the front ends.
//!
//! [`Runtime::load`] scans the repository (Triton layout), starts an executor
//! thread per version (each compiles its own model, in parallel), and collects
//! the outcomes: a broken model is recorded with its reason and the others
//! serve. [`Runtime::infer`] validates a request at the edge, admits it to the
//! model's bounded queue (a full queue answers at once), and awaits the answer.

pub mod executor;
pub mod gather;
pub mod repository;
pub mod settings;
pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tickserve_core::config::ServerConfig;
use tickserve_core::validate::validate;
use tickserve_core::{DataType, Error, InferRequest, InferResponse, metrics as names};
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tokio::sync::oneshot;

pub use crate::executor::Loaded;
use crate::executor::{Executor, Intake, Job, LoadSpec};
pub use crate::settings::ModelSettings;
pub use crate::stats::ModelStats;

/// A model version that is ready to serve.
#[derive(Debug)]
pub struct ModelHandle {
    /// The model's name.
    pub name: String,
    /// The version, as the protocol spells it.
    pub version: String,
    /// What its executors reported at load: signature, settings, family,
    /// device, load time, statistics (also reached through `Deref`).
    pub loaded: Loaded,
    /// The executor's queue. Sent to by [`Runtime::infer`], received by the
    /// executor thread; dropping every sender stops the thread.
    queue: Sender<Job>,
    /// The executors: each locked by its own thread for each batch, and by a
    /// caller that finds it idle with nothing queued, to run at once.
    executors: Vec<Arc<Mutex<Executor>>>,
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

/// The loaded repository and its executors.
pub struct Runtime {
    models: HashMap<String, ModelVersions>,
    executors: Vec<JoinHandle<()>>,
}

impl Runtime {
    /// Loads ONNX Runtime and every model of the repository in `config`.
    /// Fails only when the engine itself cannot start; model failures are
    /// recorded per model.
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
        let found = repository::scan(&config.repository.path)?;
        let mut models: HashMap<String, ModelVersions> = HashMap::new();
        let mut pending = Vec::new();
        let mut executors = Vec::new();
        for entry in found {
            let slot = models.entry(entry.name.clone()).or_default();
            let model_config = match entry.config {
                Ok(c) => c,
                Err(e) => {
                    slot.error = Some(e);
                    continue;
                }
            };
            if entry.versions.is_empty() {
                slot.error = Some(format!(
                    "no version directories: expected {}/<version>/model.onnx",
                    entry.dir.display()
                ));
            }
            // Settings that shape the queue come from configuration alone; each
            // executor resolves the rest (the NaN default) from the ONNX file.
            let queue_settings =
                match ModelSettings::resolve(&model_config, &config.model_defaults, false) {
                    Ok(s) => s,
                    Err(e) => {
                        slot.error = Some(e);
                        continue;
                    }
                };
            for (version, onnx_path) in entry.versions {
                let spec = LoadSpec {
                    name: entry.name.clone(),
                    version,
                    onnx_path,
                    config: model_config.clone(),
                    defaults: config.model_defaults.clone(),
                };
                // Unbounded as a channel (it allocates as it fills): the bound is
                // the admission check on rows in `infer`.
                let (queue_tx, queue_rx) = std::sync::mpsc::channel();
                let intake = Arc::new(Mutex::new(Intake::new(
                    queue_rx,
                    queue_settings.buckets.largest(),
                    queue_settings.max_queue_delay,
                )));
                let stats = Arc::new(ModelStats::new(
                    &entry.name,
                    queue_settings.buckets.sizes().len(),
                ));
                let mut reports = Vec::with_capacity(queue_settings.executors);
                let mut spawn_error = None;
                for index in 0..queue_settings.executors {
                    match executor::spawn(
                        spec.clone(),
                        engine.clone(),
                        Arc::clone(&stats),
                        Arc::clone(&intake),
                        index,
                    ) {
                        Ok((thread, report)) => {
                            executors.push(thread);
                            reports.push(report);
                        }
                        Err(e) => spawn_error = Some(format!("cannot start executor thread: {e}")),
                    }
                }
                pending.push((entry.name.clone(), version, queue_tx, reports, spawn_error));
            }
        }
        for (name, version, queue, reports, spawn_error) in pending {
            let mut loaded_executors = Vec::with_capacity(reports.len());
            let mut first = None;
            let mut failure = spawn_error;
            for report in reports {
                match report.recv() {
                    Ok(Ok((loaded, executor))) => {
                        loaded_executors.push(executor);
                        first.get_or_insert(loaded);
                    }
                    Ok(Err(reason)) => failure = Some(reason),
                    Err(_) => failure = Some("an executor thread stopped while loading".into()),
                }
            }
            // On failure `queue` drops here: the loaded executors see the channel
            // close and stop.
            let state = match (failure, first) {
                (None, Some(loaded)) => VersionState::Ready(Arc::new(ModelHandle {
                    name: name.clone(),
                    version: version.to_string(),
                    loaded,
                    queue,
                    executors: loaded_executors,
                })),
                (Some(reason), _) => VersionState::Failed(reason),
                (None, None) => VersionState::Failed("no executor loaded".into()),
            };
            if let VersionState::Ready(h) = &state {
                metrics::gauge!(names::MODEL_INFO, "model" => name.clone(),
                    "version" => version.to_string(), "family" => h.family.clone())
                .set(1.0);
            }
            let ready = matches!(state, VersionState::Ready(_));
            metrics::gauge!(names::MODEL_READY, "model" => name.clone(), "version" => version.to_string())
                .set(if ready { 1.0 } else { 0.0 });
            models
                .entry(name)
                .or_default()
                .versions
                .insert(version, state);
        }
        Ok(Runtime { models, executors })
    }

    /// Every model, by name (sorted).
    pub fn models(&self) -> BTreeMap<&str, &ModelVersions> {
        self.models.iter().map(|(k, v)| (k.as_str(), v)).collect()
    }

    /// Every ready model version, by model name then version.
    pub fn ready_handles(&self) -> impl Iterator<Item = &Arc<ModelHandle>> {
        self.models().into_values().flat_map(|m| {
            m.versions.values().filter_map(|s| match s {
                VersionState::Ready(h) => Some(h),
                VersionState::Failed(_) => None,
            })
        })
    }

    /// True when every model version loaded.
    pub fn all_ready(&self) -> bool {
        self.models.values().all(|m| {
            m.error.is_none()
                && m.versions
                    .values()
                    .all(|s| matches!(s, VersionState::Ready(_)))
        })
    }

    /// The model version asked for (`None`: the default), ready to serve.
    pub fn model(&self, name: &str, version: Option<&str>) -> Result<&Arc<ModelHandle>, Error> {
        let not_found = |known: String| Error::ModelNotFound {
            model: name.to_string(),
            version: version.map(str::to_string),
            known,
        };
        let entry = self
            .models
            .get(name)
            .ok_or_else(|| not_found(String::new()))?;
        let found = match version {
            None | Some("") => entry.default_version(),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .and_then(|n| entry.versions.get_key_value(&n).map(|(k, s)| (*k, s))),
        };
        match found {
            Some((_, VersionState::Ready(handle))) => Ok(handle),
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

    /// The metrics label for a model name: the name if the repository has
    /// such a model, `_unknown` otherwise (clients cannot grow label sets).
    pub fn model_label<'a>(&'a self, name: &str) -> &'a str {
        self.models
            .get_key_value(name)
            .map(|(k, _)| k.as_str())
            .unwrap_or("_unknown")
    }

    /// The error for an input whose datatype string tickserve does not know
    /// (`FP16`, `BYTES`, a typo), naming the datatype the model expects.
    pub fn datatype_error(&self, model: &str, input: &str, got: &str) -> Error {
        let expected = self
            .model(model, None)
            .ok()
            .and_then(|h| h.signature.inputs.iter().find(|t| t.name == input))
            .map(|t| format!("datatype {}", t.datatype))
            .unwrap_or_else(|| {
                let all: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
                format!("one of the datatypes tickserve serves ({})", all.join(", "))
            });
        Error::input(model, input, expected, got)
    }

    /// Validates `request`, queues it for its model's executor, and awaits the answer.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, Error> {
        let handle = self.model(&request.model, request.version.as_deref())?;
        let valid = validate(&request, &handle.signature, &handle.settings.limits)?;
        let admitted = Instant::now();
        let deadline = request
            .deadline
            .or_else(|| handle.settings.default_timeout.map(|t| admitted + t));
        // Latency first: an idle executor with nothing queued runs the request
        // right here, on the caller's thread, with no thread handoff (about 45 µs
        // of wake-ups saved on loopback; README, "Performance"). Queued requests
        // keep their turn: with anything queued, this one queues too. A request
        // that needs several bucket runs goes to the executor thread, so it does
        // not hold an async worker thread for long.
        if valid.rows <= handle.settings.buckets.largest() && handle.stats.queue.rows() == 0 {
            for executor in &handle.executors {
                if let Ok(mut executor) = executor.try_lock() {
                    return executor.answer(&valid, request.id, admitted, deadline);
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
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request: valid,
            id: request.id,
            admitted,
            deadline,
            reply,
        };
        // Admission bounded the queue; only a stopped executor refuses the send.
        handle.queue.send(job).map_err(|_| {
            handle.stats.queue.leave(rows);
            Error::ModelNotReady {
                model: handle.name.clone(),
                version: handle.version.clone(),
                reason: "its executor has stopped".to_string(),
            }
        })?;
        answer.await.unwrap_or_else(|_| {
            Err(Error::Internal {
                model: handle.name.clone(),
                message: "the executor dropped the request".to_string(),
            })
        })
    }

    /// Stops every executor after it finishes its queue, and waits for them.
    pub fn shutdown(self) {
        let Runtime { models, executors } = self;
        drop(models);
        for thread in executors {
            let _ = thread.join();
        }
    }
}
