//! Compile once, and prove it: the compilations counter counts one graph per
//! family and bucket at load (the eight `tick_*` members share one, as do
//! `seq_lstm` and `seq_lstm_window`), and does
//! not move while every row count from 1 to 3× the largest bucket is served on
//! every model (one-tick sequences on a stateful model).

use crate::support;

use tickserve_core::metrics::GRAPH_COMPILATIONS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_compiles_nothing() {
    if support::alone(module_path!(), "serving_compiles_nothing") {
        return;
    }
    let repository = support::root().join("config/models");
    let server = support::start(&support::config(&repository)).await;
    let base = format!("http://{}", server.http_addr);
    let client = reqwest::Client::new();

    let at_ready = support::counter_total(&support::metrics_text(&base).await, GRAPH_COMPILATIONS);
    let models = server.edge().runtime.models();
    // Buckets per family: a shared family counts once, however many members.
    let mut families: std::collections::BTreeMap<String, usize> = Default::default();
    for (name, model) in &models {
        for state in model.versions.values() {
            let tickserve_runtime::VersionState::Ready(h) = state else {
                panic!("sample model {name} failed to load");
            };
            let family = if h.shares_graph {
                h.family_key.clone()
            } else {
                format!("{name} alone")
            };
            families.insert(family, h.settings.buckets.sizes().len());
        }
    }
    let buckets: usize = families.values().sum();
    assert_eq!(
        at_ready, buckets as f64,
        "one compilation per family and bucket: {families:?}"
    );
    // tick_000 … tick_007 are one family; seq_lstm_window (seq_lstm's graph
    // and weights, windowed) joins seq_lstm's.
    assert_eq!(
        families.len(),
        models.len() - 8,
        "tick_000 … tick_007 are one family, seq_lstm and seq_lstm_window another"
    );

    for (name, model) in &models {
        let Some((_, tickserve_runtime::VersionState::Ready(handle))) = model.default_version()
        else {
            unreachable!()
        };
        let spec = &handle.signature.inputs[0];
        let largest = handle.settings.buckets.largest();
        let stateful = handle.sequences().is_some();
        for n in 1..=3 * largest {
            // A stateful model takes one tick (row) per request: n sequences
            // of one tick each instead.
            let rows = if stateful { 1 } else { n };
            let mut shape = vec![rows];
            shape.extend(&spec.dims);
            let mut body = serde_json::json!({"inputs": [{
                "name": spec.name, "datatype": "FP32", "shape": shape,
                "data": vec![0.25f32; rows * spec.row_elements()],
            }]});
            if stateful {
                body["parameters"] = serde_json::json!(
                    {"sequence_id": n, "sequence_start": true, "sequence_end": true});
            }
            let response = client
                .post(format!("{base}/v2/models/{name}/infer"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{name} with {rows} rows");
        }
    }
    let after = support::counter_total(&support::metrics_text(&base).await, GRAPH_COMPILATIONS);
    assert_eq!(after, at_ready, "compilations moved while serving");
    server.shutdown().await.unwrap();
}
