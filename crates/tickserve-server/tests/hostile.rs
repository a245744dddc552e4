//! Hostile clients, over HTTP and gRPC, against a real server on loopback:
//! each case is followed by a normal request that must succeed.
//!
//! Durations: a client's timeout so large that `now + timeout` would overflow
//! an `Instant` is the longest deadline (an hour), not a panic; a
//! `grpc-timeout` outside the gRPC spec is INVALID_ARGUMENT; a `model.toml`
//! with an absurd `max_queue_delay` or `timeout` fails that model's load with
//! a message naming the key and the limit, and the other models serve.

#![allow(clippy::unwrap_used)]

mod common;

use serde_json::{Value, json};
use tickserve_server::grpc::pb;
use tickserve_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;

/// `alpha_mlp`, and two copies of it whose `model.toml` asks for absurd durations.
fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, toml) in [
        ("alpha_mlp", ""),
        ("slow_batcher", "max_queue_delay = \"100000000000s\"\n"),
        ("patient", "timeout = \"10000000000000000000s\"\n"),
    ] {
        let model = dir.path().join(name);
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::copy(
            common::root().join("config/models/alpha_mlp/1/model.onnx"),
            model.join("1/model.onnx"),
        )
        .unwrap();
        std::fs::write(model.join("model.toml"), toml).unwrap();
    }
    dir
}

fn one_row() -> Value {
    let data: Vec<f32> = (0..50).map(|i| i as f32 / 50.0).collect();
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": data}]})
}

fn grpc_one_row() -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "alpha_mlp".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![1, 50],
            parameters: Default::default(),
            contents: None,
        }],
        raw_input_contents: vec![(0..50).flat_map(|i| (i as f32).to_le_bytes()).collect()],
        ..Default::default()
    }
}

/// POSTs one row of `alpha_mlp` with `headers` and request `parameters`.
async fn http_infer(
    client: &reqwest::Client,
    base: &str,
    headers: &[(&str, &str)],
    parameters: Value,
) -> (u16, String) {
    let mut body = one_row();
    body["parameters"] = parameters;
    let mut request = client
        .post(format!("{base}/v2/models/alpha_mlp/infer"))
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflowing_durations_are_refused_or_bounded_never_a_panic() {
    let repository = repository();
    let server = common::start(&common::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let good = |answer: (u16, String)| assert_eq!(answer.0, 200, "{}", answer.1);

    // HTTP: a header and a parameter each far past what an Instant can hold.
    for (headers, parameters) in [
        (
            vec![("Tickserve-Timeout", "10000000000000000000s")],
            json!({}),
        ),
        (vec![], json!({"timeout": u64::MAX})),
        (
            vec![("Tickserve-Timeout", "18446744073709551615s")],
            json!({"timeout": u64::MAX}),
        ),
    ] {
        let (status, text) = http_infer(&http, &base, &headers, parameters.clone()).await;
        assert_eq!(status, 200, "{headers:?} {parameters}: {text}");
        good(http_infer(&http, &base, &[], json!({})).await);
    }
    // A duration humantime cannot hold is a clear 400.
    let (status, text) = http_infer(
        &http,
        &base,
        &[("Tickserve-Timeout", "100000000000000000000000s")],
        json!({}),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("tickserve-timeout"), "{text}");
    good(http_infer(&http, &base, &[], json!({})).await);

    // gRPC: the largest grpc-timeout the spec allows, a parameter of i64::MAX,
    // and a grpc-timeout with more digits than the spec allows.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let with_timeout = |value: &'static str| {
        let mut request = tonic::Request::new(grpc_one_row());
        request
            .metadata_mut()
            .insert("grpc-timeout", value.parse().unwrap());
        request
    };
    grpc.model_infer(with_timeout("99999999H")).await.unwrap();
    let mut huge_parameter = grpc_one_row();
    huge_parameter.parameters.insert(
        "timeout".into(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(i64::MAX)),
        },
    );
    grpc.model_infer(huge_parameter).await.unwrap();
    let refused = grpc
        .model_infer(with_timeout("18446744073709551615S"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("grpc-timeout"),
        "{}",
        refused.message()
    );
    grpc.model_infer(grpc_one_row()).await.unwrap();

    // model.toml: each absurd duration fails its own model's load, naming
    // the key and the limit; alpha_mlp serves on.
    for (model, needles) in [
        (
            "slow_batcher",
            ["max_queue_delay is", "the most it may be is 1s"],
        ),
        ("patient", ["timeout is", "the most it may be is 1h"]),
    ] {
        let response = http
            .post(format!("{base}/v2/models/{model}/infer"))
            .json(&one_row())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, 503, "{model}: {text}");
        for needle in needles {
            assert!(text.contains(needle), "{model}: '{text}' lacks '{needle}'");
        }
    }
    good(http_infer(&http, &base, &[], json!({})).await);
    server.shutdown().await.unwrap();
}
