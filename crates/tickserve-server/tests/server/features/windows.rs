//! Sequence windows against a real server: `seq_lstm_window` (the sample
//! `seq_lstm` graph with `[[sequence.window]]`) takes one tick per request
//! and answers as `seq_lstm` on the window a client would have kept; the
//! window is read, written (a history) and dropped over both protocols, a
//! failed tick leaves it as it was, `window_warmup = "wait"` answers nothing
//! until the window is full, and the window survives a snapshot restart and a
//! reload. (The full check against onnxruntime, 200 sequences × 500 ticks
//! from 8 clients over gRPC, HTTP and a stream, is
//! `tests/python/sequence_check.py --model seq_lstm_window`.)

use crate::support;

use serde_json::{Value, json};
use tickserve_proto::tickserve as spb;
use tickserve_proto::tickserve::sequence_service_client::SequenceServiceClient;

const WINDOW: usize = 30;
const FEATURES: usize = 8;
const MODEL: &str = "seq_lstm_window";

/// Tick `t` of a sequence whose inputs are seeded by `seed`.
fn tick(seed: u64, t: usize) -> Vec<f32> {
    (0..FEATURES)
        .map(|f| (seed as f32 * 0.37 + t as f32 * 0.11 + f as f32 * 0.07).sin() * 0.8)
        .collect()
}

/// A repository with the sample `seq_lstm` and `seq_lstm_window`, and
/// `seq_lstm` again as `seq_lstm_wait`, a window model that waits for a full
/// window.
fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let window_toml = support::sample_toml(MODEL).unwrap();
    support::sample(dir.path(), "seq_lstm", "seq_lstm", 1, None);
    support::sample(dir.path(), "seq_lstm", MODEL, 1, Some(&window_toml));
    let wait = window_toml.replace("window_warmup = \"pad\"", "window_warmup = \"wait\"");
    assert_ne!(
        wait, window_toml,
        "the sample's model.toml sets window_warmup"
    );
    support::sample(dir.path(), "seq_lstm", "seq_lstm_wait", 1, Some(&wait));
    dir
}

fn body(model_tick: &str, seq: Value, start: bool, values: &[f32]) -> Value {
    json!({
        "parameters": {"sequence_id": seq, "sequence_start": start},
        "inputs": [{"name": model_tick, "datatype": "FP32", "shape": [1, FEATURES], "data": values}],
    })
}

use support::post_json as post;

fn prediction(answer: &Value) -> f32 {
    answer["outputs"][0]["data"][0].as_f64().unwrap() as f32
}

fn floats(tensor: &Value) -> Vec<f32> {
    tensor["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

/// `seq_lstm` on the window a client keeps: zeros, then `ticks` (the newest 30).
async fn offline(base: &str, ticks: &[Vec<f32>]) -> f32 {
    let mut window = vec![0f32; WINDOW * FEATURES];
    let newest = &ticks[ticks.len().saturating_sub(WINDOW)..];
    let from = (WINDOW - newest.len()) * FEATURES;
    window[from..].copy_from_slice(&newest.concat());
    let request = json!({
        "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, WINDOW, FEATURES], "data": window}],
    });
    let (status, answer) = post(&format!("{base}/v2/models/seq_lstm/infer"), &request).await;
    assert_eq!(status, 200, "{answer}");
    prediction(&answer)
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * b.abs().max(1.0)
}

fn grpc_window(ticks: &[Vec<f32>]) -> spb::StateTensor {
    spb::StateTensor {
        name: "window".into(),
        datatype: "FP32".into(),
        shape: vec![1, ticks.len() as i64, FEATURES as i64],
        contents: ticks
            .concat()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_model_takes_one_tick_and_answers_as_the_model_on_the_clients_window() {
    let repository = repository();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let infer = format!("{base}/v2/models/{MODEL}/infer");
    let api = format!("{base}/v2/models/{MODEL}/sequences");

    // Clients see one tick; the configuration names the window and its length.
    let metadata = support::get_json(&format!("{base}/v2/models/{MODEL}")).await;
    assert_eq!(metadata["inputs"][0]["name"], json!("window"), "{metadata}");
    assert_eq!(metadata["inputs"][0]["shape"], json!([-1, 8]), "{metadata}");
    let config = support::get_json(&format!("{base}/v2/models/{MODEL}/config")).await;
    assert_eq!(
        config["parameters"]["sequence_windows"]["string_value"],
        json!("window:30"),
        "{config}"
    );
    assert_eq!(
        config["parameters"]["sequence_window_warmup"]["string_value"],
        json!("pad")
    );

    // 35 ticks: each equals seq_lstm on the client's window (zeros before
    // the first tick), and says how many ticks the window held.
    let ticks: Vec<Vec<f32>> = (0..35).map(|t| tick(1, t)).collect();
    for t in 0..ticks.len() {
        let (status, answer) = post(&infer, &body("window", json!(1), t == 0, &ticks[t])).await;
        assert_eq!(status, 200, "{answer}");
        let want = offline(&base, &ticks[..=t]).await;
        assert!(
            close(prediction(&answer), want),
            "tick {t}: {answer} vs {want}"
        );
        assert_eq!(
            answer["parameters"]["sequence_window_ticks"],
            json!((t + 1).min(WINDOW)),
            "tick {t}"
        );
    }

    // A tick that fails (its deadline passes in the queue) leaves the
    // window as it was: the read shows the 30 newest ticks, and the next
    // tick answers as if the failed one never came.
    let read_body = json!({"parameters": {"sequence_id": 1}});
    let (_, before) = post(&format!("{api}/read"), &read_body).await;
    let mut late = body("window", json!(1), false, &tick(9, 9));
    late["parameters"]["timeout"] = json!(1);
    let (status, answer) = post(&infer, &late).await;
    assert_eq!(status, 504, "{answer}");
    let (status, after) = post(&format!("{api}/read"), &read_body).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        (&before["outputs"], &before["parameters"]["ticks"]),
        (&after["outputs"], &after["parameters"]["ticks"]),
        "a failed tick changed the window"
    );
    assert_eq!(after["parameters"]["sequence_window_ticks"], json!(30));
    assert_eq!(after["outputs"][0]["shape"], json!([1, 30, 8]));
    assert_eq!(floats(&after["outputs"][0]), ticks[5..].concat());

    // A history written over gRPC (5 ticks of the 30) is what the next
    // tick runs on; it reads back as written.
    let mut sequences = SequenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let copy = spb::SequenceId {
        id: Some(spb::sequence_id::Id::Text("preloaded".into())),
    };
    let history: Vec<Vec<f32>> = (0..5).map(|t| tick(2, t)).collect();
    sequences
        .sequence_state_write(spb::SequenceStateWriteRequest {
            model_name: MODEL.into(),
            model_version: String::new(),
            sequence_id: Some(copy.clone()),
            state: vec![grpc_window(&history)],
        })
        .await
        .unwrap();
    let read = sequences
        .sequence_state_read(spb::SequenceRequest {
            model_name: MODEL.into(),
            model_version: String::new(),
            sequence_id: Some(copy.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.state, vec![grpc_window(&history)]);
    let next = tick(2, 5);
    let (status, answer) = post(&infer, &body("window", json!("preloaded"), false, &next)).await;
    assert_eq!(status, 200, "{answer}");
    let mut all = history.clone();
    all.push(next);
    assert!(close(prediction(&answer), offline(&base, &all).await));
    assert_eq!(answer["parameters"]["sequence_window_ticks"], json!(6));

    // Bad writes name the window, what it takes and what came.
    let too_long: Vec<Vec<f32>> = (0..31).map(|t| tick(3, t)).collect();
    let cases = [
        (
            grpc_window(&too_long),
            "shape [1, k, 8] with k from 1 to 30",
        ),
        (
            spb::StateTensor {
                shape: vec![1, 1, 4],
                contents: vec![0u8; 16].into(),
                ..grpc_window(&history[..1])
            },
            "got shape [1, 1, 4] (16 bytes)",
        ),
    ];
    for (state, expected) in cases {
        let error = sequences
            .sequence_state_write(spb::SequenceStateWriteRequest {
                model_name: MODEL.into(),
                model_version: String::new(),
                sequence_id: Some(copy.clone()),
                state: vec![state],
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(error.message().contains("'window'"), "{}", error.message());
        assert!(error.message().contains(expected), "{}", error.message());
    }
    // A whole window sent where a tick goes is refused, naming the tick.
    let whole = json!({
        "parameters": {"sequence_id": 1},
        "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, WINDOW, FEATURES],
                    "data": vec![0f32; WINDOW * FEATURES]}],
    });
    let (status, answer) = post(&infer, &whole).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("'window'"),
        "{answer}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_window_answers_nothing_until_it_is_full() {
    let repository = repository();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let wait = format!("{base}/v2/models/seq_lstm_wait/infer");
    let ticks: Vec<Vec<f32>> = (0..WINDOW + 2).map(|t| tick(4, t)).collect();
    for t in 0..ticks.len() {
        let (status, answer) = post(&wait, &body("window", json!(7), t == 0, &ticks[t])).await;
        assert_eq!(status, 200, "{answer}");
        let held = (t + 1).min(WINDOW);
        assert_eq!(answer["parameters"]["sequence_window_ticks"], json!(held));
        if held < WINDOW {
            assert_eq!(answer["outputs"], json!([]), "tick {t} ran: {answer}");
        } else {
            let want = offline(&base, &ticks[..=t]).await;
            assert!(close(prediction(&answer), want), "tick {t}: {answer}");
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_survive_a_snapshot_restart_and_a_reload() {
    let repository = repository();
    let mut config = support::config(repository.path());
    let snapshot = repository.path().join("sequences.snapshot");
    config.runtime.sequence_snapshot = Some(snapshot.clone());
    config.security.model_control_mode = tickserve_core::config::ModelControlMode::Explicit;
    let ticks: Vec<Vec<f32>> = (0..12).map(|t| tick(5, t)).collect();
    let read_body = json!({"parameters": {"sequence_id": "kept"}});

    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for (t, values) in ticks[..10].iter().enumerate() {
        let (status, _) = post(
            &format!("{base}/v2/models/{MODEL}/infer"),
            &body("window", json!("kept"), t == 0, values),
        )
        .await;
        assert_eq!(status, 200);
    }
    let (_, before) = post(
        &format!("{base}/v2/models/{MODEL}/sequences/read"),
        &read_body,
    )
    .await;
    server.shutdown().await.unwrap();
    assert!(snapshot.exists(), "no snapshot written");

    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let api = format!("{base}/v2/models/{MODEL}/sequences");
    let (status, after) = post(&format!("{api}/read"), &read_body).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        (
            &after["outputs"],
            &after["parameters"]["sequence_window_ticks"]
        ),
        (&before["outputs"], &json!(10)),
        "the snapshot did not bring the window back"
    );
    let reload = reqwest::Client::new()
        .post(format!("{base}/v2/repository/models/{MODEL}/load"))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 200);
    let (status, answer) = post(
        &format!("{base}/v2/models/{MODEL}/infer"),
        &body("window", json!("kept"), false, &ticks[10]),
    )
    .await;
    assert_eq!(status, 200, "the reload dropped the window: {answer}");
    assert!(close(
        prediction(&answer),
        offline(&base, &ticks[..=10]).await
    ));
    assert_eq!(answer["parameters"]["sequence_window_ticks"], json!(11));
    server.shutdown().await.unwrap();
}

/// Triton's Python clients over gRPC, HTTP and a stream against onnxruntime
/// on the clients' windows, and preloaded histories: the bar's check at a
/// size CI affords (the full 200 × 500 is the script's default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_windows_match_onnxruntime_offline() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let args: Vec<&std::ffi::OsStr> = [
        "--model",
        MODEL,
        "--sequences",
        "40",
        "--ticks",
        "60",
        "--clients",
        "8",
    ]
    .iter()
    .map(std::ffi::OsStr::new)
    .collect();
    support::run_python_check(&server, "sequence_check.py", &args, "done").await;
    server.shutdown().await.unwrap();
}
