//! Fuzzing entry points (`fuzz/`, cargo-fuzz; the committed corpus replays in
//! `tests/engine_cpu/fuzz_corpus.rs`), and the random models ([`models`])
//! the engine is tested against ONNX Runtime on.
//!
//! [`forest`] is a differential: the compiled tree walk ([`CompiledForest`]: eight trees
//! at a time over a flat node array, read without bounds checks) against the plain walk
//! it is held to (`Forest::evaluate`), on forests and rows built from the bytes: any
//! shape of trees, thresholds and weights (NaN and infinities too), every comparison,
//! aggregate and post transform. A forest whose feature lies outside the row must be
//! refused; every other must give the plain walk's scores exactly (the same additions in
//! the same order).

pub mod models;

use crate::forest::CompiledForest;
use tickserve_plan::forest::{Aggregate, Forest, Mode, Node, PostTransform, Tree, Yield};

/// The fuzzer's bytes as a stream of choices (zeros once they run out).
struct Draw<'a>(&'a [u8]);

impl Draw<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn below(&mut self, n: u8) -> usize {
        usize::from(self.byte() % n.max(1))
    }
    /// A float: small integers and halves mostly (ties with thresholds), any bits
    /// sometimes.
    fn float(&mut self) -> f32 {
        match self.below(8) {
            0 => f32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()]),
            1 => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0][self.below(4)],
            _ => (f32::from(self.byte()) - 128.0) / 2.0,
        }
    }
}

/// Builds a subtree at `nodes`' end and returns its index and its depth (branches on
/// its longest path).
fn subtree(
    d: &mut Draw,
    nodes: &mut Vec<Node>,
    shape: (usize, usize, bool),
    depth: usize,
) -> (usize, usize) {
    let (features, targets, hostile) = shape;
    let at = nodes.len();
    nodes.push(Node::Leaf(Vec::new()));
    if depth >= 12 || d.below(3) == 0 {
        let weights = (0..1 + d.below(targets as u8))
            .map(|_| (d.below(targets as u8), d.float()))
            .collect();
        nodes[at] = Node::Leaf(weights);
        return (at, 0);
    }
    let feature = if hostile {
        features + d.below(3)
    } else {
        d.below(features as u8)
    };
    let threshold = d.float();
    let mode = [
        Mode::Leq,
        Mode::Lt,
        Mode::Gte,
        Mode::Gt,
        Mode::Eq,
        Mode::Neq,
    ][d.below(6)];
    let missing_true = d.below(2) == 0;
    let (on_true, left) = subtree(d, nodes, shape, depth + 1);
    let (on_false, right) = subtree(d, nodes, shape, depth + 1);
    nodes[at] = Node::Branch {
        feature,
        threshold,
        mode,
        missing_true,
        on_true,
        on_false,
    };
    (at, 1 + left.max(right))
}

/// One case: the forest and rows `data` describes; panics where the compiled walk
/// and the plain walk disagree, or where `CompiledForest::new` accepts a forest
/// whose feature lies outside the row (or refuses one within it).
pub fn forest(data: &[u8]) {
    let mut d = Draw(data);
    let features = 1 + d.below(8);
    let targets = 1 + d.below(3);
    let hostile = d.below(16) == 0;
    let aggregate = [
        Aggregate::Sum,
        Aggregate::Average,
        Aggregate::Min,
        Aggregate::Max,
    ][d.below(4)];
    let post_transform = [
        PostTransform::None,
        PostTransform::Logistic,
        PostTransform::Softmax,
        PostTransform::SoftmaxZero,
    ][d.below(4)];
    let base_values = match d.below(3) {
        0 => Vec::new(),
        1 if targets == 1 => vec![d.float()],
        _ => (0..targets).map(|_| d.float()).collect(),
    };
    let trees = (0..1 + d.below(40))
        .map(|_| {
            let mut nodes = Vec::new();
            let (_, depth) = subtree(&mut d, &mut nodes, (features, targets, hostile), 0);
            Tree { nodes, depth }
        })
        .collect();
    let forest = Forest {
        input: "x".to_string(),
        features,
        outputs: vec![("y".to_string(), Yield::Scores)],
        targets,
        classes: None,
        scale: 1.0,
        aggregate,
        post_transform,
        base_values,
        trees,
    };
    let outside = forest
        .trees
        .iter()
        .flat_map(|t| &t.nodes)
        .any(|n| matches!(n, Node::Branch { feature, .. } if *feature >= features));
    let compiled = match CompiledForest::new(forest.clone()) {
        Ok(compiled) => compiled,
        Err(e) => {
            assert!(outside, "a forest within its row was refused: {e}");
            return;
        }
    };
    assert!(!outside, "a feature outside the row was accepted");
    let rows = 1 + d.below(4);
    let input: Vec<f32> = (0..rows * features).map(|_| d.float()).collect();
    let mut output = vec![0.0f32; rows * targets];
    let mut labels = vec![0i64; rows];
    let (mut scores, mut given) = (vec![0.0f32; targets], vec![false; targets]);
    compiled.run(
        &input,
        rows,
        &mut output,
        &mut labels,
        &mut scores,
        &mut given,
    );
    for (r, row) in input.chunks_exact(features).enumerate() {
        let (want, _) = forest.evaluate(row);
        let got = &output[r * targets..(r + 1) * targets];
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "row {r}: compiled {got:?}, the plain walk {want:?}"
            );
        }
    }
}
