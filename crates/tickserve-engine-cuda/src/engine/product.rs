//! A product as the engine records it, `out = in · W` over a bucket's rows,
//! in one of two forms, both cuBLAS's pointer-array product so that `W`'s
//! address is read from the table at run time:
//!
//! - one member: one product over every row, `W` from the member's row of
//!   the table (batch of one);
//! - mixed members: one product per batch row, all in one call, each with
//!   its own row's member's `W` (batch of `rows`, `W`'s pointers the table's
//!   column for the slot).
//!
//! Each product owns an [`Operands`] block in the arena holding the input
//! and output addresses both forms need, written once at load.

use tickserve_core::EngineError;

use cudarc::cublas::sys as blas_sys;

use super::{BucketGraph, CudaModel, aligned};
use crate::plan::WeightId;

/// Where one product's operand pointers live in a bucket's arena: `[input,
/// output]` (the whole bucket, for one member), then every row's input,
/// then every row's output (for mixed members).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Operands {
    /// The block's offset in the arena.
    pub(super) at: usize,
}

impl Operands {
    /// Places a block for `rows` rows at `*at`, moving `*at` past it.
    pub(super) fn place(rows: usize, at: &mut usize) -> Operands {
        let block = Operands { at: *at };
        *at += Operands::bytes(rows);
        block
    }

    /// A block's size for `rows` rows.
    pub(super) fn bytes(rows: usize) -> usize {
        aligned((2 + 2 * rows) * 8)
    }

    /// The block's contents: `input` and `output`, then each row's input
    /// (`input_row` bytes apart), then each row's output (`output_row` apart).
    pub(super) fn pointers(
        input: u64,
        input_row: usize,
        output: u64,
        output_row: usize,
        rows: usize,
    ) -> Vec<u64> {
        let mut pointers = Vec::with_capacity(2 + 2 * rows);
        pointers.extend([input, output]);
        pointers.extend((0..rows).map(|r| input + (r * input_row) as u64));
        pointers.extend((0..rows).map(|r| output + (r * output_row) as u64));
        pointers
    }
}

/// One product's shape: `out[m, n] = in[m, k] · W` with `m = rows ·
/// per_row`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Product {
    /// The weight.
    pub(super) slot: WeightId,
    /// Its operands' block.
    pub(super) operands: Operands,
    /// `W` is stored `[n, k]`.
    pub(super) transposed: bool,
    /// Product rows per batch row.
    pub(super) per_row: usize,
    /// Inner dimension.
    pub(super) k: usize,
    /// Output columns.
    pub(super) n: usize,
}

impl CudaModel {
    /// Records `product` over `bucket`: with one member's weights, or with
    /// each row's member's (`mixed`).
    pub(super) fn record_product(
        &self,
        bucket: &BucketGraph,
        mixed: bool,
        product: &Product,
    ) -> Result<(), EngineError> {
        let (base, rows, layout) = (bucket.arena.ptr, bucket.rows, &bucket.layout);
        let block = base + product.operands.at as u64;
        let (weights, inputs, outputs, m, batch) = if mixed {
            (
                base + (product.slot * rows * 8) as u64,
                block + 16,
                block + 16 + (rows * 8) as u64,
                product.per_row,
                rows,
            )
        } else {
            (
                base + (layout.table + product.slot * 8) as u64,
                block,
                block + 8,
                rows * product.per_row,
                1,
            )
        };
        let (k, n) = (product.k, product.n);
        let (op_w, ld_w) = if product.transposed {
            (blas_sys::cublasOperation_t::CUBLAS_OP_T, k)
        } else {
            (blas_sys::cublasOperation_t::CUBLAS_OP_N, n)
        };
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // Row-major `out = in · W` is column-major `outᵀ = Wᵀ · inᵀ`.
        // SAFETY: the three pointer arrays are device addresses inside the
        // arena, `batch` long each, holding the weights' (the table), the
        // inputs' and the outputs' addresses; alpha and beta are read during
        // the call.
        unsafe {
            blas_sys::cublasSgemmBatched(
                self.blas.handle,
                op_w,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha,
                weights as *const *const f32,
                ld_w as i32,
                inputs as *const *const f32,
                k as i32,
                &beta,
                outputs as *const *mut f32,
                n as i32,
                batch as i32,
            )
        }
        .result()
        .map_err(|e| EngineError::Internal(format!("cuBLAS product: {e:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_holds_the_whole_bucket_then_every_row_in_then_every_row_out() {
        let p = Operands::pointers(1000, 20, 5000, 12, 3);
        assert_eq!(p, [1000, 5000, 1000, 1020, 1040, 5000, 5012, 5024]);
        assert!(Operands::bytes(3) >= p.len() * 8);
        let mut at = 256;
        let block = Operands::place(64, &mut at);
        assert_eq!((block.at, at), (256, 256 + Operands::bytes(64)));
    }
}
