//! Stateful sequences against a real server: `seq_lstm_step` keeps h and c
//! per sequence, and after 30 ticks over HTTP, unary gRPC and a
//! `ModelStreamInfer` stream its prediction equals `seq_lstm` (the same
//! weights) run on the 30-tick window; sequences fed the same ticks agree
//! and never see each other's state; the errors, the table bound, idle
//! expiry (error and restart), the state API over both protocols, the model
//! configuration and the metrics. (The exhaustive check against onnxruntime,
//! 200 sequences × 500 ticks from 8 clients, is `tests/python/sequence_check.py`.)

use crate::support;

use support::post_json_as as post_as;

use serde_json::{Value, json};
use tickserve_core::config::{FrontEnd, Restriction};
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tickserve_proto::tickserve as spb;
use tickserve_proto::tickserve::sequence_service_client::SequenceServiceClient;

const TICKS: usize = 30;
const FEATURES: usize = 8;

/// Tick `t` of a sequence whose inputs are seeded by `seed`.
pub(super) fn tick(seed: u64, t: usize) -> Vec<f32> {
    (0..FEATURES)
        .map(|f| {
            let x = (seed as f32 * 0.37 + t as f32 * 0.11 + f as f32 * 0.07).sin();
            x * 0.8
        })
        .collect()
}

/// A repository with the sample `seq_lstm` and `seq_lstm_step`, and
/// `seq_lstm_step` again as each `(name, model.toml)`.
fn repository(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["seq_lstm", "seq_lstm_step"] {
        let toml = support::sample_toml(name);
        support::sample(dir.path(), name, name, 1, toml.as_deref());
    }
    for (name, toml) in extra {
        support::sample(dir.path(), "seq_lstm_step", name, 1, Some(toml));
    }
    dir
}

const STATE_PAIRS: &str = "[[sequence.state]]\ninput = \"h_in\"\noutput = \"h_out\"\n\
                           [[sequence.state]]\ninput = \"c_in\"\noutput = \"c_out\"\n";

pub(super) fn body(seq: Value, start: bool, end: bool, values: &[f32]) -> Value {
    json!({
        "parameters": {"sequence_id": seq, "sequence_start": start, "sequence_end": end},
        "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, FEATURES], "data": values}],
    })
}

pub(super) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

pub(super) fn prediction(answer: &Value) -> f32 {
    answer["outputs"][0]["data"][0].as_f64().unwrap() as f32
}

fn grpc_tick(
    model: &str,
    seq: u64,
    start: bool,
    end: bool,
    values: &[f32],
) -> pb::ModelInferRequest {
    use pb::infer_parameter::ParameterChoice;
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "sequence_id".to_string(),
        pb::InferParameter {
            parameter_choice: Some(ParameterChoice::Uint64Param(seq)),
        },
    );
    for (name, flag) in [("sequence_start", start), ("sequence_end", end)] {
        parameters.insert(
            name.to_string(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::BoolParam(flag)),
            },
        );
    }
    pb::ModelInferRequest {
        model_name: model.into(),
        parameters,
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "tick".into(),
            datatype: "FP32".into(),
            shape: vec![1, FEATURES as i64],
            contents: Some(pb::InferTensorContents {
                fp32_contents: values.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn grpc_prediction(response: &pb::ModelInferResponse) -> f32 {
    response.outputs[0].contents.as_ref().unwrap().fp32_contents[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_ticks_of_state_equal_the_window_model_over_every_protocol() {
    if support::alone(
        module_path!(),
        "thirty_ticks_of_state_equal_the_window_model_over_every_protocol",
    ) {
        return;
    }
    // A copy of its own, so that no other test's sequences count in its metrics.
    let repository = repository(&[("seq_check", STATE_PAIRS)]);
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let step = format!("{base}/v2/models/seq_check/infer");
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();

    // Sequences over HTTP: 1 and 2 get identical ticks (so must agree), a
    // string id gets other ticks; over gRPC: 3; over one stream: 4 and 5
    // (5 with 1's ticks). Ticks interleave across all of them.
    let (to_stream, stream_in) = tokio::sync::mpsc::channel(64);
    let mut stream = grpc
        .clone()
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(stream_in))
        .await
        .unwrap()
        .into_inner();
    let mut last = std::collections::HashMap::<&str, f32>::new();
    for t in 0..TICKS {
        let (start, end) = (t == 0, t == TICKS - 1);
        for (name, id, seed) in [
            ("1", json!(1), 1),
            ("2", json!(2), 1),
            ("AAPL", json!("AAPL"), 7),
        ] {
            let (status, answer) = post(&http, &step, &body(id, start, end, &tick(seed, t))).await;
            assert_eq!(status, 200, "{answer}");
            last.insert(name, prediction(&answer));
        }
        let answer = grpc
            .model_infer(grpc_tick("seq_check", 3, start, end, &tick(3, t)))
            .await
            .unwrap()
            .into_inner();
        last.insert("3", grpc_prediction(&answer));
        to_stream
            .send(grpc_tick("seq_check", 4, start, end, &tick(4, t)))
            .await
            .unwrap();
        to_stream
            .send(grpc_tick("seq_check", 5, start, end, &tick(1, t)))
            .await
            .unwrap();
        for name in ["4", "5"] {
            let answer = stream.message().await.unwrap().unwrap();
            assert_eq!(answer.error_message, "", "stream tick {t}");
            last.insert(
                name,
                grpc_prediction(answer.infer_response.as_ref().unwrap()),
            );
        }
    }
    drop(to_stream);

    // The window model on each sequence's 30 ticks.
    for (name, seed) in [
        ("1", 1),
        ("2", 1),
        ("AAPL", 7),
        ("3", 3),
        ("4", 4),
        ("5", 1),
    ] {
        let window: Vec<f32> = (0..TICKS).flat_map(|t| tick(seed, t)).collect();
        let request = json!({"inputs": [{"name": "window", "datatype": "FP32",
            "shape": [1, TICKS, FEATURES], "data": window}]});
        let (status, answer) =
            post(&http, &format!("{base}/v2/models/seq_lstm/infer"), &request).await;
        assert_eq!(status, 200, "{answer}");
        let expected = prediction(&answer);
        let got = last[name];
        assert!(
            (got - expected).abs() <= 1e-5 * expected.abs().max(1.0),
            "sequence {name}: {got} after {TICKS} ticks, the window model says {expected}"
        );
    }
    // Sequences fed the same ticks agree (within the tolerance: batched with
    // others they may run in another bucket, whose kernels differ by ulps).
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(1.0);
    assert!(
        close(last["1"], last["2"]) && close(last["1"], last["5"]),
        "{last:?}"
    );
    assert!(!close(last["1"], last["AAPL"]), "{last:?}");

    // Every sequence ended with its last tick.
    let list = support::get_json(&format!("{base}/v2/models/seq_check/sequences")).await;
    assert_eq!(list["sequences"], json!([]), "{list}");
    let metrics = support::metrics_text(&base).await;
    for (name, value) in [
        ("tickserve_sequence_starts_total", "6"),
        ("tickserve_sequence_ends_total", "6"),
        ("tickserve_sequences_active", "0"),
    ] {
        let line = format!("{name}{{model=\"seq_check\"}} {value}");
        assert!(metrics.lines().any(|l| l == line), "no {line}: {metrics}");
    }
    assert!(
        metrics.contains(
            r#"tickserve_requests_total{model="seq_check",protocol="grpc_stream",code="ok"} 60"#
        ),
        "{metrics}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sequence_requests_are_clear_client_errors() {
    let repository = repository(&[(
        "seq_small",
        &format!("[sequence]\nmax_sequences = 2\n{STATE_PAIRS}"),
    )]);
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    let x = tick(0, 0);
    let no_sequence =
        json!({"inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": x}]});
    let two_rows: Vec<f32> = x.iter().chain(&x).copied().collect();
    let cases = [
        (
            body(json!(41), false, false, &x),
            400,
            "sequence 41 is not active",
        ),
        (
            no_sequence.clone(),
            400,
            "each request names its sequence (parameter sequence_id",
        ),
        (
            json!({"parameters": {"sequence_id": 1, "sequence_start": true},
                   "inputs": [{"name": "tick", "datatype": "FP32", "shape": [2, 8], "data": two_rows}]}),
            400,
            "carries one tick, 1 row; got 2 rows",
        ),
        (
            json!({"parameters": {"sequence_id": 1, "sequence_start": true},
                   "inputs": [{"name": "h_in", "datatype": "FP32", "shape": [1, 16], "data": vec![0.0f32; 16]}]}),
            400,
            "input 'h_in': expected one of the model's inputs ('tick')",
        ),
        (
            body(json!(-1), true, false, &x),
            400,
            "sequence_id must be an unsigned integer or a string",
        ),
        (
            body(json!(0), true, false, &x),
            400,
            "sequence_id 0 names no sequence",
        ),
    ];
    for (request, status, message) in cases {
        let (got, answer) = post(&http, &step, &request).await;
        assert_eq!(got, status, "{answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("seq_lstm_step"), "{error}");
        assert!(error.contains(message), "{error}");
    }
    // A stateless model refuses a sequence.
    let request = json!({"parameters": {"sequence_id": 5},
        "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, 30, 8], "data": vec![0.0f32; 240]}]});
    let (status, answer) = post(&http, &format!("{base}/v2/models/seq_lstm/infer"), &request).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("keeps no sequence state"),
        "{answer}"
    );

    // After its end a sequence is gone.
    let (status, _) = post(&http, &step, &body(json!(9), true, true, &x)).await;
    assert_eq!(status, 200);
    let (status, answer) = post(&http, &step, &body(json!(9), false, false, &x)).await;
    assert_eq!(status, 400, "{answer}");

    // max_sequences = 2: a third start waits for an end (429).
    let small = format!("{base}/v2/models/seq_small/infer");
    for id in [1, 2] {
        let (status, answer) = post(&http, &small, &body(json!(id), true, false, &x)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, answer) = post(&http, &small, &body(json!(3), true, false, &x)).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("keeps 2 sequences, its max_sequences"),
        "{answer}"
    );
    let (status, _) = post(&http, &small, &body(json!(1), false, true, &x)).await;
    assert_eq!(status, 200);
    let (status, answer) = post(&http, &small, &body(json!(3), true, false, &x)).await;
    assert_eq!(status, 200, "{answer}");
    // Other requests were never harmed: a good tick still answers.
    let (status, _) = post(&http, &step, &body(json!(77), true, false, &x)).await;
    assert_eq!(status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_initial_file_is_named_as_model_toml_writes_it_never_by_the_servers_path() {
    let missing = format!("[sequence]\n{STATE_PAIRS}").replacen(
        "output = \"h_out\"\n",
        "output = \"h_out\"\ninitial_file = \"h0.bin\"\n",
        1,
    );
    let repository = repository(&[("seq_missing", &missing), ("seq_short", &missing)]);
    std::fs::write(repository.path().join("seq_short/h0.bin"), [0u8; 3]).unwrap();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let server_path = repository.path().to_string_lossy().to_string();
    let index = reqwest::Client::new()
        .post(format!("{base}/v2/repository/index"))
        .body("{}")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let status = reqwest::get(format!("{base}/v1/models/seq_short"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for answer in [&index, &status] {
        assert!(!answer.contains(&server_path), "{answer}");
    }
    assert!(index.contains("'h0.bin': no such file"), "{index}");
    assert!(index.contains("'h0.bin' holds 3 bytes"), "{index}");
    assert!(status.contains("'h0.bin' holds 3 bytes"), "{status}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sequence_expires_with_an_error_or_restarts_and_says_so() {
    if support::alone(
        module_path!(),
        "an_idle_sequence_expires_with_an_error_or_restarts_and_says_so",
    ) {
        return;
    }
    let repository = repository(&[
        (
            "seq_expiring",
            &format!("[sequence]\nmax_sequence_idle = \"100ms\"\n{STATE_PAIRS}"),
        ),
        (
            "seq_restarting",
            &format!(
                "[sequence]\nmax_sequence_idle = \"100ms\"\nidle_action = \"restart\"\n{STATE_PAIRS}"
            ),
        ),
    ]);
    // The tables age sequences on a clock the test moves.
    let mut config = support::config(repository.path());
    config.clock = tickserve_core::Clock::by_hand();
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let x = tick(1, 0);
    for model in ["seq_expiring", "seq_restarting"] {
        let url = format!("{base}/v2/models/{model}/infer");
        let (status, first) = post(&http, &url, &body(json!(1), true, false, &x)).await;
        assert_eq!(status, 200, "{first}");
        let (status, second) = post(&http, &url, &body(json!(1), false, false, &x)).await;
        assert_eq!(status, 200);
        assert_ne!(
            prediction(&first),
            prediction(&second),
            "the state did not carry"
        );
        config.clock.advance(std::time::Duration::from_millis(300));
        let (status, answer) = post(&http, &url, &body(json!(1), false, false, &x)).await;
        if model == "seq_expiring" {
            assert_eq!(status, 400, "{answer}");
            let error = answer["error"].as_str().unwrap();
            assert!(error.contains("sequence 1 is not active"), "{error}");
        } else {
            assert_eq!(status, 200, "{answer}");
            assert_eq!(
                answer["parameters"]["sequence_restarted"],
                json!(true),
                "{answer}"
            );
            // Started afresh: the same answer as the first tick.
            assert_eq!(prediction(&answer), prediction(&first));
            let (_, next) = post(&http, &url, &body(json!(1), false, false, &x)).await;
            assert!(next.get("parameters").is_none(), "{next}");
        }
    }
    let metrics = support::metrics_text(&base).await;
    for model in ["seq_expiring", "seq_restarting"] {
        let line = format!("tickserve_sequence_expiries_total{{model=\"{model}\"}} 1");
        assert!(metrics.lines().any(|l| l == line), "no {line}: {metrics}");
    }
    // The restarted sequence goes idle too: the scrape itself ends it, with
    // no request touching it.
    let line = "tickserve_sequences_active{model=\"seq_restarting\"} 1";
    assert!(metrics.lines().any(|l| l == line), "no {line}: {metrics}");
    config.clock.advance(std::time::Duration::from_millis(300));
    let metrics = support::metrics_text(&base).await;
    for line in [
        "tickserve_sequences_active{model=\"seq_restarting\"} 0",
        "tickserve_sequence_expiries_total{model=\"seq_restarting\"} 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line}: {metrics}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_state_reads_writes_and_drops_over_http_and_grpc() {
    let repository = repository(&[]);
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    let api = format!("{base}/v2/models/seq_lstm_step/sequences");

    // Run sequence 1 for 5 ticks; read its state; write it into a fresh
    // sequence "copy" over gRPC; both then answer the next tick alike.
    for t in 0..5 {
        let (status, _) = post(&http, &step, &body(json!(1), t == 0, false, &tick(1, t))).await;
        assert_eq!(status, 200);
    }
    let (status, read) = post(
        &http,
        &format!("{api}/read"),
        &json!({"parameters": {"sequence_id": 1}}),
    )
    .await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["parameters"]["ticks"], json!(5));
    assert_eq!(read["outputs"][0]["name"], json!("h_in"));
    assert_eq!(read["outputs"][1]["shape"], json!([1, 16]));

    let mut sequences = SequenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let state: Vec<spb::StateTensor> = read["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| spb::StateTensor {
            name: t["name"].as_str().unwrap().to_string(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            contents: t["data"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|v| (v.as_f64().unwrap() as f32).to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        })
        .collect();
    let copy = spb::SequenceId {
        id: Some(spb::sequence_id::Id::Text("copy".into())),
    };
    sequences
        .sequence_state_write(spb::SequenceStateWriteRequest {
            model_name: "seq_lstm_step".into(),
            model_version: String::new(),
            sequence_id: Some(copy.clone()),
            state: state.clone(),
        })
        .await
        .unwrap();
    let read_back = sequences
        .sequence_state_read(spb::SequenceRequest {
            model_name: "seq_lstm_step".into(),
            model_version: String::new(),
            sequence_id: Some(copy.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read_back.state, state, "the write did not round-trip");
    let (_, a) = post(&http, &step, &body(json!(1), false, false, &tick(1, 5))).await;
    let (_, b) = post(
        &http,
        &step,
        &body(json!("copy"), false, false, &tick(1, 5)),
    )
    .await;
    assert_eq!(prediction(&a), prediction(&b), "{a} {b}");

    // A bad write names what was expected.
    let error = sequences
        .sequence_state_write(spb::SequenceStateWriteRequest {
            model_name: "seq_lstm_step".into(),
            model_version: String::new(),
            sequence_id: Some(copy.clone()),
            state: state[..1].to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(
        error
            .message()
            .contains("'c_in': expected a tensor for every state"),
        "{}",
        error.message()
    );

    let listed = sequences
        .sequence_list(spb::SequenceListRequest {
            model_name: "seq_lstm_step".into(),
            model_version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sequences.len(), 2);

    // Drop over HTTP; the next tick of that sequence is refused.
    let (status, _) = post(
        &http,
        &format!("{api}/drop"),
        &json!({"parameters": {"sequence_id": "copy"}}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(&http, &step, &body(json!("copy"), false, false, &x0())).await;
    assert_eq!(status, 400);
    let list = support::get_json(&api).await;
    assert_eq!(list["sequences"].as_array().unwrap().len(), 1, "{list}");

    // The configuration reports sequence_batching, and clients see only `tick`.
    let config = support::get_json(&format!("{base}/v2/models/seq_lstm_step/config")).await;
    assert!(config.get("dynamic_batching").is_none(), "{config}");
    assert_eq!(config["input"].as_array().unwrap().len(), 1, "{config}");
    assert_eq!(
        config["sequence_batching"]["state"][0]["input_name"],
        json!("h_in")
    );
    assert_eq!(
        config["sequence_batching"]["state"][1]["output_name"],
        json!("c_out")
    );
    assert_eq!(
        config["sequence_batching"]["oldest"]["max_candidate_sequences"],
        json!(4096)
    );
    let metadata = support::get_json(&format!("{base}/v2")).await;
    assert!(
        metadata["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("sequence(string_id)"))
    );
    server.shutdown().await.unwrap();
}

fn x0() -> Vec<f32> {
    tick(0, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_survive_a_drain_and_restart_with_a_snapshot_and_a_reload() {
    let repository = repository(&[]);
    let mut config = support::config(repository.path());
    let snapshot = repository.path().join("sequences.snapshot");
    config.runtime.sequence_snapshot = Some(snapshot.clone());
    config.security.model_control_mode = tickserve_core::config::ModelControlMode::Explicit;
    let http = reqwest::Client::new();

    // Sequences 1 and 2 get the same 5 ticks; 2 gets the sixth before the
    // restart, 1 after it: the answers must agree.
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    for t in 0..5 {
        for id in [1, 2] {
            let (status, _) =
                post(&http, &step, &body(json!(id), t == 0, false, &tick(1, t))).await;
            assert_eq!(status, 200);
        }
    }
    let (_, before) = post(&http, &step, &body(json!(2), false, false, &tick(1, 5))).await;
    server.shutdown().await.unwrap();
    assert!(snapshot.exists(), "no snapshot written");

    let server = support::start(&config).await;
    assert!(
        !snapshot.exists(),
        "the snapshot was not set aside after its restore"
    );
    let base = format!("http://{}", server.http_addr);
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    let (status, after) = post(&http, &step, &body(json!(1), false, false, &tick(1, 5))).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(prediction(&before), prediction(&after));

    // A reload of the model keeps its sequences: sequence 2 goes on.
    let (status, _) = post(&http, &step, &body(json!(1), false, false, &tick(1, 6))).await;
    assert_eq!(status, 200);
    let reload = http
        .post(format!("{base}/v2/repository/models/seq_lstm_step/load"))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 200);
    let (_, one) = post(&http, &step, &body(json!(1), false, false, &tick(1, 7))).await;
    let (status, two) = post(&http, &step, &body(json!(2), false, false, &tick(1, 6))).await;
    assert_eq!(status, 200, "{two}");
    let (_, two) = post(&http, &step, &body(json!(2), false, false, &tick(1, 7))).await;
    assert_eq!(prediction(&one), prediction(&two));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monte_carlo_on_a_sequence_advances_the_state_by_its_clean_tick_only() {
    let repository = repository(&[(
        "seq_mc_small",
        &format!("[monte_carlo]\nenabled = true\nmax_samples = 64\n[sequence]\n{STATE_PAIRS}"),
    )]);
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    // Sequence 1 gets a Monte Carlo tick where sequence 2 gets a plain one;
    // their next plain ticks must agree.
    for id in [1, 2] {
        let (status, _) = post(&http, &step, &body(json!(id), true, false, &tick(1, 0))).await;
        assert_eq!(status, 200);
    }
    let mut noisy = body(json!(1), false, false, &tick(1, 1));
    noisy["parameters"]["mc_samples"] = json!(64);
    noisy["parameters"]["mc_noise_sigma"] = json!(0.3);
    noisy["parameters"]["mc_seed"] = json!(7);
    let (status, answer) = post(&http, &step, &noisy).await;
    assert_eq!(status, 200, "{answer}");
    let names: Vec<&str> = answer["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["prediction_mean", "prediction_std"], "{answer}");
    assert_eq!(answer["outputs"][0]["shape"], json!([1, 1]));
    assert!(
        answer["outputs"][1]["data"][0].as_f64().unwrap() > 0.0,
        "{answer}"
    );
    let (_, plain) = post(&http, &step, &body(json!(2), false, false, &tick(1, 1))).await;
    let (_, one) = post(&http, &step, &body(json!(1), false, false, &tick(1, 2))).await;
    let (_, two) = post(&http, &step, &body(json!(2), false, false, &tick(1, 2))).await;
    let (one, two) = (prediction(&one), prediction(&two));
    assert!(
        (one - two).abs() <= 1e-5,
        "the noisy copies moved the state: {one} {two}"
    );
    // The mean of the noisy copies is near the clean prediction, not equal.
    let mean = answer["outputs"][0]["data"][0].as_f64().unwrap() as f32;
    assert_ne!(mean, prediction(&plain));

    // The clean tick runs beside the noisy copies and counts in max_samples:
    // max_samples noisy copies are a clear 400 (not a 429 for ever), one
    // fewer runs.
    let small = format!("{base}/v2/models/seq_mc_small/infer");
    let (status, _) = post(&http, &small, &body(json!(1), true, false, &tick(1, 0))).await;
    assert_eq!(status, 200);
    for (samples, expected) in [(64, 400), (63, 200)] {
        let mut noisy = body(json!(1), false, false, &tick(1, 1));
        noisy["parameters"]["mc_samples"] = json!(samples);
        noisy["parameters"]["mc_noise_sigma"] = json!(0.3);
        let (status, answer) = post(&http, &small, &noisy).await;
        assert_eq!(status, expected, "{samples}: {answer}");
        if status == 400 {
            let error = answer["error"].as_str().unwrap();
            assert!(error.contains("+ 1 clean row"), "{error}");
        }
    }
    server.shutdown().await.unwrap();
}

/// Triton's Python clients over gRPC, HTTP and a stream, against onnxruntime
/// running each sequence offline: the bar's check, at a size CI affords (the
/// full 200 × 500 is the script's default: docs/sequences.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_sequences_match_onnxruntime_offline() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let args: Vec<&std::ffi::OsStr> = ["--sequences", "40", "--ticks", "60", "--clients", "8"]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
    support::run_python_check(&server, "sequence_check.py", &args, "done").await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_bound_to_keys_are_each_keys_own() {
    let repository = repository(&[(
        "seq_bound",
        &format!("[sequence]\nbind_to_key = true\n{STATE_PAIRS}"),
    )]);
    // Two desks, two keys in one key file; inference and the state API
    // (the model-repository group) behind them.
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "desk-a-key\n\ndesk-b-key\n").unwrap();
    let mut config = support::config(repository.path());
    for front_end in [FrontEnd::Http, FrontEnd::Grpc] {
        config.security.restricted.push(
            Restriction::parse_triton(
                &format!(
                    "inference,model-repository:tickserve-key=file:{}",
                    keys.path().display()
                ),
                front_end,
            )
            .unwrap(),
        );
    }
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let (a, b) = ("desk-a-key", "desk-b-key");
    for (model, bound) in [("seq_bound", true), ("seq_lstm_step", false)] {
        let url = format!("{base}/v2/models/{model}/infer");
        let api = format!("{base}/v2/models/{model}/sequences");
        let (status, first) = post_as(a, &url, &body(json!(7), true, false, &tick(1, 0))).await;
        assert_eq!(status, 200, "{first}");
        // Desk B ticks "7": not desk A's sequence when bound.
        let (status, other) = post_as(b, &url, &body(json!(7), false, false, &tick(1, 1))).await;
        let (_, unknown) = post_as(b, &url, &body(json!(99), false, false, &tick(1, 1))).await;
        if bound {
            assert_eq!(status, 400, "{other}");
            // The words a sequence never started gets: nothing to probe.
            let words = |v: &Value| v["error"].as_str().unwrap().replace("99", "7");
            assert_eq!(words(&other), words(&unknown));
            // Its own 7, started, read and dropped: desk A's is untouched.
            let (status, _) = post_as(b, &url, &body(json!(7), true, false, &tick(1, 5))).await;
            assert_eq!(status, 200);
            let (status, _) = post_as(
                b,
                &format!("{api}/drop"),
                &json!({"parameters": {"sequence_id": 7}}),
            )
            .await;
            assert_eq!(status, 200);
            let (status, read) = post_as(
                a,
                &format!("{api}/read"),
                &json!({"parameters": {"sequence_id": 7}}),
            )
            .await;
            assert_eq!(
                (status, &read["parameters"]["ticks"]),
                (200, &json!(1)),
                "{read}"
            );
            let listed = reqwest::Client::new()
                .get(&api)
                .bearer_auth(b)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            assert_eq!(listed["sequences"], json!([]), "{listed}");
        } else {
            // Unbound (the default): any key drives any sequence.
            assert_eq!(status, 200, "{other}");
        }
    }
    // Over gRPC, desk B's key reads no state of desk A's sequence.
    let mut grpc = SequenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let read = |key: &str| {
        let mut request = tonic::Request::new(spb::SequenceRequest {
            model_name: "seq_bound".into(),
            sequence_id: Some(spb::SequenceId {
                id: Some(spb::sequence_id::Id::Number(7)),
            }),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        request
    };
    assert!(grpc.sequence_state_read(read(a)).await.is_ok());
    let refused = grpc.sequence_state_read(read(b)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    server.shutdown().await.unwrap();
}

/// The routing header a load balancer hashes on: `tickserve-sequence-id`
/// agrees with the body's `sequence_id` or the request is refused; alone it
/// continues the sequence it names; every answer to a tick carries it back;
/// sent twice, empty or with a space it is refused. Over HTTP and gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_header_names_the_sequence_and_comes_back() {
    let repository = repository(&[]);
    let server = support::start(&support::config(repository.path())).await;
    let url = format!("http://{}/v2/models/seq_lstm_step/infer", server.http_addr);
    let client = reqwest::Client::new();
    let send = |body: Value, keys: &'static [&'static str]| {
        let mut request = client.post(&url).json(&body);
        for key in keys {
            request = request.header("tickserve-sequence-id", *key);
        }
        async move {
            let answer = request.send().await.unwrap();
            let echoed = answer
                .headers()
                .get("tickserve-sequence-id")
                .map(|v| v.to_str().unwrap().to_string());
            (
                answer.status().as_u16(),
                echoed,
                answer.json::<Value>().await.unwrap(),
            )
        }
    };
    // Agreeing: answered, and the header comes back.
    let (status, echoed, answer) = send(body(json!(41), true, false, &tick(1, 0)), &["41"]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(echoed.as_deref(), Some("41"));
    // A model of state pairs, no windows: its answers say nothing of windows.
    assert!(
        answer["parameters"].get("sequence_window_ticks").is_none(),
        "{answer}"
    );
    // Without the header, the answer still names its sequence.
    let (status, echoed, _) = send(body(json!(41), false, false, &tick(1, 1)), &[]).await;
    assert_eq!((status, echoed.as_deref()), (200, Some("41")));
    // The header alone continues the sequence: the same answer as the body's id.
    let alone = json!({"inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, FEATURES], "data": tick(1, 2)}]});
    let (status, echoed, by_header) = send(alone, &["41"]).await;
    assert_eq!(
        (status, echoed.as_deref()),
        (200, Some("41")),
        "{by_header}"
    );
    let (_, _, again) = send(body(json!(42), true, false, &tick(1, 0)), &[]).await;
    assert!(again["outputs"].is_array());
    send(body(json!(42), false, false, &tick(1, 1)), &[]).await;
    let (_, _, by_body) = send(body(json!(42), false, false, &tick(1, 2)), &[]).await;
    assert_eq!(prediction(&by_header), prediction(&by_body));
    // A number spelt with leading zeros is the text it is, the one reading a
    // balancer hashes: it continues the string id "0001007", never 1007.
    let (status, _, _) = send(
        body(json!("0001007"), true, false, &tick(1, 0)),
        &["0001007"],
    )
    .await;
    assert_eq!(status, 200);
    let alone = json!({"inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, FEATURES], "data": tick(1, 1)}]});
    let (status, echoed, answer) = send(alone, &["0001007"]).await;
    assert_eq!(
        (status, echoed.as_deref()),
        (200, Some("0001007")),
        "{answer}"
    );
    let (status, _, answer) =
        send(body(json!(1007), false, false, &tick(1, 2)), &["0001007"]).await;
    assert_eq!(status, 400, "{answer}");
    // Disagreeing, repeated, malformed: 400 naming the header.
    for (seq, keys) in [
        (json!(41), &["43"][..]),
        (json!("EURUSD"), &["41"][..]),
        (json!(41), &["41", "41"][..]),
        (json!(41), &["4 1"][..]),
    ] {
        let (status, _, answer) = send(body(seq, false, false, &tick(1, 3)), keys).await;
        assert_eq!(status, 400, "{keys:?}: {answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("tickserve-sequence-id"),
            "{answer}"
        );
    }

    // gRPC: the metadata, agreeing and disagreeing, echoed.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let with_key = |request: pb::ModelInferRequest, key: &str| {
        let mut request = tonic::Request::new(request);
        request
            .metadata_mut()
            .insert("tickserve-sequence-id", key.parse().unwrap());
        request
    };
    let answer = grpc
        .model_infer(with_key(
            grpc_tick("seq_lstm_step", 41, false, false, &tick(1, 3)),
            "41",
        ))
        .await
        .unwrap();
    assert_eq!(
        answer.metadata().get("tickserve-sequence-id").unwrap(),
        "41"
    );
    let refused = grpc
        .model_infer(with_key(
            grpc_tick("seq_lstm_step", 41, false, false, &tick(1, 4)),
            "7",
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("tickserve-sequence-id"),
        "{}",
        refused.message()
    );
    server.shutdown().await.unwrap();
}
