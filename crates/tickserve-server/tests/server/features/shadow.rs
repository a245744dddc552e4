//! Shadow versions against a real server on loopback: a shadow gets a copy
//! of (a fraction of) its primary's requests after the primary answered,
//! the primary's answers are unchanged, and every mirrored request is
//! accounted for once: compared (largest difference, top-class agreement,
//! the shadow's time) or dropped.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;

use support::deploy_version as version;

/// A metric's value in Prometheus text (0 when absent).
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The series of a shadow metric for `shadow` (of primary 1), with `extra` labels.
fn series(name: &str, shadow: u64, extra: &str) -> String {
    format!("{name}{{model=\"desk\",primary=\"1\",shadow=\"{shadow}\"{extra}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadows_see_copies_of_their_primarys_requests_and_report_how_they_differ() {
    if support::alone(
        module_path!(),
        "shadows_see_copies_of_their_primarys_requests_and_report_how_they_differ",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    version(scratch.path(), "desk", 1, "tick_000");
    version(scratch.path(), "desk", 2, "tick_001"); // other weights: it differs
    version(scratch.path(), "desk", 3, "tick_000"); // the same weights: it agrees
    std::fs::write(
        scratch.path().join("desk/model.toml"),
        "version_policy = \"all\"\n\n[labels]\nstable = 1\n\n[split]\nstable = 100\n\n\
         [[shadow]]\nversion = \"2\"\nof = \"stable\"\n\n\
         [[shadow]]\nversion = \"3\"\nof = \"stable\"\nfraction = 0.5\n",
    )
    .unwrap();
    let journal = tempfile::tempdir().unwrap();
    let mut config = support::config(scratch.path());
    config.journal.enabled = true;
    config.journal.directory = journal.path().to_path_buf();
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);

    const REQUESTS: usize = 200;
    // Each row is asked twice: naming no version (the split sends it to
    // stable, 1) and naming version 1; both are version 1's requests.
    const MIRRORED: f64 = 2.0 * REQUESTS as f64;
    for i in 0..REQUESTS {
        let row: Vec<f32> = (0..16)
            .map(|j| ((i * 16 + j) as f32 * 0.37).sin())
            .collect();
        let body = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": row}]});
        let (status, answer) =
            support::post_json(&format!("{base}/v2/models/desk/infer"), &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["model_version"], "1", "the primary answers");
        let (_, direct) =
            support::post_json(&format!("{base}/v2/models/desk/versions/1/infer"), &body).await;
        assert_eq!(
            answer["outputs"], direct["outputs"],
            "a shadow changed the answer"
        );
    }

    // Each mirrored request is compared or dropped, once.
    let accounted = |metrics: &str, shadow: u64| {
        let rows = value(
            metrics,
            &series("tickserve_shadow_rows_total", shadow, ",agree=\"true\""),
        ) + value(
            metrics,
            &series("tickserve_shadow_rows_total", shadow, ",agree=\"false\""),
        );
        let dropped = value(
            metrics,
            &series("tickserve_shadow_dropped_total", shadow, ",reason=\"busy\""),
        ) + value(
            metrics,
            &series(
                "tickserve_shadow_dropped_total",
                shadow,
                ",reason=\"failed\"",
            ),
        );
        (rows, dropped)
    };
    let started = Instant::now();
    let metrics = loop {
        let metrics = support::metrics_text(&base).await;
        let (rows, dropped) = accounted(&metrics, 2);
        if rows + dropped >= MIRRORED {
            break metrics;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "shadow 2 accounted for {rows} + {dropped} of {MIRRORED}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Shadow 2 mirrors every request (fraction 1).
    let (rows, dropped) = accounted(&metrics, 2);
    assert_eq!(rows + dropped, MIRRORED, "{metrics}");
    assert!(
        rows >= MIRRORED / 2.0,
        "most copies ran: {rows} ran, {dropped} dropped"
    );
    let compared = value(
        &metrics,
        &series("tickserve_shadow_max_abs_diff_count", 2, ""),
    );
    assert_eq!(compared, rows, "one difference per compared request");
    assert!(
        value(
            &metrics,
            &series("tickserve_shadow_max_abs_diff_sum", 2, "")
        ) > 0.0,
        "other weights, other answers:\n{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            &series("tickserve_shadow_duration_seconds_count", 2, "")
        ),
        rows
    );
    // Shadow 3 (the primary's own weights) mirrors about half, and agrees.
    let (rows3, dropped3) = accounted(&metrics, 3);
    assert!(
        (150.0..=250.0).contains(&(rows3 + dropped3)),
        "fraction 0.5 of {MIRRORED} mirrored {rows3} + {dropped3}"
    );
    assert_eq!(
        value(
            &metrics,
            &series("tickserve_shadow_max_abs_diff_sum", 3, "")
        ),
        0.0,
        "the same weights differ:\n{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            &series("tickserve_shadow_rows_total", 3, ",agree=\"false\"")
        ),
        0.0
    );
    // The shadows' copies are not requests: only the client's were counted
    // (this model's: the binary's other test counts its own).
    let requests: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("tickserve_requests_total{model=\"desk\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(requests, (2 * REQUESTS) as f64, "{metrics}");

    // Each shadow answer is journaled as the shadow's record, protocol
    // `shadow`; the primary's records are the clients' requests.
    let writer = std::sync::Arc::clone(server.edge().journal.as_ref().unwrap());
    tokio::task::spawn_blocking(move || writer.flush())
        .await
        .unwrap();
    let read = tickserve_journal::read::scan_dir(journal.path()).unwrap();
    let mut by_version = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for (stream, files) in &read.streams {
        let batches = files
            .iter()
            .flat_map(|f| f.batches().unwrap().map(Result::unwrap));
        for batch in batches {
            let protocols = batch
                .column_by_name("protocol")
                .unwrap()
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .unwrap();
            let entry = by_version.entry(stream.version.clone()).or_default();
            for p in protocols.iter().flatten() {
                if p == "shadow" {
                    entry.1 += 1;
                } else {
                    entry.0 += 1;
                }
            }
        }
    }
    assert_eq!(
        by_version.get("1"),
        Some(&(2 * REQUESTS, 0)),
        "{by_version:?}"
    );
    assert_eq!(
        by_version.get("2"),
        Some(&(0, rows as usize)),
        "{by_version:?}"
    );
    assert_eq!(
        by_version.get("3"),
        Some(&(0, rows3 as usize)),
        "{by_version:?}"
    );
    server.shutdown().await.expect("clean shutdown");
}

/// A sequence's tick and a Monte Carlo request are never mirrored: neither
/// may touch a sequence's state or draw noise twice. A plain request of the
/// same model is (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_ticks_and_monte_carlo_requests_are_not_mirrored() {
    if support::alone(
        module_path!(),
        "sequence_ticks_and_monte_carlo_requests_are_not_mirrored",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    version(scratch.path(), "book", 1, "seq_lstm_step");
    version(scratch.path(), "book", 2, "seq_lstm_step");
    let states =
        std::fs::read_to_string(support::root().join("config/models/seq_lstm_step/model.toml"))
            .unwrap();
    std::fs::write(
        scratch.path().join("book/model.toml"),
        format!("version_policy = \"all\"\n{states}\n[[shadow]]\nversion = \"2\"\nof = \"1\"\n"),
    )
    .unwrap();
    version(scratch.path(), "quant", 1, "tick_000");
    version(scratch.path(), "quant", 2, "tick_000");
    std::fs::write(
        scratch.path().join("quant/model.toml"),
        "version_policy = \"all\"\n\n[monte_carlo]\nenabled = true\n\n\
         [[shadow]]\nversion = \"2\"\nof = \"1\"\n",
    )
    .unwrap();
    let server = support::start(&support::config(scratch.path())).await;
    let base = format!("http://{}", server.http_addr);
    for t in 0..3 {
        let tick = json!({
            "parameters": {"sequence_id": 5, "sequence_start": t == 0},
            "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": vec![0.25; 8]}]
        });
        let (status, answer) =
            support::post_json(&format!("{base}/v2/models/book/versions/1/infer"), &tick).await;
        assert_eq!(status, 200, "{answer}");
    }
    let row = |parameters: serde_json::Value| {
        json!({"parameters": parameters,
               "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16]}]})
    };
    let quant = format!("{base}/v2/models/quant/versions/1/infer");
    for _ in 0..3 {
        let mc = row(json!({"mc_samples": 8, "mc_seed": 1, "mc_noise_sigma": 0.1}));
        let (status, answer) = support::post_json(&quant, &mc).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, answer) = support::post_json(&quant, &row(json!({}))).await;
    assert_eq!(status, 200, "{answer}");
    // The plain request is accounted for: then every earlier copy would be too.
    // (Models of their own: the other test of this binary counts under `desk`.)
    let mirrored = |metrics: &str, model: &str| {
        ["agree=\"true\"", "agree=\"false\""]
            .iter()
            .map(|l| format!("tickserve_shadow_rows_total{{model=\"{model}\",primary=\"1\",shadow=\"2\",{l}}}"))
            .chain(["busy", "failed"].iter().map(|r| {
                format!("tickserve_shadow_dropped_total{{model=\"{model}\",primary=\"1\",shadow=\"2\",reason=\"{r}\"}}")
            }))
            .map(|s| value(metrics, &s))
            .sum::<f64>()
    };
    let started = Instant::now();
    let metrics = loop {
        let metrics = support::metrics_text(&base).await;
        if mirrored(&metrics, "quant") >= 1.0 {
            break metrics;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        mirrored(&metrics, "quant"),
        1.0,
        "Monte Carlo mirrored:\n{metrics}"
    );
    assert_eq!(
        mirrored(&metrics, "book"),
        0.0,
        "sequence ticks mirrored:\n{metrics}"
    );
    server.shutdown().await.unwrap();
}
