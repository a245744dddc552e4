//! A tree ensemble as a [`Forest`]: the one `TreeEnsembleRegressor` or
//! `TreeEnsembleClassifier` node (`ai.onnx.ml`) of a model, as LightGBM,
//! XGBoost and scikit-learn export them through onnxmltools and skl2onnx,
//! read into trees of branches and leaves with every attribute checked
//! (ids, features, children, targets, classes), and [`Forest::evaluate`],
//! its meaning for one row in plain Rust, as ONNX Runtime computes it: each
//! tree walked from its root, a branch taken when its comparison holds or
//! when the feature is NaN and the node sends missing values that way; the
//! leaves' weights aggregated per target (sum, average, min, max; a
//! classifier's per class, summed), the base values added, then the post
//! transform (`NONE`, `LOGISTIC`, `SOFTMAX`, `SOFTMAX_ZERO`; for one target
//! ONNX Runtime applies none of them, and neither does this). A classifier
//! also gives its label: the top class's, or for two classes ONNX
//! Runtime's binary rules ([`Forest::finish`]).
//!
//! The exporters put a few nodes after the ensemble (LightGBM: an
//! `Identity` per output, a `Cast` of the label to INT64, the probabilities
//! multiplied by a constant 1): `Identity`, a `Cast` to the type the value
//! already has and one `Mul` of the scores by a one-element FP32 constant
//! are read; any other node is refused.
//!
//! What this reads is as hostile as a request: a branch naming a feature
//! the input lacks, a child outside its tree, a node reached twice (a
//! cycle), a weight on a branch or for a target beyond `n_targets` (a class
//! beyond the labels) is refused, naming the node. `PROBIT`, string class
//! labels and the few class layouts where ONNX Runtime's answer is not
//! defined (it fails the row, or leaves a probability unwritten) are not
//! taken: such a model runs on ONNX Runtime.

use std::collections::HashMap;

use tickserve_core::{DataType, Weight};
use tickserve_onnx::proto::{AttributeProto, NodeProto};
use tickserve_onnx::{OnnxModel, PartialSignature};

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
    /// Softmax over a row's scores that leaves a score of 0 (within
    /// 1e-7) near 0: `e^(s - max)` for the others, `s · e^-max` for it.
    SoftmaxZero,
}

/// What one output of the graph holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Yield {
    /// The scores: `targets` FP32 a row (a classifier's probabilities).
    Scores,
    /// A classifier's label: one INT64 a row.
    Label,
}

/// A classifier's classes.
#[derive(Debug, Clone, PartialEq)]
pub struct Classes {
    /// The label of each class id.
    pub labels: Vec<i64>,
    /// Every weight names one class id: ONNX Runtime's binary case (two
    /// classes, the second's probability derived from the first's score).
    pub one_class: bool,
    /// No weight is negative (a binary score is then a probability).
    pub all_positive: bool,
}

/// A regression tree ensemble.
#[derive(Debug, Clone, PartialEq)]
pub struct Forest {
    /// The input's name.
    pub input: String,
    /// Floats per row of the input.
    pub features: usize,
    /// The graph's outputs, in order: their names and what each holds.
    pub outputs: Vec<(String, Yield)>,
    /// Scores per row (a classifier's: one per class).
    pub targets: usize,
    /// A classifier's classes; `None` for a regressor.
    pub classes: Option<Classes>,
    /// The scores are multiplied by this after the post transform (a `Mul`
    /// after the ensemble; 1 without one).
    pub scale: f32,
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

/// Reads `model` as a forest: one `TreeEnsembleRegressor` or
/// `TreeEnsembleClassifier` node from the one FP32 input of `signature`,
/// followed by nothing but the nodes the exporters add (see the module's
/// documentation), to the graph's outputs. `constants` are the graph's
/// weights where they were taken out of it (a family's): the constant of a
/// `Mul` is looked for among its initializers, then there.
pub fn import_forest(
    model: &OnnxModel,
    signature: &PartialSignature,
    constants: &[Weight],
) -> Result<Forest, Unsupported> {
    let graph = model.graph_proto();
    let ensembles: Vec<&NodeProto> = graph
        .node
        .iter()
        .filter(|n| n.domain() == "ai.onnx.ml" && n.op_type().starts_with("TreeEnsemble"))
        .collect();
    let [node] = ensembles.as_slice() else {
        return Err(whole_graph("a forest is one TreeEnsemble node"));
    };
    let node: &NodeProto = node;
    let classifier = match node.op_type() {
        "TreeEnsembleRegressor" => false,
        "TreeEnsembleClassifier" => true,
        _ => {
            return Err(refuse(
                node,
                "not a TreeEnsembleRegressor or TreeEnsembleClassifier",
            ));
        }
    };
    let [input] = signature.inputs.as_slice() else {
        return Err(whole_graph("a forest takes one input"));
    };
    if input.datatype != DataType::Fp32 || input.dims.len() != 1 {
        return Err(refuse(node, "its input must be FP32 rows of one dimension"));
    }
    if node.input.first().map(String::as_str) != Some(input.name.as_str()) {
        return Err(refuse(node, "it must read the graph's input"));
    }
    let features = input.dims[0];
    let classes = if classifier {
        Some(read_classes(node)?)
    } else {
        None
    };
    let targets = match &classes {
        Some(classes) => classes.labels.len(),
        None => index(attribute(node, "n_targets").map_or(1, |a| a.i()))
            .filter(|t| (1..=MAX_TARGETS).contains(t))
            .ok_or_else(|| refuse(node, "n_targets must be from 1 to 65536"))?,
    };
    let aggregate = match string(node, "aggregate_function", "SUM") {
        "SUM" => Aggregate::Sum,
        // A classifier's trees are summed, whatever the node says.
        _ if classifier => Aggregate::Sum,
        "AVERAGE" => Aggregate::Average,
        "MIN" => Aggregate::Min,
        "MAX" => Aggregate::Max,
        other => return Err(refuse(node, format!("aggregate_function {other}"))),
    };
    let post_transform = match string(node, "post_transform", "NONE") {
        "NONE" => PostTransform::None,
        "LOGISTIC" => PostTransform::Logistic,
        "SOFTMAX" => PostTransform::Softmax,
        "SOFTMAX_ZERO" => PostTransform::SoftmaxZero,
        // ONNX Runtime's probit outside (0, 1) is not IEEE's (an
        // approximation's edge cases): a PROBIT forest stays on it.
        other => return Err(refuse(node, format!("post_transform {other}"))),
    };
    let base_values = floats(node, "base_values")?;
    let base_fits = match &classes {
        // Two classes: ONNX Runtime reads none, one (the first class's
        // score) or two.
        Some(_) if targets == 2 => base_values.len() <= 2,
        _ => base_values.is_empty() || base_values.len() == targets,
    };
    if !base_fits {
        return Err(refuse(
            node,
            format!("{} base_values for {targets} targets", base_values.len()),
        ));
    }
    let outputs = read_outputs(model, node, classifier, signature, constants)?;
    let (trees, weights_given) = read_trees(node, features, targets, aggregate, classifier)?;
    let forest = Forest {
        input: input.name.clone(),
        features,
        outputs: outputs.0,
        targets,
        classes,
        scale: outputs.1,
        aggregate,
        post_transform,
        base_values,
        trees,
    };
    if let Some(classes) = &forest.classes {
        defined(node, &forest, classes, weights_given)?;
    }
    Ok(forest)
}

/// The most targets (classes) of a forest.
pub const MAX_TARGETS: usize = 1 << 16;

/// A classifier's labels, and how its weights name the classes.
fn read_classes(node: &NodeProto) -> Result<Classes, Unsupported> {
    if attribute(node, "classlabels_strings").is_some_and(|a| !a.strings.is_empty()) {
        return Err(refuse(
            node,
            "its class labels are strings: tickserve serves no string tensors",
        ));
    }
    let labels = ints(node, "classlabels_int64s").to_vec();
    if !(2..=MAX_TARGETS).contains(&labels.len()) {
        return Err(refuse(
            node,
            format!(
                "{} class labels: from 2 to {MAX_TARGETS} are compiled",
                labels.len()
            ),
        ));
    }
    let ids = ints(node, "class_ids");
    let weights = floats(node, "class_weights")?;
    // ONNX Runtime's binary case: exactly one class id among the weights
    // (none is not one).
    let first = ids.first().copied();
    Ok(Classes {
        one_class: first.is_some() && ids.iter().all(|&id| Some(id) == first),
        all_positive: weights.iter().all(|&w| w >= 0.0),
        labels,
    })
}

/// The graph's outputs as what the ensemble gives, through the nodes after
/// it; and the one scale on the scores.
fn read_outputs(
    model: &OnnxModel,
    node: &NodeProto,
    classifier: bool,
    signature: &PartialSignature,
    constants: &[Weight],
) -> Result<(Vec<(String, Yield)>, f32), Unsupported> {
    let graph = model.graph_proto();
    let gives: &[Yield] = if classifier {
        &[Yield::Label, Yield::Scores]
    } else {
        &[Yield::Scores]
    };
    let mut values: HashMap<&str, Yield> = node
        .output
        .iter()
        .zip(gives)
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, y)| (name.as_str(), *y))
        .collect();
    let mut scale: Option<f32> = None;
    let mut after = false;
    for tail in &graph.node {
        if std::ptr::eq(tail, node) {
            after = true;
            continue;
        }
        if !after {
            return Err(refuse(tail, "a forest's graph computes nothing before it"));
        }
        let known: Vec<Yield> = tail
            .input
            .iter()
            .filter_map(|i| values.get(i.as_str()).copied())
            .collect();
        let [y] = known.as_slice() else {
            return Err(refuse(tail, "it must read one value of the ensemble"));
        };
        let [out] = tail.output.as_slice() else {
            return Err(refuse(tail, "it must give one value"));
        };
        let fits = match (tail.op_type(), y) {
            ("Identity", _) => tail.input.len() == 1,
            // ONNX's element types: 1 is FLOAT, 7 is INT64.
            ("Cast", Yield::Scores) => attribute(tail, "to").map(|a| a.i()) == Some(1),
            ("Cast", Yield::Label) => attribute(tail, "to").map(|a| a.i()) == Some(7),
            ("Mul", Yield::Scores) if scale.is_none() && tail.input.len() == 2 => {
                let other = tail
                    .input
                    .iter()
                    .find(|i| !values.contains_key(i.as_str()))
                    .and_then(|name| {
                        graph
                            .initializer
                            .iter()
                            .find(|t| t.name() == name)
                            .and_then(|t| tickserve_onnx::tensor_weight(t).ok())
                            .or_else(|| constants.iter().find(|w| &w.name == name).cloned())
                    })
                    .filter(|w| w.datatype == DataType::Fp32 && w.data.len() == 4);
                scale =
                    other.map(|w| f32::from_le_bytes([w.data[0], w.data[1], w.data[2], w.data[3]]));
                scale.is_some()
            }
            _ => false,
        };
        if !fits {
            return Err(refuse(
                tail,
                "after the ensemble, only Identity, a Cast to the value's own type and one Mul \
                 of the scores by a one-element FP32 constant are compiled",
            ));
        }
        values.insert(out.as_str(), *y);
    }
    let mut outputs = Vec::with_capacity(signature.outputs.len());
    for (name, datatype, _) in &signature.outputs {
        let y = values.get(name.as_str()).copied().ok_or_else(|| {
            refuse(
                node,
                format!("the graph's output '{name}' is not a value of the ensemble"),
            )
        })?;
        let want = match y {
            Yield::Scores => DataType::Fp32,
            Yield::Label => DataType::Int64,
        };
        if *datatype != want {
            return Err(refuse(
                node,
                format!("the graph's output '{name}' is declared {datatype}; it holds {want}"),
            ));
        }
        outputs.push((name.clone(), y));
    }
    if outputs.is_empty() {
        return Err(whole_graph("a forest gives at least one output"));
    }
    Ok((outputs, scale.unwrap_or(1.0)))
}

/// A refusal of the graph as a whole, not of one node.
fn whole_graph(reason: &str) -> Unsupported {
    Unsupported {
        op: "graph".to_string(),
        node: String::new(),
        reason: reason.to_string(),
    }
}

/// Refuses the class layouts where ONNX Runtime's answer is not defined:
/// more than two classes, no base values and a row that may reach no
/// weight (it fails the row); two classes, one base value and weights on
/// both (it leaves the second probability unwritten).
fn defined(
    node: &NodeProto,
    forest: &Forest,
    classes: &Classes,
    weights_given: bool,
) -> Result<(), Unsupported> {
    if forest.targets > 2 && forest.base_values.is_empty() && !weights_given {
        return Err(refuse(
            node,
            "no base values and no tree whose every leaf weighs a class: a row could reach \
             no class",
        ));
    }
    if forest.targets == 2 && forest.base_values.len() == 1 && !classes.one_class {
        return Err(refuse(
            node,
            "two classes, one base value and weights on both: ONNX Runtime leaves a \
             probability unwritten",
        ));
    }
    Ok(())
}

/// Each tree of `node`, from its root down; and whether some tree weighs
/// a target at every leaf.
fn read_trees(
    node: &NodeProto,
    features: usize,
    targets: usize,
    aggregate: Aggregate,
    classifier: bool,
) -> Result<(Vec<Tree>, bool), Unsupported> {
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
    let prefix = if classifier { "class" } else { "target" };
    let target_trees = ints(node, &format!("{prefix}_treeids"));
    let target_nodes = ints(node, &format!("{prefix}_nodeids"));
    let target_ids = ints(node, &format!("{prefix}_ids"));
    let target_weights = floats(node, &format!("{prefix}_weights"))?;
    let w = target_trees.len();
    if target_nodes.len() != w || target_ids.len() != w || target_weights.len() != w {
        return Err(refuse(
            node,
            format!("the {prefix}_* attributes differ in length"),
        ));
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
                    format!("{prefix} id {} is not below {targets}", target_ids[k]),
                )
            })?;
        weights
            .entry(place)
            .or_default()
            .push((target, target_weights[k]));
    }

    // Each tree: its nodes from the root down, every node reached once.
    let mut trees = Vec::with_capacity(by_tree.len());
    let mut weighed = false;
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
        weighed |= nodes
            .iter()
            .all(|n| !matches!(n, Node::Leaf(leaf) if leaf.is_empty()));
        trees.push(Tree { nodes, depth });
    }
    if !weights.is_empty() {
        return Err(refuse(node, "a weight names a node no tree reaches"));
    }
    Ok((trees, weighed))
}

/// ONNX Runtime's logistic function.
pub fn logistic(x: f32) -> f32 {
    let v = 1.0 / (1.0 + (-x.abs()).exp());
    if x < 0.0 { 1.0 - v } else { v }
}

/// Applies `post` to a row's scores (two or more), as ONNX Runtime does.
fn transform(post: PostTransform, scores: &mut [f32], out: &mut [f32]) {
    match post {
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
        PostTransform::SoftmaxZero => {
            let max = scores.iter().copied().fold(-f32::MAX, f32::max);
            let scale = (-max).exp();
            let mut sum = 0.0f32;
            for (o, s) in out.iter_mut().zip(scores.iter()) {
                if *s > 0.000_000_1 || *s < -0.000_000_1 {
                    *o = (s - max).exp();
                    sum += *o;
                } else {
                    *o = s * scale;
                }
            }
            for o in out.iter_mut() {
                *o /= sum;
            }
        }
    }
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

    /// The scores of one row into `out`, from the leaves' weights per
    /// target (`scores`, and whether any leaf gave the target one; both
    /// scratch afterwards), and its label (a classifier's; 0 otherwise).
    pub fn finish(&self, scores: &mut [f32], given: &mut [bool], out: &mut [f32]) -> i64 {
        let label = match &self.classes {
            Some(classes) => self.finish_classes(classes, scores, given, out),
            None => {
                self.finish_targets(scores, given, out);
                0
            }
        };
        if self.scale != 1.0 {
            for o in out.iter_mut() {
                *o *= self.scale;
            }
        }
        label
    }

    /// A regressor's scores.
    fn finish_targets(&self, scores: &mut [f32], given: &[bool], out: &mut [f32]) {
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
        transform(self.post_transform, scores, out);
    }

    /// A classifier's probabilities and label, as ONNX Runtime's
    /// `TreeAggregatorClassifier` and `write_scores` make them.
    fn finish_classes(
        &self,
        classes: &Classes,
        scores: &mut [f32],
        given: &mut [bool],
        out: &mut [f32],
    ) -> i64 {
        let base = &self.base_values;
        if self.targets > 2 {
            for (k, b) in base.iter().enumerate() {
                scores[k] = if given[k] { scores[k] + b } else { *b };
                given[k] = true;
            }
            // The first of the greatest scores a class was given.
            let mut top: Option<usize> = None;
            for k in 0..self.targets {
                if given[k] && top.is_none_or(|t| scores[k] > scores[t]) {
                    top = Some(k);
                }
            }
            transform(self.post_transform, scores, out);
            // `import_forest` refused forests where a row can reach no class.
            return top.map_or(classes.labels[0], |t| classes.labels[t]);
        }
        // Two classes. How the second score is written (ONNX Runtime's
        // `add_second_class`), when only one is kept.
        let mut second: Option<u8> = None;
        let mut kept = 2;
        match base.as_slice() {
            [_, b1] if given[1] => {
                // ONNX Runtime reads the first base value as the second's.
                scores[1] = b1 + scores[0];
                scores[0] = -scores[1];
            }
            [b0, b1] => {
                scores[1] += b1;
                scores[0] += b0;
            }
            [b0] => {
                scores[0] += b0;
                if !given[1] {
                    kept = 1;
                }
            }
            _ => {
                second = Some(3);
                if !given[1] {
                    kept = 1;
                }
            }
        }
        let positive = if kept == 2 && given[1] {
            scores[1]
        } else if given[0] {
            scores[0]
        } else {
            0.0
        };
        let label = if classes.one_class {
            let (wins, which) = if classes.all_positive {
                (positive > 0.5, [1, 0])
            } else {
                (positive > 0.0, [3, 2])
            };
            second = Some(which[usize::from(wins)]);
            classes.labels[usize::from(wins)]
        } else {
            // ONNX Runtime's default labels here, whatever the classes'.
            i64::from(positive > 0.0)
        };
        // ONNX Runtime reads a score no leaf gave as 0, whatever was added
        // to it.
        for (s, g) in scores.iter_mut().zip(given.iter()) {
            if !g {
                *s = 0.0;
            }
        }
        if kept == 2 {
            transform(self.post_transform, &mut scores[..2], &mut out[..2]);
            return label;
        }
        let s = scores[0];
        // (`import_forest` refused the one layout that writes one score.)
        out[..2].copy_from_slice(&match (self.post_transform, second) {
            (PostTransform::Logistic, _) => [logistic(-s), logistic(s)],
            (_, Some(0 | 1)) => [1.0 - s, s],
            _ => [-s, s],
        });
        label
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

    /// One row's scores (`targets` floats) and label (a classifier's; 0
    /// otherwise), walking every tree: the meaning the compiled layout is
    /// tested against.
    pub fn evaluate(&self, row: &[f32]) -> (Vec<f32>, i64) {
        let mut scores = vec![0.0f32; self.targets];
        let mut given = vec![false; self.targets];
        for tree in &self.trees {
            self.combine(Forest::leaf(tree, row), &mut scores, &mut given);
        }
        let mut out = vec![0.0f32; self.targets];
        let label = self.finish(&mut scores, &mut given, &mut out);
        (out, label)
    }
}
