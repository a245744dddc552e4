//! Warm from the first request: `Runtime::warm_here` runs every ready model
//! once on the calling thread, on each of its executors (the server calls it
//! on every thread that may run a request at once before it reports ready),
//! and counts nothing as a request.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use tickserve_core::config::ServerConfig;
use tickserve_engine_cuda::Gpus;
use tickserve_runtime::{Engines, Runtime};

use crate::support;
use support::{copy_sample_model, hooked_engine, library};

#[test]
fn warm_here_runs_each_executor_on_the_calling_thread_and_counts_no_request() {
    let runs: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let engine = hooked_engine(Arc::new(move |_: &[f32]| {
        seen.lock().unwrap().push(std::thread::current().id());
        Ok(())
    }));
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    config.model_defaults.executors = 2;
    let engines = Engines::new(engine.clone(), engine, Gpus::Absent("test".into()));
    let runtime = Runtime::load_with(&config, engines).unwrap();

    let warming = std::thread::spawn(move || {
        runtime.warm_here();
        (std::thread::current().id(), runtime)
    });
    let (thread, runtime) = warming.join().unwrap();
    let on_it = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t == thread)
        .count();
    assert_eq!(on_it, 2, "one run per executor on the warming thread");
    let stats = runtime.model("alpha_mlp", None).unwrap().stats.snapshot();
    assert_eq!(stats.success.count, 0);
    assert_eq!(stats.inference_count, 0);
    assert_eq!(stats.execution_count, 0);
}
