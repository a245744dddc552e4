//! Long-lived gRPC streams against a real server beside a normal client: a
//! quiet `ModelStreamInfer` stream outlives every timeout and still answers;
//! health `Watch` streams are bounded. (A stream's unsent answers:
//! `stream_answers.rs`.)

use crate::support;

use std::time::{Duration, Instant};

use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tokio_stream::StreamExt;

/// Every timeout of the server short: 300 ms.
fn short_timeouts() -> tickserve_core::config::ServerConfig {
    let mut config = support::config(&support::root().join("config/models"));
    let short = Duration::from_millis(300);
    config.server.header_read_timeout = short;
    config.server.body_read_timeout = short;
    config.server.send_timeout = short;
    config.server.idle_timeout = short;
    config.server.http2_keep_alive = short;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_stream_outlives_every_timeout_and_still_answers() {
    let server = support::start(&short_timeouts()).await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let (requests, outbox) = tokio::sync::mpsc::channel(4);
    let mut answers = client
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap()
        .into_inner();
    for tick in 0..3 {
        requests.send(support::grpc_alpha_row()).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .unwrap_or_else(|_| panic!("tick {tick}: no answer within 10 s"))
            .unwrap_or_else(|| panic!("tick {tick}: the stream ended"))
            .unwrap();
        assert_eq!(answer.error_message, "", "tick {tick}");
        assert!(answer.infer_response.is_some(), "tick {tick}");
        // A normal client beside the stream, on its own connection.
        let mut normal =
            GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
                .await
                .unwrap();
        normal.model_infer(support::grpc_alpha_row()).await.unwrap();
        if tick < 2 {
            // Quiet for five times every timeout before the next tick: a
            // quiet instrument. Real time: the server runs on this test's
            // runtime, so a paused clock would also move its timers while
            // the next tick is on its way.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
    // The client ends its stream: the server's drain has nothing to wait for.
    drop(requests);
    assert!(
        tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .expect("the stream ends once its client stops sending")
            .is_none(),
        "an answer after the last request"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_streams_are_bounded() {
    let mut config = support::config(&support::root().join("config/models"));
    config.server.max_health_watches = 2;
    let server = support::start(&config).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let watch = || tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    let first = health.watch(watch()).await.unwrap();
    let second = health.watch(watch()).await.unwrap();
    let refused = health.watch(watch()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // Check is never refused; a Watch that ends frees its place.
    health.check(watch()).await.unwrap();
    drop(first);
    let started = Instant::now();
    loop {
        match health.watch(watch()).await {
            Ok(_third) => break,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(5),
                "no place after a watch ended: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(second);
    server.shutdown().await.unwrap();
}
