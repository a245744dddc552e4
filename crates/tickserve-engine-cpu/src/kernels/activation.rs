//! `tanh` and the logistic function as a branch-free rational approximation
//! (Eigen's `generic_fast_tanh_float`, the one ONNX Runtime's MLAS uses for
//! its Tanh and its recurrent cells), so the compiler vectorises a slice of
//! them. The logistic is `0.5 + 0.5 · tanh(x / 2)`. A NaN comes out as
//! ONNX Runtime's does (see [`fast_tanh`]).

/// Beyond this, `tanh` is ±1 to within the approximation's error.
const CLAMP: f32 = 7.905_311;
/// Below this, `tanh(x) = x` to within an ulp.
const TINY: f32 = 0.0004;

// Eigen's coefficients as it publishes them (more digits than an f32 holds).
#[allow(clippy::excessive_precision)]
const ALPHA: [f32; 7] = [
    4.893_524_6e-3,
    6.372_619_3e-4,
    1.485_722_4e-5,
    5.122_297e-8,
    -8.604_671_5e-11,
    2.000_187_9e-13,
    -2.760_768_5e-16,
];
#[allow(clippy::excessive_precision)]
const BETA: [f32; 4] = [4.893_525e-3, 2.268_434_6e-3, 1.185_347_1e-4, 1.198_258_4e-6];

/// `tanh(x)`, within 5e-7. A NaN stays a NaN, or, with `CELL`, gives 1, as
/// in ONNX Runtime's recurrent cells: their MLAS kernels clamp with x86's
/// `minps` and `maxps`, which return the bound for a NaN (its Tanh and
/// Sigmoid ops keep the NaN).
#[inline(always)]
pub fn fast_tanh<const CELL: bool>(x: f32) -> f32 {
    let clamped = if CELL {
        let below = if x < CLAMP { x } else { CLAMP };
        if below > -CLAMP { below } else { -CLAMP }
    } else {
        x.clamp(-CLAMP, CLAMP)
    };
    let x2 = clamped * clamped;
    let mut p = ALPHA[6];
    for a in ALPHA[..6].iter().rev() {
        p = p * x2 + a;
    }
    let p = p * clamped;
    let q = ((BETA[3] * x2 + BETA[2]) * x2 + BETA[1]) * x2 + BETA[0];
    if x.abs() < TINY { x } else { p / q }
}

/// `tanh(x)` computed in `f64`: what the tests hold the approximation to.
pub fn exact_tanh(x: f32) -> f32 {
    f64::from(x).tanh() as f32
}

/// The logistic function computed in `f64`.
pub fn exact_sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-f64::from(x)).exp())) as f32
}

/// [`fast_tanh`] of each element.
pub fn tanh_all<const CELL: bool>(xs: &mut [f32]) {
    for x in xs {
        *x = fast_tanh::<CELL>(*x);
    }
}

/// The logistic function of each element.
pub fn sigmoid_all<const CELL: bool>(xs: &mut [f32]) {
    for x in xs {
        *x = 0.5 * fast_tanh::<CELL>(0.5 * *x) + 0.5;
    }
}

/// [`tanh_all`] compiled for AVX2 and FMA.
///
/// # Safety
///
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tanh_avx2<const CELL: bool>(xs: &mut [f32]) {
    for x in xs {
        *x = fast_tanh::<CELL>(*x);
    }
}

/// [`sigmoid_all`] compiled for AVX2 and FMA.
///
/// # Safety
///
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn sigmoid_avx2<const CELL: bool>(xs: &mut [f32]) {
    for x in xs {
        *x = 0.5f32.mul_add(fast_tanh::<CELL>(0.5 * *x), 0.5);
    }
}
