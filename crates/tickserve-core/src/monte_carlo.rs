//! Monte Carlo input noise: a request asks for N noisy copies of each of its
//! rows, the copies run as one batched request (they fill buckets, which
//! costs little more than one row), and the answer is the spread of the
//! predictions: mean and standard deviation per output element, or quantiles,
//! or the raw samples.
//!
//! Noise is Gaussian, `sigma` times a standard normal, added to every element
//! of every floating-point input the model does not opt out. It comes from a
//! counter-based generator: sample `s` of row `r`, element `e` draws from a
//! hash of (seed, r, s, e) alone, so the same seed gives bit-identical noisy
//! rows however the requests are batched, split or interleaved.
//!
//! The request parameters, read by the server's one parameter reader, are
//! the same over every protocol: `mc_samples` (turns it on), `mc_noise_sigma` (a scalar; without
//! it the model's per-feature `[monte_carlo.sigma]` applies), `mc_seed`,
//! `mc_output` (`moments`, the default; `quantiles`; `samples`) and
//! `mc_quantiles` (`"0.05,0.5,0.95"`, the default).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::validate::ValidRequest;
use crate::{DataType, Error, InferResponse, OutputTensor, Signature, TensorSpec};

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
            max_samples,
            perturbed,
        })
    }

    /// The settings of a model with `inputs` and no `[monte_carlo]` table.
    pub fn defaults(inputs: &[TensorSpec], max_queue_rows: usize) -> MonteCarloSettings {
        Self::resolve(&MonteCarloConfig::default(), inputs, max_queue_rows).unwrap_or(
            MonteCarloSettings {
                max_samples: DEFAULT_MAX_SAMPLES.min(max_queue_rows),
                perturbed: vec![None; inputs.len()],
            },
        )
    }

    /// Checks `mc` for a request of `rows` rows to `model`, and fixes its seed.
    pub fn plan(
        &self,
        model: &str,
        signature: &Signature,
        mc: &MonteCarlo,
        rows: usize,
    ) -> Result<Plan, Error> {
        let total = rows
            .checked_mul(mc.samples)
            .filter(|&t| t <= self.max_samples);
        let Some(total) = total else {
            return Err(Error::request(
                model,
                format!(
                    "mc_samples {} × {rows} rows is more than this model's monte_carlo.max_samples ({})",
                    mc.samples, self.max_samples
                ),
            ));
        };
        let mut sigmas = Vec::with_capacity(self.perturbed.len());
        for (spec, configured) in signature.inputs.iter().zip(&self.perturbed) {
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
}

/// A seed for a request that brings none: different for every call.
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
    /// Rows the expanded request carries (rows × samples).
    pub fn total_rows(&self) -> usize {
        self.total
    }

    /// The seed the noise comes from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

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
        }
    }

    /// The answer to the original request from the answer to the expanded
    /// one: each output's summary over the samples of each row.
    pub fn reduce(&self, mut response: InferResponse) -> InferResponse {
        let outputs = std::mem::take(&mut response.outputs);
        for output in outputs {
            response.outputs.extend(self.summarize(output));
        }
        response
    }

    fn summarize(&self, output: OutputTensor) -> Vec<OutputTensor> {
        let dims: Vec<i64> = output.shape.get(1..).unwrap_or_default().to_vec();
        let elements = dims
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .product::<usize>();
        let with_rows = |leading: &[i64]| -> Vec<i64> {
            std::iter::once(self.rows as i64)
                .chain(leading.iter().copied())
                .chain(dims.iter().copied())
                .collect()
        };
        if self.summary == Summary::Samples {
            return vec![OutputTensor {
                name: format!("{}_samples", output.name),
                datatype: output.datatype,
                shape: with_rows(&[self.samples as i64]),
                data: output.data,
            }];
        }
        let values = &as_f64(output.datatype, &output.data);
        let wide = output.datatype == DataType::Fp64;
        let encode = |v: &[f64]| -> (DataType, Vec<u8>) {
            if wide {
                (
                    DataType::Fp64,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            } else {
                (
                    DataType::Fp32,
                    v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
                )
            }
        };
        // The samples of element e of row r.
        let column = |r: usize, e: usize| {
            (0..self.samples).map(move |s| {
                values
                    .get((r * self.samples + s) * elements + e)
                    .copied()
                    .unwrap_or(0.0)
            })
        };
        let per_element = |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
            (0..self.rows)
                .flat_map(|r| (0..elements).map(move |e| (r, e)))
                .map(|(r, e)| f(r, e))
                .collect()
        };
        let tensor = |suffix: String, v: Vec<f64>| {
            let (datatype, data) = encode(&v);
            OutputTensor {
                name: format!("{}_{suffix}", output.name),
                datatype,
                shape: with_rows(&[]),
                data,
            }
        };
        let n = self.samples as f64;
        match &self.summary {
            Summary::Moments => {
                let means = per_element(&|r, e| column(r, e).sum::<f64>() / n);
                let stds = per_element(&|r, e| {
                    let mean = means[r * elements + e];
                    (column(r, e).map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt()
                });
                vec![tensor("mean".into(), means), tensor("std".into(), stds)]
            }
            Summary::Quantiles(quantiles) => {
                let mut sorted: Vec<Vec<f64>> = (0..self.rows * elements)
                    .map(|i| {
                        let mut c: Vec<f64> =
                            column(i / elements.max(1), i % elements.max(1)).collect();
                        c.sort_by(f64::total_cmp);
                        c
                    })
                    .collect();
                quantiles
                    .iter()
                    .map(|&q| {
                        let v = sorted.iter_mut().map(|c| quantile(c, q)).collect();
                        tensor(format!("q{}", percent(q)), v)
                    })
                    .collect()
            }
            Summary::Samples => Vec::new(),
        }
    }
}

/// The q-quantile of sorted `values`, interpolating linearly (numpy's default).
fn quantile(values: &[f64], q: f64) -> f64 {
    match values.len() {
        0 => f64::NAN,
        1 => values[0],
        n => {
            let at = q * (n - 1) as f64;
            let low = at.floor() as usize;
            let high = (low + 1).min(n - 1);
            values[low] + (values[high] - values[low]) * (at - low as f64)
        }
    }
}

/// `q` in percent for an output name: 0.05 → `5`, 0.5 → `50`, 0.025 → `2.5`.
pub fn percent(q: f64) -> String {
    let p = (q * 1e6).round() / 1e4;
    let text = format!("{p:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Tensor bytes as f64 values.
fn as_f64(datatype: DataType, data: &[u8]) -> Vec<f64> {
    macro_rules! each {
        ($t:ty) => {
            data.chunks_exact(size_of::<$t>())
                .map(|c| {
                    let mut a = [0u8; size_of::<$t>()];
                    a.copy_from_slice(c);
                    <$t>::from_le_bytes(a) as f64
                })
                .collect()
        };
    }
    match datatype {
        DataType::Bool => data.iter().map(|&b| f64::from(u8::from(b != 0))).collect(),
        DataType::Uint8 => each!(u8),
        DataType::Uint16 => each!(u16),
        DataType::Uint32 => each!(u32),
        DataType::Uint64 => each!(u64),
        DataType::Int8 => each!(i8),
        DataType::Int16 => each!(i16),
        DataType::Int32 => each!(i32),
        DataType::Int64 => each!(i64),
        DataType::Fp32 => each!(f32),
        DataType::Fp64 => each!(f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature() -> Signature {
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

    fn valid(rows: usize) -> ValidRequest {
        let x: Vec<u8> = (0..rows * 2)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let ids: Vec<u8> = (0..rows).flat_map(|i| (i as i64).to_le_bytes()).collect();
        ValidRequest {
            rows,
            inputs: vec![x.into(), ids.into()],
            outputs: vec![0],
        }
    }

    fn mc(samples: usize, seed: u64, summary: Summary) -> MonteCarlo {
        MonteCarlo {
            samples,
            sigma: Some(0.1),
            seed: Some(seed),
            summary,
        }
    }

    #[test]
    fn expansion_is_deterministic_and_leaves_integers_alone() {
        let s = signature();
        let settings = MonteCarloSettings::defaults(&s.inputs, 4096);
        let plan = settings
            .plan("m", &s, &mc(8, 42, Summary::Moments), 2)
            .unwrap();
        let a = plan.expand(&valid(2), &s);
        let b = plan.expand(&valid(2), &s);
        assert_eq!(a.rows, 16);
        assert_eq!(a.inputs, b.inputs);
        // Integers copied: row 1's id in all of its 8 copies.
        let ids: Vec<i64> = a.inputs[1]
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ids, [vec![0; 8], vec![1; 8]].concat());
        let other = settings
            .plan("m", &s, &mc(8, 43, Summary::Moments), 2)
            .unwrap();
        assert_ne!(other.expand(&valid(2), &s).inputs[0], a.inputs[0]);
        assert!(
            settings
                .plan("m", &s, &mc(4097, 1, Summary::Moments), 1)
                .is_err()
        );
        assert!(
            settings
                .plan("m", &s, &mc(2048, 1, Summary::Moments), 3)
                .is_err()
        );
    }

    #[test]
    fn noise_is_standard_normal() {
        let n = 200_000u64;
        let draws: Vec<f64> = (0..n).map(|c| gaussian(9, c)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors: 1/sqrt(n) ≈ 0.0022 for the mean, sqrt(2/n) ≈ 0.0032 for the variance.
        assert!(mean.abs() < 0.011, "{mean}");
        assert!((var - 1.0).abs() < 0.016, "{var}");
    }

    #[test]
    fn summaries_are_named_and_shaped() {
        let s = signature();
        let settings = MonteCarloSettings::defaults(&s.inputs, 4096);
        let response = |samples: usize| InferResponse {
            model: "m".into(),
            version: "1".into(),
            id: String::new(),
            // 1 row × `samples` samples × 2 elements: sample k is [k, 2k].
            outputs: vec![OutputTensor {
                name: "y".into(),
                datatype: DataType::Fp32,
                shape: vec![samples as i64, 2],
                data: (0..samples)
                    .flat_map(|k| [k as f32, 2.0 * k as f32])
                    .flat_map(f32::to_le_bytes)
                    .collect(),
            }],
            timing: Default::default(),
            sequence_restarted: false,
        };
        let plan = settings
            .plan("m", &s, &mc(5, 1, Summary::Moments), 1)
            .unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_mean");
        assert_eq!(out.outputs[0].shape, vec![1, 2]);
        assert_eq!(as_f64(DataType::Fp32, &out.outputs[0].data), vec![2.0, 4.0]);
        assert_eq!(out.outputs[1].name, "y_std");
        let std = as_f64(DataType::Fp32, &out.outputs[1].data);
        assert!((std[0] - 2f64.sqrt()).abs() < 1e-6, "{std:?}");
        let plan = settings
            .plan("m", &s, &mc(5, 1, Summary::Quantiles(vec![0.5, 0.025])), 1)
            .unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_q50");
        assert_eq!(as_f64(DataType::Fp32, &out.outputs[0].data), vec![2.0, 4.0]);
        assert_eq!(out.outputs[1].name, "y_q2.5");
        let plan = settings
            .plan("m", &s, &mc(5, 1, Summary::Samples), 1)
            .unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_samples");
        assert_eq!(out.outputs[0].shape, vec![1, 5, 2]);
    }

    #[test]
    fn model_settings_are_checked() {
        let s = signature();
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("ids".into(), vec![0.1]);
        assert!(
            MonteCarloSettings::resolve(&config, &s.inputs, 4096)
                .unwrap_err()
                .contains("INT64")
        );
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("x".into(), vec![0.1, 0.2, 0.3]);
        assert!(
            MonteCarloSettings::resolve(&config, &s.inputs, 4096)
                .unwrap_err()
                .contains("3 values")
        );
        let config = MonteCarloConfig {
            exclude: vec!["x".into()],
            ..Default::default()
        };
        let settings = MonteCarloSettings::resolve(&config, &s.inputs, 4096).unwrap();
        let e = settings
            .plan("m", &s, &mc(4, 1, Summary::Moments), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("FP32 and FP64"), "{e}");
        let mut config = MonteCarloConfig::default();
        config.sigma.insert("x".into(), vec![0.1, 0.2]);
        let settings = MonteCarloSettings::resolve(&config, &s.inputs, 100).unwrap();
        assert_eq!(settings.max_samples, 100);
        let per_feature = MonteCarlo {
            sigma: None,
            ..mc(4, 1, Summary::Moments)
        };
        assert!(settings.plan("m", &s, &per_feature, 1).is_ok());
        assert!(
            MonteCarloSettings::defaults(&s.inputs, 100)
                .plan("m", &s, &per_feature, 1)
                .is_err()
        );
    }
}
