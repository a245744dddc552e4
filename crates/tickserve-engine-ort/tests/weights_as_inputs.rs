//! One graph for a family: `tick_000`'s graph compiled once per bucket with its
//! weights as inputs, every other member added with `add_member`, gives each
//! member exactly what that member's own constant-weight compilation gives, in
//! every bucket; wrong weights are refused, and a removed member no longer runs.

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, DataType, EngineError, MemberId, SOLE_MEMBER};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};
use tickserve_onnx::OnnxModel;

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn engine(root: &Path) -> OrtEngine {
    OrtEngine::new(
        &root.join(".local/lib/libonnxruntime.so.1.31.1"),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh")
}

fn read(root: &Path, m: usize) -> OnnxModel {
    OnnxModel::parse(
        &std::fs::read(root.join(format!("config/models/tick_{m:03}/1/model.onnx"))).unwrap(),
    )
    .unwrap()
}

#[test]
fn every_member_through_the_shared_graph_equals_its_own_compilation_in_every_bucket() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let engine = engine(&root);
    let buckets = Buckets::new(&[1, 2, 4, 8, 16, 32, 64], None).unwrap();
    let reference = read(&root, 0);
    let signature = reference.signature(&ModelConfig::default()).unwrap();
    let (graph, first) = reference.with_weights_as_inputs().unwrap();
    let mut family = engine
        .compile(&OrtCompileRequest {
            family: &reference.family_key(),
            onnx: &graph,
            signature: &signature,
            buckets: &buckets,
            weights: Some(&first),
        })
        .unwrap();
    let mut own_models = Vec::new();
    for m in 0..8 {
        let member = read(&root, m);
        assert_eq!(member.family_key(), reference.family_key());
        if m > 0 {
            let (_, weights) = member.with_weights_as_inputs().unwrap();
            family.add_member(m as MemberId, &weights).unwrap();
        }
        own_models.push(
            engine
                .compile(&OrtCompileRequest {
                    family: "own",
                    onnx: &member,
                    signature: &signature,
                    buckets: &buckets,
                    weights: None,
                })
                .unwrap(),
        );
    }
    for (bucket, &size) in buckets.sizes().iter().enumerate() {
        let x: Vec<u8> = (0..size * 16)
            .flat_map(|i| (((i * 37) % 101) as f32 / 25.0 - 2.0).to_le_bytes())
            .collect();
        for (m, own) in own_models.iter_mut().enumerate() {
            own.input_mut(bucket, 0).copy_from_slice(&x);
            own.run(bucket, SOLE_MEMBER).unwrap();
            let want = floats(own.output(bucket, 0));
            family.input_mut(bucket, 0).copy_from_slice(&x);
            family.run(bucket, m as MemberId).unwrap();
            let got = floats(family.output(bucket, 0));
            assert_eq!(got.len(), size);
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-6),
                    "tick_{m:03} bucket {size}: {a} vs {b}"
                );
            }
        }
    }
    // Members really differ: the same input gives different outputs.
    family.run(0, 0).unwrap();
    let zero = floats(family.output(0, 0));
    family.run(0, 1).unwrap();
    assert_ne!(zero, floats(family.output(0, 0)));

    // Wrong weights are refused with a reason; a constant-weight model takes no members.
    let (_, mut wrong) = read(&root, 1).with_weights_as_inputs().unwrap();
    wrong[0].dims.push(1);
    let err = family.add_member(99, &wrong).unwrap_err();
    assert!(matches!(err, EngineError::InvalidModel(_)), "{err:?}");
    assert!(err.to_string().contains(&wrong[0].name), "{err}");
    wrong.pop();
    assert!(family.add_member(99, &wrong).is_err());
    let mut renamed = read(&root, 1).with_weights_as_inputs().unwrap().1;
    renamed[0].name = "nope".into();
    renamed[0].datatype = DataType::Fp32;
    assert!(
        family
            .add_member(99, &renamed)
            .unwrap_err()
            .to_string()
            .contains("nope")
    );
    assert!(
        own_models[0]
            .add_member(5, &read(&root, 5).with_weights_as_inputs().unwrap().1)
            .is_err()
    );

    family.remove_member(3);
    assert!(
        family
            .run(0, 3)
            .unwrap_err()
            .to_string()
            .contains("member 3")
    );
    family.run(0, 4).unwrap();
}
