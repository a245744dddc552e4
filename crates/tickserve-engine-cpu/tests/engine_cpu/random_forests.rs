//! Random tree ensembles against ONNX Runtime: forests written as ONNX files
//! (`tickserve_engine_cpu::fuzzing::models::forest`: `TreeEnsembleRegressor`
//! and `TreeEnsembleClassifier`, `ai.onnx.ml` 3), each with its own shape:
//! unbalanced trees up to depth 7, every
//! branch mode (one for the whole forest, or mixed), NaN sent either way,
//! thresholds and inputs on one grid so equality splits are taken, one to
//! three targets (two to four classes, with labels of any sign), leaves
//! with several or no weights (a classifier's on one class only, or all
//! positive), every aggregate, base values or none (a binary classifier's
//! none, one or two), every post transform (PROBIT refused, by name), each
//! tree's nodes after its root out of order, tree ids with gaps, an
//! `Identity` or a `Mul` by a constant after the ensemble; inputs with
//! NaNs. Each forest, compiled by the engine and by ONNX Runtime, gives the
//! same scores on the same rows (within 1e-5, absolute below 1; NaN where
//! ONNX Runtime gives NaN) and the same labels.

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompileRequest, CompiledModel, Device, Engine, SOLE_MEMBER};
use tickserve_engine_cpu::fuzzing::models::{Choices, Seeded, forest};
use tickserve_engine_cpu::{CpuEngine, Isa};
use tickserve_engine_ort::OrtCompileRequest;
use tickserve_onnx::{ModelGraph, OnnxModel};

use super::against_onnx_runtime::{floats, onnx_runtime};

#[test]
fn random_forests_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let sizes = [1, 5];
    let buckets = Buckets::new(&sizes, None).unwrap();
    let forests: u64 = std::env::var("TICKSERVE_RANDOM_FORESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    for seed in 0..forests {
        let mut d = Seeded(seed);
        let bytes = forest(&mut d);
        if let Ok(dir) = std::env::var("TICKSERVE_DUMP_FORESTS") {
            std::fs::write(format!("{dir}/{seed}.onnx"), &bytes).unwrap();
        }
        let onnx = OnnxModel::parse(&bytes).unwrap();
        let signature = onnx.signature(&ModelConfig::default()).unwrap();
        let graph = ModelGraph {
            onnx: onnx.clone(),
            signature: signature.clone(),
        };
        let theirs = ort.compile(&OrtCompileRequest {
            family: "forest",
            onnx: &onnx,
            signature: &signature,
            buckets: &buckets,
            weights: None,
        });
        let mut theirs = match theirs {
            Ok(theirs) => theirs,
            // A row of its warm-up reached no class: ONNX Runtime fails
            // it; the engine refuses such a forest at import.
            Err(e) if e.to_string().contains("narrowing_error") => {
                let refused = tickserve_plan::forest::import_forest(&onnx, &signature, &[])
                    .is_err_and(|e| {
                        ["could reach no class", "PROBIT"]
                            .iter()
                            .any(|r| e.to_string().contains(r))
                    });
                assert!(refused, "seed {seed}: ONNX Runtime failed a row: {e}");
                continue;
            }
            Err(e) => panic!("seed {seed}: ONNX Runtime refused it: {e}"),
        };
        for isa in [Isa::Portable, Isa::detect()] {
            let compiled = CpuEngine::with_isa(isa).compile(&CompileRequest {
                family: "forest",
                graph: &graph,
                buckets: &buckets,
                weights: None,
                device: Device::Cpu,
                check: true,
                resident: None,
            });
            let mut ours = match compiled {
                Ok(ours) => ours,
                // PROBIT, and the class layouts whose answer ONNX
                // Runtime leaves undefined, are left to it.
                Err(e)
                    if ["post_transform PROBIT", "could reach no class", "unwritten"]
                        .iter()
                        .any(|r| e.to_string().contains(r)) =>
                {
                    continue;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            };
            for (bucket, &rows) in sizes.iter().enumerate() {
                let width = signature.inputs[0].dims[0];
                let row: Vec<f32> = (0..rows * width)
                    .map(|_| if d.chance(10) { f32::NAN } else { d.grid() })
                    .collect();
                let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
                ours.input_mut(bucket, 0).copy_from_slice(&bytes);
                theirs.input_mut(bucket, 0).copy_from_slice(&bytes);
                ours.run(bucket, SOLE_MEMBER).unwrap();
                theirs.run(bucket, SOLE_MEMBER).unwrap();
                let scores = signature.outputs.len() - 1;
                if scores == 1 {
                    let labels = |b: &[u8]| {
                        b.chunks_exact(8)
                            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        labels(ours.output(bucket, 0)),
                        labels(theirs.output(bucket, 0)),
                        "seed {seed} ({}, {rows} rows) labels (inputs {row:?}; {})",
                        isa.name(),
                        describe(&onnx, &signature)
                    );
                }
                let (got, want) = (
                    floats(ours.output(bucket, scores)),
                    floats(theirs.output(bucket, scores)),
                );
                assert_eq!(got.len(), want.len(), "seed {seed}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * w.abs().max(1.0) || (g.is_nan() && w.is_nan()),
                        "seed {seed} ({}, {rows} rows) element {i}: compiled {g}, onnxruntime {w} \
                         (inputs {row:?}; all {got:?} against {want:?}; {})",
                        isa.name(),
                        describe(&onnx, &signature)
                    );
                }
            }
        }
    }
}

/// The forest's settings, for a failure's message.
fn describe(onnx: &OnnxModel, signature: &tickserve_onnx::PartialSignature) -> String {
    match tickserve_plan::forest::import_forest(onnx, signature, &[]) {
        Ok(f) => format!(
            "{} trees, {} targets, {:?}, {:?}, base {:?}, classes {:?}, scale {}",
            f.trees.len(),
            f.targets,
            f.aggregate,
            f.post_transform,
            f.base_values,
            f.classes,
            f.scale
        ),
        Err(e) => e.to_string(),
    }
}
