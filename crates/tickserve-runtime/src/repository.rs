//! Scans a model repository in Triton's layout:
//! `ROOT/NAME/VERSION/model.onnx`, with an optional `ROOT/NAME/model.toml`;
//! or, as KServe hands one model to its server, a single-model layout:
//! `ROOT/model.onnx` (version 1) or `ROOT/VERSION/model.onnx`, with an
//! optional `ROOT/model.toml`, served as `repository.model_name`.
//!
//! A model directory may hold `labels.toml` (`stable = 3`) beside
//! `model.toml`: labels that move without reloading the model.
//!
//! Messages name files relative to the repository (`alpha/model.toml`): they
//! reach clients (load errors, the index), who have no business knowing
//! where the server keeps its files.

use std::path::{Path, PathBuf};

use tickserve_core::config::{Labels, ModelConfig, RepositoryConfig, load_labels};

/// One model directory of the repository.
#[derive(Debug)]
pub struct ModelDir {
    /// The model's name (the directory's name).
    pub name: String,
    /// The directory.
    pub dir: PathBuf,
    /// Its `model.toml`, or why it could not be read.
    pub config: Result<ModelConfig, String>,
    /// Its `labels.toml` (empty when there is none), or why it could not be read.
    pub labels: Result<Labels, String>,
    /// Version numbers with their `model.onnx`, ascending.
    pub versions: Vec<(u64, PathBuf)>,
}

/// Lists the models of `repository`, sorted by name. Errors only when its
/// root itself cannot be read.
pub fn scan(repository: &RepositoryConfig) -> Result<Vec<ModelDir>, String> {
    Ok(model_paths(repository)?
        .into_iter()
        .map(|(name, dir)| read_model_dir(dir, name))
        .collect())
}

/// The name and directory of every model of `repository`, sorted by name
/// (directories whose names start with `.` are not models).
pub fn model_paths(repository: &RepositoryConfig) -> Result<Vec<(String, PathBuf)>, String> {
    let root = repository.path.as_path();
    let entries =
        std::fs::read_dir(root).map_err(|e| format!("cannot read the model repository: {e}"))?;
    if is_single_model(root) {
        return Ok(vec![(repository.model_name.clone(), root.to_path_buf())]);
    }
    let mut models = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        models.push((name, dir));
    }
    models.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(models)
}

/// Reads model `name` of the repository at `root` alone (a model control
/// request: no need to list the whole repository); `None` if there is no such
/// directory.
pub fn scan_one(repository: &RepositoryConfig, name: &str) -> Option<ModelDir> {
    let root = repository.path.as_path();
    if is_single_model(root) {
        return (name == repository.model_name)
            .then(|| read_model_dir(root.to_path_buf(), name.to_string()));
    }
    let valid = !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']);
    let dir = root.join(name);
    (valid && dir.is_dir()).then(|| read_model_dir(dir, name.to_string()))
}

/// KServe's single-model layout: `root/model.onnx`, or only version
/// directories (numeric names) under `root`.
fn is_single_model(root: &Path) -> bool {
    if root.join("model.onnx").is_file() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return false;
    };
    let dirs: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|name| !name.starts_with('.'))
        .collect();
    !dirs.is_empty() && dirs.iter().all(|d| version_number(d).is_some())
}

/// The version a directory's name names: a number written as Rust writes
/// it (`1`, `10`; not `01`, `+1` or ` 1`), so that one version is one
/// directory. Other names are not versions.
pub fn version_number(name: &str) -> Option<u64> {
    let number = name.parse::<u64>().ok()?;
    (number.to_string() == name).then_some(number)
}

fn read_model_dir(dir: PathBuf, name: String) -> ModelDir {
    let config = ModelConfig::load(&dir, &format!("{name}/model.toml"));
    let labels = load_labels(&dir, &format!("{name}/labels.toml"));
    let mut versions: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|v| {
                    let number = version_number(v.file_name().to_str()?)?;
                    let onnx = v.path().join("model.onnx");
                    onnx.is_file().then_some((number, onnx))
                })
                .collect()
        })
        .unwrap_or_default();
    // The single-model layout's `model.onnx` at the top is version 1.
    let top = dir.join("model.onnx");
    if top.is_file() && !versions.iter().any(|(v, _)| *v == 1) {
        versions.push((1, top));
    }
    versions.sort_by_key(|(v, _)| *v);
    ModelDir {
        name,
        dir,
        config,
        labels,
        versions,
    }
}
