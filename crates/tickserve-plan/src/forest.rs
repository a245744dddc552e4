//! A tree ensemble as a [`Forest`]: the one `TreeEnsembleRegressor` node
//! (`ai.onnx.ml`) of a model, as LightGBM, XGBoost and scikit-learn export
//! them through onnxmltools and skl2onnx, read into trees of branches and
//! leaves with every attribute checked (ids, features, children, targets),
//! and [`Forest::evaluate`], its meaning for one row in plain Rust, as ONNX
//! Runtime computes it: each tree walked from its root, a branch taken when
//! its comparison holds or when the feature is NaN and the node sends
//! missing values that way; the leaves' weights aggregated per target
//! (sum, average, min, max), the base values added, then the post
//! transform (`NONE`, `LOGISTIC`, `SOFTMAX`; for one target ONNX Runtime
//! applies none of them, and neither does this).
//!
//! What this reads is as hostile as a request: a branch naming a feature
//! the input lacks, a child outside its tree, a node reached twice (a
//! cycle), a weight on a branch or for a target beyond `n_targets` is
//! refused, naming the node. Classifiers (`TreeEnsembleClassifier`),
//! `SOFTMAX_ZERO` and `PROBIT` are not taken yet: such a model runs on ONNX
//! Runtime.

use std::collections::HashMap;

use tickserve_core::{DataType, TensorSpec};
use tickserve_onnx::OnnxModel;
use tickserve_onnx::proto::{AttributeProto, NodeProto};

use crate::import::Unsupported;

/// The most nodes in one tree's path from its root to a leaf.
pub const MAX_DEPTH: usize = 512;

/// How a branch compares the feature `x` with its threshold `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `x <= t`.
    Leq,
    /// `x < t`.
    Lt,
    /// `x >= t`.
    Gte,
    /// `x > t`.
    Gt,
    /// `x == t`.
    Eq,
    /// `x != t`.
    Neq,
}

impl Mode {
    /// Whether the comparison holds (false for a NaN but for `Neq`).
    #[inline(always)]
    pub fn holds(self, x: f32, t: f32) -> bool {
        match self {
            Mode::Leq => x <= t,
            Mode::Lt => x < t,
            Mode::Gte => x >= t,
            Mode::Gt => x > t,
            Mode::Eq => x == t,
            Mode::Neq => x != t,
        }
    }
}

/// A node of a tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A split.
    Branch {
        /// The input's element compared.
        feature: usize,
        /// The threshold.
        threshold: f32,
        /// The comparison.
        mode: Mode,
        /// A NaN feature goes to `on_true`.
        missing_true: bool,
        /// The node taken when the comparison holds (index in the tree).
        on_true: usize,
        /// The node taken otherwise.
        on_false: usize,
    },
    /// A leaf: its weights, by target.
    Leaf(Vec<(usize, f32)>),
}

/// One tree: its nodes, the root first.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    /// The nodes; `nodes[0]` is the root.
    pub nodes: Vec<Node>,
    /// The most branches on a path from the root to a leaf.
    pub depth: usize,
}

/// How the trees' weights for a target are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Their sum.
    Sum,
    /// Their sum over the number of trees.
    Average,
    /// The least.
    Min,
    /// The greatest.
    Max,
}

/// What is applied to the aggregated scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostTransform {
    /// Nothing.
    None,
    /// `1 / (1 + e^-x)` per score.
    Logistic,
    /// Softmax over a row's scores.
    Softmax,
}

/// A regression tree ensemble.
#[derive(Debug, Clone, PartialEq)]
pub struct Forest {
    /// The input's name.
    pub input: String,
    /// Floats per row of the input.
    pub features: usize,
    /// The output's name.
    pub output: String,
    /// Scores per row of the output.
    pub targets: usize,
    /// How leaves' weights combine.
    pub aggregate: Aggregate,
    /// Applied to the scores.
    pub post_transform: PostTransform,
    /// Added to the aggregated scores: one per target, or none.
    pub base_values: Vec<f32>,
    /// The trees, in the order of their ids.
    pub trees: Vec<Tree>,
}

fn refuse(node: &NodeProto, reason: impl Into<String>) -> Unsupported {
    Unsupported {
        op: node.op_type().to_string(),
        node: node.name().to_string(),
        reason: reason.into(),
    }
}

fn attribute<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name() == name)
}

fn ints<'n>(node: &'n NodeProto, name: &str) -> &'n [i64] {
    attribute(node, name).map_or(&[], |a| a.ints.as_slice())
}

/// A float list attribute, or its `_as_tensor` form when that is FP32.
fn floats(node: &NodeProto, name: &str) -> Result<Vec<f32>, Unsupported> {
    if let Some(a) = attribute(node, &format!("{name}_as_tensor")) {
        let weight =
            a.t.as_ref()
                .map(tickserve_onnx::tensor_weight)
                .transpose()
                .map_err(|e| refuse(node, format!("{name}_as_tensor: {e}")))?;
        return match weight {
            Some(w) if w.datatype == DataType::Fp32 => Ok(w
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            Some(w) => Err(refuse(
                node,
                format!(
                    "{name}_as_tensor is {}: only FP32 thresholds and weights are compiled",
                    w.datatype
                ),
            )),
            None => Err(refuse(node, format!("{name}_as_tensor holds no tensor"))),
        };
    }
    Ok(attribute(node, name).map_or_else(Vec::new, |a| a.floats.clone()))
}

fn string<'n>(node: &'n NodeProto, name: &str, default: &'n str) -> &'n str {
    attribute(node, name)
        .map(|a| std::str::from_utf8(a.s()).unwrap_or("?"))
        .unwrap_or(default)
}

/// An id from the file as an index, if it is one.
fn index(id: i64) -> Option<usize> {
    usize::try_from(id).ok()
}

/// A node still to place: its index in the file, its depth, and the branch
/// (its place in the tree, and which side) that names it.
type Pending = (usize, usize, Option<(usize, bool)>);

/// Reads `model` as a forest: one `TreeEnsembleRegressor` node from its one
/// FP32 input (`inputs`, the signature's) to its one output.
pub fn import_forest(model: &OnnxModel, inputs: &[TensorSpec]) -> Result<Forest, Unsupported> {
    let graph = model.graph_proto();
    let whole = |reason: &str| Unsupported {
        op: "graph".to_string(),
        node: String::new(),
        reason: reason.to_string(),
    };
    let [node] = graph.node.as_slice() else {
        return Err(whole("a forest is one TreeEnsembleRegressor node"));
    };
    if node.domain() != "ai.onnx.ml" || node.op_type() != "TreeEnsembleRegressor" {
        return Err(refuse(node, "not a TreeEnsembleRegressor of ai.onnx.ml"));
    }
    let [input] = inputs else {
        return Err(whole("a forest takes one input"));
    };
    if input.datatype != DataType::Fp32 || input.dims.len() != 1 {
        return Err(refuse(node, "its input must be FP32 rows of one dimension"));
    }
    if node.input.first().map(String::as_str) != Some(input.name.as_str()) {
        return Err(refuse(node, "it must read the graph's input"));
    }
    let [output] = graph.output.as_slice() else {
        return Err(whole("a forest gives one output"));
    };
    if node.output.first().map(String::as_str) != Some(output.name()) {
        return Err(refuse(node, "it must write the graph's output"));
    }
    let features = input.dims[0];
    let targets = index(attribute(node, "n_targets").map_or(1, |a| a.i()))
        .filter(|t| (1..=1 << 16).contains(t))
        .ok_or_else(|| refuse(node, "n_targets must be from 1 to 65536"))?;
    let aggregate = match string(node, "aggregate_function", "SUM") {
        "SUM" => Aggregate::Sum,
        "AVERAGE" => Aggregate::Average,
        "MIN" => Aggregate::Min,
        "MAX" => Aggregate::Max,
        other => return Err(refuse(node, format!("aggregate_function {other}"))),
    };
    let post_transform = match string(node, "post_transform", "NONE") {
        "NONE" => PostTransform::None,
        "LOGISTIC" => PostTransform::Logistic,
        "SOFTMAX" => PostTransform::Softmax,
        // ONNX Runtime's probit outside (0, 1) is not IEEE's (an
        // approximation's edge cases): a PROBIT forest stays on it.
        other => return Err(refuse(node, format!("post_transform {other}"))),
    };
    let base_values = floats(node, "base_values")?;
    if !(base_values.is_empty() || base_values.len() == targets) {
        return Err(refuse(
            node,
            format!("{} base_values for {targets} targets", base_values.len()),
        ));
    }

    let tree_ids = ints(node, "nodes_treeids");
    let node_ids = ints(node, "nodes_nodeids");
    let feature_ids = ints(node, "nodes_featureids");
    let thresholds = floats(node, "nodes_values")?;
    let modes: Vec<&[u8]> = attribute(node, "nodes_modes")
        .map_or_else(Vec::new, |a| a.strings.iter().map(Vec::as_slice).collect());
    let true_ids = ints(node, "nodes_truenodeids");
    let false_ids = ints(node, "nodes_falsenodeids");
    let missing = ints(node, "nodes_missing_value_tracks_true");
    let n = tree_ids.len();
    if n == 0 {
        return Err(refuse(node, "it has no nodes"));
    }
    for (name, len) in [
        ("nodes_nodeids", node_ids.len()),
        ("nodes_featureids", feature_ids.len()),
        ("nodes_values", thresholds.len()),
        ("nodes_modes", modes.len()),
        ("nodes_truenodeids", true_ids.len()),
        ("nodes_falsenodeids", false_ids.len()),
    ] {
        if len != n {
            return Err(refuse(
                node,
                format!("{name} has {len} entries; nodes_treeids {n}"),
            ));
        }
    }
    if !(missing.is_empty() || missing.len() == n) {
        return Err(refuse(
            node,
            "nodes_missing_value_tracks_true must have one entry per node",
        ));
    }

    // Each tree's nodes (trees in id order), and each node's place.
    let mut by_tree: std::collections::BTreeMap<i64, Vec<usize>> =
        std::collections::BTreeMap::new();
    for (i, &t) in tree_ids.iter().enumerate() {
        by_tree.entry(t).or_default().push(i);
    }
    let mut at: HashMap<(i64, i64), usize> = HashMap::with_capacity(n);
    for (i, (&t, &id)) in tree_ids.iter().zip(node_ids).enumerate() {
        if at.insert((t, id), i).is_some() {
            return Err(refuse(node, format!("tree {t} has node {id} twice")));
        }
    }

    // Leaves' weights, by node.
    let target_trees = ints(node, "target_treeids");
    let target_nodes = ints(node, "target_nodeids");
    let target_ids = ints(node, "target_ids");
    let target_weights = floats(node, "target_weights")?;
    let w = target_trees.len();
    if target_nodes.len() != w || target_ids.len() != w || target_weights.len() != w {
        return Err(refuse(node, "the target_* attributes differ in length"));
    }
    let mut weights: HashMap<usize, Vec<(usize, f32)>> = HashMap::new();
    for k in 0..w {
        let place = at
            .get(&(target_trees[k], target_nodes[k]))
            .copied()
            .ok_or_else(|| {
                refuse(
                    node,
                    format!(
                        "a weight names node {} of tree {}, which is not there",
                        target_nodes[k], target_trees[k]
                    ),
                )
            })?;
        let target = index(target_ids[k])
            .filter(|&t| t < targets)
            .ok_or_else(|| {
                refuse(
                    node,
                    format!(
                        "target id {} is not below n_targets {targets}",
                        target_ids[k]
                    ),
                )
            })?;
        weights
            .entry(place)
            .or_default()
            .push((target, target_weights[k]));
    }

    // Each tree: its nodes from the root down, every node reached once.
    let mut trees = Vec::with_capacity(by_tree.len());
    for (&tree_id, members) in &by_tree {
        // The root: the node no other node of the tree names.
        let mut named: std::collections::HashSet<i64> = std::collections::HashSet::new();
        for &i in members {
            if modes[i] != b"LEAF" {
                named.insert(true_ids[i]);
                named.insert(false_ids[i]);
            }
        }
        let roots: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| !named.contains(&node_ids[i]))
            .collect();
        let [root] = roots.as_slice() else {
            return Err(refuse(
                node,
                format!("tree {tree_id} has {} roots", roots.len()),
            ));
        };
        let mut nodes: Vec<Node> = Vec::new();
        let mut placed: HashMap<usize, usize> = HashMap::new();
        let mut stack: Vec<Pending> = vec![(*root, 0, None)];
        let mut depth = 0;
        while let Some((i, d, parent)) = stack.pop() {
            if placed.contains_key(&i) {
                return Err(refuse(
                    node,
                    format!("node {} of tree {tree_id} is reached twice", node_ids[i]),
                ));
            }
            if d > MAX_DEPTH {
                return Err(refuse(
                    node,
                    format!("tree {tree_id} is deeper than {MAX_DEPTH}"),
                ));
            }
            depth = depth.max(d);
            let slot = nodes.len();
            placed.insert(i, slot);
            if let Some((p, is_true)) = parent
                && let Some(Node::Branch {
                    on_true, on_false, ..
                }) = nodes.get_mut(p)
            {
                if is_true {
                    *on_true = slot;
                } else {
                    *on_false = slot;
                }
            }
            let leaf_weights = weights.remove(&i);
            let mode = match modes[i] {
                b"LEAF" => {
                    let leaf = leaf_weights.unwrap_or_default();
                    if leaf.is_empty()
                        && (targets == 1 || matches!(aggregate, Aggregate::Min | Aggregate::Max))
                    {
                        return Err(refuse(
                            node,
                            format!("leaf {} of tree {tree_id} has no weight", node_ids[i]),
                        ));
                    }
                    if targets == 1 && leaf.len() > 1 {
                        return Err(refuse(
                            node,
                            format!(
                                "leaf {} of tree {tree_id} has {} weights for one target",
                                node_ids[i],
                                leaf.len()
                            ),
                        ));
                    }
                    nodes.push(Node::Leaf(leaf));
                    continue;
                }
                b"BRANCH_LEQ" => Mode::Leq,
                b"BRANCH_LT" => Mode::Lt,
                b"BRANCH_GTE" => Mode::Gte,
                b"BRANCH_GT" => Mode::Gt,
                b"BRANCH_EQ" => Mode::Eq,
                b"BRANCH_NEQ" => Mode::Neq,
                other => {
                    return Err(refuse(
                        node,
                        format!("node mode {}", String::from_utf8_lossy(other)),
                    ));
                }
            };
            if leaf_weights.is_some() {
                return Err(refuse(
                    node,
                    format!("branch {} of tree {tree_id} has a weight", node_ids[i]),
                ));
            }
            let feature = index(feature_ids[i])
                .filter(|&f| f < features)
                .ok_or_else(|| {
                    refuse(
                        node,
                        format!(
                            "node {} of tree {tree_id} reads feature {} of {features}",
                            node_ids[i], feature_ids[i]
                        ),
                    )
                })?;
            let child = |id: i64| {
                at.get(&(tree_id, id)).copied().ok_or_else(|| {
                    refuse(
                        node,
                        format!(
                            "node {} of tree {tree_id} names node {id}, which is not in the tree",
                            node_ids[i]
                        ),
                    )
                })
            };
            let (on_true, on_false) = (child(true_ids[i])?, child(false_ids[i])?);
            nodes.push(Node::Branch {
                feature,
                threshold: thresholds[i],
                mode,
                missing_true: missing.get(i).is_some_and(|&m| m != 0),
                on_true: 0,
                on_false: 0,
            });
            stack.push((on_false, d + 1, Some((slot, false))));
            stack.push((on_true, d + 1, Some((slot, true))));
        }
        if nodes.len() != members.len() {
            return Err(refuse(
                node,
                format!("tree {tree_id} has nodes its root does not reach"),
            ));
        }
        trees.push(Tree { nodes, depth });
    }
    if !weights.is_empty() {
        return Err(refuse(node, "a weight names a node no tree reaches"));
    }
    Ok(Forest {
        input: input.name.clone(),
        features,
        output: output.name().to_string(),
        targets,
        aggregate,
        post_transform,
        base_values,
        trees,
    })
}

/// ONNX Runtime's logistic function.
pub fn logistic(x: f32) -> f32 {
    let v = 1.0 / (1.0 + (-x.abs()).exp());
    if x < 0.0 { 1.0 - v } else { v }
}

impl Forest {
    /// The leaf `tree` reaches for `row`.
    pub fn leaf<'t>(tree: &'t Tree, row: &[f32]) -> &'t [(usize, f32)] {
        let mut at = 0;
        loop {
            match &tree.nodes[at] {
                Node::Leaf(weights) => return weights,
                Node::Branch {
                    feature,
                    threshold,
                    mode,
                    missing_true,
                    on_true,
                    on_false,
                } => {
                    let x = row[*feature];
                    at = if mode.holds(x, *threshold) || (*missing_true && x.is_nan()) {
                        *on_true
                    } else {
                        *on_false
                    };
                }
            }
        }
    }

    /// The scores of one row, from the leaves' weights per target (`sums`
    /// and whether any leaf gave the target one).
    pub fn finish(&self, scores: &mut [f32], given: &[bool], out: &mut [f32]) {
        let trees = self.trees.len() as f32;
        if self.targets == 1 {
            let origin = if self.base_values.len() == 1 {
                self.base_values[0]
            } else {
                0.0
            };
            let mut z = scores[0];
            if self.aggregate == Aggregate::Average {
                z /= trees;
            }
            z = if given[0] || matches!(self.aggregate, Aggregate::Sum | Aggregate::Average) {
                z + origin
            } else {
                origin
            };
            // ONNX Runtime applies no post transform to a single target.
            out[0] = z;
            return;
        }
        let with_base = self.base_values.len() == self.targets;
        for (j, s) in scores.iter_mut().enumerate() {
            let base = if with_base { self.base_values[j] } else { 0.0 };
            // A target no leaf gave a weight comes out 0, base value or
            // not, as in ONNX Runtime (its score reads 0 without one).
            *s = match (given[j], self.aggregate) {
                (false, _) => 0.0,
                (true, Aggregate::Sum | Aggregate::Min | Aggregate::Max) => *s + base,
                (true, Aggregate::Average) => *s / trees + base,
            };
        }
        match self.post_transform {
            PostTransform::None => out.copy_from_slice(scores),
            PostTransform::Logistic => {
                for (o, s) in out.iter_mut().zip(scores.iter()) {
                    *o = logistic(*s);
                }
            }
            PostTransform::Softmax => {
                let max = scores.iter().copied().fold(-f32::MAX, f32::max);
                let mut sum = 0.0f32;
                for (o, s) in out.iter_mut().zip(scores.iter()) {
                    *o = (s - max).exp();
                    sum += *o;
                }
                for o in out.iter_mut() {
                    *o /= sum;
                }
            }
        }
    }

    /// Adds a leaf's weights into `scores` as the aggregate combines them.
    #[inline(always)]
    pub fn combine(&self, leaf: &[(usize, f32)], scores: &mut [f32], given: &mut [bool]) {
        for &(target, w) in leaf {
            let (s, g) = (&mut scores[target], &mut given[target]);
            *s = match self.aggregate {
                Aggregate::Sum | Aggregate::Average => *s + w,
                Aggregate::Min => {
                    if !*g || w < *s {
                        w
                    } else {
                        *s
                    }
                }
                Aggregate::Max => {
                    if !*g || w > *s {
                        w
                    } else {
                        *s
                    }
                }
            };
            *g = true;
        }
    }

    /// One row's output (`targets` floats), walking every tree: the meaning
    /// the compiled layout is tested against.
    pub fn evaluate(&self, row: &[f32]) -> Vec<f32> {
        let mut scores = vec![0.0f32; self.targets];
        let mut given = vec![false; self.targets];
        for tree in &self.trees {
            self.combine(Forest::leaf(tree, row), &mut scores, &mut given);
        }
        let mut out = vec![0.0f32; self.targets];
        self.finish(&mut scores, &given, &mut out);
        out
    }
}
