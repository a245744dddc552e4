//! Models no one here wrote, served on the engine `runtime.cpu_engine =
//! "auto"` chooses: tree ensembles from LightGBM's, XGBoost's and
//! scikit-learn's converters, LSTMs, GRUs and dense networks from PyTorch's
//! two exporters and tf2onnx; every model's configuration names the compiled CPU engine (the
//! one that is not a plan names ONNX Runtime), and its answers over KServe
//! v2 HTTP and gRPC, shared memory and TF Serving's API equal onnxruntime's
//! (`tests/python/exported_check.py`, `tests/python/tfserving_check.py`).

use crate::support;

/// Serves `corpus` (shared memory on too) and runs both checks on it,
/// `extra` passed to exported_check.py, the stateful models `stateful`
/// skipped by TF Serving's API (it carries no sequence parameters).
async fn serve(corpus: &str, name: &str, extra: &[&str], stateful: &str) {
    let repository = support::root().join(corpus);
    let mut config = support::config(&repository);
    let service = format!("tickserve-test-{}-{name}", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    let server = support::start(&config).await;
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--service".as_ref(),
        service.as_ref(),
        "--repository".as_ref(),
        repository.as_os_str(),
        "--engine".as_ref(),
        "tickserve_cpu".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    support::run_python_check(&server, "exported_check.py", &args, "done").await;
    support::run_python_check(
        &server,
        "tfserving_check.py",
        &[
            "--repository".as_ref(),
            repository.as_os_str(),
            "--models".as_ref(),
            "*".as_ref(),
            "--skip".as_ref(),
            stateful.as_ref(),
        ],
        "done",
    )
    .await;
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_tree_ensembles_answer_as_onnxruntime_on_every_front_end() {
    serve(
        "crates/tickserve-engine-cpu/tests/exported",
        "trees",
        &["--nan"],
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_sequence_and_dense_models_answer_as_onnxruntime_on_every_front_end() {
    serve(
        "crates/tickserve-engine-cuda/tests/exported",
        "sequences",
        // tf2onnx writes a Keras GRU with reset_after=False as a Loop, and
        // a Keras LayerNormalization as a reshape around a BatchNormalization.
        &[
            "--except",
            "tf_gru_v1=onnxruntime",
            "--except",
            "tf_mlp_norm=onnxruntime",
        ],
        "pt_lstm_state",
    )
    .await;
}
