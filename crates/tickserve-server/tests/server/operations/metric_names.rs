//! Pins every metric's name, type and label names: a rename or a new label is
//! a visible change to this test, and to the dashboards that query them.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};

/// name → (type, label names), as `/metrics` exposes them.
const PINNED: &[(&str, &str, &[&str])] = &[
    ("tickserve_batch_rows", "histogram", &["model"]),
    (
        "tickserve_compute_duration_seconds",
        "histogram",
        &["bucket", "device", "model"],
    ),
    (
        "tickserve_connections_refused_total",
        "counter",
        &["protocol", "reason"],
    ),
    (
        "tickserve_graph_compilations_total",
        "counter",
        &["bucket", "device", "family"],
    ),
    ("tickserve_heap_allocated_bytes", "gauge", &[]),
    ("tickserve_heap_resident_bytes", "gauge", &[]),
    (
        "tickserve_keep_warm_runs_total",
        "counter",
        &["device", "family"],
    ),
    (
        "tickserve_mixed_member_runs_total",
        "counter",
        &["device", "family"],
    ),
    (
        "tickserve_model_info",
        "gauge",
        &["family", "model", "version"],
    ),
    (
        "tickserve_model_loads_total",
        "counter",
        &["model", "outcome"],
    ),
    ("tickserve_model_ready", "gauge", &["model", "version"]),
    ("tickserve_model_switch_seconds", "gauge", &["model"]),
    ("tickserve_model_unloads_total", "counter", &["model"]),
    ("tickserve_padded_rows", "histogram", &["model"]),
    (
        "tickserve_priority_queue_requests",
        "gauge",
        &["level", "model"],
    ),
    (
        "tickserve_priority_rejections_total",
        "counter",
        &["level", "model", "reason"],
    ),
    ("tickserve_process_cpu_seconds_total", "counter", &[]),
    ("tickserve_process_resident_memory_bytes", "gauge", &[]),
    ("tickserve_queue_duration_seconds", "histogram", &["model"]),
    ("tickserve_queue_rows", "gauge", &["model"]),
    (
        "tickserve_rejections_total",
        "counter",
        &["model", "reason"],
    ),
    (
        "tickserve_request_duration_seconds",
        "histogram",
        &["model", "protocol"],
    ),
    (
        "tickserve_requests_total",
        "counter",
        &["code", "model", "protocol"],
    ),
    ("tickserve_send_timeouts_total", "counter", &["protocol"]),
    ("tickserve_sequence_ends_total", "counter", &["model"]),
    ("tickserve_sequence_expiries_total", "counter", &["model"]),
    ("tickserve_sequence_starts_total", "counter", &["model"]),
    ("tickserve_sequences_active", "gauge", &["model"]),
    (
        "tickserve_tls_handshake_failures_total",
        "counter",
        &["protocol"],
    ),
    (
        "tickserve_weight_swaps_total",
        "counter",
        &["device", "family"],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_names_and_labels_are_pinned() {
    if support::alone(module_path!(), "metric_names_and_labels_are_pinned") {
        return;
    }
    let repository = support::root().join("config/models");
    let mut config = support::config(&repository);
    config.security.model_control_mode = tickserve_core::config::ModelControlMode::Explicit;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let client = reqwest::Client::new();
    let body = serde_json::json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
        "data": vec![0.5f32; 16]}]});
    let r = client
        .post(format!("{base}/v2/models/tick_000/infer"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().contains_key("tickserve-queue-us"),
        "per-response queue time"
    );
    assert!(
        r.headers().contains_key("tickserve-compute-us"),
        "per-response compute time"
    );
    // Another member of tick_000's family: its run binds other weights (a swap).
    let r = client
        .post(format!("{base}/v2/models/tick_001/infer"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A reload: a load, an unload (the version it replaced) and a switch.
    let (status, answer) = support::post_json(
        &format!("{base}/v2/repository/models/tick_001/load"),
        &serde_json::json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let text = support::metrics_text(&base).await;

    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        } else if line.starts_with("tickserve_") {
            let (series, _) = line.rsplit_once(' ').unwrap();
            let (name, label_text) = series.split_once('{').unwrap_or((series, ""));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(name);
            let keys = labels.entry(family.to_string()).or_default();
            for pair in label_text
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty())
            {
                let key = pair.split_once('=').unwrap().0;
                if key != "le" {
                    keys.insert(key.to_string());
                }
            }
        }
    }
    let exposed: Vec<(String, String, Vec<String>)> = types
        .iter()
        .filter(|(name, _)| name.starts_with("tickserve_"))
        .map(|(name, kind)| {
            let keys = labels
                .get(name)
                .map(|k| k.iter().cloned().collect())
                .unwrap_or_default();
            (name.clone(), kind.clone(), keys)
        })
        .collect();
    let pinned: Vec<(String, String, Vec<String>)> = PINNED
        .iter()
        .map(|(n, t, l)| {
            (
                n.to_string(),
                t.to_string(),
                l.iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(exposed, pinned, "metric names, types or labels changed");
    server.shutdown().await.unwrap();
}
