//! A model whose rows depend on each other (each row minus the batch mean:
//! the fixtures' `batch_mean`) is found at load and never runs two requests
//! together, so one client's rows cannot change another's answer; with
//! `mixed_rows = "refuse"` its load fails saying why.

use std::sync::Arc;
use std::time::Duration;

use tickserve_core::InferRequest;
use tickserve_core::config::ServerConfig;
use tickserve_runtime::{Runtime, VersionState};

use crate::support;
use support::{request, root};

fn row(values: [f32; 4]) -> InferRequest {
    request("batch_mean", "x", vec![1, 4], &values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_rows_mix_never_runs_two_requests_together() {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("scripts/dev/make_models.py"))
        .arg("--fixtures")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(
        made.success(),
        "make_models.py --fixtures (run scripts/setup.sh first)"
    );
    // The same model whose largest bucket is 2: the smallest batch in which
    // rows can mix is still probed.
    let pair = dir.path().join("batch_mean_pair");
    std::fs::create_dir_all(pair.join("1")).unwrap();
    std::fs::copy(
        dir.path().join("batch_mean/1/model.onnx"),
        pair.join("1/model.onnx"),
    )
    .unwrap();
    std::fs::write(
        pair.join("model.toml"),
        "mixed_rows = \"refuse\"\nbuckets = [1, 2]\n",
    )
    .unwrap();
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    // Every request through the executor thread, waiting for company: the
    // conditions in which requests are batched together.
    config.runtime.inline_budget = Duration::ZERO;
    config.model_defaults.max_queue_delay = Duration::from_millis(20);
    let runtime = Arc::new(Runtime::load(&config).unwrap());

    let models = runtime.models();
    let Some((_, VersionState::Failed(reason))) = models["batch_mean_refused"].default_version()
    else {
        panic!("batch_mean_refused loaded")
    };
    assert!(
        reason.contains("depend on each other") && reason.contains("refuse"),
        "{reason}"
    );
    let Some((_, VersionState::Failed(reason))) = models["batch_mean_pair"].default_version()
    else {
        panic!("batch_mean_pair (buckets [1, 2]) loaded: its rows were not probed")
    };
    assert!(reason.contains("depend on each other"), "{reason}");

    // Alone, each row minus its own mean is zero; batched with others it
    // would not be. Many clients at once, each must get exactly zeros.
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let runtime = Arc::clone(&runtime);
            tokio::spawn(async move {
                let base = i as f32;
                runtime.infer(row([base, base, base, base])).await
            })
        })
        .collect();
    for task in tasks {
        let answer = task.await.unwrap().unwrap();
        assert!(
            answer.outputs[0].data.iter().all(|&b| b == 0),
            "another client's rows changed this answer: {:?}",
            answer.outputs[0].data
        );
    }
    let runtime = Arc::try_unwrap(runtime).ok().unwrap();
    runtime.shutdown();
}
