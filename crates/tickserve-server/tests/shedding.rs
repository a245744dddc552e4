//! Load shedding: when a model's queue cannot take a request's rows, the
//! request is answered 429 with Retry-After at once, and the others are served.

#![allow(clippy::unwrap_used)]

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_at_once() {
    let repository = tempfile::tempdir().unwrap();
    let model = repository.path().join("seq_lstm");
    std::fs::create_dir_all(model.join("1")).unwrap();
    std::fs::copy(
        common::root().join("config/models/seq_lstm/1/model.onnx"),
        model.join("1/model.onnx"),
    )
    .unwrap();
    // Room for one 64-row request in the queue; buckets up to 8 rows, so every
    // request needs eight runs and goes through the queue (none runs at once).
    std::fs::write(
        model.join("model.toml"),
        "buckets = [1, 2, 4, 8]\nmax_request_rows = 64\nmax_queue_rows = 64\n",
    )
    .unwrap();
    let server = common::start(&common::config(repository.path())).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    let rows = 64usize;
    let header = serde_json::json!({"inputs": [{"name": "window", "datatype": "FP32",
        "shape": [rows, 30, 8], "parameters": {"binary_data_size": rows * 30 * 8 * 4}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend((0..rows * 30 * 8).flat_map(|i| ((i % 13) as f32 / 13.0).to_le_bytes()));

    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(url)
                .header("Inference-Header-Content-Length", json_len)
                .body(body)
                .send()
                .await
                .unwrap();
            let retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            (r.status().as_u16(), retry_after, r.text().await.unwrap())
        }));
    }
    let (mut ok, mut shed) = (0, 0);
    for task in tasks {
        let (status, retry_after, text) = task.await.unwrap();
        match status {
            200 => ok += 1,
            429 => {
                shed += 1;
                assert_eq!(retry_after.as_deref(), Some("1"), "429 carries Retry-After");
                assert!(
                    text.contains("model 'seq_lstm': queue is full") && text.contains("limit 64"),
                    "{text}"
                );
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    println!("{ok} served, {shed} shed");
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    let metrics = reqwest::get(format!("http://{}/metrics", server.http_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
    let repository = common::root().join("config/models");
    let mut config = common::config(&repository);
    config.server.max_inflight = 1;
    let server = common::start(&config).await;
    let url = format!("http://{}/v2/models/seq_lstm/infer", server.http_addr);
    let rows = 256usize;
    let header = serde_json::json!({"inputs": [{"name": "window", "datatype": "FP32",
        "shape": [rows, 30, 8], "parameters": {"binary_data_size": rows * 30 * 8 * 4}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend((0..rows * 30 * 8).flat_map(|i| ((i % 11) as f32 / 11.0).to_le_bytes()));
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(url)
                .header("Inference-Header-Content-Length", json_len)
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }));
    }
    let (mut ok, mut shed) = (0, 0);
    for task in tasks {
        let (status, text) = task.await.unwrap();
        match status {
            200 => ok += 1,
            429 => {
                shed += 1;
                assert!(text.contains("limit of 1 requests in flight"), "{text}");
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    println!("{ok} served, {shed} shed");
    assert!(ok > 0 && shed > 0, "{ok} served, {shed} shed");
    server.shutdown().await.unwrap();
}
