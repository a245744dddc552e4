//! A member's weights as the kernels read them, made once when the member
//! joins: each product's matrix `[k, n]` in [`Panels`] (Gemm's `transB` and
//! ONNX's recurrent `[gates · hidden, in]` matrices transposed on the way),
//! a recurrent layer's two biases summed where the cell adds them anyway.
//! Every slot is kept as it came too (elementwise steps read them).

use tickserve_plan::plan::{Cell, Op, Plan};

use crate::kernels::Panels;

/// One member's weights.
#[derive(Debug)]
pub struct Packed {
    /// Every slot as floats, in slot order (what elementwise steps read).
    pub slots: Vec<Vec<f32>>,
    /// Per step of the plan, what its kernel reads, if anything is packed.
    pub steps: Vec<Option<StepWeights>>,
}

/// The weights of one step, packed.
#[derive(Debug)]
pub enum StepWeights {
    /// A product's matrix, `[k, n]`.
    Matrix(Panels),
    /// A recurrent layer's.
    Recurrent(RecurrentWeights),
}

/// A recurrent layer's weights, packed.
#[derive(Debug)]
pub struct RecurrentWeights {
    /// Input weights, `[input_size, gates · hidden]`.
    pub w: Panels,
    /// Recurrent weights, `[hidden, gates · hidden]`.
    pub r: Panels,
    /// Added to `x · W` (`gates · hidden`): both biases for an LSTM and a
    /// GRU's update and reset gates, the input's alone for its candidate.
    pub input_bias: Vec<f32>,
    /// Added to `h · R` (`gates · hidden`): a GRU's candidate's recurrent
    /// bias, zero elsewhere (the candidate's recurrent part is reset-gated).
    pub recurrent_bias: Vec<f32>,
}

impl Packed {
    /// Packs `slots` (a member's weights in `plan`'s slot order, as
    /// `tickserve_plan::arrange` gives them) for `plan`'s steps.
    pub fn new(plan: &Plan, slots: Vec<Vec<f32>>) -> Packed {
        let steps = plan
            .steps
            .iter()
            .map(|step| match &step.op {
                Op::MatMul {
                    weight,
                    transposed,
                    k,
                    n,
                    ..
                } => Some(StepWeights::Matrix(match transposed {
                    true => Panels::transposed(&slots[*weight], *k, *n),
                    false => Panels::row_major(&slots[*weight], *k, *n),
                })),
                Op::Recurrent(layer) => {
                    let (gates, hidden) = (layer.cell.gates(), layer.hidden);
                    let width = gates * hidden;
                    let mut input_bias = vec![0.0f32; width];
                    let mut recurrent_bias = vec![0.0f32; width];
                    if let Some(b) = layer.b {
                        let (wb, rb) = slots[b].split_at(width);
                        input_bias.copy_from_slice(wb);
                        // A GRU's candidate keeps its recurrent bias apart:
                        // the reset gate multiplies it (linear before reset)
                        // or it follows the reset product.
                        let apart = match layer.cell {
                            Cell::Lstm => width,
                            Cell::Gru { .. } => 2 * hidden,
                        };
                        for (i, (x, r)) in input_bias.iter_mut().zip(rb).enumerate() {
                            if i < apart {
                                *x += r;
                            } else {
                                recurrent_bias[i] = *r;
                            }
                        }
                    }
                    Some(StepWeights::Recurrent(RecurrentWeights {
                        w: Panels::transposed(&slots[layer.w], layer.input_size, width),
                        r: Panels::transposed(&slots[layer.r], hidden, width),
                        input_bias,
                        recurrent_bias,
                    }))
                }
                _ => None,
            })
            .collect();
        Packed { slots, steps }
    }
}
