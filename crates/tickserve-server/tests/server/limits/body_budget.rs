//! Request bodies counted as they arrive, against a real server: many bodies
//! sent in part under a small `server.max_inflight_bytes` hold at most that
//! (peak resident memory within the budget and a stated slack), the excess
//! is refused 429 / RESOURCE_EXHAUSTED at once, and a normal client is
//! served meanwhile. Alone in its process ([`support::alone`]): it reads the
//! process's peak resident memory.

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Room for four bodies (each held whole from its `Content-Length`), and
/// half a mebibyte for a normal client beside them.
const BUDGET: usize = (4 << 20) + (512 << 10);
const BODY: usize = 1 << 20;
const SENT: usize = 900 << 10;
const BODIES: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partly_sent_bodies_hold_at_most_the_budget_and_the_excess_is_refused_at_once() {
    if support::alone(
        module_path!(),
        "partly_sent_bodies_hold_at_most_the_budget_and_the_excess_is_refused_at_once",
    ) {
        return;
    }
    let mut config = support::config(&support::root().join("config/models"));
    config.server.max_inflight_bytes = BUDGET;
    config.server.max_request_bytes = BODY;
    config.server.max_connection_bytes = BODY;
    config.server.body_read_timeout = Duration::from_secs(60);
    config.server.max_connections = 256;
    let server = support::start(&config).await;
    let http = server.http_addr;
    let base = format!("http://{http}");
    // Warm: one request of every kind this test sends, and the peak so far.
    let row = r#"{"inputs":[{"name":"features","datatype":"FP32","shape":[1,50],"data":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]}"#;
    let normal = || async {
        reqwest::Client::new()
            .post(format!("{base}/v2/models/alpha_mlp/infer"))
            .body(row)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(normal().await, 200);
    let before = support::peak_resident();

    // 64 bodies of 1 MiB, each sent 900 KiB in and left there: 56 MiB if
    // each were read, against a budget of 4.5 MiB.
    let head = format!(
        "POST /v2/models/alpha_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n"
    );
    let chunk = vec![b' '; 64 << 10];
    let mut connections = Vec::new();
    for _ in 0..BODIES {
        let mut tcp = TcpStream::connect(http).await.unwrap();
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut sent = 0;
        while sent < SENT {
            let n = chunk.len().min(SENT - sent);
            if tcp.write_all(&chunk[..n]).await.is_err() {
                break; // refused and closed
            }
            sent += n;
        }
        connections.push(tcp);
    }
    // Each refused body was answered 429 at once, while its client was
    // still sending: read what every connection got (bounded).
    let mut refused = 0;
    for tcp in &mut connections {
        let mut got = vec![0u8; 1024];
        let read = tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut got)).await;
        if let Ok(Ok(n)) = read
            && got[..n].starts_with(b"HTTP/1.1 429")
        {
            refused += 1;
        }
    }
    // At most the budget's worth held: 4 bodies (held by their declared
    // length) fit, the other 60 were refused.
    assert_eq!(refused, BODIES - BUDGET / BODY, "refused of {BODIES}");
    assert!(server.edge().inflight_bytes() <= BUDGET);
    assert_eq!(normal().await, 200, "a normal client beside them");
    // The stated bound: the budget, and 16 MiB of slack for the connections'
    // own buffers and the allocator.
    let grew = support::peak_resident().saturating_sub(before);
    assert!(
        grew <= BUDGET + (16 << 20),
        "peak resident memory grew by {} MiB",
        grew >> 20
    );
    drop(connections);
    let started = Instant::now();
    while server.edge().inflight_bytes() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "bytes still held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A gRPC message that would go over what is left: RESOURCE_EXHAUSTED.
    let held = server.edge().admit_bytes(BUDGET - (100 << 10)).unwrap();
    let mut grpc = tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        format!("http://{}", server.grpc_addr),
    )
    .await
    .unwrap();
    let mut large = support::grpc_alpha_row();
    large.raw_input_contents = vec![vec![0u8; 500 << 10].into()];
    large.inputs[0].contents = None;
    let status = grpc.model_infer(large).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    drop(held);
    grpc.model_infer(support::grpc_alpha_row()).await.unwrap();
    server.shutdown().await.unwrap();
}
