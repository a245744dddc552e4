//! Random tree ensembles against ONNX Runtime: forests written here as ONNX
//! files (`TreeEnsembleRegressor` and `TreeEnsembleClassifier`, `ai.onnx.ml`
//! 3), each with its own shape: unbalanced trees up to depth 7, every
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

use prost::Message;
use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompileRequest, CompiledModel, Device, Engine, SOLE_MEMBER};
use tickserve_engine_cpu::{CpuEngine, Isa};
use tickserve_engine_ort::OrtCompileRequest;
use tickserve_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto,
    TypeProto, ValueInfoProto, attribute_proto::AttributeType, tensor_shape_proto, type_proto,
};
use tickserve_onnx::{ModelGraph, OnnxModel};

use super::against_onnx_runtime::{floats, onnx_runtime};

/// SplitMix64: the forests and rows a seed gives.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A value on the grid thresholds and inputs share: k / 4 in [-2, 2].
    fn grid(&mut self) -> f32 {
        (self.below(17) as f32 - 8.0) / 4.0
    }
}

#[derive(Default)]
struct Attributes {
    tree_ids: Vec<i64>,
    node_ids: Vec<i64>,
    features: Vec<i64>,
    values: Vec<f32>,
    modes: Vec<&'static str>,
    on_true: Vec<i64>,
    on_false: Vec<i64>,
    missing: Vec<i64>,
    target_trees: Vec<i64>,
    target_nodes: Vec<i64>,
    target_ids: Vec<i64>,
    target_weights: Vec<f32>,
}

const MODES: [&str; 6] = [
    "BRANCH_LEQ",
    "BRANCH_LT",
    "BRANCH_GTE",
    "BRANCH_GT",
    "BRANCH_EQ",
    "BRANCH_NEQ",
];

struct Shape {
    features: i64,
    targets: i64,
    uniform: Option<&'static str>,
    min_max: bool,
    /// A classifier's leaves: every weight on this one class.
    one_class: Option<i64>,
    /// A classifier's weights: none negative.
    positive: bool,
}

/// Adds a random subtree of `tree` at `depth`; returns its node id.
fn subtree(
    d: &mut Draw,
    a: &mut Attributes,
    s: &Shape,
    tree: i64,
    next: &mut i64,
    depth: u32,
) -> i64 {
    let id = *next;
    *next += 1;
    let branch = depth < 7 && (depth == 0 || d.chance(65));
    a.tree_ids.push(tree);
    a.node_ids.push(id);
    let at = a.modes.len();
    a.features.push(0);
    a.values.push(0.0);
    a.modes.push("LEAF");
    a.on_true.push(0);
    a.on_false.push(0);
    a.missing.push(0);
    if branch {
        a.features[at] = d.below(s.features as u64) as i64;
        a.values[at] = d.grid();
        a.modes[at] = s.uniform.unwrap_or(MODES[d.below(6) as usize]);
        a.missing[at] = i64::from(d.chance(50));
        let t = subtree(d, a, s, tree, next, depth + 1);
        let f = subtree(d, a, s, tree, next, depth + 1);
        a.on_true[at] = t;
        a.on_false[at] = f;
    } else {
        // One weight for one target; any targets (none for a sum) otherwise.
        let targets: Vec<i64> = if s.targets == 1 {
            vec![0]
        } else if let Some(class) = s.one_class {
            if d.chance(90) {
                vec![class]
            } else {
                Vec::new()
            }
        } else {
            (0..s.targets)
                .filter(|_| d.chance(if s.min_max { 80 } else { 60 }))
                .collect()
        };
        let targets = if targets.is_empty() && s.min_max {
            vec![0]
        } else {
            targets
        };
        for target in targets {
            a.target_trees.push(tree);
            a.target_nodes.push(id);
            a.target_ids.push(target);
            let w = (d.below(2001) as f32 - 1000.0) / 400.0;
            a.target_weights
                .push(if s.positive { w.abs() / 2.5 } else { w });
        }
    }
    id
}

fn ints(name: &str, values: Vec<i64>) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: values,
        ..Default::default()
    }
}

fn floats_attribute(name: &str, values: Vec<f32>) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Floats as i32),
        floats: values,
        ..Default::default()
    }
}

fn string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(value.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// A tensor of `[N, width]` (`[N]` for none) of ONNX element type `elem`.
fn typed(name: &str, elem: i32, width: Option<i64>) -> ValueInfoProto {
    let dim = |value| tensor_shape_proto::Dimension {
        value: Some(value),
        denotation: None,
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: std::iter::once(dim(tensor_shape_proto::dimension::Value::DimParam(
                        "N".into(),
                    )))
                    .chain(width.map(|w| dim(tensor_shape_proto::dimension::Value::DimValue(w))))
                    .collect(),
                }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn tensor(name: &str, width: i64) -> ValueInfoProto {
    typed(name, 1, Some(width))
}

/// A random forest as an ONNX file.
fn forest(d: &mut Draw) -> Vec<u8> {
    let classifier = d.chance(40);
    let s = Shape {
        features: 1 + d.below(12) as i64,
        targets: if classifier {
            2 + d.below(3) as i64
        } else {
            1 + d.below(3) as i64
        },
        uniform: d.chance(50).then(|| MODES[d.below(6) as usize]),
        min_max: false,
        one_class: None,
        positive: false,
    };
    let aggregate = if classifier {
        "SUM"
    } else {
        ["SUM", "AVERAGE", "MIN", "MAX"][d.below(4) as usize]
    };
    let s = Shape {
        min_max: matches!(aggregate, "MIN" | "MAX"),
        one_class: (classifier && d.chance(50)).then(|| d.below(s.targets as u64) as i64),
        positive: classifier && d.chance(40),
        ..s
    };
    let mut a = Attributes::default();
    for tree in 0..1 + d.below(40) as i64 {
        let mut next = 0;
        subtree(d, &mut a, &s, tree * 3 + 1, &mut next, 0);
    }
    // Each tree's nodes after its root out of order (ONNX Runtime reads a
    // tree's first node as its root), each node's attributes moved together.
    let n = a.modes.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut start = 0;
    while start < n {
        let end = (start..n)
            .find(|&i| a.tree_ids[i] != a.tree_ids[start])
            .unwrap_or(n);
        for i in (start + 2..end).rev() {
            let j = start + 1 + d.below((i - start) as u64) as usize;
            order.swap(i, j);
        }
        start = end;
    }
    let pick_i = |v: &[i64]| order.iter().map(|&i| v[i]).collect::<Vec<_>>();
    let post = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"][d.below(5) as usize];
    let prefix = if classifier { "class" } else { "target" };
    let mut attributes = vec![
        ints("nodes_treeids", pick_i(&a.tree_ids)),
        ints("nodes_nodeids", pick_i(&a.node_ids)),
        ints("nodes_featureids", pick_i(&a.features)),
        floats_attribute("nodes_values", order.iter().map(|&i| a.values[i]).collect()),
        AttributeProto {
            name: Some("nodes_modes".into()),
            r#type: Some(AttributeType::Strings as i32),
            strings: order
                .iter()
                .map(|&i| a.modes[i].as_bytes().to_vec())
                .collect(),
            ..Default::default()
        },
        ints("nodes_truenodeids", pick_i(&a.on_true)),
        ints("nodes_falsenodeids", pick_i(&a.on_false)),
        ints("nodes_missing_value_tracks_true", pick_i(&a.missing)),
        ints(&format!("{prefix}_treeids"), a.target_trees),
        ints(&format!("{prefix}_nodeids"), a.target_nodes),
        ints(&format!("{prefix}_ids"), a.target_ids),
        floats_attribute(&format!("{prefix}_weights"), a.target_weights),
        string("post_transform", post),
    ];
    if classifier {
        // Labels of any sign, each once.
        let first = d.below(7) as i64 - 3;
        let step = 1 + d.below(3) as i64;
        attributes.push(ints(
            "classlabels_int64s",
            (0..s.targets).map(|k| first + k * step).collect(),
        ));
    } else {
        attributes.push(AttributeProto {
            name: Some("n_targets".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(s.targets),
            ..Default::default()
        });
        attributes.push(string("aggregate_function", aggregate));
    }
    let bases = if classifier && s.targets == 2 {
        d.below(3) as i64
    } else {
        [0, s.targets][d.below(2) as usize]
    };
    if bases > 0 {
        attributes.push(floats_attribute(
            "base_values",
            (0..bases).map(|_| d.grid() / 4.0).collect(),
        ));
    }
    // After the ensemble: nothing, an Identity, or a Mul by a constant.
    let tail = d.below(3);
    let scores = if tail == 0 { "y" } else { "z" };
    let node = NodeProto {
        input: vec!["x".into()],
        output: if classifier {
            vec!["label".into(), scores.into()]
        } else {
            vec![scores.into()]
        },
        name: Some("forest".into()),
        op_type: Some(
            if classifier {
                "TreeEnsembleClassifier"
            } else {
                "TreeEnsembleRegressor"
            }
            .into(),
        ),
        domain: Some("ai.onnx.ml".into()),
        attribute: attributes,
        ..Default::default()
    };
    let mut nodes = vec![node];
    let mut initializer = Vec::new();
    match tail {
        1 => nodes.push(NodeProto {
            input: vec!["z".into()],
            output: vec!["y".into()],
            op_type: Some("Identity".into()),
            ..Default::default()
        }),
        2 => {
            initializer.push(tickserve_onnx::proto::TensorProto {
                name: Some("scale".into()),
                data_type: Some(1),
                float_data: vec![[1.0, 0.5, -3.0][d.below(3) as usize]],
                ..Default::default()
            });
            nodes.push(NodeProto {
                input: vec!["z".into(), "scale".into()],
                output: vec!["y".into()],
                op_type: Some("Mul".into()),
                ..Default::default()
            });
        }
        _ => {}
    }
    let mut outputs = vec![tensor("y", s.targets)];
    if classifier {
        outputs.insert(0, typed("label", 7, None));
    }
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            },
            OperatorSetIdProto {
                domain: Some("ai.onnx.ml".into()),
                version: Some(3),
            },
        ],
        graph: Some(GraphProto {
            node: nodes,
            name: Some("random_forest".into()),
            input: vec![tensor("x", s.features)],
            output: outputs,
            initializer,
            ..Default::default()
        }),
        ..Default::default()
    };
    model.encode_to_vec()
}

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
        let mut d = Draw(seed);
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
