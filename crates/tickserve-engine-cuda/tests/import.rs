//! The importer against ONNX Runtime: every sample model the CUDA engine can
//! take (`alpha_mlp`, every `tick_*`) and a fixture holding every op of its
//! set, imported and evaluated on the CPU ([`reference`]), give what ONNX
//! Runtime gives on the same random rows, within 1e-5. Models with an op
//! outside the set are refused, naming the op.

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel};
use tickserve_engine_cuda::plan::Op;
use tickserve_engine_cuda::{arrange, import, reference};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};

mod common;

use common::{fixtures, read, root};

/// Deterministic pseudo-random floats in [-2, 2).
fn random_rows(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Imports `path`, runs `rows` random rows through the plan on the CPU and
/// through ONNX Runtime, and compares every output.
fn matches_onnx_runtime(engine: &OrtEngine, path: &Path, rows: usize, seed: u64) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let weights = arrange(&imported.plan, &imported.weights).unwrap();
    let buckets = Buckets::new(&[rows], None).unwrap();
    let mut ort = engine
        .compile(&OrtCompileRequest {
            family: "test",
            onnx: &model,
            signature: &signature,
            buckets: &buckets,
            weights: None,
        })
        .unwrap();
    let inputs: Vec<Vec<f32>> = signature
        .inputs
        .iter()
        .enumerate()
        .map(|(i, spec)| random_rows(seed + i as u64, rows * spec.dims.iter().product::<usize>()))
        .collect();
    for (i, data) in inputs.iter().enumerate() {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        ort.input_mut(0, i).copy_from_slice(&bytes);
    }
    ort.run(0, tickserve_core::SOLE_MEMBER).unwrap();
    let slices: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let ours = reference::run(&imported.plan, &weights, &slices, rows);
    assert_eq!(ours.len(), ort.signature().outputs.len());
    for (o, got) in ours.iter().enumerate() {
        let want = floats(ort.output(0, o));
        assert_eq!(got.len(), want.len(), "{} output {o}", path.display());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{} output {o} element {i}: plan {g}, onnxruntime {w}",
                path.display()
            );
        }
    }
}

fn engine() -> OrtEngine {
    OrtEngine::new(
        &root().join(".local/lib/libonnxruntime.so.1.31.1"),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh")
}

#[test]
fn sample_models_imported_give_what_onnx_runtime_gives() {
    let engine = engine();
    let models = root().join("config/models");
    for rows in [1, 3, 64] {
        matches_onnx_runtime(
            &engine,
            &models.join("alpha_mlp/1/model.onnx"),
            rows,
            rows as u64,
        );
        for m in 0..8 {
            let path = models.join(format!("tick_{m:03}/1/model.onnx"));
            matches_onnx_runtime(&engine, &path, rows, 100 + m);
        }
    }
}

#[test]
fn every_op_of_the_set_gives_what_onnx_runtime_gives() {
    let engine = engine();
    let dir = fixtures();
    for (rows, seed) in [(1, 7), (5, 8), (33, 9)] {
        matches_onnx_runtime(
            &engine,
            &dir.path().join("cuda_ops/1/model.onnx"),
            rows,
            seed,
        );
    }
}

#[test]
fn elementwise_nodes_fuse_into_the_step_before() {
    let model = read(&root().join("config/models/alpha_mlp/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let plan = import(&model, &signature.inputs, None).unwrap().plan;
    // Gemm + Relu, Gemm (bias in its epilogue), Softmax.
    assert_eq!(plan.steps.len(), 3, "{plan:#?}");
    assert!(matches!(plan.steps[0].op, Op::MatMul { k: 50, n: 64, .. }));
    assert_eq!(plan.steps[0].epilogue.len(), 2, "bias and Relu fused");
    assert!(matches!(plan.steps[2].op, Op::Softmax { segment: 3, .. }));
    assert_eq!(plan.weights.len(), 4);
}

#[test]
fn the_weights_as_inputs_graph_imports_to_the_same_plan() {
    let model = read(&root().join("config/models/tick_003/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let constant = import(&model, &signature.inputs, None).unwrap();
    let (graph, weights) = model.with_weights_as_inputs().unwrap();
    let family = import(&graph, &signature.inputs, Some(&weights)).unwrap();
    assert_eq!(constant.plan, family.plan);
    assert_eq!(constant.weights, family.weights);
    // Another member's weights arrange into the same slots; wrong dims do not.
    let other = read(&root().join("config/models/tick_004/1/model.onnx"));
    let (_, other_weights) = other.with_weights_as_inputs().unwrap();
    assert_eq!(arrange(&family.plan, &other_weights).unwrap().len(), 4);
    let mut bad = other_weights.clone();
    bad[0].dims = vec![1, 2];
    let error = arrange(&family.plan, &bad).unwrap_err();
    assert!(error.contains(&bad[0].name), "{error}");
}

#[test]
fn a_model_with_another_op_is_refused_naming_the_op() {
    let dir = fixtures();
    let lstm = read(&root().join("config/models/seq_lstm/1/model.onnx"));
    let signature = lstm.signature(&ModelConfig::default()).unwrap();
    let error = import(&lstm, &signature.inputs, None).unwrap_err();
    assert_eq!(error.op, "Transpose", "{error}");
    assert!(error.to_string().contains("Transpose"), "{error}");

    let tree = read(&dir.path().join("tree_gbt/1/model.onnx"));
    let signature = tree.signature(&ModelConfig::default()).unwrap();
    let error = import(&tree, &signature.inputs, None).unwrap_err();
    assert_eq!(error.op, "TreeEnsembleRegressor", "{error}");

    let typed = read(&dir.path().join("typed_io/1/model.onnx"));
    let signature = typed.signature(&ModelConfig::default()).unwrap();
    let error = import(&typed, &signature.inputs, None).unwrap_err();
    assert!(error.reason.contains("INT64"), "{error}");
}
