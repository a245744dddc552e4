//! Graceful shutdown: readiness goes false, no new request is admitted, and
//! every request already queued or running is answered before the server stops.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_what_was_admitted() {
    let repository = common::root().join("config/models");
    let server = common::start(&common::config(&repository)).await;
    let base = format!("http://{}", server.http_addr);
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{base}/v2/health/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // 512-row seq_lstm requests: eight bucket runs each, so they queue up.
    let rows = 512usize;
    let header = serde_json::json!({"inputs": [{"name": "window", "datatype": "FP32",
        "shape": [rows, 30, 8], "parameters": {"binary_data_size": rows * 30 * 8 * 4}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend((0..rows * 30 * 8).flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes()));
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let (client, url, body) = (
            client.clone(),
            format!("{base}/v2/models/seq_lstm/infer"),
            body.clone(),
        );
        tasks.push(tokio::spawn(async move {
            client
                .post(url)
                .header("Inference-Header-Content-Length", json_len)
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    // Wait until every request is admitted (queued or answered), then stop.
    let handle = std::sync::Arc::clone(server.shared().runtime.model("seq_lstm", None).unwrap());
    let admitted =
        || handle.stats.queue.rows() / rows + handle.stats.snapshot().success.count as usize;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while admitted() < tasks.len() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "requests were never admitted");
    let queued_requests = handle.stats.queue.rows() / rows;
    println!(
        "{queued_requests} of {} requests still queued when shutdown began",
        tasks.len()
    );
    let shared = std::sync::Arc::clone(server.shared());
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!shared.ready(), "readiness is false while draining");

    let mut answered_ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(200) => answered_ok += 1,
            Ok(503) => {} // arrived after admission stopped
            Ok(other) => panic!("unexpected status {other} during shutdown"),
            Err(e) => assert!(
                e.is_connect(),
                "a request was cut off instead of answered: {e}"
            ),
        }
    }
    assert!(
        answered_ok >= queued_requests.max(1),
        "{answered_ok} answered, {queued_requests} were queued at shutdown"
    );
    stopping.await.unwrap().unwrap();
}
