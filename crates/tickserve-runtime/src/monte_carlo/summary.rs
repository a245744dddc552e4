//! The answer to a Monte Carlo request: each output's summary over the
//! samples of each row (mean and std, quantiles, or the samples).

use tickserve_core::monte_carlo::Summary;
use tickserve_core::{DataType, InferResponse, OutputTensor};

use super::Plan;

impl Plan {
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
                name: format!("{}_samples", output.name).into(),
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
                name: format!("{}_{suffix}", output.name).into(),
                datatype,
                shape: with_rows(&[]),
                data: data.into(),
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
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::monte_carlo::tests::{mc, signature};
    use tickserve_core::monte_carlo::MonteCarloSettings;

    #[test]
    fn summaries_are_named_and_shaped() {
        let s = signature();
        let settings = super::super::tests::enabled(MonteCarloSettings::defaults(&s.inputs, 4096));
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
            bucket: 1,
            state_read: Vec::new(),
            window_ticks: None,
        };
        let plan =
            super::super::plan(&settings, "m", &s, &mc(5, 1, Summary::Moments), 1, 0).unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_mean");
        assert_eq!(out.outputs[0].shape, vec![1, 2]);
        assert_eq!(as_f64(DataType::Fp32, &out.outputs[0].data), vec![2.0, 4.0]);
        assert_eq!(out.outputs[1].name, "y_std");
        let std = as_f64(DataType::Fp32, &out.outputs[1].data);
        assert!((std[0] - 2f64.sqrt()).abs() < 1e-6, "{std:?}");
        let quantiles = mc(5, 1, Summary::Quantiles(vec![0.5, 0.025]));
        let plan = super::super::plan(&settings, "m", &s, &quantiles, 1, 0).unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_q50");
        assert_eq!(as_f64(DataType::Fp32, &out.outputs[0].data), vec![2.0, 4.0]);
        assert_eq!(out.outputs[1].name, "y_q2.5");
        let plan =
            super::super::plan(&settings, "m", &s, &mc(5, 1, Summary::Samples), 1, 0).unwrap();
        let out = plan.reduce(response(5));
        assert_eq!(out.outputs[0].name, "y_samples");
        assert_eq!(out.outputs[0].shape, vec![1, 5, 2]);
    }
}
