//! One graph for a family: `tick_000`'s graph with its weights as inputs, each
//! member's weights bound in turn, gives every member exactly what its own
//! session gives.

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{DynTensor, TensorElementType};
use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel};
use tickserve_engine_ort::{CompileRequest, OrtEngine, OrtOptions};
use tickserve_onnx::OnnxModel;

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn tensor(session: &Session, shape: Vec<i64>, data: &[u8]) -> DynTensor {
    let mut t = DynTensor::new(session.allocator(), TensorElementType::Float32, shape).unwrap();
    let ptr = t.data_ptr_mut().cast::<u8>();
    // SAFETY: a CPU tensor of exactly data.len() bytes, just allocated.
    unsafe { std::slice::from_raw_parts_mut(ptr, data.len()) }.copy_from_slice(data);
    t
}

#[test]
fn every_member_through_the_shared_graph_equals_its_own_session() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let engine = OrtEngine::new(
        &root.join(".local/lib/libonnxruntime.so.1.31.1"),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh");
    let read = |m: usize| {
        OnnxModel::parse(
            &std::fs::read(root.join(format!("config/models/tick_{m:03}/1/model.onnx"))).unwrap(),
        )
        .unwrap()
    };
    let reference = read(0);
    let signature = reference.signature(&ModelConfig::default()).unwrap();
    let (shared, _) = reference.with_weights_as_inputs().unwrap();
    let batch = 8usize;
    let mut family = Session::builder(engine.environment())
        .unwrap()
        .with_optimization_level(GraphOptimizationLevel::All)
        .unwrap()
        .commit_from_memory(&shared.with_static_batch(batch, &signature))
        .unwrap();
    let x: Vec<u8> = (0..batch * 16)
        .flat_map(|i| ((i % 7) as f32 - 3.0).to_le_bytes())
        .collect();
    let buckets = Buckets::new(&[batch], None).unwrap();
    for m in 0..8 {
        let member = read(m);
        assert_eq!(member.family_key(), reference.family_key());
        // The member's own session.
        let mut own = engine
            .compile(&CompileRequest {
                model: "m",
                onnx: &member,
                signature: &signature,
                buckets: &buckets,
            })
            .unwrap();
        own.input_mut(0, 0).copy_from_slice(&x);
        own.run(0).unwrap();
        let want = floats(own.output(0, 0));
        // The shared graph with this member's weights bound.
        let (_, weights) = member.with_weights_as_inputs().unwrap();
        let mut binding = family.create_binding().unwrap();
        binding
            .bind_input("features", &tensor(&family, vec![batch as i64, 16], &x))
            .unwrap();
        for w in &weights {
            let shape = w.dims.iter().map(|&d| d as i64).collect();
            binding
                .bind_input(w.name.as_str(), &tensor(&family, shape, &w.data))
                .unwrap();
        }
        let mut out =
            DynTensor::new(family.allocator(), TensorElementType::Float32, [batch, 1]).unwrap();
        binding.bind_output("signal", &mut out).unwrap();
        drop(family.run_binding(&binding).unwrap());
        // SAFETY: the bound output is a CPU tensor of [batch, 1] f32, written by the run.
        let got =
            floats(unsafe { std::slice::from_raw_parts(out.data_ptr().cast::<u8>(), batch * 4) });
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1e-6),
                "tick_{m:03}: {a} vs {b}"
            );
        }
    }
}
