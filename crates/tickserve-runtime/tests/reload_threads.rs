//! Reloading an unshared model 50 times leaves the process's thread count
//! flat: each reload founds a new family with its own executor threads, and
//! the old family's threads stop once it is gone. (A binary of its own: other
//! tests in the same process would start and stop threads meanwhile.)

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The process's thread count (Linux).
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn fifty_reloads_of_an_unshared_model_leave_the_thread_count_flat() {
    let dir = tempfile::tempdir().unwrap();
    let version = dir.path().join("alpha_mlp/1");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::copy(
        root().join("config/models/alpha_mlp/1/model.onnx"),
        version.join("model.onnx"),
    )
    .unwrap();
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    config.model_defaults.share_weights = false;
    config.model_defaults.executors = 2;
    let runtime = Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");
    runtime.load_model("alpha_mlp").unwrap();
    // Old executors stop once their family is gone; give them a moment.
    std::thread::sleep(Duration::from_millis(200));
    let before = threads();
    for _ in 0..50 {
        runtime.load_model("alpha_mlp").unwrap();
    }
    let until = Instant::now() + Duration::from_secs(10);
    while threads() > before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = threads();
    println!("threads: {before} before 50 reloads, {after} after");
    assert!(
        after <= before,
        "threads: {before} before 50 reloads, {after} after"
    );
    runtime.shutdown();
}
