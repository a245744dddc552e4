//! One engine run of `alpha_mlp` per bucket size, with 1 and 2 intra-op
//! threads: the measurement behind `runtime.intra_op_threads = 1`.
//!
//!     cargo bench -p tickserve-engine-ort --bench engine
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, SOLE_MEMBER};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};
use tickserve_onnx::OnnxModel;

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let library = std::env::var_os("TICKSERVE_ONNXRUNTIME_LIBRARY")
        .map(Into::into)
        .unwrap_or_else(|| root.join(".local/lib/libonnxruntime.so.1.31.1"));
    let bytes = std::fs::read(root.join("config/models/alpha_mlp/1/model.onnx")).unwrap();
    let onnx = OnnxModel::parse(&bytes).unwrap();
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let buckets = Buckets::new(&[1, 8, 64], None).unwrap();
    let mut group = c.benchmark_group("alpha_mlp_run");
    for threads in [1, 2] {
        let engine = OrtEngine::new(
            &library,
            OrtOptions {
                intra_op_threads: threads,
            },
        )
        .expect("ONNX Runtime loads (run scripts/setup.sh)");
        let mut model = engine
            .compile(&OrtCompileRequest {
                family: "alpha_mlp",
                onnx: &onnx,
                signature: &signature,
                buckets: &buckets,
                weights: None,
            })
            .unwrap();
        for (index, size) in buckets.sizes().iter().enumerate() {
            model.input_mut(index, 0).fill(0x3f);
            group.bench_function(format!("threads{threads}/bucket{size}"), |b| {
                b.iter(|| model.run(index, SOLE_MEMBER).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
