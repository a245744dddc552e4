//! Reloading an unshared model 50 times leaves the process's thread count
//! flat: each reload founds a new family with its own executor threads, and
//! the old family's threads stop once it is gone. (Alone in its process,
//! [`support::alone`]: other tests in the same process would start and stop
//! threads meanwhile.)

use std::time::{Duration, Instant};

use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

use crate::support;
use support::{copy_sample_model, library};

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
    if support::alone(
        module_path!(),
        "fifty_reloads_of_an_unshared_model_leave_the_thread_count_flat",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    config.model_defaults.share_weights = false;
    config.model_defaults.executors = 2;
    let runtime = Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");
    runtime.load_model("alpha_mlp").unwrap();
    // Old executors stop once their family is gone; give them a moment. A
    // fixed wait: the count it settles at is what is measured (the loop
    // below waits for the threads of the 50 reloads with a deadline).
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
