//! Changing a model while it serves, whichever way the change comes (the
//! repository poll, the load API, a reload): the versions its policy serves
//! are loaded and warmed off the request path, then the model switches to
//! them in one step under the registry's lock. Requests already admitted
//! finish on the versions they hold; a version that left is freed once its
//! last request is answered. Nothing that served stops serving until every
//! version meant to replace it is ready: a version that fails to load leaves
//! the serving ones serving, and says why (the index, the log,
//! `tickserve_model_loads_total{outcome="failed"}`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tickserve_core::config::{Labels, ModelConfig};
use tickserve_core::{Error, metrics as names};

use crate::loader::versions_of;
use crate::registry::{ModelVersions, Split, VersionState};
use crate::repository::ModelDir;
use crate::shadow::ShadowPlan;
use crate::{Runtime, carry_sequences};

/// Which of a model's serving versions load again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// Every version (the load API; a changed `model.toml`).
    All,
    /// These versions (their files changed); the others keep serving as they are.
    Versions(BTreeSet<u64>),
}

/// The versions of `dir` that its policy serves, with their files, or why none.
pub fn wanted(dir: &ModelDir, config: &ModelConfig) -> Result<Vec<(u64, PathBuf)>, String> {
    if dir.versions.is_empty() {
        return Err(format!(
            "no version directories: expected {}/<version>/model.onnx",
            dir.name
        ));
    }
    let on_disk: Vec<u64> = dir.versions.iter().map(|(v, _)| *v).collect();
    let chosen = config.version_policy.select(&on_disk);
    if chosen.is_empty() {
        let listed: Vec<String> = on_disk.iter().map(u64::to_string).collect();
        return Err(format!(
            "version_policy {} selects none of the versions on disk ({})",
            config.version_policy,
            listed.join(", ")
        ));
    }
    Ok(dir
        .versions
        .iter()
        .filter(|(v, _)| chosen.contains(v))
        .cloned()
        .collect())
}

/// Sets `next`'s labels (see [`settle_labels`]) and then its split (see
/// [`settle_split`]), which may name labels.
pub fn settle_names(
    name: &str,
    config: &ModelConfig,
    file: &Result<Labels, String>,
    before: &Labels,
    next: &mut ModelVersions,
) {
    next.labels = settle_labels(name, config, file, before, next);
    next.split = settle_split(name, config, next);
    next.shadows = settle_shadows(name, config, next);
}

/// The shadows `[[shadow]]` asks for over `next`'s ready versions, by the
/// primary version they mirror. A shadow or primary naming no ready
/// version, a shadow of itself, or one whose inputs and outputs differ
/// from its primary's is left out and logged.
fn settle_shadows(
    name: &str,
    config: &ModelConfig,
    next: &ModelVersions,
) -> BTreeMap<u64, Arc<Vec<ShadowPlan>>> {
    let ready = |v: u64| next.ready(v);
    let mut plans: BTreeMap<u64, Vec<ShadowPlan>> = BTreeMap::new();
    for asked in &config.shadow {
        let Some((version, shadow)) = next
            .resolve(&asked.version)
            .and_then(|v| ready(v).map(|h| (v, h)))
        else {
            tracing::warn!(
                model = name,
                shadow = asked.version,
                "no shadow: it names no ready version"
            );
            continue;
        };
        let primaries: Vec<u64> = match &asked.of {
            Some(of) => next.resolve(of).into_iter().collect(),
            None => next.versions.keys().copied().collect(),
        };
        for primary in primaries.into_iter().filter(|p| *p != version) {
            match ready(primary) {
                Some(p) if p.loaded.signature == shadow.loaded.signature => {
                    tracing::info!(
                        model = name,
                        primary,
                        shadow = version,
                        fraction = asked.fraction,
                        "shadow version"
                    );
                    plans.entry(primary).or_default().push(ShadowPlan::new(
                        &p.version,
                        Arc::clone(shadow),
                        asked.fraction,
                    ));
                }
                Some(_) => tracing::warn!(
                    model = name,
                    primary,
                    shadow = version,
                    "no shadow: its inputs or outputs differ from the primary's"
                ),
                None => tracing::warn!(
                    model = name,
                    primary,
                    shadow = version,
                    "no shadow: its primary is not a ready version"
                ),
            }
        }
    }
    plans.into_iter().map(|(v, p)| (v, Arc::new(p))).collect()
}

/// The split `[split]` asks for over `next`'s ready versions: each key a
/// version number or a label; a key naming no ready version, or a version
/// whose inputs and outputs differ from the default version's (a request is
/// read before it is sent to one), is left out and logged.
fn settle_split(name: &str, config: &ModelConfig, next: &ModelVersions) -> Option<Arc<Split>> {
    if config.split.is_empty() {
        return None;
    }
    let ready = |v: u64| next.ready(v);
    let default = match next.default_version() {
        Some((_, VersionState::Ready(h))) => h,
        _ => return None,
    };
    let mut weights = BTreeMap::new();
    for (key, weight) in &config.split {
        match next.resolve(key).and_then(|v| ready(v).map(|h| (v, h))) {
            Some((v, h)) if h.loaded.signature == default.loaded.signature => {
                let sum = weights.entry(v).or_insert(0u32);
                *sum = sum.saturating_add(*weight);
            }
            Some((v, _)) => tracing::warn!(
                model = name,
                key,
                version = v,
                "left out of the split: its inputs or outputs differ from the default version's"
            ),
            None => tracing::warn!(
                model = name,
                key,
                "left out of the split: it names no ready version"
            ),
        }
    }
    let split = Split::new(&weights).map(Arc::new);
    if let Some(split) = &split {
        tracing::info!(model = name, weights = ?split.weights(), "requests that name no version are split");
    }
    split
}

/// The labels `model.toml` and `labels.toml` give (the file's win), each
/// kept only where it names a ready version of `next`; a label whose new
/// target is not ready keeps its old one while that still serves. Every
/// label left out is logged.
fn settle_labels(
    name: &str,
    config: &ModelConfig,
    file: &Result<Labels, String>,
    before: &Labels,
    next: &ModelVersions,
) -> Labels {
    let mut asked = config.labels.clone();
    match file {
        Ok(labels) => asked.extend(labels.iter().map(|(l, v)| (l.clone(), *v))),
        Err(e) => {
            tracing::warn!(model = name, error = %e, "labels.toml not read; its labels keep their versions");
            asked.extend(before.iter().map(|(l, v)| (l.clone(), *v)));
        }
    }
    let ready = |v: &u64| next.ready(*v).is_some();
    let mut settled = Labels::new();
    for (label, version) in asked {
        if ready(&version) {
            settled.insert(label, version);
        } else if let Some(old) = before.get(&label).filter(|v| ready(v)) {
            tracing::warn!(
                model = name,
                label,
                version,
                kept = old,
                "a label may only name a ready version; it keeps naming the one it named"
            );
            settled.insert(label, *old);
        } else {
            tracing::warn!(
                model = name,
                label,
                version,
                "a label may only name a ready version; label not set"
            );
        }
    }
    for (label, version) in &settled {
        metrics::gauge!(names::MODEL_LABEL_VERSION, "model" => name.to_string(), "label" => label.clone())
            .set(*version as f64);
    }
    for label in before.keys().filter(|l| !settled.contains_key(*l)) {
        metrics::gauge!(names::MODEL_LABEL_VERSION, "model" => name.to_string(), "label" => label.clone())
            .set(0.0);
    }
    settled
}

impl Runtime {
    /// Brings model `dir.name` in line with its directory (see the module's
    /// doc): loads the versions its policy serves that do not serve yet, and
    /// those `reload` names; switches to them once all are ready; settles
    /// its labels. Errors name every version that failed; the versions that
    /// served before then keep serving beside those that loaded.
    #[allow(clippy::disallowed_methods)] // a switch's duration is the machine's time
    pub(crate) fn update_model(&self, dir: ModelDir, reload: &Reload) -> Result<(), Error> {
        let started = Instant::now();
        let name = dir.name.clone();
        let failed = |reason: String| {
            metrics::counter!(names::MODEL_LOADS, "model" => name.clone(), "outcome" => "failed")
                .increment(1);
            Error::LoadFailed {
                model: name.clone(),
                reason,
            }
        };
        let current = self.models.get_versions(&name);
        // A model that does not serve yet shows why in the index; one that
        // serves keeps serving (the log and the metric say why).
        let refused = |reason: String| {
            if !self.models.contains(&name) {
                let failed_model = ModelVersions {
                    error: Some(reason.clone()),
                    late: true,
                    ..ModelVersions::default()
                };
                let _ = self.models.replace(&name, failed_model, true);
            }
            failed(reason)
        };
        let config = dir.config.clone().map_err(refused)?;
        let wanted = wanted(&dir, &config).map_err(refused)?;
        let to_load: Vec<(u64, PathBuf)> = wanted
            .iter()
            .filter(|(v, _)| {
                let serving = matches!(current.versions.get(v), Some(VersionState::Ready(_)));
                !serving
                    || match reload {
                        Reload::All => true,
                        Reload::Versions(changed) => changed.contains(v),
                    }
            })
            .cloned()
            .collect();
        let candidates = self
            .candidates_of(&name, &dir.dir, &config, to_load)
            .map_err(failed)?;
        let loaded = self.linked(versions_of(
            self.loader().load(candidates),
            &self.config.clock,
        ));

        let mut next = ModelVersions::default();
        let mut failures = Vec::new();
        for (version, _) in &wanted {
            let state = match loaded.get(&(name.clone(), *version)) {
                Some(VersionState::Failed(reason)) => {
                    failures.push(format!("version {version}: {reason}"));
                    match current.versions.get(version) {
                        // A reload that failed: the version that served serves on.
                        Some(serving @ VersionState::Ready(_)) => serving.clone(),
                        _ => VersionState::Failed(reason.clone()),
                    }
                }
                Some(ready) => ready.clone(),
                None => match current.versions.get(version) {
                    Some(state) => state.clone(),
                    None => continue,
                },
            };
            next.versions.insert(*version, state);
        }
        if !failures.is_empty() {
            // Nothing stops serving until what replaces it is ready.
            for (version, state) in &current.versions {
                if matches!(state, VersionState::Ready(_)) {
                    next.versions
                        .entry(*version)
                        .or_insert_with(|| state.clone());
                }
            }
        }
        settle_names(&name, &config, &dir.labels, &current.labels, &mut next);
        next.late = !failures.is_empty();

        let old = self.models.replace(&name, next, false).ok().flatten();
        if let Some(old) = old {
            carry_sequences(&old, &self.models.get_versions(&name));
            let gone = self.models.mark_gone(&name, &old);
            if gone > 0 {
                metrics::counter!(names::MODEL_UNLOADS, "model" => name.clone()).increment(gone);
            }
        }
        metrics::gauge!(names::MODEL_SWITCH_SECONDS, "model" => name.clone())
            .set(started.elapsed().as_secs_f64());
        if failures.is_empty() {
            tracing::info!(model = %name, versions = ?wanted.iter().map(|(v, _)| v).collect::<Vec<_>>(),
                took = ?started.elapsed(), "model switched");
            Ok(())
        } else {
            tracing::warn!(model = %name, failures = ?failures, "load failed; the versions that served keep serving");
            Err(Error::LoadFailed {
                model: name.clone(),
                reason: failures.join("; "),
            })
        }
    }

    /// Moves model `dir.name`'s labels (and the split that names them) to
    /// what its files say now, loading nothing (a changed `labels.toml`).
    pub(crate) fn relabel(&self, dir: &ModelDir) {
        let Ok(config) = &dir.config else {
            return;
        };
        let mut current = self.models.get_versions(&dir.name);
        let before = current.labels.clone();
        settle_names(&dir.name, config, &dir.labels, &before, &mut current);
        self.models.set_labels(&dir.name, current);
    }
}
