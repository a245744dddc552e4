//! The model registry: every model's versions and their states, the handle a
//! request is served through, and the repository index.
//!
//! A [`ModelHandle`] is one ready model version: what it is ([`Loaded`]) and
//! its replicas, each a membership in a family on one device. Front ends look a
//! model up once per request ([`Models::get`]) and call [`ModelHandle::infer`]:
//! validation at the edge, the replica with the shortest queue, and its
//! family's [`Family::submit`]. [`Models`] is behind one lock, taken briefly
//! to look up or to swap a model's versions when model control loads or
//! unloads it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tickserve_core::durations;
use tickserve_core::monte_carlo::Plan;
use tickserve_core::priority::TimeoutAction;
use tickserve_core::sequence::{InputSource, SequenceControl, SequenceSpec};
use tickserve_core::validate::{ValidRequest, validate};
use tickserve_core::{Device, Error, InferRequest, InferResponse, Signature, metrics as names};

use crate::admission::ModelQueue;
use crate::family::{Family, Submission};
use crate::member::Member;
use crate::repository::ModelDir;
use crate::sequences::{Entry, Purpose, Sequences};
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
    /// Time from reading its file to ready (a family's first member includes
    /// the compilation; a later member only its weights).
    pub load_time: Duration,
    /// The model's statistics, shared with the front ends.
    pub stats: Arc<ModelStats>,
    /// Its rows waiting in the queues.
    pub queue: Arc<ModelQueue>,
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
    /// A stateful model's sequences (shared by its replicas: state lives in
    /// host memory and any replica can run any sequence's next tick).
    sequences: Option<Arc<Sequences>>,
}

/// A request validated and placed, waiting to run ([`ModelHandle::prepare`]).
#[derive(Debug)]
pub struct Prepared {
    submission: Submission,
    monte_carlo: Option<Plan>,
    sequence: Option<SequenceTick>,
}

/// A request's place in its sequence.
#[derive(Debug)]
struct SequenceTick {
    control: SequenceControl,
    entry: Entry,
    /// With Monte Carlo: the clean inputs, run after the noisy copies; the
    /// sequence's next state comes from that row.
    clean: Option<Vec<Bytes>>,
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
    /// A handle over `replicas` (at least one).
    pub fn new(name: &str, version: &str, loaded: Loaded, replicas: Vec<Replica>) -> ModelHandle {
        ModelHandle {
            name: name.to_string(),
            version: version.to_string(),
            sequences: loaded
                .settings
                .sequence
                .as_ref()
                .map(|spec| Arc::new(Sequences::new(name, Arc::clone(spec)))),
            loaded,
            replicas,
            next_replica: AtomicUsize::new(0),
        }
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
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, Error> {
        let prepared = self.prepare(request)?;
        self.run(prepared).await
    }

    /// The synchronous half of [`ModelHandle::infer`]: validates `request`,
    /// plans its Monte Carlo expansion, places it in its priority level and,
    /// for a stateful model, queues it for its sequence's turn. Requests
    /// prepared one after another run in that order within a sequence (a
    /// stream prepares its messages in order, then runs them concurrently).
    pub fn prepare(&self, request: InferRequest) -> Result<Prepared, Error> {
        let valid = validate(&request, &self.signature, &self.settings.limits)?;
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
                let entry = sequences.enter(&control.id, purpose)?;
                Some((control, entry))
            }
        };
        // Monte Carlo: the request's rows, each as many noisy copies, run as
        // one request; the answer is their summary.
        let monte_carlo = match &request.monte_carlo {
            None => None,
            Some(mc) => Some(self.settings.monte_carlo.plan(
                &self.name,
                &self.signature,
                mc,
                valid.rows,
            )?),
        };
        let (valid, clean) = match &monte_carlo {
            Some(plan) => {
                let noisy = plan.expand(&valid, &self.signature);
                // A sequence advances on its clean row only (kept for the run).
                let clean = sequence.as_ref().map(|_| valid.inputs);
                (noisy, clean)
            }
            None => (valid, None),
        };
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
            sequence: sequence.map(|(control, entry)| SequenceTick {
                control,
                entry,
                clean,
            }),
        })
    }

    /// The asynchronous half of [`ModelHandle::infer`]: waits for the
    /// sequence's turn (a stateful model), runs the request on the replica
    /// with the shortest queue, keeps the new state, summarizes Monte Carlo.
    pub async fn run(&self, prepared: Prepared) -> Result<InferResponse, Error> {
        let Prepared {
            mut submission,
            monte_carlo,
            sequence,
        } = prepared;
        let (answer, restarted) = match (sequence, &self.sequences) {
            (Some(tick), Some(sequences)) => {
                let turn = tick.entry.turn(&self.name, submission.deadline).await?;
                let start = turn.begin(&tick.control)?;
                let spec = sequences.spec();
                submission.request = with_state(spec, submission.request, tick.clean, &start.state);
                let mut answer = self.submit(submission).await?;
                let next = take_state(spec, &mut answer, tick_row_of(&monte_carlo));
                turn.finish(&tick.control, next);
                (answer, start.restarted)
            }
            _ => (self.submit(submission).await?, false),
        };
        let mut answer = match monte_carlo {
            Some(plan) => plan.reduce(answer),
            None => answer,
        };
        answer.sequence_restarted = restarted;
        Ok(answer)
    }

    /// Submits to the replica with the shortest queue.
    async fn submit(&self, submission: Submission) -> Result<InferResponse, Error> {
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
        replica.family.submit(&replica.member, submission).await
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

/// `request` (the client's inputs, Monte Carlo's noisy copies included) with
/// the sequence's `state` rows in their places, in the graph's input order,
/// and the state outputs asked for after the client's. With Monte Carlo the
/// `clean` row runs last, and every row gets the same state.
fn with_state(
    spec: &SequenceSpec,
    mut request: ValidRequest,
    clean: Option<Vec<Bytes>>,
    state: &[Bytes],
) -> ValidRequest {
    let rows = request.rows + usize::from(clean.is_some());
    let mut client = std::mem::take(&mut request.inputs);
    if let Some(clean) = clean {
        for (noisy, row) in client.iter_mut().zip(clean) {
            let mut joined = Vec::with_capacity(noisy.len() + row.len());
            joined.extend_from_slice(noisy);
            joined.extend_from_slice(&row);
            *noisy = Bytes::from(joined);
        }
    }
    let inputs = spec
        .input_sources
        .iter()
        .map(|source| match *source {
            InputSource::Client(i) => client.get_mut(i).map(std::mem::take).unwrap_or_default(),
            InputSource::State(s) => {
                let row = state.get(s).cloned().unwrap_or_default();
                if rows == 1 {
                    row
                } else {
                    Bytes::from(row.repeat(rows))
                }
            }
        })
        .collect();
    let outputs = request
        .outputs
        .iter()
        .filter_map(|&o| spec.output_indices.get(o).copied())
        .chain(spec.states.iter().map(|s| s.output_index))
        .collect();
    ValidRequest {
        rows,
        inputs,
        outputs,
    }
}

/// Takes the state outputs (the last ones, see [`with_state`]) out of
/// `answer`: the sequence's next state. With Monte Carlo, `clean_row` is the
/// clean row's index: the state is that row's, and the row leaves the other
/// outputs too.
fn take_state(
    spec: &SequenceSpec,
    answer: &mut InferResponse,
    clean_row: Option<usize>,
) -> Vec<Bytes> {
    let at = answer.outputs.len().saturating_sub(spec.states.len());
    let states = answer.outputs.split_off(at);
    let Some(row) = clean_row else {
        return states.into_iter().map(|t| Bytes::from(t.data)).collect();
    };
    let rows = row + 1;
    for output in &mut answer.outputs {
        let row_bytes = output.data.len() / rows;
        output.data.truncate(row * row_bytes);
        if let Some(batch) = output.shape.first_mut() {
            *batch = row as i64;
        }
    }
    states
        .into_iter()
        .map(|t| {
            let row_bytes = t.data.len() / rows;
            Bytes::copy_from_slice(t.data.get(row * row_bytes..).unwrap_or_default())
        })
        .collect()
}

/// The clean row's index in a Monte Carlo run of a sequence: after every
/// noisy copy.
fn tick_row_of(monte_carlo: &Option<Plan>) -> Option<usize> {
    monte_carlo.as_ref().map(Plan::total_rows)
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

/// Every model the runtime knows, by name.
#[derive(Debug, Default)]
pub struct Models {
    map: RwLock<HashMap<String, ModelVersions>>,
}

impl Models {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, ModelVersions>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, ModelVersions>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Every model, by name (sorted), as it stands now.
    pub fn all(&self) -> BTreeMap<String, ModelVersions> {
        self.read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every ready model version, by model name then version.
    pub fn ready_handles(&self) -> Vec<Arc<ModelHandle>> {
        self.all()
            .into_values()
            .flat_map(|m| {
                m.versions.into_values().filter_map(|s| match s {
                    VersionState::Ready(h) => Some(h),
                    VersionState::Failed(_) => None,
                })
            })
            .collect()
    }

    /// True when every model version loaded and can run.
    pub fn all_ready(&self) -> bool {
        self.read().values().all(|m| {
            m.error.is_none()
                && m.versions
                    .values()
                    .all(|s| matches!(s, VersionState::Ready(h) if h.is_ready()))
        })
    }

    /// True when a model of this name is known (loaded or failed).
    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// The model version asked for (`None`: the default), ready to serve.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        let not_found = |known: String| Error::ModelNotFound {
            model: name.to_string(),
            version: version.map(str::to_string),
            known,
        };
        let models = self.read();
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

    /// Model `name`'s versions as they stand now (empty if unknown).
    pub fn get_versions(&self, name: &str) -> ModelVersions {
        self.read().get(name).cloned().unwrap_or_default()
    }

    /// Replaces every model with `models` (the first load).
    pub fn set_all(&self, models: HashMap<String, ModelVersions>) {
        *self.write() = models;
    }

    /// Puts `versions` in place of model `name`'s, unless `keep_old` and the
    /// model is already there; returns what it replaced, or gives `versions`
    /// back as the error when it kept the old ones.
    pub fn replace(
        &self,
        name: &str,
        versions: ModelVersions,
        keep_old: bool,
    ) -> Result<Option<ModelVersions>, ModelVersions> {
        let mut models = self.write();
        if keep_old && models.contains_key(name) {
            return Err(versions);
        }
        Ok(models.insert(name.to_string(), versions))
    }

    /// Takes model `name` out; its handles still held elsewhere keep serving
    /// what they admitted.
    pub fn remove(&self, name: &str) -> Option<ModelVersions> {
        self.write().remove(name)
    }

    /// Takes every model out (shutdown), closing their queues.
    pub fn close_all(&self) {
        for handle in self.ready_handles() {
            handle.close();
        }
        self.write().clear();
    }

    /// Sets every ready version's readiness metric from its replicas' health
    /// (a family whose device was lost makes its models not ready).
    pub fn refresh_readiness(&self) {
        for handle in self.ready_handles() {
            metrics::gauge!(names::MODEL_READY, "model" => handle.name.clone(),
                "version" => handle.version.clone())
            .set(if handle.is_ready() { 1.0 } else { 0.0 });
        }
    }

    /// Sets the readiness metrics of `old` versions of model `name` to 0,
    /// unless the same version serves again.
    pub fn mark_gone(&self, name: &str, old: &ModelVersions) {
        let now = self.read();
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
                        "version" => v, "family" => h.family_key.clone())
                    .set(0.0);
                }
            }
        }
    }

    /// The repository index: every model directory on disk and every model
    /// known, each loaded or failed version with its state.
    pub fn index(&self, on_disk: &[ModelDir]) -> Vec<IndexEntry> {
        let models = self.all();
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
                    VersionState::Ready(h) => match h.failure() {
                        None => ("READY", String::new()),
                        Some(reason) => ("UNAVAILABLE", format!("its family stopped: {reason}")),
                    },
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
        index
    }
}
