//! Live model updates in `poll` mode against a real server on loopback, over
//! a scratch repository: a version dropped in (written as `.N/`, renamed to
//! `N/`) switches under load with no failed request and nothing compiled; a
//! broken version leaves the serving one serving and says why; a version
//! written slowly is never loaded half-written; labels move without a reload
//! and reach every front end; a removed model unloads; a sequence finishes
//! on the version it started on.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tickserve_proto::tensorflow as pb;
use tickserve_proto::tensorflow::serving::model_spec::VersionChoice;
use tickserve_proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use tickserve_proto::tensorflow::serving::{ModelSpec, PredictRequest};

use support::deploy_version as deploy;

fn source(model: &str) -> std::path::PathBuf {
    support::root().join("config/models").join(model)
}

use support::{poll_config, repository_index as index, until};

/// The version that answers a one-row request to `path`, or the refusal.
async fn version_at(base: &str, path: &str) -> Result<String, (u16, Value)> {
    let (status, answer) = support::post_json(&format!("{base}{path}"), &tick_row()).await;
    match status {
        200 => Ok(answer["model_version"].as_str().unwrap().to_string()),
        _ => Err((status, answer)),
    }
}

fn tick_row() -> Value {
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": vec![0.25; 16]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_switches_under_load_and_a_broken_one_leaves_the_old_serving() {
    if support::alone(
        module_path!(),
        "a_new_version_switches_under_load_and_a_broken_one_leaves_the_old_serving",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    for model in ["tick_000", "tick_001"] {
        deploy(scratch.path(), model, 1, model);
    }
    let mut config = poll_config(scratch.path(), Duration::from_millis(100));
    // The family compiles at idle priority (the executor serves at its own).
    config.runtime.compile_priority = tickserve_core::config::CompilePriority::Idle;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let compiled = support::counter_total(
        &support::metrics_text(&base).await,
        "tickserve_graph_compilations_total",
    );

    // Clients send to tick_000 (no version named) all along.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (stop, base) = (Arc::clone(&stop), base.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                seen.push(version_at(&base, "/v2/models/tick_000/infer").await);
            }
            seen
        }));
    }

    // A new member of the live family: it serves, version 1 leaves, and
    // nothing compiles.
    deploy(scratch.path(), "tick_000", 2, "tick_002");
    until("version 2 answers", || async {
        (version_at(&base, "/v2/models/tick_000/infer").await.ok()? == "2").then_some(())
    })
    .await;
    let (status, answer) = version_at(&base, "/v2/models/tick_000/versions/1/infer")
        .await
        .unwrap_err();
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("versions: 2"),
        "{answer}"
    );
    let metrics = support::metrics_text(&base).await;
    assert_eq!(
        support::counter_total(&metrics, "tickserve_graph_compilations_total"),
        compiled,
        "a new member of a live family compiled"
    );
    assert!(
        metrics.contains("tickserve_model_unloads_total{model=\"tick_000\"} 1"),
        "{metrics}"
    );

    // A broken version: it fails, says why, and version 2 serves on.
    let broken = scratch.path().join("tick_000/3");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("model.onnx"), b"not an onnx file").unwrap();
    let reason = until("version 3 listed as failed", || async {
        index(&base)
            .await
            .into_iter()
            .find(|(n, v, s, _)| n == "tick_000" && v == "3" && s == "UNAVAILABLE")
            .map(|(_, _, _, reason)| reason)
    })
    .await;
    assert!(reason.contains("not a valid ONNX model"), "{reason}");
    // What served serves on: the server stays ready.
    let ready = reqwest::get(format!("{base}/v2/health/ready"))
        .await
        .unwrap();
    assert_eq!(
        ready.status(),
        200,
        "a failed new version took readiness away"
    );
    assert_eq!(
        version_at(&base, "/v2/models/tick_000/infer")
            .await
            .unwrap(),
        "2"
    );
    let metrics = support::metrics_text(&base).await;
    assert!(
        metrics.contains("tickserve_model_loads_total{model=\"tick_000\",outcome=\"failed\"} 1"),
        "{metrics}"
    );
    // Removed again, it leaves the index; version 2 is untouched.
    std::fs::remove_dir_all(&broken).unwrap();
    until("version 3 gone from the index", || async {
        let listed = index(&base).await;
        (!listed
            .iter()
            .any(|(n, v, _, _)| n == "tick_000" && v == "3"))
        .then_some(())
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for client in clients {
        for outcome in client.await.unwrap() {
            let version = outcome.unwrap_or_else(|(status, answer)| {
                panic!("a request failed during the switch: {status} {answer}")
            });
            assert!(version == "1" || version == "2", "answered by {version}");
            answered += 1;
        }
    }
    assert!(answered > 20, "only {answered} requests during the switch");

    // A removed model unloads; the other serves on.
    std::fs::remove_dir_all(scratch.path().join("tick_000")).unwrap();
    until("tick_000 unloaded", || async {
        let refused = version_at(&base, "/v2/models/tick_000/infer").await.err()?;
        (refused.0 == 404).then_some(())
    })
    .await;
    assert_eq!(
        version_at(&base, "/v2/models/tick_001/infer")
            .await
            .unwrap(),
        "1"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_written_slowly_is_never_loaded_half_written() {
    if support::alone(
        module_path!(),
        "a_version_written_slowly_is_never_loaded_half_written",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    deploy(scratch.path(), "slow", 1, "tick_001");
    let server = support::start(&poll_config(scratch.path(), Duration::from_millis(250))).await;
    let base = format!("http://{}", server.http_addr);

    // Written in place, not renamed: 200 pieces, 25 ms apart (5 s).
    let bytes = std::fs::read(source("tick_003").join("1/model.onnx")).unwrap();
    let target = scratch.path().join("slow/2");
    std::fs::create_dir_all(&target).unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut file = std::fs::File::create(target.join("model.onnx")).unwrap();
        for piece in bytes.chunks(bytes.len().div_ceil(200)) {
            file.write_all(piece).unwrap();
            file.flush().unwrap();
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    let mut looks = 0;
    while !writer.is_finished() {
        let listed = index(&base).await;
        assert!(
            !listed.iter().any(|(n, v, _, _)| n == "slow" && v == "2"),
            "version 2 was read while it was being written: {listed:?}"
        );
        assert_eq!(
            version_at(&base, "/v2/models/slow/infer").await.unwrap(),
            "1"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.join().unwrap();
    assert!(looks > 20, "only {looks} looks while writing");
    until("version 2 serves once written", || async {
        (version_at(&base, "/v2/models/slow/infer").await.ok()? == "2").then_some(())
    })
    .await;
    let metrics = support::metrics_text(&base).await;
    assert_eq!(
        support::counter_total(
            &metrics,
            "tickserve_model_loads_total{model=\"slow\",outcome=\"failed\"}"
        ),
        0.0,
        "{metrics}"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_move_without_a_reload_and_reach_every_front_end() {
    if support::alone(
        module_path!(),
        "labels_move_without_a_reload_and_reach_every_front_end",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    deploy(scratch.path(), "labelled", 1, "tick_000");
    deploy(scratch.path(), "labelled", 2, "tick_001");
    std::fs::write(
        scratch.path().join("labelled/model.toml"),
        "version_policy = \"all\"\n\n[labels]\nstable = 1\n",
    )
    .unwrap();
    let server = support::start(&poll_config(scratch.path(), Duration::from_millis(100))).await;
    let base = format!("http://{}", server.http_addr);
    let grpc = format!("http://{}", server.grpc_addr);
    let stable = "/v2/models/labelled/versions/stable/infer";
    assert_eq!(version_at(&base, stable).await.unwrap(), "1");
    assert_eq!(
        version_at(&base, "/v2/models/labelled/infer")
            .await
            .unwrap(),
        "2",
        "the default is the highest version"
    );
    let loads = |metrics: &str| support::counter_total(metrics, "tickserve_model_loads_total");
    let loaded = loads(&support::metrics_text(&base).await);

    // labels.toml moves stable to 2 and adds canary; nothing loads.
    std::fs::write(
        scratch.path().join("labelled/labels.toml"),
        "stable = 2\ncanary = 1\n",
    )
    .unwrap();
    until("stable moved to 2", || async {
        (version_at(&base, stable).await.ok()? == "2").then_some(())
    })
    .await;
    assert_eq!(
        version_at(&base, "/v2/models/labelled/versions/canary/infer")
            .await
            .unwrap(),
        "1"
    );
    let metrics = support::metrics_text(&base).await;
    assert_eq!(loads(&metrics), loaded, "moving a label loaded something");
    assert!(
        metrics.contains("tickserve_model_label_version{model=\"labelled\",label=\"stable\"} 2"),
        "{metrics}"
    );

    // Every front end reads the label.
    let (status, answer) = support::post_json(
        &format!("{base}/v1/models/labelled/labels/stable:predict"),
        &json!({"instances": [vec![0.25; 16]]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let mut v2 = GrpcInferenceServiceClient::connect(grpc.clone())
        .await
        .unwrap();
    let mut request = support::grpc_row("labelled", 16, 0.25);
    request.model_version = "canary".into();
    let answer = v2.model_infer(request).await.unwrap().into_inner();
    assert_eq!(answer.model_version, "1");
    let mut tf = PredictionServiceClient::connect(grpc).await.unwrap();
    let predicted = tf
        .predict(PredictRequest {
            model_spec: Some(ModelSpec {
                name: "labelled".into(),
                version_choice: Some(VersionChoice::VersionLabel("stable".into())),
                signature_name: String::new(),
            }),
            inputs: [(
                "features".to_string(),
                pb::TensorProto {
                    dtype: pb::DataType::DtFloat as i32,
                    tensor_shape: Some(pb::TensorShapeProto {
                        dim: [1, 16]
                            .map(|size| pb::tensor_shape_proto::Dim {
                                size,
                                name: String::new(),
                            })
                            .to_vec(),
                        unknown_rank: false,
                    }),
                    float_val: vec![0.25; 16],
                    ..Default::default()
                },
            )]
            .into(),
            output_filter: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        predicted.model_spec.unwrap().version_choice,
        Some(VersionChoice::Version(2))
    );

    // A label may only name a ready version: stable keeps 2; canary moves.
    std::fs::write(
        scratch.path().join("labelled/labels.toml"),
        "stable = 7\ncanary = 2\n",
    )
    .unwrap();
    until("canary moved to 2", || async {
        let answered = version_at(&base, "/v2/models/labelled/versions/canary/infer").await;
        (answered.ok()? == "2").then_some(())
    })
    .await;
    assert_eq!(version_at(&base, stable).await.unwrap(), "2");
    let (status, answer) = version_at(&base, "/v2/models/labelled/versions/beta/infer")
        .await
        .unwrap_err();
    assert_eq!(status, 404, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains("version beta") && error.contains("labels: canary (2), stable (2)"),
        "{error}"
    );

    // Clients may not load or unload: the files decide.
    let (status, answer) = support::post_json(
        &format!("{base}/v2/repository/models/labelled/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("polled"),
        "{answer}"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_finishes_on_its_version_when_a_new_one_arrives() {
    let scratch = tempfile::tempdir().unwrap();
    deploy(scratch.path(), "stateful", 1, "seq_lstm");
    let window = std::fs::read_to_string(source("seq_lstm_window").join("model.toml")).unwrap();
    std::fs::write(
        scratch.path().join("stateful/model.toml"),
        format!("version_policy = {{ latest = 2 }}\n\n{window}"),
    )
    .unwrap();
    let server = support::start(&poll_config(scratch.path(), Duration::from_millis(100))).await;
    let base = format!("http://{}", server.http_addr);
    let url = format!("{base}/v2/models/stateful/infer");
    let tick = |id: u64, start: bool| {
        json!({
            "parameters": {"sequence_id": id, "sequence_start": start},
            "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, 8], "data": vec![0.1; 8]}],
        })
    };
    let answered = |body: Value| {
        let url = url.clone();
        async move { support::answered_version(&url, &body).await }
    };
    for id in 1..=20 {
        assert_eq!(answered(tick(id, true)).await, "1");
    }
    deploy(scratch.path(), "stateful", 2, "seq_lstm");
    let mut fresh = 1000;
    until("new sequences start on version 2", || {
        fresh += 1;
        let started = answered(tick(fresh, true));
        async move { (started.await == "2").then_some(()) }
    })
    .await;
    // The sequences of version 1 finish there; new ones start on version 2.
    for round in 0..3 {
        for id in 1..=20 {
            assert_eq!(
                answered(tick(id, false)).await,
                "1",
                "sequence {id}, round {round}"
            );
        }
    }
    for id in 21..=30 {
        assert_eq!(answered(tick(id, true)).await, "2");
        assert_eq!(answered(tick(id, false)).await, "2");
    }
    server.shutdown().await.expect("clean shutdown");
}
