//! The loops a plan's steps spend their time in, each twice: a portable
//! one, and one compiled for AVX2 and FMA that runs where the CPU has them
//! ([`Isa::detect`], once per process). Both compute the same sums in the
//! same order but for the fused multiply-add's rounding.
//!
//! - [`product`]: `y += x · W` over a few rows, `W` packed in [`Panels`] of
//!   64 columns, so each weight is read once per run whatever the rows, as
//!   one stream per block of columns.
//! - [`tanh`] and [`sigmoid`]: a rational approximation of `tanh` (Eigen's,
//!   which ONNX Runtime's MLAS uses too), within 5e-7 of the exact value over
//!   all of `f32`, vectorised by the compiler; a NaN stays one, or gives 1
//!   inside a recurrent cell, as in ONNX Runtime.

mod activation;
mod product;

pub use activation::{exact_sigmoid, exact_tanh, fast_tanh};
pub use product::{PANEL, Panels, Product};

/// The instruction sets the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, whatever the compiler targets by default.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2Fma,
}

impl Isa {
    /// The best this CPU runs.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Isa::Avx2Fma;
        }
        Isa::Portable
    }

    /// Its name in logs and `tickserve check` (`avx2+fma`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2Fma => "avx2+fma",
        }
    }
}

/// `y[r, j - c] += Σ_i x[r, i] · w[i, j]` for the rows `p` names and its
/// columns `j` (from `c`, the first).
///
/// # Panics
///
/// When a slice is shorter than `p`'s shape needs (a bug in the caller,
/// never a client's input: shapes are fixed at load).
pub fn product(isa: Isa, p: &Product<'_>, y: &mut [f32], y_stride: usize) {
    p.check(y, y_stride);
    if p.rows == 0 {
        return;
    }
    for (part, at) in p.parts() {
        let y = &mut y[at..];
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2Fma` is only detected where the CPU has both,
            // `check` proved the whole product in bounds, and `y` starts at
            // the part's first column.
            Isa::Avx2Fma => unsafe { product::avx2(&part, y, y_stride) },
            _ => product::portable(&part, y, y_stride),
        }
    }
}

/// `tanh` of every element, in place; `CELL`: a NaN gives 1, as in ONNX
/// Runtime's recurrent cells, else it stays a NaN, as in its Tanh op.
pub fn tanh<const CELL: bool>(isa: Isa, xs: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2Fma` is only detected where the CPU has both.
        Isa::Avx2Fma => unsafe { activation::tanh_avx2::<CELL>(xs) },
        _ => activation::tanh_all::<CELL>(xs),
    }
}

/// The logistic function of every element, in place; `CELL` as [`tanh`].
pub fn sigmoid<const CELL: bool>(isa: Isa, xs: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2Fma` is only detected where the CPU has both.
        Isa::Avx2Fma => unsafe { activation::sigmoid_avx2::<CELL>(xs) },
        _ => activation::sigmoid_all::<CELL>(xs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isas() -> Vec<Isa> {
        let mut isas = vec![Isa::Portable];
        if Isa::detect() != Isa::Portable {
            isas.push(Isa::detect());
        }
        isas
    }

    /// Every row count and column count around the blocking's edges.
    #[test]
    fn products_equal_the_plain_sum_at_every_shape() {
        let value = |seed: usize| ((seed * 7919) % 1000) as f32 / 500.0 - 1.0;
        for isa in isas() {
            for rows in [1, 2, 3, 4, 5, 7, 9] {
                for n in [1, 3, 8, 15, 16, 17, 33, 64, 65, 130] {
                    for k in [1, 2, 5, 17] {
                        let (xs, ws, ys) = (k + 3, n + 2, n + 1);
                        let x: Vec<f32> = (0..rows * xs).map(value).collect();
                        let w: Vec<f32> = (0..k * ws).map(|i| value(i + 11)).collect();
                        let packed = Panels::row_major(&w, k, ws);
                        let start: Vec<f32> = (0..rows * ys).map(|i| value(i + 5)).collect();
                        let mut y = start.clone();
                        let p = Product {
                            x: &x,
                            x_stride: xs,
                            rows,
                            w: &packed,
                            columns: 0..n,
                        };
                        product(isa, &p, &mut y, ys);
                        for r in 0..rows {
                            for j in 0..ys {
                                let want = if j < n {
                                    start[r * ys + j]
                                        + (0..k).map(|i| x[r * xs + i] * w[i * ws + j]).sum::<f32>()
                                } else {
                                    start[r * ys + j]
                                };
                                let got = y[r * ys + j];
                                assert!(
                                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                                    "{isa:?} rows {rows} n {n} k {k} at [{r}, {j}]: {got} != {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Columns from anywhere: within a panel, across panels' edges, none.
    #[test]
    fn a_range_of_columns_is_the_same_columns_of_the_whole_product() {
        let value = |seed: usize| ((seed * 7919) % 1000) as f32 / 500.0 - 1.0;
        let (k, n) = (19, 200);
        // Packed from the transpose, as recurrent and `transB` weights are.
        let t: Vec<f32> = (0..n * k).map(value).collect();
        let w = Panels::transposed(&t, k, n);
        for isa in isas() {
            for rows in [1, 2, 3, 5] {
                let x: Vec<f32> = (0..rows * k).map(|i| value(i + 3)).collect();
                for columns in [0..n, 5..69, 63..65, 64..128, 17..17, 100..200, 130..131] {
                    let width = columns.len();
                    let mut y = vec![0.5f32; rows * width];
                    let p = Product {
                        x: &x,
                        x_stride: k,
                        rows,
                        w: &w,
                        columns: columns.clone(),
                    };
                    product(isa, &p, &mut y, width);
                    for r in 0..rows {
                        for (c, j) in columns.clone().enumerate() {
                            let want =
                                0.5 + (0..k).map(|i| x[r * k + i] * t[j * k + i]).sum::<f32>();
                            let got = y[r * width + c];
                            assert!(
                                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                                "{isa:?} rows {rows} columns {columns:?} at [{r}, {j}]: {got} != {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "product")]
    fn a_short_operand_is_refused_before_any_element_is_read() {
        let x = [1.0f32; 3];
        let w = Panels::row_major(&[1.0f32; 8], 4, 2);
        let mut y = [0.0f32; 4];
        let p = Product {
            x: &x,
            x_stride: 4,
            rows: 1,
            w: &w,
            columns: 0..2,
        };
        product(Isa::detect(), &p, &mut y, 2);
    }

    #[test]
    fn activations_are_within_5e_7_of_the_exact_ones() {
        let xs: Vec<f32> = (-40_000..=40_000)
            .map(|i| i as f32 / 1000.0)
            .chain([f32::MAX, f32::MIN, 1e-30, -1e-30, 0.0, -0.0, 1e-4, 3.9e-4])
            .collect();
        for isa in isas() {
            let mut t = xs.clone();
            tanh::<false>(isa, &mut t);
            let mut s = xs.clone();
            sigmoid::<false>(isa, &mut s);
            for ((&x, &t), &s) in xs.iter().zip(&t).zip(&s) {
                let (et, es) = (exact_tanh(x), exact_sigmoid(x));
                assert!(
                    (t - et).abs() <= 5e-7,
                    "{isa:?} tanh({x}) = {t}, exactly {et}"
                );
                assert!(
                    (s - es).abs() <= 5e-7,
                    "{isa:?} sigmoid({x}) = {s}, exactly {es}"
                );
            }
        }
        // In a cell, MLAS clamps a NaN to its upper bound: tanh and the
        // logistic give 1; as ops they keep it.
        for isa in isas() {
            let mut nan = [f32::NAN; 4];
            tanh::<true>(isa, &mut nan[..1]);
            sigmoid::<true>(isa, &mut nan[1..2]);
            tanh::<false>(isa, &mut nan[2..3]);
            sigmoid::<false>(isa, &mut nan[3..]);
            assert_eq!(nan[..2], [1.0, 1.0], "{isa:?}");
            assert!(nan[2].is_nan() && nan[3].is_nan(), "{isa:?}");
        }
    }
}
