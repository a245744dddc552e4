//! What the dynamic batcher buys when the network is not the limit: C callers
//! on the async runtime each send one-row `alpha_mlp` requests straight to
//! `Runtime::infer` (no HTTP, no gRPC, no load generator), against the
//! sample repository served unbatched (`buckets = [1]`, every request its own
//! run) and batched (the shipped buckets 1..64). Reported as the time per
//! request at each concurrency; requests per second is its inverse. After
//! each configuration the engine runs per request go to stderr.
//!
//!     cargo bench -p tickserve-runtime --bench batching
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // a benchmark measures the machine's time

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tickserve_core::config::ServerConfig;
use tickserve_core::{DataType, InferRequest, InputTensor, ModelRequest};
use tickserve_runtime::Runtime;

const CONCURRENCY: [usize; 3] = [1, 8, 32];

fn runtime(buckets: Vec<usize>) -> Runtime {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut config = ServerConfig::default();
    config.repository.path = root.join("config/models");
    config.runtime.onnxruntime_library = root.join(".local/lib/libonnxruntime.so.1.31.1");
    config.model_defaults.buckets = buckets;
    Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)")
}

fn one_row() -> InferRequest {
    let row: Vec<u8> = (0..50u32)
        .flat_map(|i| (i as f32 / 50.0).to_le_bytes())
        .collect();
    InferRequest {
        model: "alpha_mlp".into(),
        version: None,
        request: ModelRequest {
            id: String::new(),
            inputs: vec![InputTensor {
                name: "features".into(),
                datatype: DataType::Fp32,
                shape: vec![1, 50],
                data: row.into(),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        },
    }
}

/// Sends `total` requests from `callers` concurrent tasks; returns the wall time.
async fn flood(runtime: &Arc<Runtime>, callers: usize, total: u64) -> Duration {
    let per_caller = total.div_ceil(callers as u64);
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let runtime = Arc::clone(runtime);
            tokio::spawn(async move {
                let request = one_row();
                for _ in 0..per_caller {
                    runtime.infer(request.clone()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Time per request is what criterion divides by: scale to what was asked.
    started
        .elapsed()
        .mul_f64(total as f64 / (per_caller * callers as u64) as f64)
}

fn bench(c: &mut Criterion) {
    let threads = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("alpha_mlp_in_process");
    for (name, buckets) in [
        ("unbatched", vec![1]),
        ("batched", vec![1, 2, 4, 8, 16, 32, 64]),
    ] {
        let runtime = Arc::new(runtime(buckets));
        let handle = runtime.model("alpha_mlp", None).unwrap();
        for callers in CONCURRENCY {
            let runs_before: u64 = handle.replica_runs().iter().map(|(_, n)| n).sum();
            let mut requests = 0;
            group.bench_function(format!("{name}/concurrency{callers}"), |b| {
                b.iter_custom(|iters| {
                    requests += iters.div_ceil(callers as u64) * callers as u64;
                    threads.block_on(flood(&runtime, callers, iters))
                })
            });
            let runs: u64 = handle.replica_runs().iter().map(|(_, n)| n).sum();
            eprintln!(
                "{name}, concurrency {callers}: {:.2} engine runs per request",
                (runs - runs_before) as f64 / requests.max(1) as f64
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
