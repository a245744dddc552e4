//! Triton's official Python clients against a real server on loopback: metadata
//! and inference on every sample model, compared with onnxruntime (Python).

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_http_and_grpc_match_onnxruntime() {
    let repository = support::root().join("config/models");
    let server = support::start(&support::config(&repository)).await;
    support::run_python_check(
        &server,
        "tritonclient_check.py",
        &["--repository".as_ref(), repository.as_os_str()],
        "all models match",
    )
    .await;
    server.shutdown().await.expect("clean shutdown");
}
