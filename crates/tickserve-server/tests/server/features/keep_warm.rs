//! Keep-warm against a real server: with `keep_warm` set, idle executors run
//! their smallest bucket (counted in `tickserve_keep_warm_runs_total`), which
//! never counts as a request in statistics or metrics and never touches a
//! sequence's state; a request sent meanwhile is answered as ever.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use tickserve_core::metrics::KEEP_WARM_RUNS;

/// Waits (at most 30 s) until the server at `base` has made more than
/// `above` warm runs; returns how many.
async fn warm_runs_above(base: &str, above: f64) -> f64 {
    let started = Instant::now();
    loop {
        let runs = support::counter_total(&support::metrics_text(base).await, KEEP_WARM_RUNS);
        if runs > above {
            return runs;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no warm run in 30 s (keep_warm = 2ms): {runs}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_runs_are_not_requests_and_leave_sequences_alone() {
    if support::alone(
        module_path!(),
        "warm_runs_are_not_requests_and_leave_sequences_alone",
    ) {
        return;
    }
    let mut config = support::config(&support::root().join("config/models"));
    config.model_defaults.keep_warm = Duration::from_millis(2);
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);

    // Idle: warm runs, and no request counted anywhere.
    warm_runs_above(&base, 0.0).await;
    let metrics = support::metrics_text(&base).await;
    assert_eq!(
        support::counter_total(&metrics, "tickserve_requests_total"),
        0.0
    );
    let stats = support::get_json(&format!("{base}/v2/models/alpha_mlp/stats")).await;
    assert_eq!(
        stats["model_stats"][0]["inference_count"],
        json!(0),
        "{stats}"
    );

    // A sequence's state is what its tick left, however many warm runs later.
    let tick = json!({
        "parameters": {"sequence_id": 5, "sequence_start": true},
        "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8],
                    "data": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}],
    });
    let (status, answer) =
        support::post_json(&format!("{base}/v2/models/seq_lstm_step/infer"), &tick).await;
    assert_eq!(status, 200, "{answer}");
    let read = json!({"parameters": {"sequence_id": 5}});
    let api = format!("{base}/v2/models/seq_lstm_step/sequences/read");
    let (_, before) = support::post_json(&api, &read).await;
    let runs = support::counter_total(&support::metrics_text(&base).await, KEEP_WARM_RUNS);
    warm_runs_above(&base, runs + 20.0).await;
    let (_, after) = support::post_json(&api, &read).await;
    assert_eq!(
        before["outputs"], after["outputs"],
        "a warm run moved the state"
    );
    assert_eq!(after["parameters"]["ticks"], json!(1));

    // Requests among warm runs are answered, and only they are counted.
    for _ in 0..5 {
        let row = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50],
                                     "data": vec![0.5f32; 50]}]});
        let (status, answer) =
            support::post_json(&format!("{base}/v2/models/alpha_mlp/infer"), &row).await;
        assert_eq!(status, 200, "{answer}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = support::get_json(&format!("{base}/v2/models/alpha_mlp/stats")).await;
    assert_eq!(
        stats["model_stats"][0]["inference_count"],
        json!(5),
        "{stats}"
    );
    server.shutdown().await.unwrap();
}
