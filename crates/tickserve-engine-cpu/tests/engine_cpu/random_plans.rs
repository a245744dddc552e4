//! Random dense networks against ONNX Runtime
//! (`tickserve_engine_cpu::fuzzing::models::mlp`: one to three layers of
//! `Gemm` in either orientation or `MatMul` and `Add`, every activation the
//! plan takes, constant rows multiplied or subtracted, a closing `Softmax`
//! or `LayerNormalization`): every one is imported by the engine and, at
//! buckets of 1, 3 and 64 rows with both kernel sets, answers as ONNX
//! Runtime does within 1e-5. `TICKSERVE_RANDOM_PLANS=N` runs N (200 by
//! default).

use tickserve_core::config::ModelConfig;
use tickserve_engine_cpu::fuzzing::models::{Seeded, mlp};
use tickserve_onnx::OnnxModel;

use super::against_onnx_runtime::{model_matches_onnx_runtime, onnx_runtime};

#[test]
fn random_plans_answer_as_onnx_runtime_does() {
    let ort = onnx_runtime();
    let plans: u64 = std::env::var("TICKSERVE_RANDOM_PLANS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    for seed in 0..plans {
        let bytes = mlp(&mut Seeded(seed));
        if let Ok(dir) = std::env::var("TICKSERVE_DUMP_PLANS") {
            std::fs::write(format!("{dir}/{seed}.onnx"), &bytes).unwrap();
        }
        let model = OnnxModel::parse(&bytes).unwrap();
        model_matches_onnx_runtime(
            &ort,
            &model,
            &ModelConfig::default(),
            &format!("random plan {seed} ({:?})", model.operators()),
            0,
        );
    }
}
