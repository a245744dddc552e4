//! The model registry: every model's versions and their states, and the
//! repository index. [`Models`] is behind one lock, taken briefly to look a
//! model up or to swap a model's versions when model control loads or
//! unloads it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tickserve_core::config::Labels;
use tickserve_core::sequence::{SequenceControl, SequenceId};
use tickserve_core::{Error, metrics as names};

use crate::handle::ModelHandle;
use crate::repository::ModelDir;
use crate::shadow::ShadowPlan;

/// The state of one model version.
#[derive(Debug, Clone)]
pub enum VersionState {
    /// Loaded and serving.
    Ready(Arc<ModelHandle>),
    /// Its load failed, for this reason.
    Failed(String),
}

/// How a model's requests that name no version are shared among its
/// versions (`[split]`): each draw picks a version by weight.
#[derive(Debug)]
pub struct Split {
    /// Version, and the running sum of weights up to and including it.
    shares: Vec<(u64, u64)>,
    total: u64,
    draws: AtomicU64,
}

impl Split {
    /// A split over `weights` (version → weight); `None` when no version
    /// has weight.
    pub fn new(weights: &BTreeMap<u64, u32>) -> Option<Split> {
        let mut total = 0u64;
        let mut shares = Vec::new();
        for (&version, &weight) in weights.iter().filter(|(_, w)| **w > 0) {
            total += u64::from(weight);
            shares.push((version, total));
        }
        (total > 0).then_some(Split {
            shares,
            total,
            draws: AtomicU64::new(0),
        })
    }

    /// The versions and their weights, ascending.
    pub fn weights(&self) -> Vec<(u64, u64)> {
        let mut before = 0;
        self.shares
            .iter()
            .map(|(v, upto)| {
                let weight = upto - before;
                before = *upto;
                (*v, weight)
            })
            .collect()
    }

    /// The version `draw` (any number, spread evenly) falls on.
    fn pick(&self, draw: u64) -> u64 {
        let point = draw % self.total;
        self.shares
            .iter()
            .find(|(_, upto)| point < *upto)
            .or(self.shares.last())
            .map_or(0, |(version, _)| *version)
    }

    /// The next version for a request of no sequence: SplitMix64 over a
    /// counter, so any run of draws keeps close to the weights.
    fn next(&self) -> u64 {
        self.pick(crate::draw::splitmix64(
            self.draws.fetch_add(1, Ordering::Relaxed),
        ))
    }

    /// The version for sequence `id`: the same for every tick of it while
    /// the weights stay (a fixed hash of the id).
    fn for_sequence(&self, id: &SequenceId) -> u64 {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        self.pick(h.finish())
    }
}

/// Every version of one model, highest last.
#[derive(Debug, Clone, Default)]
pub struct ModelVersions {
    /// Version number → state.
    pub versions: BTreeMap<u64, VersionState>,
    /// A failure that concerns the model as a whole (no versions, unreadable model.toml).
    pub error: Option<String>,
    /// Labels and the ready version each names.
    pub labels: Labels,
    /// How requests that name no version are shared, if they are.
    pub split: Option<Arc<Split>>,
    /// The shadows of each version that has some.
    pub shadows: BTreeMap<u64, Arc<Vec<ShadowPlan>>>,
    /// Its failures came from a change while serving (the poll, the load
    /// API), not the start: they are in the index, but do not take the
    /// server's readiness away (what served serves on).
    pub late: bool,
}

/// A request's model version, as [`Models::route`] found it.
#[derive(Debug)]
pub struct Routed {
    /// The version that answers.
    pub handle: Arc<ModelHandle>,
    /// True when the model's split drew it (the request named no version).
    pub drawn: bool,
    /// True when the request named no version and the model serves more
    /// than one: a sequence's tick goes to the version it lives on
    /// ([`Models::for_sequence`]).
    pub sticky: bool,
    /// Its shadows, if it has any.
    pub shadows: Option<Arc<Vec<ShadowPlan>>>,
}

impl ModelVersions {
    /// The default version: the highest that is ready, else the highest.
    pub fn default_version(&self) -> Option<(u64, &VersionState)> {
        self.versions
            .iter()
            .rev()
            .find(|(_, s)| matches!(s, VersionState::Ready(_)))
            .or_else(|| self.versions.iter().next_back())
            .map(|(v, s)| (*v, s))
    }

    /// Version `version`'s handle, if it is ready.
    pub fn ready(&self, version: u64) -> Option<&Arc<ModelHandle>> {
        match self.versions.get(&version) {
            Some(VersionState::Ready(handle)) => Some(handle),
            _ => None,
        }
    }

    /// The version number `asked` names: a number, or a label.
    pub fn resolve(&self, asked: &str) -> Option<u64> {
        match asked.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => self.labels.get(asked).copied(),
        }
    }

    /// The version `asked` names (see [`ModelVersions::resolve`]).
    fn named(&self, asked: &str) -> Option<(u64, &VersionState)> {
        let number = self.resolve(asked)?;
        self.versions.get_key_value(&number).map(|(k, s)| (*k, s))
    }

    /// What a request may name, for a "not found" message:
    /// `versions: 1, 2; labels: stable (2)`.
    pub fn known(&self) -> String {
        let versions: Vec<String> = self.ready_versions();
        let mut known = format!("versions: {}", versions.join(", "));
        if !self.labels.is_empty() {
            let labels: Vec<String> = self
                .labels
                .iter()
                .map(|(l, v)| format!("{l} ({v})"))
                .collect();
            known.push_str(&format!("; labels: {}", labels.join(", ")));
        }
        known
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
    /// `READY`, or `UNAVAILABLE` (with `reason`); the server shows a halted
    /// version as `HALTED`.
    pub state: &'static str,
    /// Why it is unavailable (`unloaded`, or its load failure).
    pub reason: String,
}

/// Models by name. Hashed with FxHash (a few instructions for a short name,
/// where SipHash takes some 150 on every request's lookup): the keys are the
/// repository's names, so a client's name can lengthen a lookup's probe, not
/// grow the table.
type ByName = HashMap<String, ModelVersions, rustc_hash::FxBuildHasher>;

/// Every model the runtime knows, by name.
#[derive(Debug, Default)]
pub struct Models {
    map: RwLock<ByName>,
}

impl Models {
    fn read(&self) -> RwLockReadGuard<'_, ByName> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, ByName> {
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

    /// True when every model version loaded and can run; a failed change
    /// while serving ([`ModelVersions::late`]) does not count, a lost
    /// device does.
    pub fn all_ready(&self) -> bool {
        self.read().values().all(|m| {
            let running = |s: &VersionState| match s {
                VersionState::Ready(h) => h.is_ready(),
                VersionState::Failed(_) => m.late,
            };
            (m.error.is_none() || m.late) && m.versions.values().all(running)
        })
    }

    /// True when a model of this name is known (loaded or failed).
    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// The model version asked for (`None`: the default), ready to serve.
    /// No version named means the default (the highest ready), split or not:
    /// metadata, readiness and the sequence-state API see one version.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        self.find(name, version, false).map(|routed| routed.handle)
    }

    /// An inference request's lookup: [`Models::get`], except that the
    /// model's split draws the version of a request that names none; with
    /// whether it did, and the version's shadows.
    pub fn route(&self, name: &str, version: Option<&str>) -> Result<Routed, Error> {
        self.find(name, version, true)
    }

    fn find(&self, name: &str, version: Option<&str>, split: bool) -> Result<Routed, Error> {
        let not_found = |known: String| Error::ModelNotFound {
            model: name.to_string(),
            version: version.map(str::to_string),
            known,
        };
        let models = self.read();
        let entry = models.get(name).ok_or_else(|| not_found(String::new()))?;
        let split = entry.split.as_ref().filter(|_| split);
        let drawn = split.is_some() && version.is_none_or(str::is_empty);
        let found = match (version, split) {
            (None | Some(""), Some(split)) => {
                let v = split.next();
                entry.versions.get_key_value(&v).map(|(k, s)| (*k, s))
            }
            (None | Some(""), None) => entry.default_version(),
            (Some(v), _) => entry.named(v),
        };
        match found {
            Some((v, VersionState::Ready(handle))) => Ok(Routed {
                handle: Arc::clone(handle),
                drawn,
                sticky: version.is_none_or(str::is_empty) && entry.versions.len() > 1,
                shadows: entry.shadows.get(&v).cloned(),
            }),
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
                None => Err(not_found(entry.known())),
            },
        }
    }

    /// For a request of sequence `sequence` that named no version: the
    /// version the sequence lives on (any ready version, so a sequence stays
    /// where it started when a new version arrives or the split moves), here
    /// or, in a fleet, on another replica;
    /// else, for a split model, the version its id falls on. `None` for
    /// a new sequence of a model that is not split (the default serves it).
    pub fn for_sequence(&self, name: &str, sequence: &SequenceControl) -> Option<Arc<ModelHandle>> {
        let models = self.read();
        let entry = models.get(name)?;
        // Any version it lives on, in the split or no longer.
        let living = entry.versions.values().find_map(|state| {
            let VersionState::Ready(handle) = state else {
                return None;
            };
            let table = handle.sequences()?;
            table
                .holds(&table.key(&sequence.id, sequence.owner))
                .then_some(handle)
        });
        // Else the version it lives on elsewhere in the fleet, as last seen.
        let in_fleet = || {
            entry.versions.values().find_map(|state| {
                let VersionState::Ready(handle) = state else {
                    return None;
                };
                let table = handle.sequences()?;
                let version = table.lives_on(&table.key(&sequence.id, sequence.owner))?;
                entry.ready(version.parse().ok()?)
            })
        };
        living
            .or_else(in_fleet)
            .or_else(|| {
                let split = entry.split.as_ref()?;
                entry.ready(split.for_sequence(&sequence.id))
            })
            .map(Arc::clone)
    }

    /// Model `name`'s versions as they stand now (empty if unknown).
    pub fn get_versions(&self, name: &str) -> ModelVersions {
        self.read().get(name).cloned().unwrap_or_default()
    }

    /// Replaces every model with `models` (the first load).
    pub fn set_all(&self, models: HashMap<String, ModelVersions>) {
        *self.write() = models.into_iter().collect();
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

    /// Brings the gauges that are not kept current by requests up to date
    /// (called before each scrape): every ready version's readiness from its
    /// replicas' health (a family whose device was lost makes its models not
    /// ready), and every stateful version's sequences idle past their limit
    /// ended (so that `tickserve_sequences_active` counts only live ones).
    pub fn refresh_readiness(&self) {
        for handle in self.ready_handles() {
            metrics::gauge!(names::MODEL_READY, "model" => handle.name.clone(),
                "version" => handle.version.clone())
            .set(if handle.is_ready() { 1.0 } else { 0.0 });
            if let Some(sequences) = handle.sequences() {
                sequences.sweep();
            }
        }
    }

    /// Puts the labels, split and shadows of `names` in place of model
    /// `name`'s (if it is known).
    pub fn set_labels(&self, name: &str, names: ModelVersions) {
        if let Some(model) = self.write().get_mut(name) {
            model.labels = names.labels;
            model.split = names.split;
            model.shadows = names.shadows;
        }
    }

    /// Sets the readiness metrics of `old` versions of model `name` to 0,
    /// unless the same version serves again (the same handle, or a reload
    /// of it); returns how many ready versions of `old` no longer serve as
    /// they did (unloaded or replaced).
    pub fn mark_gone(&self, name: &str, old: &ModelVersions) -> u64 {
        let now = self.read();
        let mut gone = 0;
        for (version, state) in &old.versions {
            let now_state = now.get(name).and_then(|m| m.versions.get(version));
            if let (VersionState::Ready(before), Some(VersionState::Ready(after))) =
                (state, now_state)
                && !Arc::ptr_eq(before, after)
            {
                gone += 1;
            }
            let serving = matches!(now_state, Some(VersionState::Ready(_)));
            if !serving {
                if matches!(state, VersionState::Ready(_)) {
                    gone += 1;
                }
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
        gone
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
        // A reason is clipped as an error message is (4 KiB), whatever a
        // repository's file made of it.
        for entry in &mut index {
            if entry.reason.len() > tickserve_core::text::MAX_MESSAGE_BYTES {
                entry.reason = tickserve_core::text::clip_message(&entry.reason);
            }
        }
        index
    }
}

#[cfg(test)]
mod tests;
