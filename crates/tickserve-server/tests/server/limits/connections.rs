//! Connection limits against hostile clients on loopback (raw TCP sockets
//! beside a normal client): slow headers, idle keep-alive connections, idle
//! HTTP/2 connections, silent connections, stalled bodies and a connection
//! flood are each cut off, while the normal client keeps being served; one
//! address holds at most its share of the connections, and another address
//! is served at once.

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROW: &str = r#"{"inputs":[{"name":"features","datatype":"FP32","shape":[1,50],"data":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]}"#;

/// One normal inference request over a fresh connection: its status.
async fn normal(http: std::net::SocketAddr) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{http}/v2/models/alpha_mlp/infer"))
        .body(ROW)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Reads until the server closes `stream` or `within` passes: what it sent,
/// and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let until = Instant::now() + within;
    let mut buffer = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buffer[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

fn repository() -> std::path::PathBuf {
    support::root().join("config/models")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_idle_and_silent_clients_are_closed_while_others_are_served() {
    let mut config = support::config(&repository());
    config.server.header_read_timeout = Duration::from_millis(300);
    config.server.body_read_timeout = Duration::from_millis(300);
    let server = support::start(&config).await;
    let (http, grpc) = (server.http_addr, server.grpc_addr);

    // Headers that never finish (slowloris).
    let mut slow = TcpStream::connect(http).await.unwrap();
    slow.write_all(b"POST /v2/models/alpha_mlp/infer HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A kept-alive connection left idle after one request.
    let mut idle = TcpStream::connect(http).await.unwrap();
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Connections that send nothing at all, to either front end.
    let mut silent_http = TcpStream::connect(http).await.unwrap();
    let mut silent_grpc = TcpStream::connect(grpc).await.unwrap();
    // A body that stalls after 10 of its 1000 bytes.
    let mut stalled = TcpStream::connect(http).await.unwrap();
    stalled
        .write_all(
            b"POST /v2/models/alpha_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"",
        )
        .await
        .unwrap();

    // Meanwhile a normal client is served, again and again.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        assert_eq!(normal(http).await, 200);
    }

    let within = Duration::from_secs(5);
    let (sent, closed) = read_until_closed(&mut slow, within).await;
    assert!(closed, "slow headers still open: {sent}");
    let (sent, closed) = read_until_closed(&mut idle, within).await;
    assert!(
        closed && sent.starts_with("HTTP/1.1 200"),
        "idle keep-alive: {closed} {sent}"
    );
    for (name, stream) in [("HTTP", &mut silent_http), ("gRPC", &mut silent_grpc)] {
        let (sent, closed) = read_until_closed(stream, within).await;
        assert!(closed && sent.is_empty(), "silent {name}: {closed} {sent}");
    }
    let (sent, closed) = read_until_closed(&mut stalled, within).await;
    assert!(
        sent.starts_with("HTTP/1.1 400") && sent.contains("did not arrive within 300ms"),
        "stalled body: {closed} {sent}"
    );
    assert_eq!(normal(http).await, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_is_capped_at_max_connections() {
    if support::alone(
        module_path!(),
        "a_connection_flood_is_capped_at_max_connections",
    ) {
        return;
    }
    let mut config = support::config(&repository());
    config.server.max_connections = 8;
    config.server.header_read_timeout = Duration::from_secs(30);
    let server = support::start(&config).await;
    let http = server.http_addr;

    // Eight connections, half of them on each front end, hold every slot;
    // the ninth is closed at once, on either front end.
    let mut held = hold_every_slot(&server, 8, "over the limit").await;
    // Once some leave, a normal client is served again.
    held.truncate(5);
    served_again(http).await;
    let metrics = support::metrics_text(&format!("http://{http}")).await;
    assert!(
        support::counter_total(&metrics, "tickserve_connections_refused_total") >= 2.0,
        "refusals counted"
    );
    drop(held);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_and_another_is_served_at_once() {
    if support::alone(
        module_path!(),
        "one_address_holds_at_most_its_share_and_another_is_served_at_once",
    ) {
        return;
    }
    let mut config = support::config(&repository());
    config.server.max_connections = 8;
    config.server.max_connections_per_peer = 4;
    config.server.header_read_timeout = Duration::from_secs(30);
    let server = support::start(&config).await;
    let http = server.http_addr;

    // 127.0.0.1 holds its four, over both front ends, and never reads; its
    // fifth is closed at once, on either front end...
    let held = hold_every_slot(&server, 4, "over its share").await;
    // ...while another address (loopback has many) is served at once.
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let answer = other
        .post(format!("http://{http}/v2/models/alpha_mlp/infer"))
        .body(ROW)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let metrics = other
        .get(format!("http://{http}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("reason=\"max_connections_per_peer\""),
        "refusals counted by reason"
    );
    drop(held);
    // Its connections closed, the first address is served again.
    served_again(http).await;
    server.shutdown().await.unwrap();
}

/// `count` silent connections from 127.0.0.1, alternating between the two
/// front ends, each having sent a byte (so the server has counted it open);
/// then one more on each front end must be closed at once (`why` says why).
async fn hold_every_slot(
    server: &tickserve_server::Server,
    count: usize,
    why: &str,
) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..count {
        let addr = if i % 2 == 0 {
            server.http_addr
        } else {
            server.grpc_addr
        };
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"G").await.unwrap();
        held.push(stream);
    }
    // A fixed wait: the listener counts a connection when its task takes
    // it, which nothing outside the server can observe; the extra
    // connection below must come after every held one is counted.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for addr in [server.http_addr, server.grpc_addr] {
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let (sent, closed) = read_until_closed(&mut extra, Duration::from_secs(5)).await;
        assert!(closed && sent.is_empty(), "{why}: {closed} {sent}");
    }
    held
}

/// Waits (at most 5 s) until a normal client from 127.0.0.1 is served at
/// `http`, and asserts it is answered 200.
async fn served_again(http: std::net::SocketAddr) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match reqwest::Client::new()
            .post(format!("http://{http}/v2/models/alpha_mlp/infer"))
            .body(ROW)
            .send()
            .await
        {
            Ok(r) => break assert_eq!(r.status(), 200),
            Err(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("not served after connections closed: {e}"),
        }
    }
}

/// The HTTP/2 frames in `bytes` (a server's side of a connection), whole
/// ones only: (type, flags, payload).
fn frames(bytes: &[u8]) -> Vec<(u8, u8, &[u8])> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = usize::from(bytes[at]) << 16
            | usize::from(bytes[at + 1]) << 8
            | usize::from(bytes[at + 2]);
        let Some(payload) = bytes.get(at + 9..at + 9 + len) else {
            break;
        };
        found.push((bytes[at + 3], bytes[at + 4], payload));
        at += 9 + len;
    }
    found
}

/// The frame types in `bytes`.
fn frame_types(bytes: &[u8]) -> Vec<u8> {
    frames(bytes).into_iter().map(|(kind, _, _)| kind).collect()
}

/// The payloads of the PING frames (not acknowledgements) in `bytes`.
fn pings(bytes: &[u8]) -> Vec<[u8; 8]> {
    frames(bytes)
        .into_iter()
        .filter(|(kind, flags, _)| *kind == 6 && flags & 1 == 0)
        .filter_map(|(_, _, payload)| payload.try_into().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_sent_goaway_and_closed() {
    let mut config = support::config(&repository());
    config.server.idle_timeout = Duration::from_millis(300);
    let server = support::start(&config).await;
    for address in [server.grpc_addr, server.http_addr] {
        // The HTTP/2 preface and an empty SETTINGS frame, then nothing.
        let mut idle = TcpStream::connect(address).await.unwrap();
        idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        let mut buffer = [0u8; 4096];
        let mut answered = 0;
        let closed = loop {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, idle.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(n)) => {
                    got.extend_from_slice(&buffer[..n]);
                    // Answer the server's PINGs, as every HTTP/2 client does
                    // (a graceful close waits for the answer).
                    for ping in pings(&got).into_iter().skip(answered) {
                        let mut ack = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                        ack.extend_from_slice(&ping);
                        idle.write_all(&ack).await.unwrap();
                        answered += 1;
                    }
                }
                Err(_) => break false,
            }
        };
        let types = frame_types(&got);
        assert!(closed, "{address}: still open; frames {types:?}");
        assert!(
            types.contains(&0x7),
            "{address}: no GOAWAY before closing: {types:?}"
        );
        assert_eq!(normal(server.http_addr).await, 200);
    }
    // A client keeps working across the close: it reconnects.
    let mut client = tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        format!("http://{}", server.grpc_addr),
    )
    .await
    .unwrap();
    for call in 0..3 {
        client
            .server_ready(tickserve_proto::inference::ServerReadyRequest {})
            .await
            .unwrap();
        if call < 2 {
            // A fixed wait of real time past the idle timeout: nothing
            // signals that a connection is idle, and the server runs on
            // this test's runtime, so a paused clock would also move the
            // server's timers while the client's next call is on its way.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
    server.shutdown().await.unwrap();
}

/// An HTTP/2 connection to `address` that never opens its receive window,
/// with one gRPC `ServerMetadata` call sent on it (its answer can never be
/// sent), driven in the background.
async fn shut_window_peer(address: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let tcp = TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{address}/inference.GRPCInferenceService/ServerMetadata"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (_answer, mut send) = client.send_request(request, false).unwrap();
    // An empty message: the compression flag and a zero length.
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    tokio::spawn(async move {
        let _keep = (client, send, _answer);
        let _ = driver.await;
    })
}

/// An HTTP/1 connection that pipelines requests and never reads an answer:
/// the answers fill the socket's buffers.
async fn pipelining_peer(address: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let tcp = TcpStream::connect(address).await.unwrap();
    tokio::spawn(async move {
        let (_read, mut write) = tcp.into_split();
        let request = b"GET /v2/models/alpha_mlp/config HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
        for _ in 0..2000 {
            if write.write_all(&request).await.is_err() {
                return;
            }
        }
        // Holds the read half open, unread, until the server closes.
        std::future::pending::<()>().await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_never_read_are_closed_and_a_normal_client_is_served_within_a_second() {
    if support::alone(
        module_path!(),
        "peers_that_never_read_are_closed_and_a_normal_client_is_served_within_a_second",
    ) {
        return;
    }
    let mut config = support::config(&repository());
    config.server.max_connections = 2;
    config.server.send_timeout = Duration::from_millis(200);
    let server = support::start(&config).await;
    let (http, grpc) = (server.http_addr, server.grpc_addr);
    // Every connection the server allows, taken by a peer that never reads.
    let peers = [shut_window_peer(grpc).await, pipelining_peer(http).await];
    let started = Instant::now();
    let served = loop {
        let answer = reqwest::Client::new()
            .get(format!("http://{http}/v2/health/ready"))
            .timeout(Duration::from_millis(200))
            .send()
            .await;
        if answer.is_ok_and(|a| a.status() == 200) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no normal request served for 5 s beside peers that never read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(served < Duration::from_secs(1), "served after {served:?}");
    // Both peers were closed for it, and counted (bounded wait: the second
    // may go a little later than the first).
    let lines = ["grpc", "http"]
        .map(|protocol| format!("tickserve_send_timeouts_total{{protocol=\"{protocol}\"}} 1"));
    let started = Instant::now();
    loop {
        let metrics = reqwest::get(format!("http://{http}/metrics")).await;
        let text = match metrics {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if lines.iter().all(|line| text.lines().any(|l| l == line)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not both send timeouts counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for peer in peers {
        peer.abort();
    }
    server.shutdown().await.unwrap();
}

/// An HTTP/2 HEADERS frame opening stream 1: `POST path` with gRPC's
/// headers, HPACK-encoded by hand (literal values, no Huffman).
fn grpc_headers_frame(path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    block.push(0x44); // :path, literal with indexing, name from the table
    block.push(u8::try_from(path.len()).unwrap());
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x0f, 0x10]); // content-type (index 31), literal
    block.push(16);
    block.extend_from_slice(b"application/grpc");
    block.push(0x00); // te: a literal name and value
    block.push(2);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    let len = block.len();
    let mut frame = vec![
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        0x1,
        0x4,
        0,
        0,
        0,
        1,
    ];
    frame.extend_from_slice(&block);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_http2_peer_with_a_stream_open_is_found_by_keep_alive() {
    let mut config = support::config(&repository());
    config.server.http2_keep_alive = Duration::from_millis(200);
    let server = support::start(&config).await;
    // A stream opened, then silence: the peer answers nothing, pings included
    // (a host that vanished). Its stream keeps the connection from idling.
    let mut dead = TcpStream::connect(server.grpc_addr).await.unwrap();
    let mut hello =
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec();
    hello.extend(grpc_headers_frame(
        "/inference.GRPCInferenceService/ModelStreamInfer",
    ));
    dead.write_all(&hello).await.unwrap();
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    let mut buffer = [0u8; 4096];
    let closed = loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, dead.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buffer[..n]),
            Err(_) => break false,
        }
    };
    let types = frame_types(&got);
    assert!(closed, "still open after 5 s; frames {types:?}");
    assert!(types.contains(&0x6), "no PING before closing: {types:?}");
    assert_eq!(normal(server.http_addr).await, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_at_most_max_connection_bytes_of_bodies() {
    let mut config = support::config(&repository());
    config.server.max_request_bytes = 1 << 20;
    config.server.max_connection_bytes = 1 << 20;
    config.server.body_read_timeout = Duration::from_secs(30);
    let server = support::start(&config).await;
    // Two bodies on one HTTP/2 connection (h2c), each sent 600 KiB in of
    // its 1 MiB: the first fits in the connection's 1 MiB, the second does
    // not, and is answered 429 at once.
    let tcp = TcpStream::connect(server.http_addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut client = client.clone().ready().await.unwrap();
        let request = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/v2/models/alpha_mlp/infer",
                server.http_addr
            ))
            .header("content-length", (1 << 20).to_string())
            .body(())
            .unwrap();
        let (answer, mut send) = client.send_request(request, false).unwrap();
        let chunk = bytes::Bytes::from(vec![b' '; 600 << 10]);
        send.reserve_capacity(chunk.len());
        send.send_data(chunk, false).unwrap();
        streams.push((answer, send));
        // The first body's bytes are taken in (and held) before the second
        // comes.
        let started = Instant::now();
        while streams.len() == 1 && server.edge().inflight_bytes() < 600 << 10 {
            assert!(started.elapsed() < Duration::from_secs(5), "not taken in");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let (second, _keep) = streams.pop().unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second body was not answered at once")
        .unwrap();
    assert_eq!(answer.status(), 429);
    // The first still waits for the rest of its body: unanswered.
    let (first, _keep_first) = streams.pop().unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), first)
            .await
            .is_err(),
        "the first body was answered before it was whole"
    );
    assert_eq!(normal(server.http_addr).await, 200);
    driver.abort();
    server.shutdown().await.unwrap();
}
