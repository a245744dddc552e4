//! The kill switch and the breaker on a real server: a version halted over
//! HTTP or gRPC answers nothing on every front end (FAILED_PRECONDITION / 423, the
//! message saying `halted` and why), reports not ready and `HALTED` in the
//! index, stays loaded, and serves again at once when resumed; the endpoints
//! take the `risk` key (closed without one, unless opened on purpose, and
//! a breaker's halt is lifted only with it); a halt outlives a restart; a
//! breaker's trips halt its version, whose traffic then goes to its
//! fallback or is refused.

use crate::support;

use std::path::Path;

use tickserve_client::{ClientError, GrpcClient, ShmClient, Tensor};
use tickserve_core::config::{FrontEnd, Restriction, RiskControl, ServerConfig};
use tickserve_proto::tickserve as pb;
use tickserve_proto::tickserve::risk_service_client::RiskServiceClient;

const KEY: &str = "risk-officer";

/// `alpha_mlp` as `name` version `version`, with `toml` as its `model.toml`.
fn alpha(repository: &Path, name: &str, version: u64, toml: &str) {
    support::sample(repository, "alpha_mlp", name, version, Some(toml));
}

/// A row of `value` in every feature: 0.0 answers probabilities below 0.34,
/// -5.0 one of 0.99 (onnxruntime).
pub(super) fn body(value: f32) -> serde_json::Value {
    serde_json::json!({
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": vec![value; 50]}]
    })
}

/// A server on `repository` whose `model-repository` and `risk` endpoints take `KEY`
/// (HTTP header `risk-key`, gRPC metadata `triton-grpc-protocol-risk-key`),
/// with shared memory on and halts kept in `halts`.
fn config(repository: &Path, halts: &Path, service: &str) -> ServerConfig {
    let mut config = support::config(repository);
    config.security.restricted = [FrontEnd::Http, FrontEnd::Grpc]
        .iter()
        .map(|&f| {
            Restriction::parse_triton(&format!("model-repository,risk:risk-key={KEY}"), f).unwrap()
        })
        .collect();
    config.risk.halts_file = Some(halts.to_path_buf());
    config.shm.enabled = true;
    config.shm.service = service.to_string();
    config
}

async fn post(url: &str, body: &serde_json::Value, key: Option<&str>) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().post(url).json(body);
    if let Some(key) = key {
        request = request.header("risk-key", key);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

/// The index entry of `model` version `version`: (state, reason).
async fn indexed(base: &str, model: &str, version: &str) -> (String, String) {
    let (status, index) = post(
        &format!("{base}/v2/repository/index"),
        &serde_json::json!({}),
        Some(KEY),
    )
    .await;
    assert_eq!(status, 200, "{index}");
    let entry = index
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == model && e["version"] == version)
        .unwrap_or_else(|| panic!("{model} {version} not in {index}"))
        .clone();
    (
        entry["state"].as_str().unwrap_or_default().to_string(),
        entry["reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_version_answers_nothing_anywhere_until_resumed_and_stays_halted_across_a_restart()
{
    if support::alone(
        module_path!(),
        "a_halted_version_answers_nothing_anywhere_until_resumed_and_stays_halted_across_a_restart",
    ) {
        return;
    }
    let repository = tempfile::tempdir().unwrap();
    alpha(repository.path(), "alpha", 1, "");
    let state = tempfile::tempdir().unwrap();
    let halts = state.path().join("halts.json");
    let service = format!("tickserve-test-{}-risk", std::process::id());
    let server = support::start(&config(repository.path(), &halts, &service)).await;
    let base = format!("http://{}", server.http_addr);
    let infer = format!("{base}/v2/models/alpha/infer");
    let halt_url = format!("{base}/v2/models/alpha/versions/1/halt");
    let reason = serde_json::json!({"reason": "fat-finger fills on EURUSD"});

    // The key is needed; a version must be named.
    assert_eq!(post(&halt_url, &reason, None).await.0, 401);
    assert_eq!(post(&halt_url, &reason, Some("wrong")).await.0, 403);
    let (status, answer) = post(&format!("{base}/v2/models/alpha/halt"), &reason, Some(KEY)).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        post(
            &format!("{base}/v2/models/alpha/versions/9/halt"),
            &reason,
            Some(KEY)
        )
        .await
        .0,
        404
    );
    assert_eq!(post(&infer, &body(0.0), None).await.0, 200);

    // Halted over HTTP: refused on every front end, saying why.
    let (status, answer) = post(&halt_url, &reason, Some(KEY)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["halted"], true);
    assert_eq!(answer["kept"], true);
    let (status, answer) = post(&infer, &body(0.0), None).await;
    assert_eq!(status, 423, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("halted") && message.contains("fat-finger fills on EURUSD"),
        "{message}"
    );
    let grpc = GrpcClient::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let row = Tensor::from_f32("features", &[1, 50], &[0.0; 50]);
    match grpc.infer("alpha", std::slice::from_ref(&row)).await {
        Err(ClientError::Server { code, message }) => {
            assert_eq!(code, "FAILED_PRECONDITION");
            assert!(message.contains("halted"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let shm_service = service.clone();
    let shm_row = row.clone();
    let shm = tokio::task::spawn_blocking(move || {
        ShmClient::connect_to(&shm_service)
            .unwrap()
            .infer("alpha", &[shm_row])
    })
    .await
    .unwrap();
    assert!(
        matches!(&shm, Err(ClientError::Server { code, message }) if code == "FAILED_PRECONDITION" && message.contains("halted")),
        "{shm:?}"
    );
    let answer = support::stream_once(&server, support::grpc_row("alpha", 50, 0.0)).await;
    assert!(answer.error_message.contains("halted"), "{answer:?}");
    let mut tf_grpc = tickserve_proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(
        format!("http://{}", server.grpc_addr),
    )
    .await
    .unwrap();
    let refused = tf_grpc
        .predict(support::tf_predict("alpha", &[0.0; 50]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("halted"),
        "{}",
        refused.message()
    );
    let tf = reqwest::Client::new()
        .post(format!("{base}/v1/models/alpha:predict"))
        .json(&serde_json::json!({"instances": [vec![0.0; 50]]}))
        .send()
        .await
        .unwrap();
    assert_eq!(tf.status().as_u16(), 423);
    assert!(tf.text().await.unwrap().contains("halted"));
    // Not ready, HALTED in the index, counted.
    let ready = reqwest::get(format!("{base}/v2/models/alpha/versions/1/ready"))
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let (state, why) = indexed(&base, "alpha", "1").await;
    assert_eq!(state, "HALTED");
    assert!(why.contains("fat-finger"), "{why}");
    let metrics = support::metrics_text(&base).await;
    assert!(
        metrics.contains(r#"tickserve_model_halted{model="alpha",version="1"} 1"#),
        "{metrics}"
    );
    server.shutdown().await.unwrap();

    // A restart keeps the halt.
    let server = support::start(&config(repository.path(), &halts, &service)).await;
    let base = format!("http://{}", server.http_addr);
    let infer = format!("{base}/v2/models/alpha/infer");
    assert_eq!(post(&infer, &body(0.0), None).await.0, 423);
    assert_eq!(indexed(&base, "alpha", "1").await.0, "HALTED");

    // Resumed over gRPC (the key as metadata): it serves at once.
    let mut risk = RiskServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let resume = |key: Option<&str>| {
        let mut request = tonic::Request::new(pb::ModelResumeRequest {
            name: "alpha".into(),
            version: "1".into(),
        });
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("triton-grpc-protocol-risk-key", key.parse().unwrap());
        }
        request
    };
    let refused = risk.model_resume(resume(None)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let resumed = risk
        .model_resume(resume(Some(KEY)))
        .await
        .unwrap()
        .into_inner();
    assert!(resumed.resumed && resumed.kept);
    assert_eq!(post(&infer, &body(0.0), None).await.0, 200);
    assert_eq!(indexed(&base, "alpha", "1").await.0, "READY");

    // Halted over gRPC too.
    let mut halt = tonic::Request::new(pb::ModelHaltRequest {
        name: "alpha".into(),
        version: "1".into(),
        reason: "desk closed".into(),
    });
    halt.metadata_mut()
        .insert("triton-grpc-protocol-risk-key", KEY.parse().unwrap());
    let halted = risk.model_halt(halt).await.unwrap().into_inner();
    assert_eq!(
        (halted.reason.as_str(), halted.by.as_str()),
        ("desk closed", "api")
    );
    let (status, answer) = post(&infer, &body(0.0), None).await;
    assert_eq!(status, 423, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("desk closed"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_halts_its_version_after_its_trips_and_its_fallback_answers() {
    let repository = tempfile::tempdir().unwrap();
    let guarded = "[[guard]]\noutput = \"probabilities\"\nmax = 0.9\n";
    alpha(
        repository.path(),
        "fallback",
        1,
        &format!(
            "version_policy = \"all\"\n{guarded}[breaker]\ntrips = 3\nwindow = \"1m\"\nfallback = \"2\"\n"
        ),
    );
    support::deploy_version(repository.path(), "fallback", 2, "alpha_mlp");
    alpha(
        repository.path(),
        "refused",
        1,
        &format!("{guarded}[breaker]\ntrips = 2\nwindow = \"1m\"\n"),
    );
    let state = tempfile::tempdir().unwrap();
    let service = format!("tickserve-test-{}-breaker", std::process::id());
    let server = support::start(&config(
        repository.path(),
        &state.path().join("halts.json"),
        &service,
    ))
    .await;
    let base = format!("http://{}", server.http_addr);
    let v1 = format!("{base}/v2/models/fallback/versions/1/infer");

    // Two trips: still serving (and a good row is answered by version 1).
    for _ in 0..2 {
        assert_eq!(post(&v1, &body(-5.0), None).await.0, 422);
    }
    let (status, answer) = post(&v1, &body(0.0), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model_version"], "1");
    // The third halts version 1: its requests go to version 2 from then on.
    assert_eq!(post(&v1, &body(-5.0), None).await.0, 422);
    let (status, answer) = post(&v1, &body(0.0), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model_version"], "2");
    let (state, why) = indexed(&base, "fallback", "1").await;
    assert_eq!(state, "HALTED");
    assert!(
        why.contains("by its breaker") && why.contains("3 guard trips within 1m"),
        "{why}"
    );

    // Without a fallback, a halted version is refused.
    let refused = format!("{base}/v2/models/refused/infer");
    for _ in 0..2 {
        assert_eq!(post(&refused, &body(-5.0), None).await.0, 422);
    }
    let (status, answer) = post(&refused, &body(0.0), None).await;
    assert_eq!(status, 423, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("is halted: by its breaker"),
        "{answer}"
    );
    server.shutdown().await.unwrap();
}

/// A sequence stays on the version its state lives on; when that version is
/// halted, its ticks are refused, not answered by another version without
/// the state, whether they name the version or not (its fallback too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_on_a_halted_version_is_refused_not_moved() {
    let repository = tempfile::tempdir().unwrap();
    support::deploy_version(repository.path(), "book", 1, "seq_lstm_step");
    support::deploy_version(repository.path(), "book", 2, "seq_lstm_step");
    let states =
        std::fs::read_to_string(support::root().join("config/models/seq_lstm_step/model.toml"))
            .unwrap();
    std::fs::write(
        repository.path().join("book/model.toml"),
        format!(
            "version_policy = \"all\"\n{states}\n[breaker]\ntrips = 100\nwindow = \"1m\"\nfallback = \"2\"\n"
        ),
    )
    .unwrap();
    let mut config = support::config(repository.path());
    config.risk.control = RiskControl::Open;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let tick = |start: bool| {
        serde_json::json!({
            "parameters": {"sequence_id": 9, "sequence_start": start},
            "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": vec![0.5; 8]}]
        })
    };
    let (status, answer) = post(
        &format!("{base}/v2/models/book/versions/1/infer"),
        &tick(true),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Naming no version, the tick goes to the version its sequence lives on.
    let (status, answer) = post(&format!("{base}/v2/models/book/infer"), &tick(false), None).await;
    assert_eq!(
        (status, &answer["model_version"]),
        (200, &serde_json::json!("1")),
        "{answer}"
    );
    let (status, _) = post(
        &format!("{base}/v2/models/book/versions/1/halt"),
        &serde_json::json!({"reason": "test"}),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, answer) = post(&format!("{base}/v2/models/book/infer"), &tick(false), None).await;
    assert_eq!(status, 423, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("halted"),
        "{answer}"
    );
    // Naming the halted version, whose fallback answers its other requests:
    // the sequence's tick is refused as halted, not told "not active" by
    // the fallback (which would have the client restart it and lose it).
    let v1 = format!("{base}/v2/models/book/versions/1/infer");
    let (status, answer) = post(&v1, &tick(false), None).await;
    assert_eq!(status, 423, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("halted"),
        "{answer}"
    );
    // A new sequence naming it starts on the fallback.
    let mut other = tick(true);
    other["parameters"]["sequence_id"] = serde_json::json!(10);
    let (status, answer) = post(&v1, &other, None).await;
    assert_eq!(
        (status, &answer["model_version"]),
        (200, &serde_json::json!("2")),
        "{answer}"
    );
    server.shutdown().await.unwrap();
}

/// Halt and resume are closed under the default settings, saying how to
/// open them; opened on purpose without a key, they answer, but a breaker's
/// halt is lifted only with the `risk` key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halt_and_resume_are_closed_by_default_and_a_breakers_halt_needs_the_key() {
    let repository = tempfile::tempdir().unwrap();
    let guarded = "[[guard]]\noutput = \"probabilities\"\nmax = 0.9\n";
    alpha(repository.path(), "alpha", 1, "");
    alpha(
        repository.path(),
        "tripped",
        1,
        &format!("{guarded}[breaker]\ntrips = 1\nwindow = \"1m\"\n"),
    );
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let reason = serde_json::json!({"reason": "r"});
    let (status, answer) = post(
        &format!("{base}/v2/models/alpha/versions/1/halt"),
        &reason,
        None,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("risk key group is closed")
            && message.contains("[[security.restricted]]")
            && message.contains("control = \"open\""),
        "{message}"
    );
    let channel = support::grpc_channel(&server).await;
    let refused = RiskServiceClient::new(channel)
        .model_halt(pb::ModelHaltRequest {
            name: "alpha".into(),
            version: "1".into(),
            reason: "r".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        post(&format!("{base}/v2/models/alpha/infer"), &body(0.0), None)
            .await
            .0,
        200
    );
    server.shutdown().await.unwrap();

    let mut open = support::config(repository.path());
    open.risk.control = RiskControl::Open;
    let server = support::start(&open).await;
    let base = format!("http://{}", server.http_addr);
    let halt = format!("{base}/v2/models/alpha/versions/1/halt");
    // A body that is JSON but not an object is refused, not read as no reason.
    for body in [serde_json::json!("fat finger"), serde_json::json!([1, 2])] {
        let (status, answer) = post(&halt, &body, None).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("a JSON object"),
            "{answer}"
        );
    }
    assert_eq!(
        post(&format!("{base}/v2/models/alpha/infer"), &body(0.0), None)
            .await
            .0,
        200
    );
    assert_eq!(post(&halt, &reason, None).await.0, 200);
    let resume = format!("{base}/v2/models/alpha/versions/1/resume");
    assert_eq!(post(&resume, &serde_json::json!({}), None).await.0, 200);
    // The breaker halts `tripped`; lifting that halt needs the key.
    let tripped = format!("{base}/v2/models/tripped/infer");
    assert_eq!(post(&tripped, &body(-5.0), None).await.0, 422);
    assert_eq!(post(&tripped, &body(0.0), None).await.0, 423);
    let (status, answer) = post(
        &format!("{base}/v2/models/tripped/versions/1/resume"),
        &serde_json::json!({}),
        None,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("breaker's halt is lifted only with"),
        "{answer}"
    );
    assert_eq!(
        post(&tripped, &body(0.0), None).await.0,
        423,
        "still halted"
    );
    server.shutdown().await.unwrap();
}

/// A halts file named bare (`halts.json`: no folder) is kept in the
/// working directory, and the halt outlives a restart there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_halts_file_name_is_kept_in_the_working_directory() {
    let repository = tempfile::tempdir().unwrap();
    alpha(repository.path(), "alpha_mlp", 1, "");
    let cwd = tempfile::tempdir().unwrap();
    let file = cwd.path().join("tickserve.toml");
    std::fs::write(
        &file,
        format!(
            "[repository]\npath = \"{}\"\n[runtime]\nonnxruntime_library = \"{}\"\n\
             [risk]\ncontrol = \"open\"\nhalts_file = \"halts.json\"\n",
            repository.path().display(),
            support::root()
                .join(".local/lib/libonnxruntime.so.1.31.1")
                .display(),
        ),
    )
    .unwrap();
    let server = support::spawn_server(&file, cwd.path());
    let base = format!("http://{}/v2/models/alpha_mlp", server.http);
    let (status, answer) = post(
        &format!("{base}/versions/1/halt"),
        &serde_json::json!({"reason": "desk closed"}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["kept"], true, "{answer}");
    let kept = std::fs::read_to_string(cwd.path().join("halts.json")).unwrap();
    assert!(kept.contains("desk closed"), "{kept}");
    drop(server);
    let server = support::spawn_server(&file, cwd.path());
    let (status, answer) = post(
        &format!("http://{}/v2/models/alpha_mlp/infer", server.http),
        &body(0.0),
        None,
    )
    .await;
    assert_eq!(status, 423, "{answer}");
}
