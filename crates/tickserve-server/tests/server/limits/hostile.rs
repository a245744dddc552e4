//! Hostile clients, over HTTP and gRPC, against a real server on loopback:
//! each case is followed by a normal request that must succeed.
//!
//! Durations: a client's timeout so large that `now + timeout` would overflow
//! an `Instant` is the longest deadline (an hour), not a panic; a
//! `grpc-timeout` outside the gRPC spec is INVALID_ARGUMENT; a `model.toml`
//! with an absurd `max_queue_delay` or `timeout` fails that model's load with
//! a message naming the key and the limit, and the other models serve.
//!
//! A unary gRPC call that ends before its message is INVALID_ARGUMENT, on
//! the v2 inference (served from the message's bytes), another v2 method and
//! TF Serving's Predict.
//!
//! A hostile repository, in `poll` mode: no file outside a model's directory
//! reaches a client (a `model.toml` or an initial file that links or points
//! out), no file stops the poll or the server (a FIFO, a device, a huge
//! file), and one version is one directory (`01` and `+1` are not `1`).

use crate::support;

use std::path::Path;
use std::time::Duration;

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
        support::sample(dir.path(), "alpha_mlp", name, 1, Some(toml));
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
    let server = support::start(&support::config(repository.path())).await;
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
    let repository = support::fixture_repository();
    let server = support::start(&support::config(repository.path())).await;
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
    let server = support::start(&support::config(repository.path())).await;
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

/// A secret outside the repository that no client may read.
const SECRET: &str = "sk-live-7f3a9c0b1d";

/// The reason the index gives for model `name` once the poll has tried it
/// (before, it is "unloaded").
async fn reason_of(base: &str, name: &str) -> String {
    support::until(&format!("{name} listed with a reason"), || async {
        support::repository_index(base)
            .await
            .into_iter()
            .find(|(n, _, _, reason)| n == name && !reason.is_empty() && reason != "unloaded")
            .map(|(_, _, _, reason)| reason)
    })
    .await
}

fn link(target: &Path, at: &Path) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_outside_a_model_never_reach_clients_and_no_file_stops_the_poll() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("api.key");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    // 64 bytes: exactly one row of seq_lstm_step's h (16 FP32).
    let foreign_row = outside.path().join("h0.bin");
    std::fs::write(&foreign_row, [7u8; 64]).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let repo = scratch.path();
    support::deploy_version(repo, "tick_000", 1, "tick_000");
    let server = support::start(&support::poll_config(repo, Duration::from_millis(100))).await;
    let base = format!("http://{}", server.http_addr);

    // model.toml: a link to a key file outside, a FIFO, a link to
    // /dev/zero, a file past the limit.
    for (model, from) in [
        ("leak", "tick_001"),
        ("fifo", "tick_002"),
        ("zero", "tick_003"),
        ("big", "tick_004"),
    ] {
        support::deploy_version(repo, model, 1, from);
    }
    link(&secret, &repo.join("leak/model.toml"));
    let fifo = std::process::Command::new("mkfifo")
        .arg(repo.join("fifo/model.toml"))
        .status()
        .unwrap();
    assert!(fifo.success());
    link(Path::new("/dev/zero"), &repo.join("zero/model.toml"));
    let huge_line = format!("x = \"{}\"\n", "a".repeat(100_000));
    std::fs::write(repo.join("big/model.toml"), huge_line).unwrap();
    // Initial files: absolute, through `..`, and a link leading out.
    let pairs = |initial: &str| {
        format!(
            "[[sequence.state]]\ninput = \"h_in\"\noutput = \"h_out\"\ninitial_file = \"{initial}\"\n\
             [[sequence.state]]\ninput = \"c_in\"\noutput = \"c_out\"\n"
        )
    };
    let outside_name = outside.path().file_name().unwrap().to_str().unwrap();
    let up = format!("../../{outside_name}/h0.bin");
    for (model, initial) in [
        ("init_absolute", foreign_row.to_str().unwrap()),
        ("init_up", up.as_str()),
        ("init_link", "h0.bin"),
    ] {
        let dir = repo.join(model);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.toml"), pairs(initial)).unwrap();
        if model == "init_link" {
            link(&foreign_row, &dir.join("h0.bin"));
        }
        support::deploy_version(repo, model, 1, "seq_lstm_step");
    }

    let server_path = repo.to_string_lossy().to_string();
    let outside_path = outside.path().to_string_lossy().to_string();
    let not_regular = "not a regular file inside the model's directory";
    let not_inside = "not a path inside the model's directory";
    for (model, expected) in [
        ("leak", format!("leak/model.toml: {not_regular}")),
        ("fifo", format!("fifo/model.toml: {not_regular}")),
        ("zero", format!("zero/model.toml: {not_regular}")),
        ("big", "big/model.toml: larger than 65536 bytes".to_string()),
        ("init_absolute", not_inside.to_string()),
        ("init_up", not_inside.to_string()),
        ("init_link", format!("initial_file 'h0.bin': {not_regular}")),
    ] {
        let reason = reason_of(&base, model).await;
        assert!(reason.contains(&expected), "{model}: {reason}");
        // An initial file's name is shown as model.toml writes it.
        let foreign_path = (!model.starts_with("init_")).then_some(outside_path.as_str());
        let leaks = [SECRET, &server_path, "64 bytes"]
            .into_iter()
            .chain(foreign_path);
        for leaked in leaks {
            assert!(!reason.contains(leaked), "{model} shows {leaked}: {reason}");
        }
        // Inference names the failed load, and shows nothing more.
        let (status, answer) = support::post_json(
            &format!("{base}/v2/models/{model}/infer"),
            &json!({"inputs": [{"name": "features", "datatype": "FP32",
                                "shape": [1, 16], "data": vec![0.5; 16]}]}),
        )
        .await;
        assert_ne!(status, 200, "{model}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(!error.contains(SECRET), "{model}: {error}");
        assert!(!error.contains(&server_path), "{model}: {error}");
    }

    // The poll goes on: a change after all that still applies.
    support::deploy_version(repo, "tick_000", 2, "tick_002");
    support::until("tick_000 version 2 serves", || async {
        let listed = support::repository_index(&base).await;
        listed
            .iter()
            .any(|(n, v, s, _)| n == "tick_000" && v == "2" && s == "READY")
            .then_some(())
    })
    .await;
    server.shutdown().await.expect("clean shutdown");
}

/// The `signal` a one-row request to `model` answers.
async fn signal(base: &str, model: &str) -> Vec<Value> {
    let (status, answer) = support::post_json(
        &format!("{base}/v2/models/{model}/infer"),
        &json!({"inputs": [{"name": "features", "datatype": "FP32",
                            "shape": [1, 16], "data": vec![0.25; 16]}]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    answer["outputs"][0]["data"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_version_is_one_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let repo = scratch.path();
    support::deploy_version(repo, "reference", 1, "tick_000");
    let server = support::start(&support::poll_config(repo, Duration::from_millis(100))).await;
    let base = format!("http://{}", server.http_addr);
    // `1` is version 1; `01` and `+1` name no version (else they would load
    // as replicas of version 1 with other weights).
    let model = repo.join("versions");
    for (dir, from) in [("01", "tick_001"), ("+1", "tick_002"), ("1", "tick_000")] {
        let hidden = model.join(format!(".{dir}"));
        std::fs::create_dir_all(&hidden).unwrap();
        std::fs::copy(
            support::root().join(format!("config/models/{from}/1/model.onnx")),
            hidden.join("model.onnx"),
        )
        .unwrap();
        std::fs::rename(&hidden, model.join(dir)).unwrap();
    }
    support::until("versions/1 serves", || async {
        let listed = support::repository_index(&base).await;
        listed
            .iter()
            .any(|(n, v, s, _)| n == "versions" && v == "1" && s == "READY")
            .then_some(())
    })
    .await;
    let listed: Vec<_> = support::repository_index(&base)
        .await
        .into_iter()
        .filter(|(n, ..)| n == "versions")
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let expected = signal(&base, "reference").await;
    for _ in 0..30 {
        let answered = signal(&base, "versions").await;
        assert_eq!(answered, expected, "another graph answered");
    }
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_call_without_its_message_is_invalid_argument() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let channel = support::grpc_channel(&server).await;
    for method in [
        support::MODEL_INFER,
        "/inference.GRPCInferenceService/ModelReady",
        "/tensorflow.serving.PredictionService/Predict",
    ] {
        let mut raw = tonic::client::Grpc::new(channel.clone());
        raw.ready().await.unwrap();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        // A client stream of no messages: the call's body ends at once.
        let nothing = tokio_stream::iter(Vec::<bytes::Bytes>::new());
        let status = raw
            .client_streaming(tonic::Request::new(nothing), path, support::RawCodec)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        assert!(
            status.message().contains("no request message"),
            "{method}: {status:?}"
        );
    }
    // The server serves on.
    support::grpc_client(&server)
        .await
        .model_infer(support::grpc_alpha_row())
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}
