//! Shared by the integration tests: paths, a real server on loopback port 0,
//! and the fixture repository.
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use tickserve_core::config::ServerConfig;
use tickserve_server::Server;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The project's Python, with onnxruntime and tritonclient (scripts/setup.sh).
pub fn python() -> PathBuf {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    python
}

/// A server configuration on loopback, ports picked by the OS.
pub fn config(repository: &Path) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.server.host = "127.0.0.1".into();
    config.server.http_port = 0;
    config.server.grpc_port = 0;
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    config
}

/// Starts a real server on `config`.
pub async fn start(config: &ServerConfig) -> Server {
    Server::start(config)
        .await
        .expect("server starts (run scripts/setup.sh first)")
}

/// A repository of the test fixtures (scripts/make_models.py --fixtures) plus
/// the sample `alpha_mlp`.
pub fn fixture_repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(python())
        .arg(root().join("scripts/make_models.py"))
        .arg("--fixtures")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "make_models.py --fixtures failed");
    let alpha = dir.path().join("alpha_mlp/1");
    std::fs::create_dir_all(&alpha).unwrap();
    std::fs::copy(
        root().join("config/models/alpha_mlp/1/model.onnx"),
        alpha.join("model.onnx"),
    )
    .unwrap();
    dir
}

/// The sum of a counter over all its label sets in Prometheus text.
pub fn counter_total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
