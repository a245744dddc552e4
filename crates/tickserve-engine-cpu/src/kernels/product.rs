//! `y += x · W` for a handful of rows (a tick is one): the weights are
//! streamed once, row of `W` by row of `W`, into accumulators that stay in
//! registers for a block of the output's columns and every row of the
//! block (AVX2: 1 row × 64 columns, 2 × 32 or 4 × 16, eight 8-wide
//! accumulators each, enough to keep both FMA units busy).

/// The operands of one product: `rows` rows of `x` (`k` floats each, rows
/// `x_stride` apart) times `W` (`k` rows of `n` floats, `w_stride` apart).
#[derive(Debug, Clone, Copy)]
pub struct Product<'a> {
    /// The left operand.
    pub x: &'a [f32],
    /// Floats between the starts of two rows of `x`.
    pub x_stride: usize,
    /// Rows of `x` (and of the result).
    pub rows: usize,
    /// The inner dimension.
    pub k: usize,
    /// The right operand, row-major.
    pub w: &'a [f32],
    /// Floats between the starts of two rows of `W`.
    pub w_stride: usize,
    /// Columns of `W` (and of the result).
    pub n: usize,
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
        let fits = self.x.len() >= span(self.rows, self.x_stride, self.k)
            && self.w.len() >= span(self.k, self.w_stride, self.n)
            && y.len() >= span(self.rows, y_stride, self.n)
            && (self.rows <= 1 || (self.x_stride >= self.k && y_stride >= self.n))
            && (self.k <= 1 || self.w_stride >= self.n);
        assert!(
            fits,
            "product of {} × {} by {} × {} does not fit its buffers",
            self.rows, self.k, self.k, self.n
        );
    }
}

/// The portable kernel: one row at a time, `W`'s rows added in turn.
pub(super) fn portable(p: &Product<'_>, y: &mut [f32], y_stride: usize) {
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
/// The CPU has AVX2 and FMA, and [`Product::check`] passed for `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2(p: &Product<'_>, y: &mut [f32], y_stride: usize) {
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
    p: &Product<'_>,
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
    p: &Product<'_>,
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
