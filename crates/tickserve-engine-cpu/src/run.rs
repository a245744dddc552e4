//! One bucket's forward pass: every value of the plan in a buffer of its
//! own, allocated when the model loads, and the steps run in order over
//! them. What the steps need that depends only on the plan (a rearrange's
//! index table, a product's folded bias) is worked out once ([`Prepared`]).

use tickserve_plan::plan::{BinaryOp, Conv1d, Elementwise, Op, Plan, Step};
use tickserve_plan::reference;

use crate::kernels::{self, Isa, Product};
use crate::packed::{Packed, StepWeights};
use crate::recurrent::{self, Scratch};

/// What a step needs beyond the plan, worked out once per model.
#[derive(Debug)]
pub enum Prepared {
    /// Nothing.
    Nothing,
    /// A product whose epilogue starts with a bias add: the result starts
    /// from the bias (its first epilogue operation is skipped).
    BiasFirst,
    /// For each element of an output row, the element of the input row a
    /// rearrange reads.
    Table(Vec<usize>),
}

impl Prepared {
    /// What `step` needs (`plan` gives the widths).
    pub fn new(plan: &Plan, step: &Step) -> Prepared {
        match &step.op {
            Op::MatMul { n, .. } => match step.epilogue.first() {
                Some(Elementwise::Weight {
                    op: BinaryOp::Add,
                    period,
                    reversed: false,
                    ..
                }) if period == n => Prepared::BiasFirst,
                _ => Prepared::Nothing,
            },
            Op::Rearrange {
                dims,
                strides,
                offset,
                ..
            } => Prepared::Table(
                (0..plan.values[step.output].width)
                    .map(|j| reference::rearranged(j, dims, strides, *offset))
                    .collect(),
            ),
            _ => Prepared::Nothing,
        }
    }
}

/// One bucket's buffers.
#[derive(Debug)]
pub struct Bucket {
    /// Batch rows.
    pub rows: usize,
    /// Every value of the plan, `rows × width` floats.
    pub values: Vec<Vec<f32>>,
    /// Per step: a recurrent layer's scratch.
    scratch: Vec<Option<Scratch>>,
}

impl Bucket {
    /// The buffers for `rows` rows of `plan`.
    pub fn new(plan: &Plan, rows: usize) -> Bucket {
        Bucket {
            rows,
            values: plan
                .values
                .iter()
                .map(|v| vec![0.0f32; rows * v.width])
                .collect(),
            scratch: plan
                .steps
                .iter()
                .map(|s| match &s.op {
                    Op::Recurrent(layer) => Some(Scratch::new(layer, rows)),
                    _ => None,
                })
                .collect(),
        }
    }

    /// Runs `plan` with `member`'s weights on what the input values hold,
    /// over their first `rows` rows (at most the bucket's; the rest is
    /// padding, left as it was).
    pub fn run(
        &mut self,
        plan: &Plan,
        prepared: &[Prepared],
        member: &Packed,
        isa: Isa,
        rows: usize,
    ) {
        let rows = rows.min(self.rows);
        for (index, (step, prepared)) in plan.steps.iter().zip(prepared).enumerate() {
            let mut out = std::mem::take(&mut self.values[step.output]);
            let width = plan.values[step.output].width;
            let live = &mut out[..rows * width];
            let skip = self.step(plan, (index, rows), step, prepared, member, isa, live);
            epilogue(&step.epilogue[skip..], &member.slots, isa, live, width);
            self.values[step.output] = out;
        }
    }

    /// Runs `step` (the plan's `index`th) over the first `rows` rows into
    /// `out` (theirs); returns how many of its epilogue's operations it
    /// carried out itself.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        plan: &Plan,
        (index, rows): (usize, usize),
        step: &Step,
        prepared: &Prepared,
        member: &Packed,
        isa: Isa,
        out: &mut [f32],
    ) -> usize {
        let values = &self.values;
        match &step.op {
            Op::MatMul {
                input,
                groups,
                k,
                n,
                ..
            } => {
                let folded = match (prepared, step.epilogue.first()) {
                    (
                        Prepared::BiasFirst,
                        Some(Elementwise::Weight {
                            weight: bias, coef, ..
                        }),
                    ) => {
                        let bias = &member.slots[*bias];
                        for chunk in out.chunks_exact_mut(*n) {
                            for (o, b) in chunk.iter_mut().zip(bias) {
                                *o = coef * b;
                            }
                        }
                        1
                    }
                    _ => {
                        out.fill(0.0);
                        0
                    }
                };
                // Packed for every member (`Packed::new`): never missing.
                let Some(StepWeights::Matrix(w)) = &member.steps[index] else {
                    return folded;
                };
                kernels::product(
                    isa,
                    &Product {
                        x: &values[*input],
                        x_stride: *k,
                        rows: rows * groups,
                        w,
                        columns: 0..*n,
                    },
                    out,
                    *n,
                );
                folded
            }
            Op::Binary { a, b, op } => {
                for ((o, a), b) in out.iter_mut().zip(&values[*a]).zip(&values[*b]) {
                    *o = op.apply(*a, *b);
                }
                0
            }
            Op::Copy { input } => {
                out.copy_from_slice(&values[*input][..out.len()]);
                0
            }
            Op::Rearrange { input, .. } => {
                if let Prepared::Table(table) = prepared {
                    let (width, in_width) = (table.len(), plan.values[*input].width);
                    for (row, o) in out.chunks_exact_mut(width.max(1)).enumerate() {
                        let x = &values[*input][row * in_width..(row + 1) * in_width];
                        for (o, &at) in o.iter_mut().zip(table) {
                            *o = x[at];
                        }
                    }
                }
                0
            }
            Op::Concat {
                inputs,
                outer,
                chunks,
            } => {
                reference::concat(out, values, inputs, rows, *outer, chunks);
                0
            }
            Op::Conv1d(conv) => {
                let width = plan.values[step.output].width;
                let in_width = conv.channels * conv.length;
                for row in 0..rows {
                    convolve(
                        conv,
                        &member.slots[conv.weight],
                        &values[conv.input][row * in_width..(row + 1) * in_width],
                        &mut out[row * width..(row + 1) * width],
                    );
                }
                0
            }
            Op::Softmax { input, segment } => {
                reference::softmax(out, &values[*input], *segment);
                0
            }
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            } => {
                reference::layer_norm(
                    out,
                    &values[*input],
                    &member.slots[*scale],
                    bias.map(|b| member.slots[b].as_slice()),
                    *epsilon,
                    *segment,
                );
                0
            }
            Op::Recurrent(layer) => {
                let Some(StepWeights::Recurrent(weights)) = &member.steps[index] else {
                    return 0;
                };
                let mut sequence = layer.sequence.map(|v| std::mem::take(&mut self.values[v]));
                let mut last_c = layer.last_c.map(|v| std::mem::take(&mut self.values[v]));
                if let Some(scratch) = self.scratch[index].as_mut() {
                    let values = &self.values;
                    recurrent::run(
                        isa,
                        layer,
                        weights,
                        rows,
                        recurrent::Operands {
                            input: &values[layer.input],
                            initial_h: layer.initial_h.map(|v| values[v].as_slice()),
                            initial_c: layer.initial_c.map(|v| values[v].as_slice()),
                            last_h: out,
                            sequence: sequence.as_deref_mut(),
                            last_c: last_c.as_deref_mut(),
                        },
                        scratch,
                    );
                }
                if let (Some(v), Some(buffer)) = (layer.sequence, sequence) {
                    self.values[v] = buffer;
                }
                if let (Some(v), Some(buffer)) = (layer.last_c, last_c) {
                    self.values[v] = buffer;
                }
                0
            }
        }
    }
}

/// One row's convolution: `out[m, l] = Σ_c Σ_k x[c, l·stride + k·dilation −
/// pad] · w[m, c, k]` over the channels of `m`'s group.
fn convolve(conv: &Conv1d, w: &[f32], x: &[f32], out: &mut [f32]) {
    let per_group = conv.channels / conv.groups.max(1);
    let outs_per_group = conv.out_channels / conv.groups.max(1);
    for (m, out) in out.chunks_exact_mut(conv.out_length.max(1)).enumerate() {
        let first = (m / outs_per_group.max(1)) * per_group;
        for (l, o) in out.iter_mut().enumerate() {
            let mut sum = 0.0f32;
            for c in 0..per_group {
                let x = &x[(first + c) * conv.length..(first + c + 1) * conv.length];
                let w =
                    &w[(m * per_group + c) * conv.kernel..(m * per_group + c + 1) * conv.kernel];
                for (k, w) in w.iter().enumerate() {
                    let at = (l * conv.stride + k * conv.dilation).checked_sub(conv.pad);
                    if let Some(x) = at.and_then(|at| x.get(at)) {
                        sum += x * w;
                    }
                }
            }
            *o = sum;
        }
    }
}

/// Applies `chain` to every element of `out` (rows of `width`).
fn epilogue(chain: &[Elementwise], slots: &[Vec<f32>], isa: Isa, out: &mut [f32], width: usize) {
    for e in chain {
        match *e {
            // NaN stays NaN, as in ONNX Runtime (`f32::max` would give 0).
            Elementwise::Relu => out
                .iter_mut()
                .for_each(|x| *x = if *x < 0.0 { 0.0 } else { *x }),
            Elementwise::LeakyRelu(alpha) => out
                .iter_mut()
                .for_each(|x| *x = if *x >= 0.0 { *x } else { alpha * *x }),
            Elementwise::Tanh => kernels::tanh::<false>(isa, out),
            Elementwise::Sigmoid => kernels::sigmoid::<false>(isa, out),
            Elementwise::Scale(factor) => out.iter_mut().for_each(|x| *x *= factor),
            Elementwise::Weight {
                op,
                weight,
                period,
                reversed,
                coef,
            } => {
                let w = &slots[weight];
                let apply = |x: f32, w: f32| {
                    let w = coef * w;
                    if reversed {
                        op.apply(w, x)
                    } else {
                        op.apply(x, w)
                    }
                };
                if period == width {
                    for row in out.chunks_exact_mut(width.max(1)) {
                        for (x, w) in row.iter_mut().zip(w) {
                            *x = apply(*x, *w);
                        }
                    }
                } else {
                    for row in out.chunks_exact_mut(width.max(1)) {
                        for (j, x) in row.iter_mut().enumerate() {
                            *x = apply(*x, w[j % period.max(1)]);
                        }
                    }
                }
            }
            Elementwise::ChannelBias { .. } | Elementwise::BatchNorm { .. } => {
                for row in out.chunks_exact_mut(width.max(1)) {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = reference::apply(std::slice::from_ref(e), slots, *x, j);
                    }
                }
            }
        }
    }
}
