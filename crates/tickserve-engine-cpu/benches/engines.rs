//! One bucket run of one row, the compiled CPU engine beside ONNX Runtime in
//! one run: the per-tick benchmark's tree ensemble and LSTM step, and the
//! sample MLP. The same graph, the same buckets, the same input; what is
//! timed is `CompiledModel::run` alone (ONNX Runtime's: its IoBinding run).
//! Then a batch of 33 rows in the bucket of 64 on the compiled engine: the
//! whole bucket run against the batch's rows alone (`run_rows`).
//!
//!     cargo bench -p tickserve-engine-cpu --bench engines

#![allow(missing_docs, clippy::unwrap_used)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompileRequest, CompiledModel, Device, Engine, SOLE_MEMBER};
use tickserve_engine_cpu::CpuEngine;
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_onnx::{ModelGraph, OnnxModel};
use tickserve_testing::{onnxruntime_library, root, write_models};

fn compiled(engine: &dyn Engine<ModelGraph>, path: &Path, bucket: usize) -> Box<dyn CompiledModel> {
    let onnx = OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap();
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let graph = ModelGraph { onnx, signature };
    let mut model = engine
        .compile(&CompileRequest {
            family: "bench",
            graph: &graph,
            buckets: &Buckets::new(&[bucket], None).unwrap(),
            weights: None,
            device: Device::Cpu,
            check: true,
            resident: None,
        })
        .unwrap();
    for input in 0..model.signature().inputs.len() {
        let bytes = model.input_mut(0, input);
        for (i, b) in bytes.chunks_exact_mut(4).enumerate() {
            b.copy_from_slice(&((i % 7) as f32 * 0.25 - 0.75).to_le_bytes());
        }
    }
    model
}

fn engines(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    write_models("--bench", dir.path());
    let ort = OrtEngine::new(
        &onnxruntime_library(),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .unwrap();
    let cpu = CpuEngine::new();
    let models = [
        ("bench_trees", dir.path().join("bench_trees/1/model.onnx")),
        ("bench_lstm", dir.path().join("bench_lstm/1/model.onnx")),
        (
            "alpha_mlp",
            root().join("config/models/alpha_mlp/1/model.onnx"),
        ),
    ];
    for (name, path) in &models {
        let mut group = c.benchmark_group(*name);
        for (label, engine) in [
            ("onnxruntime", &ort as &dyn Engine<ModelGraph>),
            ("compiled", &cpu as &dyn Engine<ModelGraph>),
        ] {
            let mut model = compiled(engine, path, 1);
            group.bench_function(label, |b| b.iter(|| model.run(0, SOLE_MEMBER).unwrap()));
        }
        group.finish();
    }
}

fn padded(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    write_models("--bench", dir.path());
    let cpu = CpuEngine::new();
    for name in ["bench_trees", "bench_lstm"] {
        let mut model = compiled(&cpu, &dir.path().join(format!("{name}/1/model.onnx")), 64);
        let mut group = c.benchmark_group(format!("{name}, 33 rows in the bucket of 64"));
        group.bench_function("whole bucket", |b| {
            b.iter(|| model.run(0, SOLE_MEMBER).unwrap())
        });
        group.bench_function("its rows", |b| {
            b.iter(|| model.run_rows(0, 33, &[SOLE_MEMBER]).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, engines, padded);
criterion_main!(benches);
