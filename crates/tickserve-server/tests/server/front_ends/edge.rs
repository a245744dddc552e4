//! The edge, through real servers on loopback: one route table per port
//! whose parse both the key check and the handler see (every route, plain and
//! percent-encoded, refused without its key and served with it), and one
//! parameter reader for every protocol (a parameter of the wrong type is a
//! 400 / INVALID_ARGUMENT naming it; `timeout: 0` is no timeout).

use crate::support;

use serde_json::json;
use tickserve_core::config::{EndpointGroup, FrontEnd, Restriction};
use tickserve_proto::inference as pb;
use tonic::Code;

const KEY: &str = "edge-k3y";

/// A v2 JSON body of one `alpha_mlp` row, with `parameters`.
fn alpha_row(parameters: serde_json::Value) -> String {
    json!({
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": vec![0.5; 50]}],
        "parameters": parameters,
    })
    .to_string()
}

/// Every HTTP route: method, path, and the same path spelled with a
/// percent-encoded character in one or more segments.
fn routes() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        ("GET", "/v2/health/live", "/v2/health/%6Cive"),
        ("GET", "/v2/health/ready", "/v2/%68ealth/ready"),
        ("GET", "/v2", "/%762"),
        ("GET", "/metrics", "/%6Detrics"),
        ("GET", "/v2/models/stats", "/v2/models/%73tats"),
        ("GET", "/v2/models/alpha_mlp", "/v2/models/%61lpha_mlp"),
        (
            "GET",
            "/v2/models/alpha_mlp/versions/1",
            "/v2/models/alpha_mlp/versions/%31",
        ),
        (
            "GET",
            "/v2/models/alpha_mlp/ready",
            "/v2/models/alpha_mlp/%72eady",
        ),
        (
            "GET",
            "/v2/models/alpha_mlp/versions/1/ready",
            "/v2/models/alpha_mlp/versions/%31/ready",
        ),
        (
            "GET",
            "/v2/models/alpha_mlp/config",
            "/v2/models/alpha_mlp/%63onfig",
        ),
        (
            "GET",
            "/v2/models/alpha_mlp/stats",
            "/v2/models/alpha%5Fmlp/stats",
        ),
        (
            "POST",
            "/v2/models/alpha_mlp/infer",
            "/v2/models/alpha_mlp/%69nfer",
        ),
        (
            "POST",
            "/v2/models/alpha_mlp/versions/1/infer",
            "/v2/models/alpha_mlp/versions/%31/infer",
        ),
        (
            "GET",
            "/v2/models/seq_lstm_step/sequences",
            "/v2/models/seq_lstm_step/%73equences",
        ),
        (
            "POST",
            "/v2/models/seq_lstm_step/sequences/read",
            "/v2/models/seq_lstm_step/sequences/%72ead",
        ),
        (
            "POST",
            "/v2/models/seq_lstm_step/sequences/write",
            "/v2/models/seq_lstm_step/sequences/%77rite",
        ),
        (
            "POST",
            "/v2/models/seq_lstm_step/sequences/drop",
            "/v2/models/seq_lstm_step/sequences/%64rop",
        ),
        ("POST", "/v2/repository/index", "/v2/repository/%69ndex"),
        (
            "POST",
            "/v2/repository/models/alpha_mlp/load",
            "/v2/repository/models/alpha_mlp/%6Coad",
        ),
        (
            "POST",
            "/v2/repository/models/alpha_mlp/unload",
            "/v2/repository/models/alpha_mlp/%75nload",
        ),
        ("GET", "/v1/models/alpha_mlp", "/v1/models/%61lpha_mlp"),
        (
            "GET",
            "/v1/models/alpha_mlp/versions/1",
            "/v1/models/alpha_mlp/versions/%31",
        ),
        (
            "GET",
            "/v1/models/alpha_mlp/metadata",
            "/v1/models/alpha_mlp/%6Detadata",
        ),
        (
            "POST",
            "/v1/models/alpha_mlp:predict",
            "/v1/models/alpha_mlp%3Apredict",
        ),
        (
            "POST",
            "/v1/models/alpha_mlp/versions/1:predict",
            "/v1/models/alpha_mlp/versions/%31:predict",
        ),
        (
            "POST",
            "/v1/models/alpha_mlp/versions/1:predict",
            "/v1/models/alpha_mlp%2Fversions%2F1%3Apredict",
        ),
        (
            "POST",
            "/v1/models/alpha_mlp/version/1:predict",
            "/v1/models/alpha_mlp/versio%6E/1:predict",
        ),
    ]
}

/// Sends `method path` with `key` (if any): the status and the body.
async fn answer_of(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> (u16, String) {
    // reqwest would normalise nothing here: the path goes out as written.
    let url = format!("{base}{path}");
    let mut request = match method {
        "GET" => client.get(&url),
        _ => client.post(&url).body(if path.contains("predict") {
            json!({"instances": [vec![0.5; 50]]}).to_string()
        } else {
            alpha_row(json!({}))
        }),
    };
    if let Some(key) = key {
        request = request.header("admin-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// [`answer_of`]'s status.
async fn status_of(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> u16 {
    answer_of(client, base, method, path, key).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_its_encoded_spellings_need_their_key() {
    let mut config = support::config(&support::root().join("config/models"));
    support::restrict_every_group(&mut config, "admin-key", KEY, &[FrontEnd::Http]);
    config.validate().unwrap();
    let server = support::start(&config).await;
    let client = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    for (method, plain, encoded) in routes() {
        for path in [plain, encoded] {
            assert_eq!(
                status_of(&client, &base, method, path, None).await,
                401,
                "{method} {path} without the key"
            );
            assert_eq!(
                status_of(&client, &base, method, path, Some("wrong")).await,
                403,
                "{method} {path} with a wrong key"
            );
        }
        // With the key, both spellings reach the same handler.
        let (plain_status, body) = answer_of(&client, &base, method, plain, Some(KEY)).await;
        let encoded_status = status_of(&client, &base, method, encoded, Some(KEY)).await;
        assert!(
            ![401, 404, 405].contains(&plain_status)
                && !body.contains("need a key")
                && !body.contains("not the right one"),
            "{method} {plain}: {plain_status} {body}"
        );
        assert_eq!(plain_status, encoded_status, "{method} {encoded}");
    }
    // A path that does not parse is 404 with or without a key, never served.
    for path in [
        "/v2/models/alpha_mlp/%zz",
        "/v2/models/alpha_mlp/infer/",
        "/v2//health/live",
        "/v2/models/alpha_mlp/bogus",
        "/v3",
    ] {
        for key in [None, Some(KEY)] {
            assert_eq!(
                status_of(&client, &base, "GET", path, key).await,
                404,
                "{path} {key:?}"
            );
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameter_of_another_type_is_refused_naming_it_over_http_and_grpc() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    for (parameters, words) in [
        (
            json!({"timeout": {"us": 5}}),
            "parameter timeout must be an integer of 0 or more",
        ),
        (json!({"timeout": "5"}), "got the string \"5\""),
        (json!({"timeout": -1}), "got the integer -1"),
        (
            json!({"priority": [1]}),
            "parameter priority must be an integer of 0 or more",
        ),
        (
            json!({"sequence_id": {}}),
            "parameter sequence_id must be an unsigned integer or a string; got a JSON object",
        ),
        (json!({"sequence_id": null}), "got JSON null"),
        (
            json!({"sequence_start": "yes"}),
            "parameter sequence_start must be true or false",
        ),
        (
            json!({"mc_samples": [4]}),
            "parameter mc_samples must be a positive integer",
        ),
        (
            json!({"binary_data_output": "yes"}),
            "parameter binary_data_output must be true or false",
        ),
    ] {
        let response = client
            .post(&url)
            .body(alpha_row(parameters.clone()))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(status, 400, "{parameters}: {body}");
        assert!(error.contains(words), "{parameters}: {error}");
        assert!(error.contains("alpha_mlp"), "{parameters}: {error}");
    }
    // Unknown parameters are the model's, as in Triton: ignored.
    let response = client
        .post(&url)
        .body(alpha_row(json!({"desk": {"id": 7}})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let mut grpc = support::grpc_client(&server).await;
    use pb::infer_parameter::ParameterChoice as P;
    for (name, value, words) in [
        (
            "timeout",
            P::StringParam("5".into()),
            "parameter timeout must be",
        ),
        ("timeout", P::DoubleParam(5.0), "got the number 5"),
        ("priority", P::BoolParam(true), "parameter priority must be"),
        (
            "sequence_id",
            P::DoubleParam(1.5),
            "parameter sequence_id must be",
        ),
        (
            "mc_samples",
            P::StringParam("4".into()),
            "parameter mc_samples must be",
        ),
    ] {
        let mut request = support::grpc_alpha_row();
        request.parameters.insert(
            name.to_string(),
            pb::InferParameter {
                parameter_choice: Some(value),
            },
        );
        let status = grpc.model_infer(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(status.message().contains(words), "{name}: {status:?}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_zero_is_no_timeout_over_http_and_grpc() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    for timeout in [json!(0), json!(0u64)] {
        let response = client
            .post(&url)
            .body(alpha_row(json!({"timeout": timeout})))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    }
    let mut grpc = support::grpc_client(&server).await;
    use pb::infer_parameter::ParameterChoice as P;
    for zero in [P::Int64Param(0), P::Uint64Param(0)] {
        let mut request = support::grpc_alpha_row();
        request.parameters.insert(
            "timeout".to_string(),
            pb::InferParameter {
                parameter_choice: Some(zero),
            },
        );
        grpc.model_infer(request).await.unwrap();
    }
    server.shutdown().await.unwrap();
}

/// `"outputs": []` asks for every output (Triton's reading), as gRPC's
/// empty list (which it cannot tell from none) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_outputs_list_asks_for_every_output() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    let mut body: serde_json::Value = serde_json::from_str(&alpha_row(json!({}))).unwrap();
    body["outputs"] = json!([]);
    let (status, answer) = support::post_json(&url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let outputs = answer["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{answer}");
    assert_eq!(outputs[0]["name"], json!("probabilities"), "{answer}");
    server.shutdown().await.unwrap();
}

/// One `alpha_mlp` row over HTTP with `client`, answered 200.
async fn alpha_answer(
    client: &reqwest::Client,
    server: &tickserve_server::Server,
) -> reqwest::Response {
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    let response = client
        .post(&url)
        .body(alpha_row(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// An answer's timing headers, as numbers: (queue, compute).
fn timing_of(headers: &http::HeaderMap) -> (u64, u64) {
    let read = |name: &str| -> u64 {
        let value = headers.get(name).unwrap_or_else(|| panic!("no {name}"));
        value.to_str().unwrap().parse().unwrap()
    };
    (
        read(tickserve_server::QUEUE_TIME_HEADER),
        read(tickserve_server::COMPUTE_TIME_HEADER),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_on_a_connection_carries_its_timing_over_http_and_grpc() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    // One connection each: the first answer's headers differ in how HTTP/2
    // compresses them from those of the answers after it.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let response = alpha_answer(&client, &server).await;
        let (_, compute) = timing_of(response.headers());
        assert!(compute > 0, "compute {compute} µs");
    }
    let mut grpc = support::grpc_client(&server).await;
    for _ in 0..3 {
        let answer = grpc.model_infer(support::grpc_alpha_row()).await.unwrap();
        let (_, compute) = timing_of(&answer.metadata().clone().into_headers());
        assert!(compute > 0, "compute {compute} µs");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_headers_off_leaves_them_out_over_http_and_grpc() {
    let mut config = support::config(&support::root().join("config/models"));
    config.server.timing_headers = false;
    let server = support::start(&config).await;
    let response = alpha_answer(&reqwest::Client::new(), &server).await;
    let mut grpc = support::grpc_client(&server).await;
    let answer = grpc.model_infer(support::grpc_alpha_row()).await.unwrap();
    for headers in [
        response.headers(),
        &answer.metadata().clone().into_headers(),
    ] {
        for name in [
            tickserve_server::QUEUE_TIME_HEADER,
            tickserve_server::COMPUTE_TIME_HEADER,
        ] {
            assert!(headers.get(name).is_none(), "{name} sent: {headers:?}");
        }
    }
    server.shutdown().await.unwrap();
}

/// A key per group: group `g`'s key is `key-g`, sent in its own header
/// `g-key` (gRPC: `triton-grpc-protocol-g-key`).
fn keyed_apart(config: &mut tickserve_core::config::ServerConfig) {
    config.security.restricted = EndpointGroup::ALL
        .iter()
        .flat_map(|g| {
            let text = format!("{0}:{0}-key=key-{0}", g.as_str());
            [
                Restriction::parse_triton(&text, FrontEnd::Http).unwrap(),
                Restriction::parse_triton(&text, FrontEnd::Grpc).unwrap(),
            ]
        })
        .collect();
}

/// A group that is not `group`.
fn another(group: EndpointGroup) -> EndpointGroup {
    let all = EndpointGroup::ALL;
    let at = all.iter().position(|g| *g == group).unwrap();
    all[(at + 1) % all.len()]
}

/// The route table's group of each HTTP route, as the docs state it.
fn http_group(path: &str) -> EndpointGroup {
    use EndpointGroup as G;
    let plain = path.replace("%31", "1");
    let p = plain.as_str();
    if p == "/metrics" || p.starts_with("/%6D") {
        G::Metrics
    } else if p.contains(":predict")
        || p.contains("%3Apredict")
        || p.ends_with("infer")
        || p.contains("versio%6E")
    {
        G::Inference
    } else if p.contains("/v2/repository/") || p.contains("sequences") {
        G::ModelRepository
    } else if p.ends_with("config") {
        G::ModelConfig
    } else if p.ends_with("stats") {
        G::Statistics
    } else if p.contains("health")
        || p.ends_with("ready")
        || p.starts_with("/v1/models/") && !p.contains("metadata")
    {
        G::Health
    } else {
        G::Metadata
    }
}

/// Each group behind a key of its own: every HTTP route, in both spellings,
/// is refused with another group's key and served with its own; every gRPC
/// method of the protos likewise. A route or method filed under the wrong
/// group fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_group_opens_with_its_own_key_only_on_every_route_and_method() {
    let mut config = support::config(&support::root().join("config/models"));
    keyed_apart(&mut config);
    config.validate().unwrap();
    let server = support::start(&config).await;
    let client = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    for (method, plain, encoded) in routes() {
        let group = http_group(plain);
        for path in [plain, encoded] {
            let url = format!("{base}{path}");
            let send = |header: String, key: String| {
                let request = match method {
                    "GET" => client.get(&url),
                    _ => client.post(&url).body(alpha_row(json!({}))),
                };
                request.header(header, key).send()
            };
            let other = another(group).as_str();
            let status = send(format!("{other}-key"), format!("key-{other}"))
                .await
                .unwrap()
                .status();
            assert_eq!(
                status, 401,
                "{method} {path} ({group:?}) with {other}'s key"
            );
            let status = send("authorization".into(), format!("Bearer key-{other}"))
                .await
                .unwrap()
                .status();
            assert_eq!(
                status, 403,
                "{method} {path} ({group:?}) with {other}'s bearer key"
            );
            let own = group.as_str();
            let status = send(format!("{own}-key"), format!("key-{own}"))
                .await
                .unwrap()
                .status();
            assert!(
                ![401, 403].contains(&status.as_u16())
                    || status == 403 && plain.contains("/v2/repository/models/"),
                "{method} {path} ({group:?}) with its own key: {status}"
            );
        }
    }

    // Every gRPC method, over HTTP/2 with an empty message: the key check
    // answers before any service reads it.
    let grpc = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let grpc_status = |path: String, metadata: (String, String)| {
        let grpc = grpc.clone();
        let url = format!("http://{}{path}", server.grpc_addr);
        async move {
            let response = grpc
                .post(url)
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header(metadata.0, metadata.1)
                .body(vec![0u8; 5])
                .send()
                .await
                .unwrap();
            response
                .headers()
                .get("grpc-status")
                .map(|v| v.to_str().unwrap().to_string())
        }
    };
    let methods = grpc_methods_of_the_protos();
    assert!(methods.len() >= 19, "{methods:?}");
    for (path, group) in methods {
        let other = another(group).as_str();
        let refused = grpc_status(
            path.clone(),
            (
                format!("triton-grpc-protocol-{other}-key"),
                format!("key-{other}"),
            ),
        )
        .await;
        assert_eq!(
            refused.as_deref(),
            Some("16"),
            "{path} ({group:?}) with {other}'s key: UNAUTHENTICATED"
        );
        let refused = grpc_status(
            path.clone(),
            ("authorization".into(), format!("Bearer key-{other}")),
        )
        .await;
        assert_eq!(
            refused.as_deref(),
            Some("7"),
            "{path} ({group:?}) with {other}'s bearer key: PERMISSION_DENIED"
        );
        let own = group.as_str();
        let served = grpc_status(
            path.clone(),
            (
                format!("triton-grpc-protocol-{own}-key"),
                format!("key-{own}"),
            ),
        )
        .await;
        assert!(
            !matches!(served.as_deref(), Some("16" | "7" | "12")),
            "{path} ({group:?}) with its own key: grpc-status {served:?}"
        );
    }
    server.shutdown().await.unwrap();
}

/// Every `rpc` of the served `.proto` files with the group the docs give it.
fn grpc_methods_of_the_protos() -> Vec<(String, EndpointGroup)> {
    use EndpointGroup as G;
    let proto = support::root().join("proto");
    let mut methods = Vec::new();
    for file in [
        "grpc_service.proto",
        "tickserve_sequence.proto",
        "tensorflow_serving/apis/prediction_service.proto",
        "tensorflow_serving/apis/model_service.proto",
    ] {
        let text = std::fs::read_to_string(proto.join(file)).unwrap();
        let package = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("package "))
            .unwrap()
            .trim_end_matches(';')
            .to_string();
        let mut service = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.split_whitespace().next().unwrap().to_string();
            }
            if let Some(rest) = line.strip_prefix("rpc ") {
                let method = rest.split('(').next().unwrap().trim().to_string();
                let group = match method.as_str() {
                    "ServerLive" | "ServerReady" | "ModelReady" | "GetModelStatus" => G::Health,
                    "ServerMetadata" | "ModelMetadata" | "GetModelMetadata" => G::Metadata,
                    "ModelInfer" | "ModelStreamInfer" | "Predict" => G::Inference,
                    "ModelConfig" => G::ModelConfig,
                    "ModelStatistics" => G::Statistics,
                    _ => G::ModelRepository,
                };
                methods.push((format!("/{package}.{service}/{method}"), group));
            }
        }
    }
    methods.push(("/grpc.health.v1.Health/Check".into(), G::Health));
    methods
}

/// `tickserve_requests_total` of `model`, `protocol` and `code` in `metrics`.
fn requests(metrics: &str, model: &str, protocol: &str, code: &str) -> u64 {
    let series = format!(
        "tickserve_requests_total{{model=\"{model}\",protocol=\"{protocol}\",code=\"{code}\"}} "
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_the_request_path_are_counted_once() {
    if support::alone(
        module_path!(),
        "requests_refused_before_the_request_path_are_counted_once",
    ) {
        return;
    }
    // A model of its own: the counters are the process's.
    let repository = tempfile::tempdir().unwrap();
    support::deploy_version(repository.path(), "edge_refused", 1, "alpha_mlp");
    let mut config = support::config(repository.path());
    config.server.max_request_bytes = 4096;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let before = support::metrics_text(&base).await;

    // A body over server.max_request_bytes: 413 over v2 HTTP and TF REST.
    let big = "x".repeat(8192);
    for url in [
        format!("{base}/v2/models/edge_refused/infer"),
        format!("{base}/v1/models/edge_refused:predict"),
    ] {
        let status = http
            .post(&url)
            .body(big.clone())
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 413, "{url}");
    }
    // TF REST with a verb it does not serve: 400.
    let status = http
        .post(format!("{base}/v1/models/edge_refused:classify"))
        .body("{}")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 400);

    let after = support::metrics_text(&base).await;
    let counted = |protocol: &str, code: &str| {
        requests(&after, "edge_refused", protocol, code)
            - requests(&before, "edge_refused", protocol, code)
    };
    assert_eq!(counted("http", "payload_too_large"), 1, "{after}");
    assert_eq!(counted("tfs_rest", "payload_too_large"), 1, "{after}");
    assert_eq!(counted("tfs_rest", "invalid_argument"), 1, "{after}");
    server.shutdown().await.unwrap();
}
