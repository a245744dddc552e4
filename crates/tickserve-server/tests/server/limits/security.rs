//! Safe to expose, over both protocols on loopback: model control is off by
//! default (load and unload refused, the index readable); each endpoint group
//! can require a key, refused without it (401 / UNAUTHENTICATED), refused
//! with a wrong one (403 / PERMISSION_DENIED) and served with it, in Triton's
//! header or as a Bearer token; answers name no server path.

use crate::support;

use tickserve_core::config::{EndpointGroup, FrontEnd, Restriction};
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;

const KEY_VARIABLE: &str = "TICKSERVE_TEST_ADMIN_KEY";
const KEY: &str = "k3y-for-tests";

async fn grpc_client(
    server: &tickserve_server::Server,
) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_load_and_unload_are_refused_and_the_index_is_served() {
    if support::alone(
        module_path!(),
        "by_default_load_and_unload_are_refused_and_the_index_is_served",
    ) {
        return;
    }
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    for operation in ["load", "unload"] {
        let response = http
            .post(format!("{base}/v2/repository/models/alpha_mlp/{operation}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{operation}");
        let body: serde_json::Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("model_control_mode") && error.contains(operation),
            "{error}"
        );
    }
    let index = http
        .post(format!("{base}/v2/repository/index"))
        .send()
        .await
        .unwrap();
    assert_eq!(index.status(), 200);
    let mut grpc = grpc_client(&server).await;
    let refused = grpc
        .repository_model_unload(pb::RepositoryModelUnloadRequest {
            model_name: "alpha_mlp".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("model_control_mode"));
    let refused = grpc
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "alpha_mlp".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let index = grpc
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(index.models.iter().any(|m| m.name == "alpha_mlp"));
    // Still serving what it served.
    grpc.model_infer(support::grpc_alpha_row()).await.unwrap();
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        support::counter_total(&metrics, "tickserve_model_control_refused_total"),
        4.0
    );
    server.shutdown().await.unwrap();
}

/// A request of `group` over HTTP, with `headers`: its status.
async fn http_call(
    client: &reqwest::Client,
    base: &str,
    group: EndpointGroup,
    headers: &[(&str, String)],
) -> u16 {
    let row = format!(
        r#"{{"inputs":[{{"name":"features","datatype":"FP32","shape":[1,50],"data":[{}]}}]}}"#,
        ["0.5"; 50].join(",")
    );
    let request = match group {
        EndpointGroup::Health => client.get(format!("{base}/v2/health/ready")),
        EndpointGroup::Metadata => client.get(format!("{base}/v2/models/alpha_mlp")),
        EndpointGroup::Inference => client
            .post(format!("{base}/v2/models/alpha_mlp/infer"))
            .body(row),
        EndpointGroup::ModelConfig => client.get(format!("{base}/v2/models/alpha_mlp/config")),
        EndpointGroup::Statistics => client.get(format!("{base}/v2/models/alpha_mlp/stats")),
        EndpointGroup::ModelRepository => client.post(format!("{base}/v2/repository/index")),
        EndpointGroup::Metrics => client.get(format!("{base}/metrics")),
        // Resuming a version that is not halted changes nothing.
        EndpointGroup::Risk => client.post(format!("{base}/v2/models/alpha_mlp/versions/1/resume")),
    };
    let mut request = request;
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    if status >= 400 {
        let www = response.headers().get("www-authenticate").cloned();
        let body: serde_json::Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(group.as_str()), "{error}");
        assert!(!error.contains(KEY), "the key is echoed: {error}");
        assert_eq!(www.is_some(), status == 401);
    }
    status
}

/// A request of `group` over gRPC, with `metadata`: its code.
async fn grpc_call(
    client: &mut GrpcInferenceServiceClient<tonic::transport::Channel>,
    group: EndpointGroup,
    metadata: &[(&'static str, String)],
) -> Code {
    fn with<T>(message: T, metadata: &[(&'static str, String)]) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        for (name, value) in metadata {
            request.metadata_mut().insert(*name, value.parse().unwrap());
        }
        request
    }
    let result = match group {
        EndpointGroup::Health => client
            .server_ready(with(pb::ServerReadyRequest {}, metadata))
            .await
            .map(drop),
        EndpointGroup::Metadata => client
            .model_metadata(with(
                pb::ModelMetadataRequest {
                    name: "alpha_mlp".into(),
                    ..Default::default()
                },
                metadata,
            ))
            .await
            .map(drop),
        EndpointGroup::Inference => client
            .model_infer(with(support::grpc_alpha_row(), metadata))
            .await
            .map(drop),
        EndpointGroup::ModelConfig => client
            .model_config(with(
                pb::ModelConfigRequest {
                    name: "alpha_mlp".into(),
                    ..Default::default()
                },
                metadata,
            ))
            .await
            .map(drop),
        EndpointGroup::Statistics => client
            .model_statistics(with(
                pb::ModelStatisticsRequest {
                    name: "alpha_mlp".into(),
                    ..Default::default()
                },
                metadata,
            ))
            .await
            .map(drop),
        EndpointGroup::ModelRepository => client
            .repository_index(with(pb::RepositoryIndexRequest::default(), metadata))
            .await
            .map(drop),
        EndpointGroup::Metrics => unreachable!("HTTP only"),
        EndpointGroup::Risk => unreachable!("its own service: features::risk"),
    };
    match result {
        Ok(()) => Code::Ok,
        Err(status) => {
            assert!(
                !status.message().contains(KEY),
                "the key is echoed: {status:?}"
            );
            status.code()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_restricted_group_is_refused_without_its_key_and_served_with_it() {
    if support::alone(
        module_path!(),
        "each_restricted_group_is_refused_without_its_key_and_served_with_it",
    ) {
        return;
    }
    // SAFETY of set_var: this test runs alone in its process (above), so no
    // other test reads the environment meanwhile; the server reads the
    // variable once it starts, after this.
    unsafe { std::env::set_var(KEY_VARIABLE, format!("{KEY}\n")) };
    let mut config = support::config(&support::root().join("config/models"));
    support::restrict_every_group(
        &mut config,
        "admin-key",
        &format!("env:{KEY_VARIABLE}"),
        &[FrontEnd::Http, FrontEnd::Grpc],
    );
    config.validate().unwrap();
    let server = support::start(&config).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    let mut grpc = grpc_client(&server).await;
    for group in EndpointGroup::ALL {
        let key = || KEY.to_string();
        assert_eq!(http_call(&http, &base, group, &[]).await, 401, "{group:?}");
        assert_eq!(
            http_call(&http, &base, group, &[("admin-key", "wrong".into())]).await,
            403,
            "{group:?}"
        );
        assert_eq!(
            http_call(
                &http,
                &base,
                group,
                &[("authorization", "Bearer wrong".into())]
            )
            .await,
            403,
            "{group:?}"
        );
        assert_eq!(
            http_call(&http, &base, group, &[("admin-key", key())]).await,
            200,
            "{group:?}"
        );
        assert_eq!(
            http_call(
                &http,
                &base,
                group,
                &[("authorization", format!("Bearer {KEY}"))]
            )
            .await,
            200,
            "{group:?}"
        );
        if group == EndpointGroup::Metrics || group == EndpointGroup::Risk {
            continue;
        }
        assert_eq!(
            grpc_call(&mut grpc, group, &[]).await,
            Code::Unauthenticated,
            "{group:?}"
        );
        assert_eq!(
            grpc_call(
                &mut grpc,
                group,
                &[("triton-grpc-protocol-admin-key", "wrong".into())]
            )
            .await,
            Code::PermissionDenied,
            "{group:?}"
        );
        assert_eq!(
            grpc_call(&mut grpc, group, &[("admin-key", key())]).await,
            Code::Unauthenticated,
            "{group:?}: over gRPC the key's metadata carries Triton's prefix"
        );
        assert_eq!(
            grpc_call(
                &mut grpc,
                group,
                &[("triton-grpc-protocol-admin-key", key())]
            )
            .await,
            Code::Ok,
            "{group:?}"
        );
        assert_eq!(
            grpc_call(
                &mut grpc,
                group,
                &[("authorization", format!("Bearer {KEY}"))]
            )
            .await,
            Code::Ok,
            "{group:?}"
        );
    }
    let metrics = http
        .get(format!("{base}/metrics"))
        .header("admin-key", KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"tickserve_access_refused_total{protocol="grpc",group="model-repository",reason="missing_key"} 2"#
        ),
        "{metrics}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stays_open_unless_restricted() {
    if support::alone(module_path!(), "health_stays_open_unless_restricted") {
        return;
    }
    let mut config = support::config(&support::root().join("config/models"));
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), KEY).unwrap();
    config.security.restricted = vec![
        Restriction::parse_triton(
            &format!("inference:admin-key=file:{}", secret.path().display()),
            FrontEnd::Http,
        )
        .unwrap(),
    ];
    let server = support::start(&config).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    assert_eq!(
        http_call(&http, &base, EndpointGroup::Health, &[]).await,
        200
    );
    assert_eq!(
        http_call(&http, &base, EndpointGroup::Metrics, &[]).await,
        200
    );
    assert_eq!(
        http_call(&http, &base, EndpointGroup::Inference, &[]).await,
        401
    );
    // gRPC is not restricted by an HTTP flag.
    let mut grpc = grpc_client(&server).await;
    assert_eq!(
        grpc_call(&mut grpc, EndpointGroup::Inference, &[]).await,
        Code::Ok
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_name_no_server_path() {
    let repository = tempfile::tempdir().unwrap();
    let root = repository.path().display().to_string();
    let alpha = repository.path().join("alpha_mlp/1");
    std::fs::create_dir_all(&alpha).unwrap();
    std::fs::copy(
        support::root().join("config/models/alpha_mlp/1/model.onnx"),
        alpha.join("model.onnx"),
    )
    .unwrap();
    // A model.toml that does not parse, and a model with no versions.
    std::fs::create_dir_all(repository.path().join("broken")).unwrap();
    std::fs::write(repository.path().join("broken/model.toml"), "buckets = 7\n").unwrap();
    std::fs::create_dir_all(repository.path().join("empty")).unwrap();
    let mut config = support::config(repository.path());
    config.server.strict_readiness = false;
    config.security.model_control_mode = tickserve_core::config::ModelControlMode::Explicit;
    let server = support::start(&config).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    let mut answers = Vec::new();
    for url in [
        format!("{base}/v2/repository/index"),
        format!("{base}/v2/repository/models/broken/load"),
        format!("{base}/v2/repository/models/empty/load"),
        format!("{base}/v2/repository/models/absent/load"),
    ] {
        let response = http.post(&url).send().await.unwrap();
        answers.push(response.text().await.unwrap());
    }
    answers.push(
        http.get(format!("{base}/v2/models/broken/ready"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let mut grpc = grpc_client(&server).await;
    let index = grpc
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    answers.push(format!("{index:?}"));
    let load = grpc
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "broken".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    answers.push(load.message().to_string());
    let joined = answers.join("\n");
    assert!(joined.contains("broken/model.toml"), "{joined}");
    assert!(joined.contains("empty/<version>/model.onnx"), "{joined}");
    assert!(
        !joined.contains(&root),
        "a server path in an answer:\n{joined}"
    );
    server.shutdown().await.unwrap();
}
