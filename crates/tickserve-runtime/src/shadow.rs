//! Shadow versions (`[[shadow]]` in `model.toml`): a version that gets a
//! copy of (a fraction of) another version's requests after the primary
//! has answered, runs it only on capacity no request waits for, and has
//! its answer compared with the primary's. The client never sees a
//! shadow's answer and never waits for it; no sequence is touched (sequence
//! ticks and Monte Carlo requests are not mirrored). The shadow's own
//! statistics count its runs; the edge journals its answers (protocol
//! `shadow`) when the journal is on.
//!
//! Per (model, primary, shadow): the largest absolute difference over a
//! request's outputs (`tickserve_shadow_max_abs_diff`), whether each row's
//! top class agrees (the arg-max of the first output, or its sign when it
//! has one value per row: `tickserve_shadow_rows_total{agree}`), the
//! shadow's own run time (`tickserve_shadow_duration_seconds`), and the
//! copies dropped because the shadow would have waited, or that failed
//! (`tickserve_shadow_dropped_total{reason}`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tickserve_core::validate::ValidRequest;
use tickserve_core::{DataType, Error, InferResponse, OutputTensor, metrics as names};

use crate::handle::ModelHandle;

/// One shadow of one primary version.
#[derive(Debug)]
pub struct ShadowPlan {
    /// The shadow version.
    pub shadow: Arc<ModelHandle>,
    /// The fraction of the primary's requests it gets.
    pub fraction: f64,
    draws: AtomicU64,
    metrics: ShadowMetrics,
}

#[derive(Debug)]
struct ShadowMetrics {
    max_abs_diff: metrics::Histogram,
    duration: metrics::Histogram,
    agree: metrics::Counter,
    disagree: metrics::Counter,
    busy: metrics::Counter,
    failed: metrics::Counter,
}

impl ShadowPlan {
    /// `shadow` mirroring `fraction` of version `primary`'s requests.
    pub fn new(primary: &str, shadow: Arc<ModelHandle>, fraction: f64) -> ShadowPlan {
        let labels = [
            ("model", shadow.name.clone()),
            ("primary", primary.to_string()),
            ("shadow", shadow.version.clone()),
        ];
        let with = |extra: (&'static str, &'static str)| {
            let mut all: Vec<(&'static str, String)> = labels.to_vec();
            all.push((extra.0, extra.1.to_string()));
            all
        };
        let metrics = ShadowMetrics {
            max_abs_diff: metrics::histogram!(names::SHADOW_MAX_ABS_DIFF, &labels),
            duration: metrics::histogram!(names::SHADOW_DURATION, &labels),
            agree: metrics::counter!(names::SHADOW_ROWS, &with(("agree", "true"))),
            disagree: metrics::counter!(names::SHADOW_ROWS, &with(("agree", "false"))),
            busy: metrics::counter!(names::SHADOW_DROPPED, &with(("reason", "busy"))),
            failed: metrics::counter!(names::SHADOW_DROPPED, &with(("reason", "failed"))),
        };
        ShadowPlan {
            shadow,
            fraction,
            draws: AtomicU64::new(0),
            metrics,
        }
    }

    /// Whether this request is one the shadow gets: every request at 1, a
    /// spread `fraction` of them below.
    pub fn wants(&self) -> bool {
        if self.fraction >= 1.0 {
            return true;
        }
        drawn(self.draws.fetch_add(1, Ordering::Relaxed), self.fraction)
    }

    /// Runs `request` on the shadow (see [`ModelHandle::shadow`]) and
    /// compares its answer with `primary`'s, recording the outcome; returns
    /// the shadow's answer (`None`: dropped, it would have waited).
    #[allow(clippy::disallowed_methods)] // a shadow run's duration is the machine's time
    pub async fn run(
        &self,
        request: ValidRequest,
        primary: &InferResponse,
    ) -> Option<Result<InferResponse, Error>> {
        let started = Instant::now();
        let outcome = self.shadow.shadow(request).await;
        match &outcome {
            None => self.metrics.busy.increment(1),
            Some(Err(e)) => {
                tracing::debug!(model = %self.shadow.name, shadow = %self.shadow.version, error = %e,
                    "a shadow run failed");
                self.metrics.failed.increment(1);
            }
            Some(Ok(answer)) => {
                self.metrics
                    .duration
                    .record(started.elapsed().as_secs_f64());
                let compared = compare(&primary.outputs, &answer.outputs);
                self.metrics.max_abs_diff.record(compared.max_abs_diff);
                self.metrics.agree.increment(compared.rows_agreeing);
                self.metrics
                    .disagree
                    .increment(compared.rows - compared.rows_agreeing);
            }
        }
        outcome
    }
}

/// Two answers to one request, compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compared {
    /// The largest absolute difference over every output both have
    /// (infinite when one holds NaN where the other does not, or their
    /// shapes differ).
    pub max_abs_diff: f64,
    /// Rows of the first output.
    pub rows: u64,
    /// Rows whose top class (arg-max; sign for one value per row) agrees.
    pub rows_agreeing: u64,
}

/// Compares a primary's outputs with a shadow's, output by output (by name).
pub fn compare(primary: &[OutputTensor], shadow: &[OutputTensor]) -> Compared {
    let mut compared = Compared {
        max_abs_diff: 0.0,
        rows: 0,
        rows_agreeing: 0,
    };
    for (index, ours) in primary.iter().enumerate() {
        let theirs = shadow.iter().find(|t| t.name == ours.name);
        let (Some(a), Some(b)) = (values(ours), theirs.and_then(values)) else {
            continue;
        };
        if a.len() != b.len() || theirs.is_some_and(|t| t.shape != ours.shape) {
            compared.max_abs_diff = f64::INFINITY;
            continue;
        }
        for (x, y) in a.iter().zip(&b) {
            let diff = if x.is_nan() && y.is_nan() {
                0.0
            } else {
                (x - y).abs()
            };
            compared.max_abs_diff =
                compared
                    .max_abs_diff
                    .max(if diff.is_nan() { f64::INFINITY } else { diff });
        }
        if index == 0 {
            let rows = usize::try_from(ours.shape.first().copied().unwrap_or(1))
                .unwrap_or(1)
                .max(1);
            let width = a.len() / rows;
            if width == 0 {
                continue;
            }
            compared.rows = rows as u64;
            compared.rows_agreeing = a
                .chunks(width)
                .zip(b.chunks(width))
                .filter(|(x, y)| top(x) == top(y))
                .count() as u64;
        }
    }
    compared
}

/// Whether draw `n` falls in `fraction`: SplitMix64 of `n` as a number in
/// [0, 1), below `fraction`, so any run of draws takes its share.
fn drawn(n: u64, fraction: f64) -> bool {
    crate::draw::unit(n) < fraction
}

/// A row's top class: its arg-max, or its sign when it has one value.
fn top(row: &[f64]) -> i64 {
    match row {
        [one] => {
            if *one > 0.0 {
                1
            } else if *one < 0.0 {
                -1
            } else {
                0
            }
        }
        _ => {
            row.iter()
                .enumerate()
                .fold((-1i64, f64::NEG_INFINITY), |(best, most), (i, v)| {
                    if *v > most {
                        (i as i64, *v)
                    } else {
                        (best, most)
                    }
                })
                .0
        }
    }
}

/// An output's elements as numbers; `None` for data of the wrong length.
fn values(t: &OutputTensor) -> Option<Vec<f64>> {
    fn read<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f64) -> Option<Vec<f64>> {
        data.len().is_multiple_of(N).then(|| {
            data.chunks_exact(N)
                .map(|c| f(c.try_into().unwrap_or([0; N])))
                .collect()
        })
    }
    let d = &t.data[..];
    match t.datatype {
        DataType::Fp32 => read(d, |b| f64::from(f32::from_le_bytes(b))),
        DataType::Fp64 => read(d, f64::from_le_bytes),
        DataType::Int8 => read(d, |b: [u8; 1]| f64::from(b[0] as i8)),
        DataType::Uint8 | DataType::Bool => read(d, |b: [u8; 1]| f64::from(b[0])),
        DataType::Int16 => read(d, |b| f64::from(i16::from_le_bytes(b))),
        DataType::Uint16 => read(d, |b| f64::from(u16::from_le_bytes(b))),
        DataType::Int32 => read(d, |b| f64::from(i32::from_le_bytes(b))),
        DataType::Uint32 => read(d, |b| f64::from(u32::from_le_bytes(b))),
        DataType::Int64 => read(d, |b| i64::from_le_bytes(b) as f64),
        DataType::Uint64 => read(d, |b| u64::from_le_bytes(b) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any run of draws takes its fraction, within sampling error, and 0
    /// takes none.
    #[test]
    fn draws_take_their_fraction_of_any_run() {
        for fraction in [0.1, 0.25, 0.5] {
            for start in [0u64, 1 << 20, u64::MAX - 10_000] {
                let taken = (start..start + 10_000)
                    .filter(|&n| drawn(n, fraction))
                    .count() as f64;
                let expected = 10_000.0 * fraction;
                assert!(
                    (taken - expected).abs() < 200.0,
                    "{fraction} from {start}: {taken}"
                );
            }
        }
        assert!(!(0..1000).any(|n| drawn(n, 0.0)));
    }

    #[test]
    fn the_top_class_is_the_arg_max_or_the_sign_of_one_value() {
        assert_eq!(top(&[0.3]), 1);
        assert_eq!(top(&[-0.3]), -1);
        assert_eq!(top(&[0.0]), 0);
        assert_eq!(top(&[0.1, 0.7, 0.2]), 1);
        assert_eq!(top(&[0.9, 0.7, 0.2]), 0);
        // Equal maxima: the first, as numpy's argmax; a row of NaN has no
        // top class, and agrees with no row that has one.
        assert_eq!(top(&[0.5, 0.5, 0.1]), 0);
        assert_eq!(top(&[f64::NAN, f64::NAN]), -1);
    }

    fn fp32(name: &str, shape: &[i64], v: &[f32]) -> OutputTensor {
        OutputTensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: shape.to_vec(),
            data: v
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        }
    }

    #[test]
    fn answers_are_compared_by_largest_difference_and_top_class() {
        let a = [fp32("p", &[2, 3], &[0.1, 0.7, 0.2, 0.5, 0.3, 0.2])];
        let b = [fp32("p", &[2, 3], &[0.1, 0.6, 0.3, 0.2, 0.3, 0.5])];
        let c = compare(&a, &b);
        assert!((c.max_abs_diff - 0.3).abs() < 1e-6, "{c:?}");
        assert_eq!((c.rows, c.rows_agreeing), (2, 1));
        assert_eq!(compare(&a, &a).max_abs_diff, 0.0);
        // One value per row: the sign is the class.
        let s = [fp32("s", &[3, 1], &[0.5, -0.1, 0.0])];
        let t = [fp32("s", &[3, 1], &[0.2, 0.1, 0.0])];
        let c = compare(&s, &t);
        assert_eq!((c.rows, c.rows_agreeing), (3, 2));
        // A NaN against a number, or another shape, is as far apart as can be.
        let n = [fp32("s", &[3, 1], &[f32::NAN, -0.1, 0.0])];
        assert_eq!(compare(&s, &n).max_abs_diff, f64::INFINITY);
        assert_eq!(compare(&n, &n).max_abs_diff, 0.0);
        let other = [fp32("s", &[1, 3], &[0.5, -0.1, 0.0])];
        assert_eq!(compare(&s, &other).max_abs_diff, f64::INFINITY);
    }
}
