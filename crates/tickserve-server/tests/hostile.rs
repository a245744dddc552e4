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
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bool_bytes_are_normalized_and_every_error_status_has_a_json_body() {
    let repository = common::fixture_repository();
    let server = common::start(&common::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();

    // BOOL as raw bytes 2, 0 and 255 (the binary extension carries any byte):
    // read as true, false, true, never handed to the engine as they came.
    let header = json!({"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}},
        {"name": "mask", "datatype": "BOOL", "shape": [1, 3], "parameters": {"binary_data_size": 3}},
        {"name": "scale", "datatype": "FP64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend([1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()));
    body.extend([2u8, 0, 255]);
    body.extend([0.5f64; 3].iter().flat_map(|v| v.to_le_bytes()));
    let response = http
        .post(format!("{base}/v2/models/typed_io/infer"))
        .header("Inference-Header-Content-Length", json_len)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["outputs"][1]["data"], json!([1, 0, 3]));

    // A wrong method and an unknown path answer with the JSON error body.
    for (method, path, status) in [
        (reqwest::Method::GET, "/v2/models/alpha_mlp/infer", 405),
        (reqwest::Method::DELETE, "/v2/models/alpha_mlp", 405),
        (reqwest::Method::GET, "/v3/nothing/here", 404),
    ] {
        let response = http
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains(path), "{method} {path}: {body}");
    }
    let (status, text) = http_infer(&http, &base, &[], json!({})).await;
    assert_eq!(status, 200, "{text}");
    server.shutdown().await.unwrap();
}

/// Whether `message` names a client's string by a short prefix and its length.
fn quoted_short(message: &str, length: usize) -> bool {
    message.len() < 1024 && message.contains(&format!("{length} bytes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_client_string_comes_back_as_a_short_prefix_and_its_length_on_every_front_end() {
    let repository = repository();
    let server = common::start(&common::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let long = "x".repeat(2 << 20);
    let length = long.len();

    // v2 HTTP: a string element, a string where a flag belongs, and a string
    // where serde expects a list (its own "invalid type" text).
    let mut element = one_row();
    element["inputs"][0]["data"][3] = json!(long);
    // (Request parameters are bounded at 64 KiB of JSON.)
    let medium = "y".repeat(60_000);
    let mut flag = one_row();
    flag["parameters"] = json!({"sequence_start": medium});
    let mut shape = one_row();
    shape["inputs"][0]["shape"] = json!(long);
    let tf = json!({"instances": [[long]]});
    for (path, body, length) in [
        ("/v2/models/alpha_mlp/infer", element, length),
        ("/v2/models/alpha_mlp/infer", flag, medium.len()),
        ("/v2/models/alpha_mlp/infer", shape, length),
        ("/v1/models/alpha_mlp:predict", tf, length),
    ] {
        let response = http
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path}");
        let answer: Value = response.json().await.unwrap();
        let message = answer["error"].as_str().unwrap();
        assert!(quoted_short(message, length), "{path}: {message:.300}");
    }

    // v2 gRPC: a string where a flag belongs; the message rides in a header.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let mut request = grpc_one_row();
    request.parameters.insert(
        "sequence_start".into(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::StringParam(
                long.clone(),
            )),
        },
    );
    let status = grpc.model_infer(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        quoted_short(status.message(), length),
        "{:.300}",
        status.message()
    );

    // Other requests were never harmed.
    let (status, text) = http_infer(&http, &base, &[], json!({})).await;
    assert_eq!(status, 200, "{text}");
    server.shutdown().await.unwrap();
}
