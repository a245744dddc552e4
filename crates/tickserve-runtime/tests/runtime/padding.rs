//! A batch padded to its bucket tells the engine how many of the bucket's
//! rows are the batch's (`CompiledModel::run_rows`), so an engine that runs
//! rows one by one (the resident GPU kernel) leaves the padding unrun.

use std::sync::{Arc, Mutex};

use tickserve_core::config::ServerConfig;
use tickserve_engine_cuda::Gpus;
use tickserve_runtime::{Engines, Runtime};

use crate::support;
use support::{copy_sample_model, hooked_engine, library, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_padded_batch_runs_with_its_own_row_count() {
    let runs: Arc<Mutex<Vec<usize>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let engine = hooked_engine(Arc::new(move |firsts: &[f32]| {
        seen.lock().unwrap().push(firsts.len());
        Ok(())
    }));
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("buckets = [1, 4]\n"));
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    let engines = Engines::new(engine.clone(), engine, Gpus::Absent("test".into()));
    let runtime = Runtime::load_with(&config, engines).unwrap();
    runs.lock().unwrap().clear();
    // Three rows: bucket 4, one row of padding.
    let values: Vec<f32> = (0..3 * 50).map(|i| i as f32 / 128.0).collect();
    let answer = runtime
        .infer(request("alpha_mlp", "features", vec![3, 50], &values))
        .await
        .unwrap();
    assert_eq!(answer.outputs[0].shape[0], 3);
    assert_eq!(*runs.lock().unwrap(), [3], "the rows each run was told of");
    runtime.shutdown();
}
