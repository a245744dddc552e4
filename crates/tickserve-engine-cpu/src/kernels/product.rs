//! `y += x · W` for a handful of rows (a tick is one). `W` is packed at
//! load into [`Panels`] of [`PANEL`] columns, each panel's `k` rows
//! contiguous, so a block of the output's columns streams its weights as
//! one run of memory (row-major, a block's rows sit a whole matrix row
//! apart, and a 2 KiB stride crosses a page every other row, where the
//! hardware's prefetchers stop). Each weight is read once, into
//! accumulators that stay in registers for a block of columns and every
//! row of the block (AVX2: 1 row × 64 columns, 2 × 32 or 4 × 16, eight
//! 8-wide accumulators each, enough to keep both FMA units busy).

use std::ops::Range;

/// Columns per panel: the widest block a kernel computes at once.
pub const PANEL: usize = 64;

/// A `[k, n]` matrix as the product kernels read it: panels of [`PANEL`]
/// columns (the last one narrower), panel after panel, each row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Panels {
    floats: Vec<f32>,
    k: usize,
    n: usize,
}

impl Panels {
    /// Packs the `k × n` matrix whose element `(i, j)` is `at(i, j)`.
    fn pack(k: usize, n: usize, at: impl Fn(usize, usize) -> f32) -> Panels {
        let mut floats = Vec::with_capacity(k * n);
        for first in (0..n).step_by(PANEL) {
            let last = (first + PANEL).min(n);
            for i in 0..k {
                floats.extend((first..last).map(|j| at(i, j)));
            }
        }
        Panels { floats, k, n }
    }

    /// From `m`, `k × n` row-major.
    ///
    /// # Panics
    ///
    /// When `m` holds fewer than `k · n` floats.
    pub fn row_major(m: &[f32], k: usize, n: usize) -> Panels {
        assert!(
            m.len() >= k * n,
            "a {k} × {n} matrix from {} floats",
            m.len()
        );
        Panels::pack(k, n, |i, j| m[i * n + j])
    }

    /// From `m`, the transpose (`n × k` row-major): Gemm's `transB`, ONNX's
    /// recurrent `[gates · hidden, in]` matrices.
    ///
    /// # Panics
    ///
    /// When `m` holds fewer than `k · n` floats.
    pub fn transposed(m: &[f32], k: usize, n: usize) -> Panels {
        assert!(
            m.len() >= k * n,
            "a {k} × {n} matrix from {} floats",
            m.len()
        );
        Panels::pack(k, n, |i, j| m[j * k + i])
    }

    /// Rows (the product's inner dimension).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Panel `p` (columns `p · PANEL..`): its floats and its width.
    fn panel(&self, p: usize) -> (&[f32], usize) {
        let first = p * PANEL;
        let width = PANEL.min(self.n - first);
        (
            &self.floats[first * self.k..(first + width) * self.k],
            width,
        )
    }
}

/// The operands of one product: `rows` rows of `x` (`w.k()` floats each,
/// rows `x_stride` apart) times the `columns` of `w`. The result's column
/// 0 is `columns.start`.
#[derive(Debug, Clone)]
pub struct Product<'a> {
    /// The left operand.
    pub x: &'a [f32],
    /// Floats between the starts of two rows of `x`.
    pub x_stride: usize,
    /// Rows of `x` (and of the result).
    pub rows: usize,
    /// The right operand.
    pub w: &'a Panels,
    /// The columns of `w` computed.
    pub columns: Range<usize>,
}

/// The floats a `rows × width` block with rows `stride` apart spans.
fn span(rows: usize, stride: usize, width: usize) -> usize {
    match rows {
        0 => 0,
        _ => (rows - 1) * stride + width,
    }
}

impl Product<'_> {
    /// Panics unless every index the kernels reach is in bounds.
    pub(super) fn check(&self, y: &[f32], y_stride: usize) {
        let (k, n) = (self.w.k, self.columns.len());
        let fits = self.columns.start <= self.columns.end
            && self.columns.end <= self.w.n
            && self.x.len() >= span(self.rows, self.x_stride, k)
            && y.len() >= span(self.rows, y_stride, n)
            && (self.rows <= 1 || (self.x_stride >= k && y_stride >= n));
        assert!(
            fits,
            "product of {} × {} by columns {:?} of {} × {} does not fit its buffers",
            self.rows, k, self.columns, k, self.w.n
        );
    }

    /// The part of the product in each panel the columns touch: a
    /// row-major operand and where its column 0 is in the result.
    pub(super) fn parts(&self) -> impl Iterator<Item = (RowMajor<'_>, usize)> {
        let Range { start, end } = self.columns;
        let panels = start / PANEL..end.div_ceil(PANEL);
        panels.filter(move |_| start < end).map(move |p| {
            let (floats, width) = self.w.panel(p);
            let first = p * PANEL;
            let (from, to) = (start.max(first) - first, end.min(first + width) - first);
            let part = RowMajor {
                x: self.x,
                x_stride: self.x_stride,
                rows: self.rows,
                k: self.w.k,
                w: &floats[from..],
                w_stride: width,
                n: to - from,
            };
            (part, first + from - start)
        })
    }
}

/// One panel's part of a product: `x` times `W`, `k` rows of `n` floats
/// `w_stride` apart. Within [`Product::check`]'s bounds by construction.
pub(super) struct RowMajor<'a> {
    x: &'a [f32],
    x_stride: usize,
    rows: usize,
    k: usize,
    w: &'a [f32],
    w_stride: usize,
    n: usize,
}

/// The portable kernel: one row at a time, `W`'s rows added in turn.
pub(super) fn portable(p: &RowMajor<'_>, y: &mut [f32], y_stride: usize) {
    for r in 0..p.rows {
        let x = &p.x[r * p.x_stride..r * p.x_stride + p.k];
        let y = &mut y[r * y_stride..r * y_stride + p.n];
        for (i, &a) in x.iter().enumerate() {
            let w = &p.w[i * p.w_stride..i * p.w_stride + p.n];
            for (y, w) in y.iter_mut().zip(w) {
                *y += a * w;
            }
        }
    }
}

/// The AVX2 kernel.
///
/// # Safety
///
/// The CPU has AVX2 and FMA, and [`Product::check`] passed for the
/// product `p` is a part of, and `y` is its result from `p`'s column 0.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2(p: &RowMajor<'_>, y: &mut [f32], y_stride: usize) {
    let mut r = 0;
    while r < p.rows {
        let x = p.x[r * p.x_stride..].as_ptr();
        let out = y[r * y_stride..].as_mut_ptr();
        // SAFETY: the rows `r..r + taken` are within what `check` proved.
        let taken = unsafe {
            match p.rows - r {
                1 => columns::<1, 8>(p, x, out, y_stride),
                2 => columns::<2, 4>(p, x, out, y_stride),
                3 => columns::<3, 2>(p, x, out, y_stride),
                _ => columns::<4, 2>(p, x, out, y_stride),
            }
        };
        r += taken;
    }
}

/// Rows `0..R` of `x` and `out` (pointers to the first), every column:
/// blocks of `8·V` columns, then of 8, then one by one. Returns `R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<const R: usize, const V: usize>(
    p: &RowMajor<'_>,
    x: *const f32,
    out: *mut f32,
    y_stride: usize,
) -> usize {
    let mut j = 0;
    // SAFETY (each block): columns `j..j + 8·V` (or `j + 8`) are below `n`,
    // rows below `R` are within the checked rows.
    while j + 8 * V <= p.n {
        unsafe { block::<R, V>(p, x, out, y_stride, j) };
        j += 8 * V;
    }
    while j + 8 <= p.n {
        unsafe { block::<R, 1>(p, x, out, y_stride, j) };
        j += 8;
    }
    for r in 0..R {
        for c in j..p.n {
            let mut sum = 0.0f32;
            for i in 0..p.k {
                // SAFETY: `r < R`, `i < k`, `c < n`: inside the checked spans.
                sum = unsafe { (*x.add(r * p.x_stride + i)).mul_add(p.w[i * p.w_stride + c], sum) };
            }
            // SAFETY: as above.
            unsafe { *out.add(r * y_stride + c) += sum };
        }
    }
    R
}

/// Columns `j..j + 8·V` of rows `0..R`: the accumulators start from `out`,
/// take one FMA per weight vector and row for each of the `k` rows of `W`,
/// and are stored back.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const R: usize, const V: usize>(
    p: &RowMajor<'_>,
    x: *const f32,
    out: *mut f32,
    y_stride: usize,
    j: usize,
) {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    let mut acc: [[__m256; V]; R] = [[_mm256_setzero_ps(); V]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        for (v, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row `r` of the output, columns `j + 8v..j + 8v + 8`.
            *acc = unsafe { _mm256_loadu_ps(out.add(r * y_stride + j + 8 * v)) };
        }
    }
    let w = p.w.as_ptr();
    for i in 0..p.k {
        let mut wv: [__m256; V] = [_mm256_setzero_ps(); V];
        for (v, wv) in wv.iter_mut().enumerate() {
            // SAFETY: row `i` of `W`, columns below `n`.
            *wv = unsafe { _mm256_loadu_ps(w.add(i * p.w_stride + j + 8 * v)) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: element `i` of row `r` of `x`.
            let a = _mm256_set1_ps(unsafe { *x.add(r * p.x_stride + i) });
            for (acc, wv) in acc.iter_mut().zip(&wv) {
                *acc = _mm256_fmadd_ps(a, *wv, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, acc) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm256_storeu_ps(out.add(r * y_stride + j + 8 * v), *acc) };
        }
    }
}
