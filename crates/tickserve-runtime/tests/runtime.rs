//! The runtime on the real ONNX Runtime engine and the sample repository:
//! bucketed, padded and split runs give each row the answer it gets alone.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use tickserve_core::config::ServerConfig;
use tickserve_core::{DataType, Error, InferRequest, InputTensor};
use tickserve_runtime::{Runtime, VersionState};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sample_runtime() -> Runtime {
    let mut config = ServerConfig::default();
    config.repository.path = root().join("config/models");
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)")
}

fn features(rows: usize, width: usize, seed: u32) -> Vec<f32> {
    (0..rows * width)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

fn request(model: &str, input: &str, shape: Vec<i64>, values: &[f32]) -> InferRequest {
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
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[tokio::test]
async fn every_row_count_matches_single_row_runs() {
    let runtime = sample_runtime();
    assert!(runtime.all_ready());
    let rows = 200;
    let x = features(rows, 50, 7);
    let mut singles = Vec::new();
    for r in 0..rows {
        let out = runtime
            .infer(request(
                "alpha_mlp",
                "features",
                vec![1, 50],
                &x[r * 50..(r + 1) * 50],
            ))
            .await
            .unwrap();
        singles.extend(floats(&out.outputs[0].data));
    }
    for n in [1, 3, 64, 65, 200] {
        let out = runtime
            .infer(request(
                "alpha_mlp",
                "features",
                vec![n as i64, 50],
                &x[..n * 50],
            ))
            .await
            .unwrap();
        assert_eq!(out.outputs[0].shape, vec![n as i64, 3]);
        let got = floats(&out.outputs[0].data);
        for (a, b) in got.iter().zip(&singles[..n * 3]) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-6),
                "{n} rows: {a} vs {b}"
            );
        }
    }
    runtime.shutdown();
}

#[tokio::test]
async fn refusals_name_the_problem() {
    let runtime = sample_runtime();
    let err = runtime
        .infer(request("alpha_mlp", "features", vec![1, 49], &[0.0; 49]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let err = runtime
        .infer(request("nope", "x", vec![1], &[0.0]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ModelNotFound { .. }), "{err}");
    let models = runtime.models();
    assert!(matches!(
        models["seq_lstm"].default_version(),
        Some((1, VersionState::Ready(_)))
    ));
    runtime.shutdown();
}
