//! Members of a family made from one model: its weights scaled by a factor
//! per member. Shared by the GPU tests and the `graph_replay` benchmark
//! (which includes this file by path).

use tickserve_core::{DataType, Weight};

/// `weights` with every fp32 value times `factor` (the others as they are).
pub fn scaled(weights: &[Weight], factor: f32) -> Vec<Weight> {
    weights
        .iter()
        .map(|w| {
            let mut w = w.clone();
            if w.datatype != DataType::Fp32 {
                return w;
            }
            for x in w.data.chunks_exact_mut(4) {
                let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * factor;
                x.copy_from_slice(&v.to_le_bytes());
            }
            w
        })
        .collect()
}
