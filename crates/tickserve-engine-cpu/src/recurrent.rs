//! A recurrent layer (ONNX LSTM or GRU, forward) over each row's window:
//! the inputs' product for every step at once (one product of `rows ·
//! steps` rows), then per step the recurrent product of every row at once
//! and the gate loop, on preallocated scratch.

use tickserve_plan::plan::{Cell, Recurrent};

use crate::kernels::{self, Isa, Panels, Product};
use crate::packed::RecurrentWeights;

/// A layer's working memory for one bucket.
#[derive(Debug)]
pub struct Scratch {
    /// `x · W + bias` for every row and step, `[rows · steps, gates · hidden]`.
    xw: Vec<f32>,
    /// One step's gates, `[rows, gates · hidden]`.
    gates: Vec<f32>,
    /// A GRU's `h · R + bias`, `[rows, gates · hidden]`.
    recurrent: Vec<f32>,
    /// Hidden and cell states, `[rows, hidden]`, and a row-sized spare.
    h: Vec<f32>,
    c: Vec<f32>,
    spare: Vec<f32>,
}

impl Scratch {
    /// Scratch for `layer` over `rows` rows.
    pub fn new(layer: &Recurrent, rows: usize) -> Scratch {
        let width = layer.cell.gates() * layer.hidden;
        Scratch {
            xw: vec![0.0; rows * layer.steps * width],
            gates: vec![0.0; rows * width],
            recurrent: vec![0.0; rows * width],
            h: vec![0.0; rows * layer.hidden],
            c: vec![0.0; rows * layer.hidden],
            spare: vec![0.0; rows * layer.hidden],
        }
    }
}

/// The layer's inputs and outputs for one run.
pub struct Operands<'a> {
    /// The window, `rows × steps × input_size`.
    pub input: &'a [f32],
    /// The initial hidden state, `rows × hidden`, if given.
    pub initial_h: Option<&'a [f32]>,
    /// The initial cell state, `rows × hidden`, if given.
    pub initial_c: Option<&'a [f32]>,
    /// Receives the last hidden state, `rows × hidden`.
    pub last_h: &'a mut [f32],
    /// Receives every step's hidden state, `rows × steps × hidden`, if read.
    pub sequence: Option<&'a mut [f32]>,
    /// Receives the last cell state, `rows × hidden`, if read.
    pub last_c: Option<&'a mut [f32]>,
}

/// Runs `layer` over `rows` rows.
pub fn run(
    isa: Isa,
    layer: &Recurrent,
    weights: &RecurrentWeights,
    rows: usize,
    io: Operands<'_>,
    s: &mut Scratch,
) {
    let (steps, size, hidden) = (layer.steps, layer.input_size, layer.hidden);
    let width = layer.cell.gates() * hidden;
    for row in s.xw.chunks_exact_mut(width) {
        row.copy_from_slice(&weights.input_bias);
    }
    kernels::product(
        isa,
        &Product {
            x: io.input,
            x_stride: size,
            rows: rows * steps,
            w: &weights.w,
            columns: 0..width,
        },
        &mut s.xw,
        width,
    );
    let start = |from: Option<&[f32]>, to: &mut [f32]| match from {
        Some(v) => to.copy_from_slice(&v[..to.len()]),
        None => to.fill(0.0),
    };
    start(io.initial_h, &mut s.h);
    start(io.initial_c, &mut s.c);
    let mut sequence = io.sequence;
    for t in 0..steps {
        for r in 0..rows {
            let from = (r * steps + t) * width;
            s.gates[r * width..(r + 1) * width].copy_from_slice(&s.xw[from..from + width]);
        }
        match layer.cell {
            Cell::Lstm => lstm_step(isa, weights, rows, hidden, s),
            Cell::Gru {
                linear_before_reset,
            } => gru_step(isa, weights, rows, hidden, linear_before_reset, s),
        }
        if let Some(sequence) = sequence.as_deref_mut() {
            for r in 0..rows {
                let at = (r * steps + t) * hidden;
                sequence[at..at + hidden].copy_from_slice(&s.h[r * hidden..(r + 1) * hidden]);
            }
        }
    }
    let live = rows * hidden;
    io.last_h[..live].copy_from_slice(&s.h[..live]);
    if let Some(last_c) = io.last_c {
        last_c[..live].copy_from_slice(&s.c[..live]);
    }
}

/// `h · R` over `columns` of the gates, added to `into` (rows `gates ·
/// hidden` apart).
fn recurrent_product(
    isa: Isa,
    h: &[f32],
    rows: usize,
    hidden: usize,
    r: &Panels,
    columns: std::ops::Range<usize>,
    into: &mut [f32],
) {
    let (width, first) = (r.n(), columns.start);
    kernels::product(
        isa,
        &Product {
            x: h,
            x_stride: hidden,
            rows,
            w: r,
            columns,
        },
        &mut into[first..],
        width,
    );
}

/// One LSTM step: gates `i, o, f, c`.
fn lstm_step(isa: Isa, weights: &RecurrentWeights, rows: usize, hidden: usize, s: &mut Scratch) {
    let width = 4 * hidden;
    recurrent_product(isa, &s.h, rows, hidden, &weights.r, 0..width, &mut s.gates);
    for r in 0..rows {
        let g = &mut s.gates[r * width..(r + 1) * width];
        kernels::sigmoid::<true>(isa, &mut g[..3 * hidden]);
        kernels::tanh::<true>(isa, &mut g[3 * hidden..]);
        let (i, rest) = g.split_at(hidden);
        let (o, rest) = rest.split_at(hidden);
        let (f, candidate) = rest.split_at(hidden);
        let c = &mut s.c[r * hidden..(r + 1) * hidden];
        let spare = &mut s.spare[r * hidden..(r + 1) * hidden];
        for u in 0..hidden {
            c[u] = f[u] * c[u] + i[u] * candidate[u];
            spare[u] = c[u];
        }
        kernels::tanh::<true>(isa, spare);
        let h = &mut s.h[r * hidden..(r + 1) * hidden];
        for ((h, o), t) in h.iter_mut().zip(o).zip(spare.iter()) {
            *h = o * t;
        }
    }
}

/// One GRU step: gates `z, r, h`.
fn gru_step(
    isa: Isa,
    weights: &RecurrentWeights,
    rows: usize,
    hidden: usize,
    linear_before_reset: bool,
    s: &mut Scratch,
) {
    let width = 3 * hidden;
    if linear_before_reset {
        // h · R + Rb for every gate; the reset gate scales the candidate's.
        for row in s.recurrent.chunks_exact_mut(width) {
            row.copy_from_slice(&weights.recurrent_bias);
        }
        recurrent_product(
            isa,
            &s.h,
            rows,
            hidden,
            &weights.r,
            0..width,
            &mut s.recurrent,
        );
        for r in 0..rows {
            let g = &mut s.gates[r * width..(r + 1) * width];
            let rh = &s.recurrent[r * width..(r + 1) * width];
            for (g, rh) in g[..2 * hidden].iter_mut().zip(rh) {
                *g += rh;
            }
            kernels::sigmoid::<true>(isa, &mut g[..2 * hidden]);
            for u in 0..hidden {
                g[2 * hidden + u] += g[hidden + u] * rh[2 * hidden + u];
            }
            kernels::tanh::<true>(isa, &mut g[2 * hidden..]);
        }
    } else {
        // The update and reset gates first; the candidate's recurrent
        // product is of the reset hidden state.
        recurrent_product(
            isa,
            &s.h,
            rows,
            hidden,
            &weights.r,
            0..2 * hidden,
            &mut s.gates,
        );
        for r in 0..rows {
            let g = &mut s.gates[r * width..(r + 1) * width];
            kernels::sigmoid::<true>(isa, &mut g[..2 * hidden]);
            let h = &s.h[r * hidden..(r + 1) * hidden];
            let spare = &mut s.spare[r * hidden..(r + 1) * hidden];
            for ((x, h), reset) in spare.iter_mut().zip(h).zip(&g[hidden..2 * hidden]) {
                *x = h * reset;
            }
            for (g, b) in g[2 * hidden..]
                .iter_mut()
                .zip(&weights.recurrent_bias[2 * hidden..])
            {
                *g += b;
            }
        }
        recurrent_product(
            isa,
            &s.spare,
            rows,
            hidden,
            &weights.r,
            2 * hidden..3 * hidden,
            &mut s.gates,
        );
        for r in 0..rows {
            let g = &mut s.gates[r * width..(r + 1) * width];
            kernels::tanh::<true>(isa, &mut g[2 * hidden..]);
        }
    }
    for r in 0..rows {
        let g = &s.gates[r * width..(r + 1) * width];
        let h = &mut s.h[r * hidden..(r + 1) * hidden];
        for u in 0..hidden {
            let z = g[u];
            h[u] = (1.0 - z) * g[2 * hidden + u] + z * h[u];
        }
    }
}
