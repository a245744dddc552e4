//! Load shedding: when a model's queue cannot take a request's rows, or the
//! server has its limit of requests in flight, the request is answered 429 with
//! Retry-After at once, and the others are served.

use crate::support;

/// Floods `url` and returns (served, shed), checking every 429's message and header.
async fn served_and_shed(url: &str, rows: usize, count: usize, message: &str) -> (usize, usize) {
    let (body, json_len) = support::seq_lstm_body(rows);
    let (mut ok, mut shed) = (0, 0);
    for task in support::flood(url, &body, json_len, count) {
        let (status, retry_after, text) = task.await.unwrap().unwrap();
        match status {
            200 => ok += 1,
            429 => {
                shed += 1;
                assert_eq!(retry_after.as_deref(), Some("1"), "429 carries Retry-After");
                assert!(text.contains(message), "{text}");
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    println!("{ok} served, {shed} shed");
    (ok, shed)
}

/// A repository holding only `seq_lstm`, with `model_toml`.
fn seq_lstm_alone(model_toml: &str) -> tempfile::TempDir {
    let repository = tempfile::tempdir().unwrap();
    let model = repository.path().join("seq_lstm");
    std::fs::create_dir_all(model.join("1")).unwrap();
    std::fs::copy(
        support::root().join("config/models/seq_lstm/1/model.onnx"),
        model.join("1/model.onnx"),
    )
    .unwrap();
    std::fs::write(model.join("model.toml"), model_toml).unwrap();
    repository
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_at_once() {
    if support::alone(module_path!(), "a_full_queue_answers_429_at_once") {
        return;
    }
    // Room for one 64-row request in the queue; buckets up to 8 rows, so every
    // request needs eight runs and goes through the queue (none runs at once).
    let repository =
        seq_lstm_alone("buckets = [1, 2, 4, 8]\nmax_request_rows = 64\nmax_queue_rows = 64\n");
    let server = support::start(&support::config(repository.path())).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    let (ok, shed) = served_and_shed(&url, 64, 64, "queue is full").await;
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    let metrics = support::metrics_text(&format!("http://{}", server.http_addr)).await;
    assert!(
        metrics.contains(r#"tickserve_rejections_total{model="seq_lstm",reason="queue_full"}"#),
        "rejections are counted by reason"
    );
    server.shutdown().await.unwrap();
}

/// Edge shedding: with `server.max_inflight` requests being answered, the next
/// is refused at once with 429, whatever model it is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inflight_limit_answers_429_at_once() {
    let mut config = support::config(&support::root().join("config/models"));
    config.server.max_inflight = 1;
    let server = support::start(&config).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    let (ok, shed) = served_and_shed(&url, 256, 32, "limit of 1 requests in flight").await;
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    server.shutdown().await.unwrap();
}

/// A queue bounded in bytes: one 64-row request (61 KiB of input) fits in
/// `max_queue_bytes = 100000`, a second does not, however few rows wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_full_of_bytes_answers_429_at_once() {
    if support::alone(module_path!(), "a_queue_full_of_bytes_answers_429_at_once") {
        return;
    }
    let repository =
        seq_lstm_alone("buckets = [1, 2, 4, 8]\nmax_request_rows = 64\nmax_queue_bytes = 100000\n");
    let server = support::start(&support::config(repository.path())).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    let (ok, shed) = served_and_shed(&url, 64, 64, "bytes waiting, limit 100000").await;
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    let metrics = support::metrics_text(&format!("http://{}", server.http_addr)).await;
    assert!(
        metrics
            .contains(r#"tickserve_rejections_total{model="seq_lstm",reason="queue_bytes_full"}"#),
        "rejections are counted by reason"
    );
    server.shutdown().await.unwrap();
}

/// The server-wide budget of bytes in flight: bodies that would go over it
/// are refused at once, whatever model they are for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inflight_bytes_budget_answers_429_at_once() {
    let mut config = support::config(&support::root().join("config/models"));
    config.server.max_request_bytes = 1 << 20;
    config.server.max_inflight_bytes = 1 << 20;
    let server = support::start(&config).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    // 512 rows: 491 KiB of body each; two fit in the budget, a third does not.
    let (ok, shed) = served_and_shed(&url, 512, 24, "bytes of requests in flight").await;
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    server.shutdown().await.unwrap();
}
