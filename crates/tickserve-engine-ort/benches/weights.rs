//! How to share one compiled graph across a family: `tick_000`'s graph run
//! with its weights as constants (one session per model, today) against the
//! same graph with its weights as inputs bound through IoBinding (one session
//! per family), and two ways to swap in another member's weights before a run:
//! rebinding its four weight tensors, or picking that member's own binding.
//! Also: how long making a new member resident takes (`add_member` on the
//! engine's family model: weight tensors and one binding per bucket), which is
//! how long a member joining at run time holds its family's executor.
//!
//!     cargo bench -p tickserve-engine-ort --bench weights
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{IoBinding, Session};
use ort::value::{DynTensor, TensorElementType};
use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};
use tickserve_onnx::{OnnxModel, Weight};

fn session(engine: &OrtEngine, bytes: &[u8]) -> Session {
    Session::builder(engine.environment())
        .unwrap()
        .with_optimization_level(GraphOptimizationLevel::All)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .commit_from_memory(bytes)
        .unwrap()
}

fn tensor(session: &Session, shape: Vec<i64>, data: &[u8]) -> DynTensor {
    let mut t = DynTensor::new(session.allocator(), TensorElementType::Float32, shape).unwrap();
    let ptr = t.data_ptr_mut().cast::<u8>();
    // SAFETY: a CPU tensor of exactly data.len() bytes, just allocated.
    unsafe { std::slice::from_raw_parts_mut(ptr, data.len()) }.copy_from_slice(data);
    t
}

fn weights_of(root: &Path, member: usize) -> Vec<Weight> {
    let path = root.join(format!("config/models/tick_{member:03}/1/model.onnx"));
    let onnx = OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap();
    onnx.with_weights_as_inputs().unwrap().1
}

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let library = std::env::var_os("TICKSERVE_ONNXRUNTIME_LIBRARY")
        .map(Into::into)
        .unwrap_or_else(|| root.join(".local/lib/libonnxruntime.so.1.31.1"));
    let engine = OrtEngine::new(
        &library,
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh");
    let onnx =
        OnnxModel::parse(&std::fs::read(root.join("config/models/tick_000/1/model.onnx")).unwrap())
            .unwrap();
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let (shared, _) = onnx.with_weights_as_inputs().unwrap();
    let members: Vec<Vec<Weight>> = (0..8).map(|m| weights_of(&root, m)).collect();

    let mut group = c.benchmark_group("tick_mlp");
    for batch in [1usize, 64] {
        let x: Vec<u8> = (0..batch * 16)
            .flat_map(|i| (i as f32 / 100.0).to_le_bytes())
            .collect();
        // Weights as constants: the model's own session.
        let mut constant = session(&engine, &onnx.with_static_batch(batch, &signature));
        let mut binding: IoBinding = constant.create_binding().unwrap();
        binding
            .bind_input("features", &tensor(&constant, vec![batch as i64, 16], &x))
            .unwrap();
        let mut out =
            DynTensor::new(constant.allocator(), TensorElementType::Float32, [batch, 1]).unwrap();
        binding.bind_output("signal", &mut out).unwrap();
        group.bench_function(format!("constant_weights/batch{batch}"), |b| {
            b.iter(|| drop(constant.run_binding(&binding).unwrap()))
        });

        // Weights as inputs: one session for the family, each member's weights
        // resident as tensors, bound before a run.
        let mut family = session(&engine, &shared.with_static_batch(batch, &signature));
        let resident: Vec<Vec<(String, DynTensor)>> = members
            .iter()
            .map(|ws| {
                ws.iter()
                    .map(|w| {
                        let shape = w.dims.iter().map(|&d| d as i64).collect();
                        (w.name.clone(), tensor(&family, shape, &w.data))
                    })
                    .collect()
            })
            .collect();
        let mut binding = family.create_binding().unwrap();
        binding
            .bind_input("features", &tensor(&family, vec![batch as i64, 16], &x))
            .unwrap();
        let mut out =
            DynTensor::new(family.allocator(), TensorElementType::Float32, [batch, 1]).unwrap();
        binding.bind_output("signal", &mut out).unwrap();
        for (name, t) in &resident[0] {
            binding.bind_input(name.as_str(), t).unwrap();
        }
        group.bench_function(format!("weights_as_inputs/batch{batch}"), |b| {
            b.iter(|| drop(family.run_binding(&binding).unwrap()))
        });
        let mut member = 0;
        group.bench_function(
            format!("weights_as_inputs_swap_each_run/batch{batch}"),
            |b| {
                b.iter(|| {
                    member = (member + 1) % resident.len();
                    for (name, t) in &resident[member] {
                        binding.bind_input(name.as_str(), t).unwrap();
                    }
                    drop(family.run_binding(&binding).unwrap())
                })
            },
        );
        // One binding per member, each bound once: a swap is picking a binding.
        let input = tensor(&family, vec![batch as i64, 16], &x);
        let mut shared_out =
            DynTensor::new(family.allocator(), TensorElementType::Float32, [batch, 1]).unwrap();
        let bindings: Vec<IoBinding> = resident
            .iter()
            .map(|weights| {
                let mut b = family.create_binding().unwrap();
                b.bind_input("features", &input).unwrap();
                b.bind_output("signal", &mut shared_out).unwrap();
                for (name, t) in weights {
                    b.bind_input(name.as_str(), t).unwrap();
                }
                b
            })
            .collect();
        let mut member = 0;
        group.bench_function(
            format!("binding_per_member_swap_each_run/batch{batch}"),
            |b| {
                b.iter(|| {
                    member = (member + 1) % bindings.len();
                    drop(family.run_binding(&bindings[member]).unwrap())
                })
            },
        );
    }
    group.finish();

    let buckets = Buckets::new(&[1, 2, 4, 8, 16, 32, 64], None).unwrap();
    let (graph, first) = onnx.with_weights_as_inputs().unwrap();
    let mut family = engine
        .compile(&OrtCompileRequest {
            family: &onnx.family_key(),
            onnx: &graph,
            signature: &signature,
            buckets: &buckets,
            weights: Some(&first),
        })
        .unwrap();
    let joining = weights_of(&root, 1);
    c.bench_function("add_member/tick_seven_buckets", |b| {
        b.iter(|| {
            family.add_member(1, &joining).unwrap();
            family.remove_member(1);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
