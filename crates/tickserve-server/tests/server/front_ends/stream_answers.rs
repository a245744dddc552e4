//! A `ModelStreamInfer` stream's answers hold their bytes until they are
//! handed over to be sent: a client that keeps its receive window shut holds
//! the budget its computed answers take, until it goes. Alone in its process
//! ([`support::alone`]: it reads the process's metrics), and tried up to three times: under load, hyper now and then takes the
//! answers into tonic's send buffer before the client's shut window applies,
//! and answers handed over are let go by design.

use crate::support;

use std::time::{Duration, Instant};

use tickserve_proto::inference as pb;
use tokio::net::TcpStream;

/// One gRPC message of a `ModelStreamInfer` stream, framed.
fn framed(message: &pb::ModelInferRequest) -> bytes::Bytes {
    let body = prost::Message::encode_to_vec(message);
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&body);
    framed.into()
}

/// One request of `tick_006`: a model of its own, so that no other test
/// counts its requests.
fn row() -> pb::ModelInferRequest {
    let mut row = support::grpc_alpha_row();
    row.model_name = "tick_006".into();
    row.inputs[0].shape = vec![1, 16];
    row.inputs[0].contents = Some(pb::InferTensorContents {
        fp32_contents: vec![0.5; 16],
        ..Default::default()
    });
    row
}

/// One attempt on a fresh connection: ten requests on a stream whose
/// receive window is shut; returns the bytes the edge held once all ten
/// were computed, and checks they are all let go when the client goes.
/// `before` is the tick_006 stream requests counted so far.
async fn shut_window_attempt(server: &tickserve_server::Server, before: usize) -> usize {
    let base = format!("http://{}", server.http_addr);
    let tcp = TcpStream::connect(server.grpc_addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/inference.GRPCInferenceService/ModelStreamInfer",
            server.grpc_addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false).unwrap();
    let message = framed(&row());
    for _ in 0..10 {
        send.send_data(message.clone(), false).unwrap();
    }
    // All ten computed (bounded wait on the request counter)...
    let counted = format!(
        r#"tickserve_requests_total{{model="tick_006",protocol="grpc_stream",code="ok"}} {}"#,
        before + 10
    );
    let started = Instant::now();
    while !support::metrics_text(&base).await.contains(&counted) {
        assert!(started.elapsed() < Duration::from_secs(10), "not computed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and their messages and answers still held: nothing was sent.
    let held = server.edge().inflight_bytes();
    // The client goes: what its answers held is let go.
    drop((answer, send, client));
    driver.abort();
    let started = Instant::now();
    while server.edge().inflight_bytes() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} bytes still held after the client left",
            server.edge().inflight_bytes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_answers_hold_their_bytes_until_sent() {
    if support::alone(
        module_path!(),
        "a_streams_answers_hold_their_bytes_until_sent",
    ) {
        return;
    }
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    // Up to three attempts, each on a connection of its own: on a loaded
    // machine hyper may take an attempt's answers into tonic's send buffer
    // before the client's shut window applies (answers handed over are let
    // go by design), but a server that never holds them fails all three.
    let message_len = framed(&row()).len();
    let mut held = Vec::new();
    for attempt in 0..3 {
        let bytes = shut_window_attempt(&server, 10 * attempt).await;
        held.push(bytes);
        if bytes >= 10 * message_len {
            break;
        }
    }
    assert!(
        held.iter().any(|&b| b >= 10 * message_len),
        "bytes held in each attempt: {held:?} (at least {} expected)",
        10 * message_len
    );
    server.shutdown().await.unwrap();
}
