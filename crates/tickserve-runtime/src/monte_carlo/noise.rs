//! The noise: a counter-based Gaussian generator, and a request expanded
//! into its noisy copies.

use tickserve_core::validate::ValidRequest;
use tickserve_core::{DataType, Signature};

use super::Plan;

/// SplitMix64's finalizer: a 64-bit mix with full avalanche.
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform in (0, 1] from `seed` and `counter` alone.
fn uniform(seed: u64, counter: u64) -> f64 {
    let bits = mix(seed ^ mix(counter.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    ((bits >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal from `seed` and `counter` alone (Box–Muller).
pub fn gaussian(seed: u64, counter: u64) -> f64 {
    let u1 = uniform(seed, counter.wrapping_mul(2));
    let u2 = uniform(seed, counter.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl Plan {
    /// The request with `samples` noisy copies of each row (row `r`'s copies
    /// are rows `r × samples ..`): perturbed inputs get `sigma × N(0, 1)` per
    /// element, the others are copied.
    pub fn expand(&self, valid: &ValidRequest, signature: &Signature) -> ValidRequest {
        let mut inputs = Vec::with_capacity(valid.inputs.len());
        // Counters: every element of every input of one noisy row has its own,
        // rows after rows.
        let stride: u64 = signature
            .inputs
            .iter()
            .map(|t| t.row_elements() as u64)
            .sum();
        let mut element_base = 0u64;
        for ((spec, data), sigmas) in signature.inputs.iter().zip(&valid.inputs).zip(&self.sigmas) {
            let row_bytes = spec.row_bytes();
            let row_elements = spec.row_elements();
            let mut out = Vec::with_capacity(row_bytes * self.total);
            for r in 0..self.rows {
                let row = data
                    .get(r * row_bytes..(r + 1) * row_bytes)
                    .unwrap_or_default();
                for s in 0..self.samples {
                    let start = out.len();
                    out.extend_from_slice(row);
                    let Some(sigmas) = sigmas else {
                        continue;
                    };
                    // The counter of element e of sample s of row r of this input.
                    let first = ((r * self.samples + s) as u64)
                        .wrapping_mul(stride)
                        .wrapping_add(element_base);
                    let noise = |e: usize| {
                        let sigma = if sigmas.len() == 1 {
                            sigmas[0]
                        } else {
                            sigmas[e]
                        };
                        sigma * gaussian(self.seed, first.wrapping_add(e as u64))
                    };
                    let copy = &mut out[start..];
                    match spec.datatype {
                        DataType::Fp32 => {
                            for (e, chunk) in
                                copy.chunks_exact_mut(4).enumerate().take(row_elements)
                            {
                                let v =
                                    f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                                chunk.copy_from_slice(
                                    &((f64::from(v) + noise(e)) as f32).to_le_bytes(),
                                );
                            }
                        }
                        DataType::Fp64 => {
                            for (e, chunk) in
                                copy.chunks_exact_mut(8).enumerate().take(row_elements)
                            {
                                let mut b = [0u8; 8];
                                b.copy_from_slice(chunk);
                                chunk.copy_from_slice(
                                    &(f64::from_le_bytes(b) + noise(e)).to_le_bytes(),
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
            element_base = element_base.wrapping_add(row_elements as u64);
            inputs.push(out.into());
        }
        ValidRequest {
            rows: self.total,
            inputs,
            outputs: valid.outputs.clone(),
            bucket_rows: valid.bucket_rows,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn noise_is_standard_normal() {
        let n = 200_000u64;
        let draws: Vec<f64> = (0..n).map(|c| super::gaussian(9, c)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors: 1/sqrt(n) ≈ 0.0022 for the mean, sqrt(2/n) ≈ 0.0032 for the variance.
        assert!(mean.abs() < 0.011, "{mean}");
        assert!((var - 1.0).abs() < 0.016, "{var}");
    }
}
