//! Server readiness tells an orchestrator the truth (Triton's strict
//! readiness, on by default): a repository with a model that failed to load
//! (the fixtures' `broken`) is not ready over HTTP and gRPC, while the models
//! that loaded serve; `server.strict_readiness = false` makes it ready.

use crate::support;

use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

/// (HTTP /v2/health/ready status, gRPC ServerReady, HTTP alpha_mlp ready status).
async fn readiness(server: &tickserve_server::Server) -> (u16, bool, u16) {
    let base = format!("http://{}", server.http_addr);
    let status = |path: &'static str| {
        let url = format!("{base}{path}");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let grpc_ready = grpc
        .server_ready(pb::ServerReadyRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready;
    (
        status("/v2/health/ready").await,
        grpc_ready,
        status("/v2/models/alpha_mlp/ready").await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_model_makes_the_server_not_ready_unless_readiness_is_relaxed() {
    let repository = support::fixture_repository();
    let config = support::config(repository.path());
    assert!(config.server.strict_readiness, "strict by default");
    let server = support::start(&config).await;
    assert_eq!(readiness(&server).await, (503, false, 200));
    server.shutdown().await.unwrap();

    let mut relaxed = config.clone();
    relaxed.server.strict_readiness = false;
    let server = support::start(&relaxed).await;
    assert_eq!(readiness(&server).await, (200, true, 200));
    server.shutdown().await.unwrap();

    let sample = support::start(&support::config(&support::root().join("config/models"))).await;
    assert_eq!(readiness(&sample).await, (200, true, 200));
    sample.shutdown().await.unwrap();
}
