//! Loopback round trips against a real in-process server, one request at a
//! time over one connection: the floor (an empty RPC / GET) and a single-row
//! `alpha_mlp` inference, so docs/performance.md can state inference latency as a
//! multiple of the transport's own cost.
//!
//!     cargo bench -p tickserve-server --bench roundtrip
//!
//! The server runs on its own 2-thread runtime; the client on a current-thread
//! runtime in the benchmark thread.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use tickserve_core::config::ServerConfig;
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tickserve_server::Server;

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut config = ServerConfig::default();
    config.server.http_port = 0;
    config.server.grpc_port = 0;
    config.repository.path = root.join("config/models");
    config.runtime.onnxruntime_library = std::env::var_os("TICKSERVE_ONNXRUNTIME_LIBRARY")
        .map(Into::into)
        .unwrap_or_else(|| root.join(".local/lib/libonnxruntime.so.1.31.1"));
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = server_rt
        .block_on(Server::start(&config))
        .expect("server starts");
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let mut grpc = client_rt
        .block_on(GrpcInferenceServiceClient::connect(format!(
            "http://{}",
            server.grpc_addr
        )))
        .unwrap();
    let row: Vec<u8> = (0..50)
        .flat_map(|i| (i as f32 / 50.0).to_le_bytes())
        .collect();
    let infer = pb::ModelInferRequest {
        model_name: "alpha_mlp".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![1, 50],
            ..Default::default()
        }],
        raw_input_contents: vec![row.clone().into()],
        ..Default::default()
    };
    let mut group = c.benchmark_group("grpc");
    group.bench_function("server_live_empty_rpc", |b| {
        b.iter(|| {
            client_rt
                .block_on(grpc.server_live(pb::ServerLiveRequest {}))
                .unwrap()
        })
    });
    group.bench_function("model_infer_alpha_mlp_1row", |b| {
        b.iter(|| client_rt.block_on(grpc.model_infer(infer.clone())).unwrap())
    });
    group.finish();

    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http_addr);
    let body = serde_json::to_vec(&serde_json::json!({"inputs": [{
        "name": "features", "datatype": "FP32", "shape": [1, 50],
        "data": (0..50).map(|i| i as f32 / 50.0).collect::<Vec<_>>(),
    }]}))
    .unwrap();
    let mut group = c.benchmark_group("http");
    group.bench_function("health_live_empty_get", |b| {
        b.iter(|| {
            client_rt.block_on(async {
                http.get(format!("{base}/v2/health/live"))
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    group.bench_function("infer_alpha_mlp_1row_json", |b| {
        b.iter(|| {
            client_rt.block_on(async {
                http.post(format!("{base}/v2/models/alpha_mlp/infer"))
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    group.finish();
    server_rt.block_on(server.shutdown()).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
