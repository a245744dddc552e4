//! Output guards (`[[guard]]` in `model.toml`) on a real server: an answer
//! outside a guard's bounds, or holding a non-finite value, is withheld on
//! every front end with one kind of error (gRPC OUT_OF_RANGE, HTTP 422,
//! shared memory's OUT_OF_RANGE) naming the model, version, output, bound and
//! the element's position; an answer inside passes; a tripped sequence tick
//! leaves the sequence's state as it was; trips are counted.

use crate::support;

use std::path::Path;

use tickserve_client::{ClientError, GrpcClient, ShmClient, Tensor};
use tickserve_proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;

/// `alpha_mlp` under `name`, with `toml` as its `model.toml`.
fn alpha(repository: &Path, name: &str, toml: &str) {
    support::sample(repository, "alpha_mlp", name, 1, Some(toml));
}

/// A repository: `alpha_tight` (every probability is above 0: always trips),
/// `alpha_loose` (probabilities within [0, 1]: never trips), `alpha_nan`
/// (NaN inputs allowed, a guard with no bounds) and `step` (`seq_lstm_step`,
/// its prediction at least -0.35).
fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    alpha(
        path,
        "alpha_tight",
        "[[guard]]\noutput = \"probabilities\"\nmax = 0.0\n",
    );
    alpha(
        path,
        "alpha_loose",
        "[[guard]]\noutput = \"probabilities\"\nmin = 0.0\nmax = 1.0\n",
    );
    alpha(
        path,
        "alpha_nan",
        "nan_policy = \"allow\"\n[[guard]]\noutput = \"probabilities\"\n",
    );
    support::deploy_version(path, "step", 1, "seq_lstm_step");
    let sample =
        std::fs::read_to_string(support::root().join("config/models/seq_lstm_step/model.toml"))
            .unwrap();
    // The sample's predictions for ticks of all 0.5, then all 5.0 or all
    // 0.25 (onnxruntime): -0.286, then -0.362 or -0.296.
    std::fs::write(
        path.join("step/model.toml"),
        format!("{sample}\n[[guard]]\noutput = \"prediction\"\nmin = -0.35\n"),
    )
    .unwrap();
    support::deploy_version(path, "stepped", 1, "seq_lstm_step");
    std::fs::write(
        path.join("stepped/model.toml"),
        format!("{sample}\n[[guard]]\noutput = \"prediction\"\nmax_step = 0.05\n"),
    )
    .unwrap();
    dir
}

fn row(value: f32) -> Tensor {
    Tensor::from_f32("features", &[1, 50], &[value; 50])
}

/// The words every front end's message carries for `alpha_tight`'s trip.
fn names_the_trip(message: &str) {
    for words in [
        "alpha_tight",
        "version 1",
        "guard on output 'probabilities'",
        "element [0, 0]",
        "max = 0",
        "withheld",
    ] {
        assert!(message.contains(words), "{words:?} missing: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tripped_guard_withholds_the_answer_alike_on_every_front_end() {
    if support::alone(
        module_path!(),
        "a_tripped_guard_withholds_the_answer_alike_on_every_front_end",
    ) {
        return;
    }
    let repository = repository();
    let mut config = support::config(repository.path());
    let service = format!("tickserve-test-{}-guards", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);

    // HTTP v2: 422, the trip named.
    let body = serde_json::json!({
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": vec![0.5; 50]}]
    });
    let (status, answer) =
        support::post_json(&format!("{base}/v2/models/alpha_tight/infer"), &body).await;
    assert_eq!(status, 422, "{answer}");
    names_the_trip(answer["error"].as_str().unwrap());
    let (status, answer) =
        support::post_json(&format!("{base}/v2/models/alpha_loose/infer"), &body).await;
    assert_eq!(status, 200, "{answer}");

    // gRPC v2: OUT_OF_RANGE.
    let grpc = GrpcClient::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    match grpc.infer("alpha_tight", &[row(0.5)]).await {
        Err(ClientError::Server { code, message }) => {
            assert_eq!(code, "OUT_OF_RANGE");
            names_the_trip(&message);
        }
        other => panic!("{other:?}"),
    }
    assert!(grpc.infer("alpha_loose", &[row(0.5)]).await.is_ok());
    // A gRPC stream: the error in the stream's answer.
    let answer = support::stream_once(&server, support::grpc_row("alpha_tight", 50, 0.5)).await;
    names_the_trip(&answer.error_message);
    assert!(answer.infer_response.is_none());
    // A non-finite output trips a guard with no bounds.
    match grpc.infer("alpha_nan", &[row(f32::NAN)]).await {
        Err(ClientError::Server { code, message }) => {
            assert_eq!(code, "OUT_OF_RANGE");
            assert!(message.contains("outside finite"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(grpc.infer("alpha_nan", &[row(0.5)]).await.is_ok());
    // The same non-finite trip on every front end that carries NaN: the gRPC
    // stream, TF Serving REST (its bare NaN token), and below TF Serving gRPC,
    // v2 HTTP's binary tensors and shared memory (v2 HTTP JSON has no NaN).
    let answer = support::stream_once(&server, support::grpc_row("alpha_nan", 50, f32::NAN)).await;
    assert!(
        answer.error_message.contains("outside finite"),
        "{answer:?}"
    );
    let nan_row = format!("[{}]", vec!["NaN"; 50].join(","));
    let tf_nan = reqwest::Client::new()
        .post(format!("{base}/v1/models/alpha_nan:predict"))
        .header("content-type", "application/json")
        .body(format!("{{\"instances\": [{nan_row}]}}"))
        .send()
        .await
        .unwrap();
    assert_eq!(tf_nan.status().as_u16(), 422);
    assert!(tf_nan.text().await.unwrap().contains("outside finite"));

    // TF Serving REST: 422; TF Serving gRPC: OUT_OF_RANGE.
    let tf_rest = reqwest::Client::new()
        .post(format!("{base}/v1/models/alpha_tight:predict"))
        .json(&serde_json::json!({"instances": [vec![0.5; 50]]}))
        .send()
        .await
        .unwrap();
    assert_eq!(tf_rest.status().as_u16(), 422);
    names_the_trip(&tf_rest.text().await.unwrap());
    let mut predictions = PredictionServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let predict = |model: &str, value: f32| support::tf_predict(model, &[value; 50]);
    let refused = predictions
        .predict(predict("alpha_tight", 0.5))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
    names_the_trip(refused.message());
    let refused = predictions
        .predict(predict("alpha_nan", f32::NAN))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
    assert!(
        refused.message().contains("outside finite"),
        "{}",
        refused.message()
    );
    // v2 HTTP's binary tensors carry NaN too.
    let header = serde_json::json!({"inputs": [{"name": "features", "datatype": "FP32",
        "shape": [1, 50], "parameters": {"binary_data_size": 200}}]})
    .to_string();
    let mut binary = header.clone().into_bytes();
    binary.extend(std::iter::repeat_n(f32::NAN.to_le_bytes(), 50).flatten());
    let answer = reqwest::Client::new()
        .post(format!("{base}/v2/models/alpha_nan/infer"))
        .header("Inference-Header-Content-Length", header.len())
        .body(binary)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 422);
    assert!(answer.text().await.unwrap().contains("outside finite"));

    // Shared memory: OUT_OF_RANGE.
    let shm = tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        (
            client.infer("alpha_tight", &[row(0.5)]),
            client.infer("alpha_loose", &[row(0.5)]),
            client.infer("alpha_nan", &[row(f32::NAN)]),
        )
    })
    .await
    .unwrap();
    match shm.0 {
        Err(ClientError::Server { code, message }) => {
            assert_eq!(code, "OUT_OF_RANGE");
            names_the_trip(&message);
        }
        other => panic!("{other:?}"),
    }
    assert!(shm.1.is_ok());
    assert!(
        matches!(&shm.2, Err(ClientError::Server { code, message }) if code == "OUT_OF_RANGE" && message.contains("outside finite")),
        "{:?}",
        shm.2
    );

    // Counted by model, version, output and guard.
    let metrics = support::metrics_text(&base).await;
    for (labels, at_least) in [
        (
            r#"model="alpha_tight",version="1",output="probabilities",guard="max""#,
            5.0,
        ),
        (
            r#"model="alpha_nan",version="1",output="probabilities",guard="finite""#,
            1.0,
        ),
    ] {
        let count: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("tickserve_guard_trips_total{{{labels}}} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(count >= at_least, "{labels}: {metrics}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tripped_tick_leaves_its_sequence_as_it_was() {
    let repository = repository();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let tick = |start: bool, value: f32| {
        serde_json::json!({
            "parameters": {"sequence_id": 7, "sequence_start": start},
            "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": vec![value; 8]}]
        })
    };
    let read = || async {
        let body = serde_json::json!({"parameters": {"sequence_id": 7}});
        let (status, state) =
            support::post_json(&format!("{base}/v2/models/step/sequences/read"), &body).await;
        assert_eq!(status, 200, "{state}");
        (
            state["outputs"].clone(),
            state["parameters"]["ticks"].clone(),
        )
    };
    let infer = format!("{base}/v2/models/step/infer");
    let (status, answer) = support::post_json(&infer, &tick(true, 0.5)).await;
    assert_eq!(status, 200, "{answer}");
    let before = read().await;
    assert_eq!(before.1, serde_json::json!(1));

    // A tick whose prediction is below the guard's min: withheld, and the
    // state has not moved.
    let (status, answer) = support::post_json(&infer, &tick(false, 5.0)).await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("guard on output 'prediction'") && message.contains("min = -0.35"),
        "{message}"
    );
    assert_eq!(read().await, before, "a withheld tick moved its sequence");

    // The next tick answers what it answers after the first tick alone.
    let (status, answer) = support::post_json(&infer, &tick(false, 0.25)).await;
    assert_eq!(status, 200, "{answer}");
    let prediction = answer["outputs"][0]["data"][0].as_f64().unwrap();
    assert!((prediction + 0.29582).abs() < 1e-4, "{answer}");
    assert_eq!(read().await.1, serde_json::json!(2));
    server.shutdown().await.unwrap();
}

/// `max_step`: a tick whose prediction moves more than the step from the
/// sequence's last answered one is withheld (the sequence stays as it was);
/// the next tick is compared with the same last answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_guard_bounds_a_sequences_move_from_its_last_answer() {
    let repository = repository();
    let server = support::start(&support::config(repository.path())).await;
    let infer = format!("http://{}/v2/models/stepped/infer", server.http_addr);
    let tick = |start: bool, value: f32| {
        serde_json::json!({
            "parameters": {"sequence_id": 3, "sequence_start": start},
            "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": vec![value; 8]}]
        })
    };
    // -0.286: the first tick has nothing to step from.
    let (status, answer) = support::post_json(&infer, &tick(true, 0.5)).await;
    assert_eq!(status, 200, "{answer}");
    // -0.362 moves 0.076 from -0.286: withheld.
    let (status, answer) = support::post_json(&infer, &tick(false, 5.0)).await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("max_step = 0.05 of the last answer, -0.286"),
        "{message}"
    );
    // -0.296 moves 0.010 from -0.286 (the state is the first tick's): answered.
    let (status, answer) = support::post_json(&infer, &tick(false, 0.25)).await;
    assert_eq!(status, 200, "{answer}");
    let prediction = answer["outputs"][0]["data"][0].as_f64().unwrap();
    assert!((prediction + 0.29582).abs() < 1e-4, "{answer}");

    // The same over gRPC, another sequence: withheld as OUT_OF_RANGE.
    use tickserve_proto::inference as pb;
    let grpc_tick = |start: bool, value: f32| {
        let parameter = |choice| pb::InferParameter {
            parameter_choice: Some(choice),
        };
        pb::ModelInferRequest {
            model_name: "stepped".into(),
            parameters: [
                (
                    "sequence_id".to_string(),
                    parameter(pb::infer_parameter::ParameterChoice::Uint64Param(4)),
                ),
                (
                    "sequence_start".to_string(),
                    parameter(pb::infer_parameter::ParameterChoice::BoolParam(start)),
                ),
            ]
            .into_iter()
            .collect(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "tick".into(),
                datatype: "FP32".into(),
                shape: vec![1, 8],
                contents: Some(pb::InferTensorContents {
                    fp32_contents: vec![value; 8],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    };
    let mut grpc = support::grpc_client(&server).await;
    grpc.model_infer(grpc_tick(true, 0.5)).await.unwrap();
    let refused = grpc.model_infer(grpc_tick(false, 5.0)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
    assert!(
        refused.message().contains("max_step"),
        "{}",
        refused.message()
    );
    server.shutdown().await.unwrap();
}
