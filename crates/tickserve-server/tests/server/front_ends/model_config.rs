//! The model configuration over HTTP and gRPC tells the truth: the configured
//! `max_queue_delay`, the buckets, the executors per replica, the engine's
//! platform (the compiled CPU engine's, or ONNX Runtime's where `engine` says), one instance group per replica (real server on loopback).

use crate::support;

use serde_json::{Value, json};
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

/// A repository with `alpha_mlp` configured away from every default, and
/// `alpha_ort`, the same model kept on ONNX Runtime (`engine`).
fn configured_repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let toml = "buckets = [1, 4, 16]\nexecutors = 2\nmax_queue_delay = \"250us\"\n\
                max_request_rows = 48\ndevices = [\"cpu\", \"cpu\"]\n";
    support::sample(dir.path(), "alpha_mlp", "alpha_mlp", 1, Some(toml));
    let toml = "engine = \"onnxruntime\"\nshare_weights = false\n";
    support::sample(dir.path(), "alpha_mlp", "alpha_ort", 1, Some(toml));
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_config_reports_what_is_configured_over_http_and_grpc() {
    let repository = configured_repository();
    let server = support::start(&support::config(repository.path())).await;

    let http: Value = reqwest::get(format!(
        "http://{}/v2/models/alpha_mlp/config",
        server.http_addr
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    // The compiled CPU engine takes the MLP ("auto", the default).
    assert_eq!(http["platform"], "tickserve_cpu");
    assert_eq!(http["backend"], "tickserve_cpu");
    assert_eq!(http["max_batch_size"], 48);
    assert_eq!(
        http["dynamic_batching"],
        json!({"preferred_batch_size": [1, 4, 16], "max_queue_delay_microseconds": 250})
    );
    assert_eq!(
        http["instance_group"],
        json!([
            {"name": "alpha_mlp", "kind": "KIND_CPU", "count": 2},
            {"name": "alpha_mlp_1", "kind": "KIND_CPU", "count": 2},
        ])
    );
    assert_eq!(http["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(http["input"][0]["dims"], json!([50]));

    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let grpc = client
        .model_config(pb::ModelConfigRequest {
            name: "alpha_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(
        (grpc.platform.as_str(), grpc.backend.as_str()),
        ("tickserve_cpu", "tickserve_cpu")
    );
    let ort = client
        .model_config(pb::ModelConfigRequest {
            name: "alpha_ort".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(
        (ort.platform.as_str(), ort.backend.as_str()),
        ("onnxruntime_onnx", "onnxruntime"),
        "engine = \"onnxruntime\" keeps the model on ONNX Runtime"
    );
    assert_eq!(grpc.max_batch_size, 48);
    let Some(pb::model_config::SchedulingChoice::DynamicBatching(batching)) =
        grpc.scheduling_choice
    else {
        panic!("a stateless model reports dynamic_batching");
    };
    assert_eq!(batching.preferred_batch_size, vec![1, 4, 16]);
    assert_eq!(batching.max_queue_delay_microseconds, 250);
    let groups: Vec<(String, i32, i32, Vec<i32>)> = grpc
        .instance_group
        .into_iter()
        .map(|g| (g.name, g.kind, g.count, g.gpus))
        .collect();
    let cpu = pb::model_instance_group::Kind::Cpu as i32;
    assert_eq!(
        groups,
        vec![
            ("alpha_mlp".to_string(), cpu, 2, vec![]),
            ("alpha_mlp_1".to_string(), cpu, 2, vec![]),
        ]
    );
    assert_eq!(
        grpc.input[0].data_type,
        pb::DataType::TypeFp32 as i32,
        "{:?}",
        grpc.input
    );
    server.shutdown().await.unwrap();
}
