//! A [`Forest`] laid out for one row at a time: every node of every tree in
//! one array of 16-byte nodes (feature, threshold, the two children), a
//! leaf pointing to itself both ways, so a tree is walked without a branch
//! on the node's kind: `depth` steps of load, compare, select. Trees are
//! walked eight at a time, interleaved, so the CPU overlaps their eight
//! chains of dependent loads; the leaves' weights are then added in the
//! trees' order (the order ONNX Runtime adds them in on one thread); the
//! last group is filled up with a leaf of no weight, so every loop has fixed
//! bounds and the eight positions stay in registers. The
//! comparison is compiled per mode where every branch has one (as every
//! exporter writes them), read per node otherwise; where every branch also
//! sends NaN the same way (LightGBM's and XGBoost's mostly do), the NaN test
//! is folded into the comparison (`x <= t` or NaN is `!(x > t)`), one
//! comparison a node.

use tickserve_plan::forest::{Aggregate, Forest, Mode, Node};

/// Trees walked together.
const GROUP: usize = 8;
/// Set in [`Flat::feature`] when a NaN feature goes to the true child.
const MISSING_TRUE: u32 = 1 << 31;

/// One node.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Flat {
    /// The feature read (and [`MISSING_TRUE`]); 0 for a leaf.
    feature: u32,
    /// The threshold; NaN for a leaf (whichever way it goes, it stays).
    threshold: f32,
    /// The child when the comparison fails, and when it holds.
    next: [u32; 2],
}

/// A forest ready to run.
#[derive(Debug)]
pub struct CompiledForest {
    forest: Forest,
    nodes: Vec<Flat>,
    /// Per node, its comparison, when the branches do not share one.
    modes: Option<Vec<Mode>>,
    /// The branches' one comparison.
    mode: Mode,
    /// Whether every branch sends a NaN to its true child (`Some(true)`),
    /// or every one to its false child; the nodes then carry no flag.
    missing: Option<bool>,
    roots: Vec<u32>,
    /// Per group of [`GROUP`] trees, its deepest tree's depth.
    depths: Vec<usize>,
    /// Per node, its weight (a single target, summed or averaged).
    value: Vec<f32>,
    /// Per node, its leaf's weights in `weights` (any other case).
    ranges: Vec<(u32, u32)>,
    weights: Vec<(usize, f32)>,
    /// A single target's weights are summed: the path that reads `value`.
    summed: bool,
}

/// Why a forest is too large for the layout (node indices are 31-bit).
fn too_large() -> String {
    "the forest has more than 2^31 nodes".to_string()
}

impl CompiledForest {
    /// Lays `forest` out.
    pub fn new(forest: Forest) -> Result<CompiledForest, String> {
        let total: usize = forest.trees.iter().map(|t| t.nodes.len()).sum();
        if total >= MISSING_TRUE as usize {
            return Err(too_large());
        }
        let mut nodes = Vec::with_capacity(total);
        let mut modes = Vec::with_capacity(total);
        let mut value = Vec::with_capacity(total);
        let mut ranges = Vec::with_capacity(total);
        let mut weights = Vec::new();
        let mut roots = Vec::with_capacity(forest.trees.len());
        for tree in &forest.trees {
            let base = nodes.len();
            let id = |i: usize| u32::try_from(base + i).map_err(|_| too_large());
            roots.push(id(0)?);
            for (i, node) in tree.nodes.iter().enumerate() {
                match node {
                    Node::Branch {
                        feature,
                        threshold,
                        mode,
                        missing_true,
                        on_true,
                        on_false,
                    } => {
                        let feature = u32::try_from(*feature).map_err(|_| too_large())?;
                        nodes.push(Flat {
                            feature: feature | if *missing_true { MISSING_TRUE } else { 0 },
                            threshold: *threshold,
                            next: [id(*on_false)?, id(*on_true)?],
                        });
                        modes.push(*mode);
                        value.push(0.0);
                        ranges.push((0, 0));
                    }
                    Node::Leaf(leaf) => {
                        let me = id(i)?;
                        nodes.push(Flat {
                            feature: 0,
                            threshold: f32::NAN,
                            next: [me, me],
                        });
                        modes.push(Mode::Leq);
                        value.push(leaf.first().map_or(0.0, |(_, w)| *w));
                        let start = u32::try_from(weights.len()).map_err(|_| too_large())?;
                        weights.extend_from_slice(leaf);
                        let end = u32::try_from(weights.len()).map_err(|_| too_large())?;
                        ranges.push((start, end));
                    }
                }
            }
        }
        // A leaf of no weight that the last group's missing trees stand on:
        // every group is a full eight, and the walk's loops have fixed bounds.
        let sentinel = u32::try_from(nodes.len()).map_err(|_| too_large())?;
        nodes.push(Flat {
            feature: 0,
            threshold: f32::NAN,
            next: [sentinel, sentinel],
        });
        modes.push(Mode::Leq);
        value.push(0.0);
        ranges.push((0, 0));
        while roots.len() % GROUP != 0 {
            roots.push(sentinel);
        }
        let mut branch_modes = forest.trees.iter().flat_map(|t| {
            t.nodes.iter().filter_map(|n| match n {
                Node::Branch { mode, .. } => Some(*mode),
                Node::Leaf(_) => None,
            })
        });
        let first = branch_modes.next().unwrap_or(Mode::Leq);
        let uniform = branch_modes.all(|m| m == first);
        // Whether every branch sends NaN the same way: then the flag is
        // dropped from the nodes and folded into the comparison.
        let mut missing = forest.trees.iter().flat_map(|t| {
            t.nodes.iter().filter_map(|n| match n {
                Node::Branch { missing_true, .. } => Some(*missing_true),
                Node::Leaf(_) => None,
            })
        });
        let first_missing = missing.next().unwrap_or(false);
        let missing = (uniform && missing.all(|m| m == first_missing)).then_some(first_missing);
        if missing.is_some() {
            for node in &mut nodes {
                node.feature &= !MISSING_TRUE;
            }
        }
        let depths = forest
            .trees
            .chunks(GROUP)
            .map(|g| g.iter().map(|t| t.depth).max().unwrap_or(0))
            .collect();
        let summed =
            forest.targets == 1 && matches!(forest.aggregate, Aggregate::Sum | Aggregate::Average);
        // What the walk reads without bounds checks: every child and root a
        // node of the array, every feature one of the row's.
        let within = |i: u32| (i as usize) < nodes.len();
        let sound = forest.features > 0
            && roots.iter().all(|&r| within(r))
            && nodes.iter().all(|n| {
                n.next.iter().all(|&c| within(c))
                    && ((n.feature & !MISSING_TRUE) as usize) < forest.features
            });
        if !sound {
            return Err("the forest's nodes do not stay within it".to_string());
        }
        Ok(CompiledForest {
            nodes,
            modes: (!uniform).then_some(modes),
            mode: first,
            missing,
            roots,
            depths,
            value,
            ranges,
            weights,
            summed,
            forest,
        })
    }

    /// The input's floats per row.
    pub fn features(&self) -> usize {
        self.forest.features
    }

    /// The output's floats per row.
    pub fn targets(&self) -> usize {
        self.forest.targets
    }

    /// The forest it runs.
    pub fn forest(&self) -> &Forest {
        &self.forest
    }

    /// Runs `rows` rows of `input` into `output` (`targets` a row) and
    /// `labels` (a classifier's, one a row); `scores` and `given` are
    /// `targets` long (scratch).
    #[allow(
        clippy::neg_cmp_op_on_partial_ord,
        reason = "`!(x > t)` is true for a NaN, which is the point: `x <= t` or missing"
    )]
    pub fn run(
        &self,
        input: &[f32],
        rows: usize,
        output: &mut [f32],
        labels: &mut [i64],
        scores: &mut [f32],
        given: &mut [bool],
    ) {
        let (features, targets) = (self.forest.features, self.forest.targets);
        for ((row, out), label) in input
            .chunks_exact(features) // each row exactly as long as the walk reads
            .zip(output.chunks_exact_mut(targets))
            .zip(labels.iter_mut())
            .take(rows)
        {
            scores.fill(0.0);
            given.fill(false);
            // A comparison is false for a NaN but `!=`; `!(x > t)` is
            // `x <= t` or a NaN.
            match (&self.modes, self.mode, self.missing) {
                (Some(modes), _, _) => {
                    self.walk::<true>(row, scores, given, |i, x, t| modes[i].holds(x, t))
                }
                (None, Mode::Leq, Some(true)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| !(x > t))
                }
                (None, Mode::Lt, Some(true)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| !(x >= t))
                }
                (None, Mode::Gte, Some(true)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| !(x < t))
                }
                (None, Mode::Gt, Some(true)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| !(x <= t))
                }
                (None, Mode::Eq, Some(true)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x == t || x.is_nan())
                }
                (None, Mode::Leq, Some(false)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x <= t)
                }
                (None, Mode::Lt, Some(false)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x < t)
                }
                (None, Mode::Gte, Some(false)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x >= t)
                }
                (None, Mode::Gt, Some(false)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x > t)
                }
                (None, Mode::Eq, Some(false)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x == t)
                }
                (None, Mode::Neq, Some(_)) => {
                    self.walk::<false>(row, scores, given, |_, x, t| x != t)
                }
                (None, Mode::Leq, None) => self.walk::<true>(row, scores, given, |_, x, t| x <= t),
                (None, Mode::Lt, None) => self.walk::<true>(row, scores, given, |_, x, t| x < t),
                (None, Mode::Gte, None) => self.walk::<true>(row, scores, given, |_, x, t| x >= t),
                (None, Mode::Gt, None) => self.walk::<true>(row, scores, given, |_, x, t| x > t),
                (None, Mode::Eq, None) => self.walk::<true>(row, scores, given, |_, x, t| x == t),
                (None, Mode::Neq, None) => self.walk::<true>(row, scores, given, |_, x, t| x != t),
            }
            *label = self.forest.finish(scores, given, out);
        }
    }

    /// Walks every tree for `row`, eight at a time, and combines the leaves;
    /// `FLAGGED`: the nodes carry [`MISSING_TRUE`] (else `holds` decides a
    /// NaN too).
    #[inline(always)]
    fn walk<const FLAGGED: bool>(
        &self,
        row: &[f32],
        scores: &mut [f32],
        given: &mut [bool],
        holds: impl Fn(usize, f32, f32) -> bool,
    ) {
        let nodes = self.nodes.as_slice();
        let mut sum = 0.0f32;
        for (roots, &depth) in self.roots.chunks_exact(GROUP).zip(&self.depths) {
            let mut at = [0u32; GROUP];
            at.copy_from_slice(roots);
            for _ in 0..depth {
                for a in &mut at {
                    // SAFETY: `new` proved every root and child an index of
                    // `nodes`; `at` starts at roots and moves to children.
                    let node = unsafe { *nodes.get_unchecked(*a as usize) };
                    let feature = if FLAGGED {
                        (node.feature & !MISSING_TRUE) as usize
                    } else {
                        node.feature as usize
                    };
                    // SAFETY: `new` proved every feature below `features`,
                    // the length of every row `run` passes.
                    let x = unsafe { *row.get_unchecked(feature) };
                    let go = if FLAGGED {
                        holds(*a as usize, x, node.threshold)
                            | ((node.feature & MISSING_TRUE != 0) & x.is_nan())
                    } else {
                        holds(*a as usize, x, node.threshold)
                    };
                    *a = node.next[usize::from(go)];
                }
            }
            if self.summed {
                for &a in at.iter() {
                    sum += self.value[a as usize];
                }
            } else {
                for &a in at.iter() {
                    let (start, end) = self.ranges[a as usize];
                    self.forest
                        .combine(&self.weights[start as usize..end as usize], scores, given);
                }
            }
        }
        if self.summed {
            scores[0] = sum;
            given[0] = true;
        }
    }
}
