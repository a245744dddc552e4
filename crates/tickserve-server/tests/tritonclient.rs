//! Triton's official Python clients against a real server on loopback: metadata
//! and inference on every sample model, compared with onnxruntime (Python).

#![allow(clippy::unwrap_used)]

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_http_and_grpc_match_onnxruntime() {
    let repository = common::root().join("config/models");
    let server = common::start(&common::config(&repository)).await;
    let (http, grpc) = (server.http_addr.to_string(), server.grpc_addr.to_string());
    let output = tokio::process::Command::new(common::python())
        .arg(common::root().join("tests/e2e_tritonclient.py"))
        .args(["--http", &http, "--grpc", &grpc, "--repository"])
        .arg(&repository)
        .output()
        .await
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(
        output.status.success(),
        "tritonclient check failed:\n{text}"
    );
    assert!(text.contains("all models match"));
    server.shutdown().await.expect("clean shutdown");
}
