//! Monte Carlo runs of a request: a plan for its noisy copies
//! ([`plan`]), their expansion into one batched request ([`noise`]), and
//! the answer's summary over the samples ([`summary`]). What a request asks
//! and what a model allows are the core's (`tickserve_core::monte_carlo`);
//! the server's parameter reader reads the request's `mc_` parameters.
//!
//! Noise is Gaussian, `sigma` times a standard normal, added to every element
//! of every floating-point input the model does not opt out. It comes from a
//! counter-based generator: sample `s` of row `r`, element `e` draws from a
//! hash of (seed, r, s, e) alone, so the same seed gives bit-identical noisy
//! rows however the requests are batched, split or interleaved.

mod noise;
mod summary;

use tickserve_core::monte_carlo::{MonteCarlo, MonteCarloSettings, Summary};
use tickserve_core::{Error, Signature};

/// One request's Monte Carlo run: how to expand its rows and reduce the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    rows: usize,
    samples: usize,
    total: usize,
    seed: u64,
    /// Per input: its sigmas (one, or one per element), or `None` if not perturbed.
    sigmas: Vec<Option<Vec<f64>>>,
    summary: Summary,
}

impl Plan {
    /// The seed its noise is drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// Checks `mc` for a request of `rows` rows to `model` against the model's
/// `settings`, and fixes its seed; `clean_rows` more rows run beside the
/// noisy copies (a sequence's clean tick) and count towards `max_samples`.
pub fn plan(
    settings: &MonteCarloSettings,
    model: &str,
    signature: &Signature,
    mc: &MonteCarlo,
    rows: usize,
    clean_rows: usize,
) -> Result<Plan, Error> {
    if !settings.enabled {
        return Err(Error::request(
            model,
            "the model takes no Monte Carlo requests (mc_samples): its model.toml has no \
             [monte_carlo] enabled = true",
        ));
    }
    let total = rows.checked_mul(mc.samples);
    let Some(total) = total.filter(|&t| t.saturating_add(clean_rows) <= settings.max_samples)
    else {
        let clean = if clean_rows > 0 {
            format!(" + {clean_rows} clean row")
        } else {
            String::new()
        };
        return Err(Error::request(
            model,
            format!(
                "mc_samples {} × {rows} rows{clean} is more than this model's \
                 monte_carlo.max_samples ({})",
                mc.samples, settings.max_samples
            ),
        ));
    };
    let mut sigmas = Vec::with_capacity(settings.perturbed.len());
    for (spec, configured) in signature.inputs.iter().zip(&settings.perturbed) {
        sigmas.push(match (configured, mc.sigma) {
            (None, _) => None,
            (Some(_), Some(sigma)) => Some(vec![sigma]),
            (Some(per_feature), None) if !per_feature.is_empty() => Some(per_feature.clone()),
            (Some(_), None) => {
                return Err(Error::request(
                    model,
                    format!(
                        "give mc_noise_sigma: input '{}' has no sigma in the model's monte_carlo.sigma",
                        spec.name
                    ),
                ));
            }
        });
    }
    if sigmas.iter().all(Option::is_none) {
        return Err(Error::request(
            model,
            "Monte Carlo perturbs FP32 and FP64 inputs; this model has none that is not \
             excluded (its inputs are integers, booleans or opted out)",
        ));
    }
    Ok(Plan {
        rows,
        samples: mc.samples,
        total,
        seed: mc.seed.unwrap_or_else(fresh_seed),
        sigmas,
        summary: mc.summary.clone(),
    })
}

/// A seed for a request that brings none: different for every call.
#[allow(clippy::disallowed_methods)] // an unseeded run mixes the wall clock into its seed
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS once per process and its hashers
    // differ per instance; the time mixes in the call.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

impl Plan {
    /// Rows the expanded request carries (rows × samples).
    pub fn total_rows(&self) -> usize {
        self.total
    }

    /// Elements of noise the expansion draws (for deciding where it runs).
    pub fn noise_elements(&self, signature: &Signature) -> usize {
        let per_row: usize = signature
            .inputs
            .iter()
            .zip(&self.sigmas)
            .filter(|(_, s)| s.is_some())
            .map(|(t, _)| t.row_elements())
            .sum();
        per_row.saturating_mul(self.total)
    }

    /// The bytes the run holds beyond the request's own: the noisy inputs,
    /// and the answer of every noisy row for `outputs` (output indices)
    /// before it is summarized.
    pub fn held_bytes(&self, signature: &Signature, outputs: &[usize]) -> usize {
        let inputs: usize = signature.inputs.iter().map(|t| t.row_bytes()).sum();
        let answer: usize = outputs
            .iter()
            .filter_map(|&o| signature.outputs.get(o))
            .map(|t| t.row_bytes())
            .sum();
        inputs.saturating_add(answer).saturating_mul(self.total)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tickserve_core::monte_carlo::MonteCarloConfig;
    use tickserve_core::validate::ValidRequest;
    use tickserve_core::{DataType, TensorSpec};

    pub(crate) fn signature() -> Signature {
        Signature {
            inputs: vec![
                TensorSpec {
                    name: "x".into(),
                    datatype: DataType::Fp32,
                    dims: vec![2],
                },
                TensorSpec {
                    name: "ids".into(),
                    datatype: DataType::Int64,
                    dims: vec![1],
                },
            ],
            outputs: vec![TensorSpec {
                name: "y".into(),
                datatype: DataType::Fp32,
                dims: vec![2],
            }],
        }
    }

    pub(crate) fn valid(rows: usize) -> ValidRequest {
        let x: Vec<u8> = (0..rows * 2)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let ids: Vec<u8> = (0..rows).flat_map(|i| (i as i64).to_le_bytes()).collect();
        ValidRequest {
            rows,
            inputs: vec![x.into(), ids.into()],
            outputs: vec![0],
            bucket_rows: 0,
        }
    }

    /// `settings` with Monte Carlo on, as `enabled = true` sets it.
    pub(crate) fn enabled(settings: MonteCarloSettings) -> MonteCarloSettings {
        MonteCarloSettings {
            enabled: true,
            ..settings
        }
    }

    pub(crate) fn mc(samples: usize, seed: u64, summary: Summary) -> MonteCarlo {
        MonteCarlo {
            samples,
            sigma: Some(0.1),
            seed: Some(seed),
            summary,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_noise_and_integers_are_left_alone() {
        let s = signature();
        let settings = enabled(MonteCarloSettings::defaults(&s.inputs, 4096));
        // Two plans from the same seed (two requests with mc_seed 42) give
        // the same noisy rows.
        let plan = super::plan(&settings, "m", &s, &mc(8, 42, Summary::Moments), 2, 0).unwrap();
        let twin = super::plan(&settings, "m", &s, &mc(8, 42, Summary::Moments), 2, 0).unwrap();
        let a = plan.expand(&valid(2), &s);
        let b = twin.expand(&valid(2), &s);
        assert_eq!(a.rows, 16);
        assert_eq!(a.inputs, b.inputs);
        // Integers copied: row 1's id in all of its 8 copies.
        let ids: Vec<i64> = a.inputs[1]
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ids, [vec![0; 8], vec![1; 8]].concat());
        let other = super::plan(&settings, "m", &s, &mc(8, 43, Summary::Moments), 2, 0).unwrap();
        assert_ne!(other.expand(&valid(2), &s).inputs[0], a.inputs[0]);
        // Both sides of max_samples (4096): rows × samples at the limit pass.
        assert!(super::plan(&settings, "m", &s, &mc(4096, 1, Summary::Moments), 1, 0).is_ok());
        assert!(super::plan(&settings, "m", &s, &mc(2048, 1, Summary::Moments), 2, 0).is_ok());
        assert!(super::plan(&settings, "m", &s, &mc(4097, 1, Summary::Moments), 1, 0).is_err());
        assert!(super::plan(&settings, "m", &s, &mc(2048, 1, Summary::Moments), 3, 0).is_err());
        // A sequence's clean row counts: max_samples noisy rows leave no room for it.
        assert!(super::plan(&settings, "m", &s, &mc(4095, 1, Summary::Moments), 1, 1).is_ok());
        let e = super::plan(&settings, "m", &s, &mc(4096, 1, Summary::Moments), 1, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("+ 1 clean row"), "{e}");
        // Off unless the model turns it on.
        let off = MonteCarloSettings::defaults(&s.inputs, 4096);
        let e = super::plan(&off, "m", &s, &mc(4, 1, Summary::Moments), 1, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("enabled = true"), "{e}");
    }

    #[test]
    fn plans_are_checked_against_the_model() {
        let s = signature();
        let config = MonteCarloConfig {
            exclude: vec!["x".into()],
            ..Default::default()
        };
        let settings = enabled(MonteCarloSettings::resolve(&config, &s.inputs, 4096).unwrap());
        let e = super::plan(&settings, "m", &s, &mc(4, 1, Summary::Moments), 1, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("FP32 and FP64"), "{e}");
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("x".into(), vec![0.1, 0.2]);
        let settings = enabled(MonteCarloSettings::resolve(&config, &s.inputs, 100).unwrap());
        let per_feature = MonteCarlo {
            sigma: None,
            ..mc(4, 1, Summary::Moments)
        };
        assert!(super::plan(&settings, "m", &s, &per_feature, 1, 0).is_ok());
        let defaults = enabled(MonteCarloSettings::defaults(&s.inputs, 100));
        assert!(super::plan(&defaults, "m", &s, &per_feature, 1, 0).is_err());
    }
}
