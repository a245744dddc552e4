//! Helpers the runtime's integration tests share: where the repository is,
//! and a request with one FP32 input.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tickserve_core::{DataType, InferRequest, InputTensor};

/// The repository root: `TICKSERVE_ROOT` (set by scripts/gpu_run.sh, where
/// the test executables run from another checkout), else this checkout.
pub fn root() -> PathBuf {
    std::env::var_os("TICKSERVE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// A request to `model` with one FP32 input `input` of `shape` holding `values`.
pub fn request(model: &str, input: &str, shape: Vec<i64>, values: &[f32]) -> InferRequest {
    InferRequest {
        model: model.to_string(),
        version: None,
        id: "t".into(),
        inputs: vec![InputTensor {
            name: input.to_string(),
            datatype: DataType::Fp32,
            shape,
            data: values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        }],
        outputs: None,
        deadline: None,
        monte_carlo: None,
        priority: 0,
        sequence: None,
    }
}
