//! A [`Plan`] evaluated in plain Rust on the CPU, one element at a time: the
//! meaning the importer is tested against (ONNX Runtime on the same model)
//! and the kernels are tested against (the GPU tests).

use crate::plan::{Cell, Conv1d, Elementwise, Op, Plan, Recurrent, ValueId};

/// `len` deterministic pseudo-random floats in [-2, 2) from `seed`: the
/// inputs a plan and ONNX Runtime are compared on.
pub fn random_rows(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

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
            Elementwise::ChannelBias {
                bias,
                channels,
                inner,
            } => x + weights[bias][(column / inner) % channels],
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
            Op::Rearrange {
                input,
                dims,
                strides,
                offset,
            } => {
                let x = &values[*input];
                let in_width = plan.values[*input].width;
                for (row, o) in out.chunks_mut(width.max(1)).enumerate() {
                    let x = &x[row * in_width..(row + 1) * in_width];
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = x[rearranged(j, dims, strides, *offset)];
                    }
                }
            }
            Op::Concat {
                inputs,
                outer,
                chunks,
            } => {
                concat(&mut out, &values, inputs, rows, *outer, chunks);
            }
            Op::Conv1d(conv) => {
                let x = &values[conv.input];
                for row in 0..rows {
                    let x = &x[row * conv.channels * conv.length..];
                    let o = &mut out[row * width..(row + 1) * width];
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = convolved(conv, &weights[conv.weight], x, j);
                    }
                }
            }
            Op::Recurrent(layer) => {
                let (sequence, last_c) = recurrent(layer, &values, weights, rows, &mut out);
                if let Some(v) = layer.sequence {
                    values[v] = sequence;
                }
                if let Some(v) = layer.last_c {
                    values[v] = last_c;
                }
            }
            Op::Softmax { input, segment } => softmax(&mut out, &values[*input], *segment),
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            } => layer_norm(
                &mut out,
                &values[*input],
                &weights[*scale],
                bias.map(|b| weights[b].as_slice()),
                *epsilon,
                *segment,
            ),
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

/// [`Op::Concat`] over `rows` rows: each output row is, for each of
/// `outer` blocks, `chunks[i]` floats of value `inputs[i]` (of `values`)
/// in turn.
pub fn concat(
    out: &mut [f32],
    values: &[Vec<f32>],
    inputs: &[ValueId],
    rows: usize,
    outer: usize,
    chunks: &[usize],
) {
    let mut at = 0;
    for row in 0..rows {
        for block in 0..outer {
            for (input, &chunk) in inputs.iter().zip(chunks) {
                let from = (row * outer + block) * chunk;
                out[at..at + chunk].copy_from_slice(&values[*input][from..from + chunk]);
                at += chunk;
            }
        }
    }
}

/// [`Op::Softmax`]: softmax over each `segment` floats of `x`, into `out`.
pub fn softmax(out: &mut [f32], x: &[f32], segment: usize) {
    for (o, x) in out.chunks_mut(segment).zip(x.chunks(segment)) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = x.iter().map(|v| (v - max).exp()).sum();
        for (o, v) in o.iter_mut().zip(x) {
            *o = (v - max).exp() / sum;
        }
    }
}

/// [`Op::LayerNorm`] over each `segment` floats of `x`, into `out`.
pub fn layer_norm(
    out: &mut [f32],
    x: &[f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    epsilon: f32,
    segment: usize,
) {
    for (o, x) in out.chunks_mut(segment).zip(x.chunks(segment)) {
        let mean = x.iter().sum::<f32>() / segment as f32;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / segment as f32;
        let inv = 1.0 / (var + epsilon).sqrt();
        for (i, (o, v)) in o.iter_mut().zip(x).enumerate() {
            let b = bias.map_or(0.0, |b| b[i]);
            *o = (v - mean) * inv * scale[i] + b;
        }
    }
}

/// The input element that output element `j` of a [`Op::Rearrange`] reads.
pub fn rearranged(j: usize, dims: &[usize], strides: &[isize], offset: usize) -> usize {
    let mut rest = j;
    let mut at = offset as isize;
    for (&d, &stride) in dims.iter().zip(strides).rev() {
        at += (rest % d) as isize * stride;
        rest /= d;
    }
    at as usize
}

/// `Σ_i x[i] · w[row · len + i]`: one element of `x · Wᵀ`.
fn dot(x: &[f32], w: &[f32], row: usize) -> f32 {
    let len = x.len();
    x.iter()
        .zip(&w[row * len..(row + 1) * len])
        .map(|(a, b)| a * b)
        .sum()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Runs a recurrent layer over `rows` windows: writes the last hidden
/// states into `last_h`; returns every step's hidden state and the last
/// cell states (`rows × steps × hidden` and `rows × hidden`).
fn recurrent(
    layer: &Recurrent,
    values: &[Vec<f32>],
    weights: &[Vec<f32>],
    rows: usize,
    last_h: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    let (steps, size, hidden) = (layer.steps, layer.input_size, layer.hidden);
    let gates = layer.cell.gates();
    let (w, r) = (&weights[layer.w], &weights[layer.r]);
    let zeros = vec![0.0f32; 2 * gates * hidden];
    let b = layer.b.map_or(&zeros, |b| &weights[b]);
    let (wb, rb) = b.split_at(gates * hidden);
    let mut sequence = vec![0.0f32; rows * steps * hidden];
    let mut cells = vec![0.0f32; rows * hidden];
    for row in 0..rows {
        let state = |v: Option<usize>| {
            v.map_or_else(
                || vec![0.0f32; hidden],
                |v| values[v][row * hidden..(row + 1) * hidden].to_vec(),
            )
        };
        let (mut h, mut c) = (state(layer.initial_h), state(layer.initial_c));
        for t in 0..steps {
            let x = &values[layer.input][(row * steps + t) * size..(row * steps + t + 1) * size];
            let xw: Vec<f32> = (0..gates * hidden).map(|g| dot(x, w, g) + wb[g]).collect();
            h = match layer.cell {
                Cell::Lstm => {
                    let gate = |k: usize, u: usize| {
                        let g = k * hidden + u;
                        xw[g] + dot(&h, r, g) + rb[g]
                    };
                    (0..hidden)
                        .map(|u| {
                            let i = sigmoid(gate(0, u));
                            let o = sigmoid(gate(1, u));
                            let f = sigmoid(gate(2, u));
                            c[u] = f * c[u] + i * gate(3, u).tanh();
                            o * c[u].tanh()
                        })
                        .collect()
                }
                Cell::Gru {
                    linear_before_reset,
                } => {
                    let sig = |g: usize| sigmoid(xw[g] + dot(&h, r, g) + rb[g]);
                    let z: Vec<f32> = (0..hidden).map(sig).collect();
                    let reset: Vec<f32> = (hidden..2 * hidden).map(sig).collect();
                    let rh: Vec<f32> = h.iter().zip(&reset).map(|(h, r)| h * r).collect();
                    (0..hidden)
                        .map(|u| {
                            let g = 2 * hidden + u;
                            let candidate = if linear_before_reset {
                                xw[g] + reset[u] * (dot(&h, r, g) + rb[g])
                            } else {
                                xw[g] + dot(&rh, r, g) + rb[g]
                            };
                            (1.0 - z[u]) * candidate.tanh() + z[u] * h[u]
                        })
                        .collect()
                }
            };
            sequence[(row * steps + t) * hidden..(row * steps + t + 1) * hidden]
                .copy_from_slice(&h);
        }
        last_h[row * hidden..(row + 1) * hidden].copy_from_slice(&h);
        cells[row * hidden..(row + 1) * hidden].copy_from_slice(&c);
    }
    (sequence, cells)
}

/// Output element `j` (channel `j / out_length`, position `j % out_length`)
/// of a [`Op::Conv1d`] over one row `x`.
fn convolved(conv: &Conv1d, w: &[f32], x: &[f32], j: usize) -> f32 {
    let (m, l) = (j / conv.out_length, j % conv.out_length);
    let per_group = conv.channels / conv.groups;
    let first = (m / (conv.out_channels / conv.groups)) * per_group;
    let mut sum = 0.0f32;
    for c in 0..per_group {
        for k in 0..conv.kernel {
            let at = (l * conv.stride + k * conv.dilation) as isize - conv.pad as isize;
            if at >= 0 && (at as usize) < conv.length {
                sum += x[(first + c) * conv.length + at as usize]
                    * w[(m * per_group + c) * conv.kernel + k];
            }
        }
    }
    sum
}
