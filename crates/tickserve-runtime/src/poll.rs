//! The repository poll (`security.model_control_mode = "poll"`): every
//! `repository.poll_interval` the repository is read, and each model
//! directory is summed up in a [`Print`] (its `model.toml` and `labels.toml`
//! by content, each version directory by the names, sizes and modification
//! times of its files). A change applies only once two reads in a row give
//! the same print, so a file still being written (its size or time moving)
//! is never loaded; a deployment that writes `.4/` and renames it to `4/`
//! is never seen half-written at all (names starting with `.` are ignored).
//!
//! What a stable change does: a new model, or a changed `model.toml`, loads
//! (or reloads) the model; a new, changed or removed version directory
//! loads, reloads or drops that version (the version policy decides which
//! serve); a changed `labels.toml` moves labels and loads nothing; a removed
//! model directory unloads the model. Each goes through
//! [`Runtime::update_model`]: the serving versions serve until their
//! replacements are ready, and a failed load leaves them serving.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::time::UNIX_EPOCH;

use tickserve_core::config::RepositoryConfig;
use tickserve_core::files::{MAX_CONFIG_BYTES, read};

use crate::Runtime;
use crate::repository;
use crate::update::Reload;

/// The most files one version directory's print looks at, and how deep.
const MAX_FILES: usize = 10_000;
const MAX_DEPTH: usize = 4;

/// One model directory, summed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Print {
    config: u64,
    labels: u64,
    /// Version number → its directory's files.
    versions: BTreeMap<u64, u64>,
}

/// Every model directory of a repository, summed up, by model name.
pub type Prints = HashMap<String, Print>;

/// Reads `repository` into prints (an unreadable repository is empty).
pub fn prints(repository: &RepositoryConfig) -> Prints {
    repository::model_paths(repository)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, dir)| (name, print(&dir)))
        .collect()
}

fn print(dir: &Path) -> Print {
    // Read as the load reads it: a file that is no regular file inside
    // the directory, or too large, sums up as its error (never blocking on
    // a FIFO, never reading a device).
    let content = |file: &str| {
        let mut h = DefaultHasher::new();
        read(dir, file, file, MAX_CONFIG_BYTES).hash(&mut h);
        h.finish()
    };
    let mut versions = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let Some(version) = entry
                .file_name()
                .to_str()
                .and_then(repository::version_number)
            else {
                continue;
            };
            let mut h = DefaultHasher::new();
            let mut budget = MAX_FILES;
            files(&entry.path(), "", 0, &mut budget, &mut h);
            versions.insert(version, h.finish());
        }
    }
    // The single-model layout's top `model.onnx` is version 1.
    let top = dir.join("model.onnx");
    if top.is_file() && !versions.contains_key(&1) {
        let mut h = DefaultHasher::new();
        stamp(&top, "model.onnx", &mut h);
        versions.insert(1, h.finish());
    }
    Print {
        config: content("model.toml"),
        labels: content("labels.toml"),
        versions,
    }
}

/// Hashes the name, size and modification time of every file under `dir`.
fn files(dir: &Path, prefix: &str, depth: usize, budget: &mut usize, h: &mut DefaultHasher) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let path = entry.path();
        if path.is_dir() {
            if depth < MAX_DEPTH {
                files(&path, &name, depth + 1, budget, h);
            }
        } else {
            stamp(&path, &name, h);
        }
    }
}

fn stamp(path: &Path, name: &str, h: &mut DefaultHasher) {
    name.hash(h);
    if let Ok(meta) = std::fs::metadata(path) {
        meta.len().hash(h);
        meta.modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .hash(h);
    }
}

/// What the poll has seen and applied.
#[derive(Debug)]
pub struct Poller {
    /// The previous read.
    seen: Prints,
    /// What the runtime serves from.
    applied: Prints,
}

impl Poller {
    /// A poll that starts from `applied`: the prints the runtime loaded from.
    pub fn new(applied: Prints) -> Poller {
        Poller {
            seen: applied.clone(),
            applied,
        }
    }
}

impl Runtime {
    /// Reads the repository once and applies every change that two reads
    /// in a row agree on (see the module's doc). Returns how many models it
    /// changed. Blocking: loads run here.
    pub fn poll_repository(&self, poller: &mut Poller) -> usize {
        let now = prints(&self.config.repository);
        let mut names: BTreeSet<&String> = now.keys().collect();
        names.extend(poller.applied.keys());
        let mut changed = Vec::new();
        for name in names {
            let (current, before) = (now.get(name), poller.seen.get(name));
            if current != before || current == poller.applied.get(name) {
                continue;
            }
            changed.push(name.clone());
        }
        let mut applied = 0;
        for name in changed {
            let _control = self.control.lock().unwrap_or_else(|p| p.into_inner());
            let current = now.get(&name);
            let before = poller.applied.get(&name);
            match (
                current,
                repository::scan_one(&self.config.repository, &name),
            ) {
                (None, _) => {
                    let _ = self.unload_locked(&name);
                    poller.applied.remove(&name);
                }
                // Gone between the read and now: the next reads decide.
                (Some(_), None) => continue,
                (Some(print), Some(dir)) => {
                    let reload = match before {
                        Some(b) if b.config == print.config => Reload::Versions(
                            print
                                .versions
                                .iter()
                                .filter(|(v, p)| b.versions.get(v).is_some_and(|old| old != *p))
                                .map(|(v, _)| *v)
                                .collect(),
                        ),
                        _ => Reload::All,
                    };
                    let labels_only = before
                        .is_some_and(|b| b.config == print.config && b.versions == print.versions);
                    // A failure is logged, counted and in the index, and a
                    // panic is logged: either way the files must change
                    // before it is tried again, and the poll goes on.
                    let apply = std::panic::AssertUnwindSafe(|| {
                        if labels_only {
                            self.relabel(&dir);
                        } else {
                            let _ = self.update_model(dir, &reload);
                        }
                    });
                    if std::panic::catch_unwind(apply).is_err() {
                        tracing::error!(model = name, "applying a repository change panicked");
                    }
                    poller.applied.insert(name.clone(), print.clone());
                }
            }
            applied += 1;
        }
        poller.seen = now;
        applied
    }
}

#[cfg(test)]
mod tests;
