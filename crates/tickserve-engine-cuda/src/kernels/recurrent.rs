//! CUDA C for a recurrent layer: one gate kernel per step of the window
//! (and, for a GRU that resets before its product, a reset kernel first),
//! launched `steps` times with the step's index `t`. The products around
//! them are cuBLAS calls the engine records: the window's input projection
//! once (`xw = x · Wᵀ`, every step at once), the recurrent one per step
//! (`hr = h · Rᵀ`).
//!
//! Every recurrent kernel has one signature, `(h, c, y, xw, hr, hr2, table,
//! rows, t, mixed)`: `h` the hidden state (read and written in place, one thread
//! per element), `c` the LSTM's cell state (or the GRU's `r ⊙ h` scratch),
//! `y` every step's hidden state (or null), `xw` and `hr` the projections,
//! `hr2` the GRU's second recurrent product, `table` and `mixed` the weight
//! pointers as every kernel reads them (one member's, or one per row). A thread reads and writes only its own element of `h` and `c`,
//! so in place is safe.

use super::{Kernel, Launch};
use crate::plan::{Cell, Recurrent};

/// The name of the reset kernel of step `index` (a GRU without
/// `linear_before_reset`).
pub fn reset_name(index: usize) -> String {
    format!("step_{index}_reset")
}

/// The gate kernel's name for step `index`.
pub fn gate_name(index: usize) -> String {
    format!("step_{index}")
}

/// `x + input bias + recurrent bias` for gate row `k` (a C expression).
fn biased(layer: &Recurrent, x: &str, k: &str) -> String {
    let gh = layer.cell.gates() * layer.hidden;
    match layer.b {
        Some(b) => format!("({x} + W({b})[{k}] + W({b})[{gh} + {k}])"),
        None => x.to_string(),
    }
}

/// The input bias alone for gate row `k`, and the recurrent bias alone.
fn biases(layer: &Recurrent, k: &str) -> (String, String) {
    let gh = layer.cell.gates() * layer.hidden;
    match layer.b {
        Some(b) => (format!(" + W({b})[{k}]"), format!(" + W({b})[{gh} + {k}]")),
        None => (String::new(), String::new()),
    }
}

/// The opening every recurrent kernel shares: the thread's element, its
/// row's projections.
fn opening(name: &str, layer: &Recurrent) -> String {
    let (steps, hidden) = (layer.steps, layer.hidden);
    let gh = layer.cell.gates() * hidden;
    format!(
        "RECURRENT({name}) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * {hidden}) return;
    int row = i / {hidden};
    int u = i % {hidden};
    const float* x = xw + ((long long)row * {steps} + t) * {gh};
    const float* g = hr + (long long)row * {gh};
    (void)x; (void)g; (void)hr2; (void)c; (void)y;
"
    )
}

fn sigmoid(v: &str) -> String {
    format!("1.0f / (1.0f + expf(-({v})))")
}

/// The C source of the kernels of recurrent step `index`, and their entries.
pub(super) fn sources(index: usize, layer: &Recurrent) -> Vec<(Kernel, String)> {
    let (steps, hidden) = (layer.steps, layer.hidden);
    let h = hidden;
    let kernel = |name: String| Kernel {
        step: index,
        name,
        launch: Launch::PerElement,
    };
    let store_y = if layer.sequence.is_some() {
        format!("    y[((long long)row * {steps} + t) * {hidden} + u] = hn;\n")
    } else {
        String::new()
    };
    let gate = |k: usize| {
        biased(
            layer,
            &format!("x[{} + u] + g[{} + u]", k * h, k * h),
            &format!("{} + u", k * h),
        )
    };
    let mut out = Vec::new();
    let body = match layer.cell {
        Cell::Lstm => format!(
            "    float ig = {};
    float og = {};
    float fg = {};
    float cn = fg * c[i] + ig * tanhf({});
    c[i] = cn;
    float hn = og * tanhf(cn);
",
            sigmoid(&gate(0)),
            sigmoid(&gate(1)),
            sigmoid(&gate(2)),
            gate(3)
        ),
        Cell::Gru {
            linear_before_reset,
        } => {
            let (wb, rb) = biases(layer, &format!("{} + u", 2 * h));
            let candidate = if linear_before_reset {
                format!(
                    "tanhf(x[{k} + u]{wb} + {} * (g[{k} + u]{rb}))",
                    sigmoid(&gate(1)),
                    k = 2 * h
                )
            } else {
                // `hr2` is (r ⊙ h) · Rᵀ, from the reset kernel's product.
                let reset = reset_name(index);
                let code = format!(
                    "{}    c[i] = ({}) * h[i];\n}}\n",
                    opening(&reset, layer),
                    sigmoid(&gate(1))
                );
                out.push((kernel(reset), code));
                format!(
                    "tanhf(x[{k} + u]{wb} + hr2[(long long)row * {gh} + {k} + u]{rb})",
                    k = 2 * h,
                    gh = 3 * h
                )
            };
            format!(
                "    float z = {};
    float hn = (1.0f - z) * {candidate} + z * h[i];
",
                sigmoid(&gate(0))
            )
        }
    };
    let name = gate_name(index);
    let code = format!(
        "{}{body}    h[i] = hn;\n{store_y}}}\n",
        opening(&name, layer)
    );
    out.push((kernel(name), code));
    out
}
