//! The importer against ONNX Runtime: every sample model the CUDA engine can
//! take (`alpha_mlp`, every `tick_*`) and a fixture holding every op of its
//! set, imported and evaluated on the CPU ([`reference`]), give what ONNX
//! Runtime gives on the same random rows, within 1e-5. Models with an op
//! outside the set are refused, naming the op.

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_engine_cuda::plan::Op;
use tickserve_engine_cuda::reference::random_rows;
use tickserve_engine_cuda::{arrange, import, reference};
use tickserve_engine_ort::OrtEngine;

use crate::support;

use support::{fixtures, onnx_runtime, onnx_runtime_outputs, read, root};

/// Imports `path`, runs `rows` random rows through the plan on the CPU and
/// through ONNX Runtime, and compares every output.
fn matches_onnx_runtime(engine: &OrtEngine, path: &Path, rows: usize, seed: u64) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let weights = arrange(&imported.plan, &imported.weights).unwrap();
    let inputs: Vec<Vec<f32>> = signature
        .inputs
        .iter()
        .enumerate()
        .map(|(i, spec)| random_rows(seed + i as u64, rows * spec.dims.iter().product::<usize>()))
        .collect();
    let theirs = onnx_runtime_outputs(engine, &model, &signature, &inputs, rows);
    let slices: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let ours = reference::run(&imported.plan, &weights, &slices, rows);
    assert_eq!(ours.len(), theirs.len());
    for (o, (got, want)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(got.len(), want.len(), "{} output {o}", path.display());
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{} output {o} element {i}: plan {g}, onnxruntime {w}",
                path.display()
            );
        }
    }
}

fn engine() -> OrtEngine {
    onnx_runtime()
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
        for model in ["cuda_ops", "cuda_conv"] {
            matches_onnx_runtime(
                &engine,
                &dir.path().join(format!("{model}/1/model.onnx")),
                rows,
                seed,
            );
        }
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
fn sequence_models_imported_give_what_onnx_runtime_gives() {
    let engine = engine();
    let dir = fixtures();
    let models = root().join("config/models");
    let paths = [
        models.join("seq_lstm/1/model.onnx"),
        models.join("seq_lstm_step/1/model.onnx"),
        models.join("seq_lstm_window/1/model.onnx"),
        dir.path().join("cuda_sequence_ops/1/model.onnx"),
        dir.path().join("cuda_lstm_layout0/1/model.onnx"),
    ];
    for (rows, seed) in [(1, 21), (3, 22), (64, 23)] {
        for path in &paths {
            matches_onnx_runtime(&engine, path, rows, seed);
        }
    }
}

#[test]
fn moving_the_batch_costs_no_step() {
    // Transpose [batch, 30, 8] → [30, batch, 8], the LSTM, Squeeze: one
    // recurrent step and the head's product; the window is read where it lies.
    let model = read(&root().join("config/models/seq_lstm/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let plan = import(&model, &signature.inputs, None).unwrap().plan;
    assert_eq!(plan.steps.len(), 2, "{plan:#?}");
    let Op::Recurrent(layer) = &plan.steps[0].op else {
        panic!("{plan:#?}");
    };
    assert_eq!(layer.input, plan.inputs[0].1);
    assert_eq!((layer.steps, layer.input_size, layer.hidden), (30, 8, 16));
    assert!(matches!(plan.steps[1].op, Op::MatMul { k: 16, n: 1, .. }));
    // A transpose of two non-batch axes moves floats: one Rearrange step.
    let dir = fixtures();
    let model = read(&dir.path().join("cuda_sequence_ops/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let plan = import(&model, &signature.inputs, None).unwrap().plan;
    let kinds: Vec<&str> = plan
        .steps
        .iter()
        .map(|s| match s.op {
            Op::Recurrent(_) => "recurrent",
            Op::Rearrange { .. } => "rearrange",
            Op::Concat { .. } => "concat",
            Op::MatMul { .. } => "matmul",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "recurrent",
            "recurrent",
            "rearrange",
            "recurrent",
            "rearrange",
            "concat",
            "rearrange",
            "matmul"
        ],
        "{plan:#?}"
    );
}

#[test]
fn both_lstm_layouts_import_to_one_computation() {
    // ONNX Runtime runs layout 0 only; the batch-first layout is checked
    // against it through the same LSTM written in layout 0.
    let dir = fixtures();
    let plan_of = |name: &str| {
        let model = read(&dir.path().join(format!("{name}/1/model.onnx")));
        let signature = model.signature(&ModelConfig::default()).unwrap();
        import(&model, &signature.inputs, None).unwrap()
    };
    let (zero, one) = (plan_of("cuda_lstm_layout0"), plan_of("cuda_lstm_layout1"));
    let steps = |p: &tickserve_engine_cuda::Imported| -> Vec<Op> {
        p.plan.steps.iter().map(|s| s.op.clone()).collect()
    };
    assert_eq!(steps(&zero), steps(&one));
    let rows = 5;
    let inputs: Vec<Vec<f32>> = [24, 5, 5]
        .iter()
        .enumerate()
        .map(|(i, width)| random_rows(40 + i as u64, rows * width))
        .collect();
    let slices: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let run = |p: &tickserve_engine_cuda::Imported| {
        let weights = arrange(&p.plan, &p.weights).unwrap();
        reference::run(&p.plan, &weights, &slices, rows)
    };
    assert_eq!(run(&zero), run(&one));
}

#[test]
fn a_model_with_another_op_is_refused_naming_the_op() {
    let dir = fixtures();
    let refused = |name: &str| {
        let model = read(&dir.path().join(format!("{name}/1/model.onnx")));
        let signature = model.signature(&ModelConfig::default()).unwrap();
        import(&model, &signature.inputs, None).unwrap_err()
    };
    let error = refused("cuda_bidirectional");
    assert_eq!(error.op, "LSTM", "{error}");
    assert!(error.reason.contains("bidirectional"), "{error}");
    let error = refused("cuda_peephole");
    assert!(error.reason.contains("peepholes"), "{error}");

    let error = refused("cuda_conv2d");
    assert_eq!(error.op, "Conv", "{error}");
    assert!(error.reason.contains("one axis"), "{error}");

    let error = refused("tree_gbt");
    assert_eq!(error.op, "TreeEnsembleRegressor", "{error}");
    assert!(
        error.to_string().contains("TreeEnsembleRegressor"),
        "{error}"
    );

    let error = refused("typed_io");
    assert!(error.reason.contains("INT64"), "{error}");
}

/// A model file's numbers meet size arithmetic only checked: geometry that
/// would wrap is refused, naming the node, never imported.
#[test]
fn impossible_geometry_is_refused_naming_the_node() {
    let dir = fixtures();
    let refused = |name: &str| {
        let bytes = std::fs::read(dir.path().join(format!("{name}/1/model.onnx"))).unwrap();
        let model = tickserve_onnx::OnnxModel::parse(&bytes).unwrap();
        let signature = model.signature(&ModelConfig::default()).unwrap();
        import(&model, &signature.inputs, None).unwrap_err()
    };
    let error = refused("hostile_conv_kernel0");
    assert_eq!(error.op, "Conv", "{error}");
    assert!(error.reason.contains("empty dimension"), "{error}");
    let error = refused("hostile_lstm_huge");
    assert_eq!(error.op, "LSTM", "{error}");
    assert!(error.reason.contains("too large"), "{error}");
    let error = refused("hostile_negative_dim");
    assert!(error.reason.contains("negative dimension"), "{error}");
}
