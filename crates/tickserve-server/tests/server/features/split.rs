//! A canary split (`[split]` in model.toml) against a real server on
//! loopback: requests that name no version are shared by weight and counted
//! per version; a sequence stays on the version it started on, even when the
//! split moves under it.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tickserve_core::config::ModelControlMode;

use support::deploy_version as version;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_95_5_split_holds_over_10000_requests_and_is_counted() {
    if support::alone(
        module_path!(),
        "a_95_5_split_holds_over_10000_requests_and_is_counted",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    version(scratch.path(), "desk", 1, "tick_000");
    version(scratch.path(), "desk", 2, "tick_001");
    std::fs::write(
        scratch.path().join("desk/model.toml"),
        "version_policy = \"all\"\n\n[labels]\nstable = 1\ncanary = 2\n\n[split]\nstable = 95\ncanary = 5\n",
    )
    .unwrap();
    let server = support::start(&support::config(scratch.path())).await;
    let base = format!("http://{}", server.http_addr);
    let row = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": vec![0.25; 16]}]});

    const REQUESTS: usize = 10_000;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (url, row) = (format!("{base}/v2/models/desk/infer"), row.clone());
        tasks.push(tokio::spawn(async move {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for _ in 0..REQUESTS / 4 {
                *counts
                    .entry(support::answered_version(&url, &row).await)
                    .or_default() += 1;
            }
            counts
        }));
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        for (v, n) in task.await.unwrap() {
            *counts.entry(v).or_default() += n;
        }
    }
    // Binomial: 500 expected, standard deviation 21.8; four of them either side.
    let canary = counts.get("2").copied().unwrap_or(0);
    assert!(
        (413..=587).contains(&canary),
        "canary answered {canary} of {REQUESTS}: {counts:?}"
    );
    assert_eq!(counts.values().sum::<usize>(), REQUESTS);

    // A request that names a version (or a label) is not split, nor counted.
    for path in ["versions/1", "versions/canary"] {
        let url = format!("{base}/v2/models/desk/{path}/infer");
        let want = if path.ends_with('1') { "1" } else { "2" };
        for _ in 0..20 {
            assert_eq!(support::answered_version(&url, &row).await, want);
        }
    }
    let metrics = support::metrics_text(&base).await;
    for (v, n) in &counts {
        let line = format!("tickserve_split_requests_total{{model=\"desk\",version=\"{v}\"}} {n}");
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    server.shutdown().await.expect("clean shutdown");
}

/// A version whose inputs differ from the default version's is left out of
/// the split: a request read against the default's signature never goes to
/// a version that would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_of_another_signature_is_left_out_of_the_split() {
    let scratch = tempfile::tempdir().unwrap();
    version(scratch.path(), "mixed", 1, "tick_000");
    version(scratch.path(), "mixed", 2, "alpha_mlp");
    std::fs::write(
        scratch.path().join("mixed/model.toml"),
        "version_policy = \"all\"\n\n[split]\n1 = 50\n2 = 50\n",
    )
    .unwrap();
    let server = support::start(&support::config(scratch.path())).await;
    let url = format!("http://{}/v2/models/mixed/infer", server.http_addr);
    // The default (highest) version is alpha_mlp's: 50 features.
    let row = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": vec![0.25; 50]}]});
    for _ in 0..40 {
        assert_eq!(support::answered_version(&url, &row).await, "2");
    }
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_never_changes_version_mid_way_even_when_the_split_moves() {
    if support::alone(
        module_path!(),
        "a_sequence_never_changes_version_mid_way_even_when_the_split_moves",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    version(scratch.path(), "seq_split", 1, "seq_lstm");
    version(scratch.path(), "seq_split", 2, "seq_lstm");
    let window =
        std::fs::read_to_string(support::root().join("config/models/seq_lstm_window/model.toml"))
            .unwrap();
    std::fs::write(
        scratch.path().join("seq_split/model.toml"),
        format!("version_policy = \"all\"\n\n[split]\nstable = 50\ncanary = 50\n\n{window}"),
    )
    .unwrap();
    std::fs::write(
        scratch.path().join("seq_split/labels.toml"),
        "stable = 1\ncanary = 2\n",
    )
    .unwrap();
    let mut config = support::config(scratch.path());
    config.security.model_control_mode = ModelControlMode::Poll;
    config.repository.poll_interval = Duration::from_millis(100);
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let url = format!("{base}/v2/models/seq_split/infer");
    let tick = |id: u64, start: bool| {
        json!({
            "parameters": {"sequence_id": id, "sequence_start": start},
            "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, 8], "data": vec![0.1; 8]}],
        })
    };

    // 100 sequences, their ticks interleaved: each on one version.
    const SEQUENCES: u64 = 100;
    let mut on: BTreeMap<u64, String> = BTreeMap::new();
    for round in 0..5 {
        for id in 1..=SEQUENCES {
            let v = support::answered_version(&url, &tick(id, round == 0)).await;
            let first = on.entry(id).or_insert_with(|| v.clone());
            assert_eq!(
                *first, v,
                "sequence {id} moved from version {first} to {v} in round {round}"
            );
        }
    }
    let on_1 = on.values().filter(|v| *v == "1").count();
    assert!(
        (20..=80).contains(&on_1),
        "a 50/50 split put {on_1} of {SEQUENCES} sequences on version 1"
    );

    // Every label now names version 2: new sequences go there, and the
    // sequences living on version 1 stay there to their end.
    std::fs::write(
        scratch.path().join("seq_split/labels.toml"),
        "stable = 2\ncanary = 2\n",
    )
    .unwrap();
    let started = Instant::now();
    while !support::metrics_text(&base)
        .await
        .contains("tickserve_model_label_version{model=\"seq_split\",label=\"stable\"} 2")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the labels never moved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in 1..=SEQUENCES {
        assert_eq!(
            support::answered_version(&url, &tick(id, false)).await,
            on[&id],
            "sequence {id}"
        );
    }
    for id in SEQUENCES + 1..=SEQUENCES + 20 {
        assert_eq!(
            support::answered_version(&url, &tick(id, true)).await,
            "2",
            "new sequence {id}"
        );
    }
    server.shutdown().await.expect("clean shutdown");
}
