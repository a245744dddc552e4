//! A [`Plan`] evaluated in plain Rust on the CPU, one element at a time: the
//! meaning the importer is tested against (ONNX Runtime on the same model)
//! and the kernels are tested against (the GPU tests).

use crate::plan::{Elementwise, Op, Plan};

/// Applies `chain` to `x`, the element at `column` of its row.
pub fn apply(chain: &[Elementwise], weights: &[Vec<f32>], mut x: f32, column: usize) -> f32 {
    for e in chain {
        x = match *e {
            Elementwise::Relu => x.max(0.0),
            Elementwise::LeakyRelu(alpha) => {
                if x >= 0.0 {
                    x
                } else {
                    alpha * x
                }
            }
            Elementwise::Tanh => x.tanh(),
            Elementwise::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Elementwise::Scale(factor) => factor * x,
            Elementwise::Weight {
                op,
                weight,
                period,
                reversed,
                coef,
            } => {
                let w = coef * weights[weight][column % period];
                if reversed {
                    op.apply(w, x)
                } else {
                    op.apply(x, w)
                }
            }
            Elementwise::BatchNorm {
                scale,
                bias,
                mean,
                var,
                epsilon,
                channels,
                inner,
            } => {
                let c = (column / inner) % channels;
                (x - weights[mean][c]) / (weights[var][c] + epsilon).sqrt() * weights[scale][c]
                    + weights[bias][c]
            }
        };
    }
    x
}

/// Runs `plan` on `rows` batch rows of `inputs` (one slice per plan input,
/// `rows × width` floats) with `weights` in slot order; returns each output.
pub fn run(plan: &Plan, weights: &[Vec<f32>], inputs: &[&[f32]], rows: usize) -> Vec<Vec<f32>> {
    let mut values: Vec<Vec<f32>> = plan.values.iter().map(|_| Vec::new()).collect();
    for ((_, value), data) in plan.inputs.iter().zip(inputs) {
        values[*value] = data.to_vec();
    }
    for step in &plan.steps {
        let width = plan.values[step.output].width;
        let mut out = vec![0.0f32; rows * width];
        match &step.op {
            Op::MatMul {
                input,
                weight,
                transposed,
                groups,
                k,
                n,
            } => {
                let x = &values[*input];
                let w = &weights[*weight];
                for m in 0..rows * groups {
                    for j in 0..*n {
                        let mut sum = 0.0f32;
                        for i in 0..*k {
                            let wij = if *transposed {
                                w[j * k + i]
                            } else {
                                w[i * n + j]
                            };
                            sum += x[m * k + i] * wij;
                        }
                        out[m * n + j] = sum;
                    }
                }
            }
            Op::Binary { a, b, op } => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = op.apply(values[*a][i], values[*b][i]);
                }
            }
            Op::Copy { input } => out.copy_from_slice(&values[*input]),
            Op::Softmax { input, segment } => {
                for (o, x) in out
                    .chunks_mut(*segment)
                    .zip(values[*input].chunks(*segment))
                {
                    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f32 = x.iter().map(|v| (v - max).exp()).sum();
                    for (o, v) in o.iter_mut().zip(x) {
                        *o = (v - max).exp() / sum;
                    }
                }
            }
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            } => {
                for (o, x) in out
                    .chunks_mut(*segment)
                    .zip(values[*input].chunks(*segment))
                {
                    let mean = x.iter().sum::<f32>() / *segment as f32;
                    let var =
                        x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / *segment as f32;
                    let inv = 1.0 / (var + epsilon).sqrt();
                    for (i, (o, v)) in o.iter_mut().zip(x).enumerate() {
                        let b = bias.map_or(0.0, |b| weights[b][i]);
                        *o = (v - mean) * inv * weights[*scale][i] + b;
                    }
                }
            }
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = apply(&step.epilogue, weights, *o, i % width);
        }
        values[step.output] = out;
    }
    plan.outputs
        .iter()
        .map(|(_, v)| values[*v].clone())
        .collect()
}
