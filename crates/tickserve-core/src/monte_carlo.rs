//! Monte Carlo input noise: a request asks for N noisy copies of each of its
//! rows, the copies run as one batched request (they fill buckets, which
//! costs little more than one row), and the answer is the spread of the
//! predictions: mean and standard deviation per output element, or quantiles,
//! or the raw samples.
//!
//! Here: what a request asks ([`MonteCarlo`]) and what a model allows
//! ([`MonteCarloConfig`], resolved into [`MonteCarloSettings`]). The noise
//! generator, the expansion and the summaries are the runtime's
//! (`tickserve_runtime`'s `monte_carlo`).
//!
//! The request parameters, read by the server's one parameter reader, are
//! the same over every protocol: `mc_samples` (turns it on), `mc_noise_sigma` (a scalar; without
//! it the model's per-feature `[monte_carlo.sigma]` applies), `mc_seed`,
//! `mc_output` (`moments`, the default; `quantiles`; `samples`) and
//! `mc_quantiles` (`"0.05,0.5,0.95"`, the default).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::TensorSpec;

/// The most samples a request may ask for (rows × samples), unless the
/// model's `monte_carlo.max_samples` says less.
pub const DEFAULT_MAX_SAMPLES: usize = 4096;

/// The quantiles `mc_output = "quantiles"` returns without `mc_quantiles`.
pub const DEFAULT_QUANTILES: [f64; 3] = [0.05, 0.5, 0.95];

/// The most quantiles one request may ask for.
pub const MAX_QUANTILES: usize = 16;

/// What a Monte Carlo answer holds per output.
#[derive(Debug, Clone, PartialEq)]
pub enum Summary {
    /// `NAME_mean` and `NAME_std` (standard deviation over the samples,
    /// ddof 0, as numpy's default).
    Moments,
    /// `NAME_qP` for each quantile (P in percent: `NAME_q5`, `NAME_q50`),
    /// linear interpolation between samples (numpy's default method).
    Quantiles(Vec<f64>),
    /// `NAME_samples`, shaped `[rows, samples, ...]`, in the output's datatype.
    Samples,
}

/// A request's Monte Carlo parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MonteCarlo {
    /// Noisy copies of each row.
    pub samples: usize,
    /// One sigma for every perturbed element; `None` takes the model's.
    pub sigma: Option<f64>,
    /// The generator's seed; `None` draws one.
    pub seed: Option<u64>,
    /// What comes back.
    pub summary: Summary,
}

/// A model's `[monte_carlo]` table in `model.toml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MonteCarloConfig {
    /// Whether the model takes Monte Carlo requests at all (off unless set:
    /// one request of many samples costs as many rows).
    pub enabled: bool,
    /// The most samples one request may ask for, rows × samples (default
    /// [`DEFAULT_MAX_SAMPLES`], and never more than `max_queue_rows`).
    pub max_samples: Option<usize>,
    /// Per-feature sigmas by input name: one per element of a row, or one for
    /// all; used when a request gives no `mc_noise_sigma`.
    pub sigma: BTreeMap<String, Vec<f64>>,
    /// Floating-point inputs never perturbed.
    pub exclude: Vec<String>,
}

/// A model's Monte Carlo settings, checked against its signature at load.
#[derive(Debug, Clone, PartialEq)]
pub struct MonteCarloSettings {
    /// Whether the model takes Monte Carlo requests (`enabled = true`).
    pub enabled: bool,
    /// The most rows × samples of one request.
    pub max_samples: usize,
    /// Per input, in signature order: `None` for an input never perturbed
    /// (not floating-point, or excluded); else its per-element sigmas from
    /// `model.toml` (empty when it has none).
    pub perturbed: Vec<Option<Vec<f64>>>,
}

impl MonteCarloSettings {
    /// Checks `config` against the model's `inputs`; `max_queue_rows` caps
    /// the samples (the noisy rows queue as one request).
    pub fn resolve(
        config: &MonteCarloConfig,
        inputs: &[TensorSpec],
        max_queue_rows: usize,
    ) -> Result<MonteCarloSettings, String> {
        let max_samples = config
            .max_samples
            .unwrap_or(DEFAULT_MAX_SAMPLES)
            .min(max_queue_rows);
        if max_samples == 0 {
            return Err("monte_carlo.max_samples must be positive".to_string());
        }
        for name in config.exclude.iter().chain(config.sigma.keys()) {
            if !inputs.iter().any(|t| t.name == *name) {
                return Err(format!(
                    "monte_carlo names input '{name}', which the model does not have"
                ));
            }
        }
        let mut perturbed = Vec::with_capacity(inputs.len());
        for spec in inputs {
            let sigmas = config.sigma.get(&spec.name);
            if !spec.datatype.is_float() || config.exclude.contains(&spec.name) {
                if sigmas.is_some() {
                    return Err(format!(
                        "monte_carlo.sigma.{} is set, but the input is {} (only FP32 and FP64 \
                         inputs that are not excluded are perturbed)",
                        spec.name,
                        if spec.datatype.is_float() {
                            "excluded".to_string()
                        } else {
                            spec.datatype.to_string()
                        }
                    ));
                }
                perturbed.push(None);
                continue;
            }
            let sigmas = sigmas.cloned().unwrap_or_default();
            if !(sigmas.is_empty() || sigmas.len() == 1 || sigmas.len() == spec.row_elements()) {
                return Err(format!(
                    "monte_carlo.sigma.{} has {} values; the input has {} per row (or give one)",
                    spec.name,
                    sigmas.len(),
                    spec.row_elements()
                ));
            }
            if let Some(bad) = sigmas.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
                return Err(format!(
                    "monte_carlo.sigma.{} holds {bad}; sigmas are finite and 0 or more",
                    spec.name
                ));
            }
            perturbed.push(Some(sigmas));
        }
        Ok(MonteCarloSettings {
            enabled: config.enabled,
            max_samples,
            perturbed,
        })
    }

    /// The settings of a model with `inputs` and no `[monte_carlo]` table.
    pub fn defaults(inputs: &[TensorSpec], max_queue_rows: usize) -> MonteCarloSettings {
        Self::resolve(&MonteCarloConfig::default(), inputs, max_queue_rows).unwrap_or(
            MonteCarloSettings {
                enabled: false,
                max_samples: DEFAULT_MAX_SAMPLES.min(max_queue_rows),
                perturbed: vec![None; inputs.len()],
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataType;

    fn inputs() -> Vec<TensorSpec> {
        vec![
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
        ]
    }

    #[test]
    fn model_settings_are_checked() {
        let inputs = inputs();
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("ids".into(), vec![0.1]);
        assert!(
            MonteCarloSettings::resolve(&config, &inputs, 4096)
                .unwrap_err()
                .contains("INT64")
        );
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("x".into(), vec![0.1, 0.2, 0.3]);
        assert!(
            MonteCarloSettings::resolve(&config, &inputs, 4096)
                .unwrap_err()
                .contains("3 values")
        );
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("x".into(), vec![0.1, 0.2]);
        let settings = MonteCarloSettings::resolve(&config, &inputs, 100).unwrap();
        assert_eq!(settings.max_samples, 100);
        assert_eq!(settings.perturbed[0], Some(vec![0.1, 0.2]));
        assert_eq!(settings.perturbed[1], None, "integers are never perturbed");
    }
}
