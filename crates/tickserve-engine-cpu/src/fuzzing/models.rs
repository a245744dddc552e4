//! Random ONNX models for differential tests against ONNX Runtime, from a
//! stream of [`Choices`] (a seed's, in the tests; the fuzzer's bytes, in
//! `fuzz/fuzz_targets/against_onnx_runtime.rs`).
//!
//! [`forest`]: a `TreeEnsembleRegressor` or `TreeEnsembleClassifier`
//! (`ai.onnx.ml` 3) with its own shape: unbalanced trees up to depth 7,
//! every branch mode (one for the whole forest, or mixed), NaN sent either
//! way, thresholds on a grid inputs share (so equality splits are taken),
//! one to three targets (two to four classes, labels of any sign), leaves
//! with several or no weights (a classifier's on one class only, or all
//! positive), every aggregate, base values or none, every post transform,
//! each tree's nodes after its root out of order, tree ids with gaps, an
//! `Identity` or a `Mul` by a constant after the ensemble.
//!
//! [`mlp`]: one to three dense layers (`Gemm`, either orientation of the
//! weights, or `MatMul` and `Add`), each followed by nothing, `Relu`,
//! `Tanh`, `Sigmoid` or `LeakyRelu`, sometimes a `Mul` or `Sub` by a
//! constant row, then maybe `Softmax`, or `LayerNormalization` over at least
//! eight values straight from a dense layer. (Over a row of a few nearly
//! equal values, a saturated sigmoid's say, a normalisation divides their
//! tiny spread by itself: one rounding step apart in the inputs is 1e-5
//! apart in the answer, between any two implementations.)

use tickserve_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, attribute_proto::AttributeType,
    tensor_shape_proto, type_proto,
};

/// A stream of choices.
pub trait Choices {
    /// A number below `n` (0 for `n` of 0).
    fn below(&mut self, n: u64) -> u64;

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A value on the grid thresholds and inputs share: k / 4 in [-2, 2].
    fn grid(&mut self) -> f32 {
        (self.below(17) as f32 - 8.0) / 4.0
    }
}

/// SplitMix64: the choices a seed gives.
#[derive(Debug, Clone)]
pub struct Seeded(pub u64);

impl Choices for Seeded {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).checked_rem(n).unwrap_or(0)
    }
}

/// Bytes as choices: each choice eats eight (zeros once they run out).
#[derive(Debug, Clone)]
pub struct FromBytes<'a>(pub &'a [u8]);

impl Choices for FromBytes<'_> {
    fn below(&mut self, n: u64) -> u64 {
        let take = self.0.len().min(2);
        let (head, rest) = self.0.split_at(take);
        self.0 = rest;
        let value = head.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
        value.checked_rem(n).unwrap_or(0)
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
    d: &mut impl Choices,
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

/// A random tree ensemble as an ONNX file (see the module's documentation).
pub fn forest(d: &mut impl Choices) -> Vec<u8> {
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
    tickserve_onnx::encode(&model)
}

/// A float tensor initializer.
fn initializer(name: &str, dims: &[i64], values: Vec<f32>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(1),
        dims: dims.to_vec(),
        float_data: values,
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|i| (*i).to_string()).collect(),
        output: vec![output.into()],
        name: Some(output.into()),
        op_type: Some(op.into()),
        attribute,
        ..Default::default()
    }
}

fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..Default::default()
    }
}

fn float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(value),
        ..Default::default()
    }
}

/// A weight: k / 500 for k in [-1000, 1000].
fn weight(d: &mut impl Choices) -> f32 {
    (d.below(2001) as f32 - 1000.0) / 500.0
}

/// A random dense network as an ONNX file (see the module's documentation).
pub fn mlp(d: &mut impl Choices) -> Vec<u8> {
    let mut width = 1 + d.below(24) as i64;
    let input = tensor("x", width);
    let mut nodes = Vec::new();
    let mut initializers = Vec::new();
    let mut value = "x".to_string();
    let mut plain = true;
    for layer in 0..1 + d.below(3) {
        let out = 1 + d.below(32) as i64;
        let (w, b, y) = (
            format!("w{layer}"),
            format!("b{layer}"),
            format!("dense{layer}"),
        );
        let bias: Vec<f32> = (0..out).map(|_| weight(d)).collect();
        let values: Vec<f32> = (0..width * out).map(|_| weight(d) / 4.0).collect();
        match d.below(3) {
            0 => {
                initializers.push(initializer(&w, &[width, out], values));
                initializers.push(initializer(&b, &[out], bias));
                nodes.push(node("Gemm", &[&value, &w, &b], &y, Vec::new()));
            }
            1 => {
                initializers.push(initializer(&w, &[out, width], values));
                initializers.push(initializer(&b, &[out], bias));
                nodes.push(node("Gemm", &[&value, &w, &b], &y, vec![int("transB", 1)]));
            }
            _ => {
                let product = format!("matmul{layer}");
                initializers.push(initializer(&w, &[width, out], values));
                initializers.push(initializer(&b, &[out], bias));
                nodes.push(node("MatMul", &[&value, &w], &product, Vec::new()));
                nodes.push(node("Add", &[&product, &b], &y, Vec::new()));
            }
        }
        value = y;
        width = out;
        plain = true;
        let activated = format!("act{layer}");
        let op = match d.below(5) {
            0 => None,
            1 => Some(("Relu", Vec::new())),
            2 => Some(("Tanh", Vec::new())),
            3 => Some(("Sigmoid", Vec::new())),
            _ => Some((
                "LeakyRelu",
                vec![float("alpha", (1 + d.below(50)) as f32 / 100.0)],
            )),
        };
        if let Some((op, attributes)) = op {
            nodes.push(node(op, &[&value], &activated, attributes));
            value = activated;
            plain = false;
        }
        if d.chance(20) {
            let (c, y) = (format!("c{layer}"), format!("scaled{layer}"));
            initializers.push(initializer(
                &c,
                &[width],
                (0..width).map(|_| weight(d)).collect(),
            ));
            let op = if d.chance(50) { "Mul" } else { "Sub" };
            nodes.push(node(op, &[&value, &c], &y, Vec::new()));
            value = y;
            plain = false;
        }
    }
    match d.below(4) {
        0 => {
            nodes.push(node("Softmax", &[&value], "y", vec![int("axis", -1)]));
        }
        1 if plain && width >= 8 => {
            let scale = (0..width).map(|_| weight(d)).collect();
            let bias = (0..width).map(|_| weight(d)).collect();
            initializers.push(initializer("ln_scale", &[width], scale));
            initializers.push(initializer("ln_bias", &[width], bias));
            nodes.push(node(
                "LayerNormalization",
                &[&value, "ln_scale", "ln_bias"],
                "y",
                vec![int("axis", -1), float("epsilon", 1e-5)],
            ));
        }
        _ => nodes.push(node("Identity", &[&value], "y", Vec::new())),
    }
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: Some("random_mlp".into()),
            input: vec![input],
            output: vec![tensor("y", width)],
            initializer: initializers,
            ..Default::default()
        }),
        ..Default::default()
    };
    tickserve_onnx::encode(&model)
}
