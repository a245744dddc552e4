//! Graceful shutdown: readiness goes false, no new request is admitted, and
//! every request already queued or running is answered before the server stops.

use crate::support;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_what_was_admitted() {
    let repository = support::root().join("config/models");
    let mut config = support::config(&repository);
    // 24 requests of 512 rows: room for all of them in the queue, so every one
    // is admitted however fast the executor drains it (with the default 4096
    // rows, a slow moment answered one of them 429, and the test waited for
    // it to be admitted: a flake seen on the old runtime too, 1 run in 8).
    config.model_defaults.max_queue_rows = 24 * 512;
    let server = support::start(&config).await;
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
    let (body, json_len) = support::seq_lstm_body(rows);
    let url = format!("{base}/v2/models/seq_lstm/infer");
    let tasks = support::flood(&url, &body, json_len, 24);
    assert!(24 * rows <= config.model_defaults.max_queue_rows);
    // Wait until every request is admitted (queued or answered), then stop.
    let handle = server.edge().runtime.model("seq_lstm", None).unwrap();
    let admitted = || handle.queue.rows() / rows + handle.stats.snapshot().success.count as usize;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while admitted() < tasks.len() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "requests were never admitted");
    let queued_requests = handle.queue.rows() / rows;
    println!(
        "{queued_requests} of {} requests still queued when shutdown began",
        tasks.len()
    );
    let shared = std::sync::Arc::clone(server.edge());
    let stopping = tokio::spawn(server.shutdown());
    // The spawned shutdown turns readiness false on its first poll; on a
    // loaded machine that poll can come later than any fixed sleep, so wait
    // for it (bounded) rather than for a moment.
    let not_ready = tokio::time::timeout(Duration::from_secs(10), async {
        while shared.ready() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    })
    .await;
    assert!(not_ready.is_ok(), "readiness is false while draining");

    for task in tasks {
        let (status, _, text) = task
            .await
            .unwrap()
            .expect("an admitted request is answered, not cut off");
        assert_eq!(
            status, 200,
            "an admitted request is answered with its prediction: {text}"
        );
    }
    stopping.await.unwrap().unwrap();
}
