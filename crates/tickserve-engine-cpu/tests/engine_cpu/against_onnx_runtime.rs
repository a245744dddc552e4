//! The engine against ONNX Runtime: each model compiled for buckets of 1, 3
//! and 64 rows, run with the portable kernels and with the best this CPU
//! has, gives what ONNX Runtime gives on the same random rows within 1e-5
//! (relative, or absolute below 1); a family member's weights swapped in
//! give what that member's own file gives.

use std::path::{Path, PathBuf};

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompileRequest, CompiledModel, Device, Engine, SOLE_MEMBER};
use tickserve_engine_cpu::{CpuEngine, Isa};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};
use tickserve_onnx::OnnxModel;
use tickserve_plan::reference::random_rows;
use tickserve_testing::{onnxruntime_library, root, write_models};

const SIZES: [usize; 3] = [1, 3, 64];

fn read(path: &Path) -> OnnxModel {
    OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap()
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn isas() -> Vec<Isa> {
    let mut isas = vec![Isa::Portable];
    if Isa::detect() != Isa::Portable {
        isas.push(Isa::detect());
    }
    isas
}

/// Writes `rows` random rows into every input of bucket `bucket` of both.
fn fill(models: [&mut dyn CompiledModel; 2], bucket: usize, rows: usize, seed: u64) {
    fill_with_nan(models, bucket, rows, seed, 0);
}

/// As [`fill`], every `nan_every`-th float NaN (none for 0).
fn fill_with_nan(
    models: [&mut dyn CompiledModel; 2],
    bucket: usize,
    rows: usize,
    seed: u64,
    nan_every: usize,
) {
    let inputs = models[0].signature().inputs.clone();
    for (i, spec) in inputs.iter().enumerate() {
        let mut data = random_rows(seed + i as u64, rows * spec.dims.iter().product::<usize>());
        if nan_every > 0 {
            data.iter_mut()
                .step_by(nan_every)
                .for_each(|v| *v = f32::NAN);
        }
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        models[0].input_mut(bucket, i).copy_from_slice(&bytes);
        models[1].input_mut(bucket, i).copy_from_slice(&bytes);
    }
}

/// Asserts every output of bucket `bucket` of `ours` within 1e-5 of `theirs`.
fn same_outputs(what: &str, ours: &dyn CompiledModel, theirs: &dyn CompiledModel, bucket: usize) {
    assert_eq!(ours.signature(), theirs.signature(), "{what}");
    for (o, spec) in ours.signature().outputs.iter().enumerate() {
        if spec.datatype == tickserve_core::DataType::Int64 {
            assert_eq!(
                ours.output(bucket, o),
                theirs.output(bucket, o),
                "{what} output '{}'",
                spec.name
            );
            continue;
        }
        let (got, want) = (
            floats(ours.output(bucket, o)),
            floats(theirs.output(bucket, o)),
        );
        assert_eq!(got.len(), want.len(), "{what} output {}", spec.name);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0) || (g.is_nan() && w.is_nan()),
                "{what} output '{}' element {i}: compiled {g}, onnxruntime {w}",
                spec.name
            );
        }
    }
}

pub fn onnx_runtime() -> OrtEngine {
    OrtEngine::new(
        &onnxruntime_library(),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh")
}

/// Compiles `path` on both engines (every bucket) and compares each bucket.
fn matches_onnx_runtime(ort: &OrtEngine, path: &Path) {
    matches_onnx_runtime_with_nan(ort, path, 0);
}

/// As [`matches_onnx_runtime`], every `nan_every`-th input float NaN.
fn matches_onnx_runtime_with_nan(ort: &OrtEngine, path: &Path, nan_every: usize) {
    let model = read(path);
    // The model's own model.toml, where it has one beside its versions.
    let config = path
        .parent()
        .and_then(Path::parent)
        .filter(|dir| dir.join("model.toml").exists())
        .map(|dir| ModelConfig::load(dir, "model").unwrap())
        .unwrap_or_default();
    model_matches_onnx_runtime(ort, &model, &config, &path.display().to_string(), nan_every);
}

/// `model` (with `config`) compiled on both engines (every bucket, both
/// kernel sets), each bucket run on the same rows and compared; `what`
/// names it in a failure.
pub fn model_matches_onnx_runtime(
    ort: &OrtEngine,
    model: &OnnxModel,
    config: &ModelConfig,
    what: &str,
    nan_every: usize,
) {
    let signature = model.signature(config).unwrap();
    let buckets = Buckets::new(&SIZES, None).unwrap();
    let graph = tickserve_onnx::ModelGraph {
        onnx: model.clone(),
        signature: signature.clone(),
    };
    let mut theirs = ort
        .compile(&OrtCompileRequest {
            family: "test",
            onnx: model,
            signature: &signature,
            buckets: &buckets,
            weights: None,
        })
        .unwrap_or_else(|e| panic!("{what}: ONNX Runtime: {e}"));
    for isa in isas() {
        let mut ours = CpuEngine::with_isa(isa)
            .compile(&CompileRequest {
                family: "test",
                graph: &graph,
                buckets: &buckets,
                weights: None,
                device: Device::Cpu,
                check: false,
                resident: None,
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for (bucket, &rows) in SIZES.iter().enumerate() {
            fill_with_nan(
                [ours.as_mut(), &mut theirs],
                bucket,
                rows,
                rows as u64 * 17,
                nan_every,
            );
            ours.run(bucket, SOLE_MEMBER).unwrap();
            theirs.run(bucket, SOLE_MEMBER).unwrap();
            let what = format!("{what} ({}, {rows} rows)", isa.name());
            same_outputs(&what, ours.as_ref(), &theirs, bucket);
        }
    }
}

fn sample(name: &str) -> PathBuf {
    root().join(format!("config/models/{name}/1/model.onnx"))
}

#[test]
fn sample_models_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let mut names: Vec<String> = ["alpha_mlp", "seq_lstm", "seq_lstm_step", "seq_lstm_window"]
        .map(String::from)
        .to_vec();
    names.extend((0..8).map(|m| format!("tick_{m:03}")));
    for name in names {
        matches_onnx_runtime(&ort, &sample(&name));
    }
}

#[test]
fn every_op_of_the_plan_answers_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let dir = tempfile::tempdir().unwrap();
    write_models("--fixtures", dir.path());
    for name in [
        "cuda_ops",
        "cuda_conv",
        "cuda_sequence_ops",
        "cuda_lstm_layout0",
        "tree_gbt",
    ] {
        matches_onnx_runtime(&ort, &dir.path().join(format!("{name}/1/model.onnx")));
    }
}

#[test]
fn the_benchmark_models_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let dir = tempfile::tempdir().unwrap();
    write_models("--bench", dir.path());
    for name in ["bench_lstm", "bench_lstm_window", "bench_trees"] {
        matches_onnx_runtime(&ort, &dir.path().join(format!("{name}/1/model.onnx")));
    }
}

/// The models of the repository `corpus` (those with a version 1), by name.
fn model_names(corpus: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(corpus)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("1/model.onnx").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Models no one here wrote: PyTorch's two exporters and tf2onnx's, LSTMs
/// and GRUs of one and two layers, with state in and out, and dense
/// networks (Gemm or MatMul and Add, LayerNormalization, Softmax).
#[test]
fn exported_sequence_and_dense_models_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let corpus = root().join("crates/tickserve-engine-cuda/tests/exported");
    let mut names = model_names(&corpus);
    // Not plans: a Keras GRU with reset_after=False comes out as an ONNX
    // Loop, a Keras LayerNormalization as a reshape around a
    // BatchNormalization.
    names.retain(|n| n != "tf_gru_v1" && n != "tf_mlp_norm");
    assert!(names.len() >= 18, "{names:?}");
    for name in names {
        matches_onnx_runtime(&ort, &corpus.join(format!("{name}/1/model.onnx")));
    }
}

/// Tree ensembles no one here wrote: LightGBM's, XGBoost's and
/// scikit-learn's converters, regressors and classifiers (labels and
/// probabilities), NaN inputs sent down the sides the trees learned.
#[test]
fn exported_tree_models_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let corpus = root().join("crates/tickserve-engine-cpu/tests/exported");
    let names = model_names(&corpus);
    assert!(names.len() >= 13, "{names:?}");
    for name in names {
        for nan_every in [0, 7] {
            matches_onnx_runtime_with_nan(
                &ort,
                &corpus.join(format!("{name}/1/model.onnx")),
                nan_every,
            );
        }
    }
}

/// A LightGBM classifier as a family shares it: the constant its graph
/// multiplies the probabilities by is taken out as a weight, the forest
/// reads it from there, and a member joins only with the same constant.
#[test]
fn a_forest_family_reads_its_constants_from_its_weights() {
    let path = root().join("crates/tickserve-engine-cpu/tests/exported/lgb_bin/1/model.onnx");
    let onnx = read(&path);
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let (graph, weights) = onnx.with_weights_as_inputs().unwrap();
    assert_eq!(weights.len(), 1, "{weights:?}");
    let graph = tickserve_onnx::ModelGraph {
        onnx: graph,
        signature,
    };
    let buckets = Buckets::new(&SIZES, None).unwrap();
    let mut ours = CpuEngine::new()
        .compile(&CompileRequest {
            family: "test",
            graph: &graph,
            buckets: &buckets,
            weights: Some(&weights),
            device: Device::Cpu,
            check: false,
            resident: None,
        })
        .unwrap();
    ours.add_member(1, &weights).unwrap();
    let mut other = weights.clone();
    other[0].data = 2.0f32.to_le_bytes().to_vec();
    let refused = ours.add_member(2, &other).unwrap_err().to_string();
    assert!(refused.contains("same weights"), "{refused}");
}

#[test]
fn a_member_swapped_in_answers_as_its_own_file_does() {
    let ort = onnx_runtime();
    let first = read(&sample("tick_003"));
    let signature = first.signature(&ModelConfig::default()).unwrap();
    let (graph, weights) = first.with_weights_as_inputs().unwrap();
    let imported = tickserve_plan::import(&graph, &signature.inputs, Some(&weights)).unwrap();
    let buckets = Buckets::new(&SIZES, None).unwrap();
    let mut ours = CpuEngine::new()
        .compile_plan(&imported, Some(&weights), &signature, &buckets)
        .unwrap();
    let other = read(&sample("tick_004"));
    let (_, other_weights) = other.with_weights_as_inputs().unwrap();
    ours.add_member(7, &other_weights).unwrap();
    let mut theirs = ort
        .compile(&OrtCompileRequest {
            family: "tick_004",
            onnx: &other,
            signature: &signature,
            buckets: &buckets,
            weights: None,
        })
        .unwrap();
    fill([&mut ours, &mut theirs], 1, 3, 5);
    ours.run(1, 7).unwrap();
    theirs.run(1, SOLE_MEMBER).unwrap();
    same_outputs("tick_004 as member 7", &ours, &theirs, 1);
    // The first member still answers as tick_003; a removed one is an error.
    ours.remove_member(7);
    let error = ours.run(1, 7).unwrap_err();
    assert!(error.to_string().contains("member 7"), "{error}");
    let mut bad = other_weights.clone();
    bad[0].dims = vec![1, 2];
    let error = ours.add_member(8, &bad).unwrap_err();
    assert!(error.to_string().contains(&bad[0].name), "{error}");
}

/// A NaN in a row goes where ONNX Runtime sends it: through products and
/// activations as NaN (a Relu keeps it), down a tree's missing-value side.
/// (Inside a recurrent cell ONNX Runtime's answer depends on how each of its
/// kernels clamps; a model without trees refuses NaN inputs by default.)
#[test]
fn nan_inputs_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let dir = tempfile::tempdir().unwrap();
    write_models("--fixtures", dir.path());
    for nan_every in [3, 7] {
        matches_onnx_runtime_with_nan(&ort, &sample("alpha_mlp"), nan_every);
        matches_onnx_runtime_with_nan(&ort, &dir.path().join("tree_gbt/1/model.onnx"), nan_every);
    }
}

/// Two models of the same trees share one compiled forest: the second joins
/// with no weights and answers as the first; weights are refused.
#[test]
fn a_second_model_of_the_same_trees_joins_its_forest() {
    let dir = tempfile::tempdir().unwrap();
    write_models("--fixtures", dir.path());
    let model = read(&dir.path().join("tree_gbt/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let graph = tickserve_onnx::ModelGraph {
        onnx: model,
        signature,
    };
    let buckets = Buckets::new(&[1], None).unwrap();
    let mut ours = CpuEngine::new()
        .compile(&CompileRequest {
            family: "trees",
            graph: &graph,
            buckets: &buckets,
            weights: Some(&[]),
            device: Device::Cpu,
            check: true,
            resident: None,
        })
        .unwrap();
    ours.add_member(4, &[]).unwrap();
    let row: Vec<u8> = [0.5f32, -1.0, 2.0, 0.25]
        .iter()
        .cycle()
        .take(graph.signature.inputs[0].dims[0])
        .flat_map(|v| v.to_le_bytes())
        .collect();
    ours.input_mut(0, 0).copy_from_slice(&row);
    ours.run(0, SOLE_MEMBER).unwrap();
    let first = ours.output(0, 0).to_vec();
    ours.run(0, 4).unwrap();
    assert_eq!(ours.output(0, 0), first.as_slice());
    ours.remove_member(4);
    assert!(ours.run(0, 4).is_err());
    let weight = tickserve_core::Weight {
        name: "w".into(),
        datatype: tickserve_core::DataType::Fp32,
        dims: vec![1],
        data: vec![0; 4],
    };
    let error = ours.add_member(5, &[weight]).unwrap_err();
    assert!(error.to_string().contains("same weights"), "{error}");
}

/// A batch told its rows (`run_rows`) runs only those, plan or forest:
/// they answer exactly as the whole bucket's run does, and the padding's
/// outputs are left as they were.
#[test]
fn a_batch_runs_its_rows_not_the_padding() {
    let fixtures = tempfile::tempdir().unwrap();
    write_models("--fixtures", fixtures.path());
    let bench = tempfile::tempdir().unwrap();
    write_models("--bench", bench.path());
    let mut paths = vec![
        root().join("crates/tickserve-engine-cpu/tests/exported/lgb_bin/1/model.onnx"),
        bench.path().join("bench_lstm/1/model.onnx"),
        bench.path().join("bench_trees/1/model.onnx"),
    ];
    paths.extend(["alpha_mlp", "seq_lstm", "seq_lstm_step"].map(sample));
    paths.extend(
        [
            "cuda_ops",
            "cuda_conv",
            "cuda_sequence_ops",
            "cuda_lstm_layout0",
        ]
        .map(|name| fixtures.path().join(format!("{name}/1/model.onnx"))),
    );
    for path in &paths {
        for rows in [1, 33, 63] {
            batch_runs_its_rows(path, rows);
        }
    }
}

/// `path` compiled twice for buckets of [`SIZES`]: bucket 64 run whole on
/// rows A by both, then on rows B whole by one and told of its first
/// `rows` by the other.
fn batch_runs_its_rows(path: &Path, rows: usize) {
    let onnx = read(path);
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let graph = tickserve_onnx::ModelGraph { onnx, signature };
    let buckets = Buckets::new(&SIZES, None).unwrap();
    let compile = || {
        CpuEngine::new()
            .compile(&CompileRequest {
                family: "test",
                graph: &graph,
                buckets: &buckets,
                weights: None,
                device: Device::Cpu,
                check: false,
                resident: None,
            })
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (mut whole, mut batch) = (compile(), compile());
    let outputs = whole.signature().outputs.len();
    fill([whole.as_mut(), batch.as_mut()], 2, 64, 10);
    whole.run(2, SOLE_MEMBER).unwrap();
    batch.run(2, SOLE_MEMBER).unwrap();
    let before: Vec<Vec<u8>> = (0..outputs).map(|o| batch.output(2, o).to_vec()).collect();
    fill([whole.as_mut(), batch.as_mut()], 2, 64, 20);
    whole.run(2, SOLE_MEMBER).unwrap();
    batch.run_rows(2, rows, &[SOLE_MEMBER]).unwrap();
    let mut moved = false;
    for (o, before) in before.iter().enumerate() {
        let width = before.len() / 64;
        let (got, want) = (batch.output(2, o), whole.output(2, o));
        let what = format!("{} output {o}, {rows} rows", path.display());
        assert_eq!(
            got[..rows * width],
            want[..rows * width],
            "{what}: the batch"
        );
        assert_eq!(
            got[rows * width..],
            before[rows * width..],
            "{what}: padding"
        );
        moved |= got[..rows * width] != before[..rows * width];
    }
    assert!(moved, "{}: rows B answered as rows A", path.display());
}
