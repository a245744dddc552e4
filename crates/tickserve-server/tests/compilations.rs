//! Compile once, and prove it: the compilations counter counts one graph per
//! model and bucket at load, and does not move while every row count from 1 to
//! 3× the largest bucket is served.

#![allow(clippy::unwrap_used)]

mod common;

use tickserve_core::metrics::GRAPH_COMPILATIONS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_compiles_nothing() {
    let repository = common::root().join("config/models");
    let server = common::start(&common::config(&repository)).await;
    let base = format!("http://{}", server.http_addr);
    let client = reqwest::Client::new();

    let at_ready = common::counter_total(&common::metrics_text(&base).await, GRAPH_COMPILATIONS);
    let models = server.shared().runtime.models();
    let buckets: usize = models
        .values()
        .flat_map(|m| m.versions.values())
        .map(|s| match s {
            tickserve_runtime::VersionState::Ready(h) => h.settings.buckets.sizes().len(),
            tickserve_runtime::VersionState::Failed(e) => panic!("sample model failed: {e}"),
        })
        .sum();
    assert_eq!(
        at_ready, buckets as f64,
        "one compilation per model and bucket"
    );

    for (name, model) in &models {
        let Some((_, tickserve_runtime::VersionState::Ready(handle))) = model.default_version()
        else {
            unreachable!()
        };
        let spec = &handle.signature.inputs[0];
        let largest = handle.settings.buckets.largest();
        for rows in 1..=3 * largest {
            let mut shape = vec![rows];
            shape.extend(&spec.dims);
            let body = serde_json::json!({"inputs": [{
                "name": spec.name, "datatype": "FP32", "shape": shape,
                "data": vec![0.25f32; rows * spec.row_elements()],
            }]});
            let response = client
                .post(format!("{base}/v2/models/{name}/infer"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{name} with {rows} rows");
        }
    }
    let after = common::counter_total(&common::metrics_text(&base).await, GRAPH_COMPILATIONS);
    assert_eq!(after, at_ready, "compilations moved while serving");
    server.shutdown().await.unwrap();
}
