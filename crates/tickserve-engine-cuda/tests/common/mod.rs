//! What the engine's tests share: the repository root, reading a model, and
//! the fixture repository.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};

use tickserve_onnx::OnnxModel;

/// The repository root: `TICKSERVE_ROOT` (set by scripts/gpu_run.sh, where
/// the test executables run from another checkout), else this checkout.
pub fn root() -> PathBuf {
    std::env::var_os("TICKSERVE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Parses the ONNX file at `path`.
pub fn read(path: &Path) -> OnnxModel {
    OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap()
}

/// `scripts/make_models.py --fixtures` into a temporary directory; `None`
/// where Python with onnx is missing (the GPU machine).
pub fn try_fixtures() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("scripts/make_models.py"))
        .arg("--fixtures")
        .arg(dir.path())
        .status();
    status.is_ok_and(|s| s.success()).then_some(dir)
}

/// The fixtures; fails the test without them (run scripts/setup.sh first).
pub fn fixtures() -> tempfile::TempDir {
    try_fixtures().expect("make_models.py --fixtures (run scripts/setup.sh first)")
}
