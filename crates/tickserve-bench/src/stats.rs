//! Latency percentiles as trading desks quote them (STAC-ML: median, p99,
//! p99.9, max, and max over median).

use std::time::Duration;

/// Percentiles of a set of durations, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
    /// The largest.
    pub max: f64,
}

impl Percentiles {
    /// Of `samples` (nearest rank); all zero for none.
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        samples.sort_unstable();
        let at = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let rank = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len());
            samples[rank - 1].as_nanos() as f64 / 1e3
        };
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_of_a_thousand() {
        let mut samples: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!((p.p50, p.p99, p.p999, p.max), (500.0, 990.0, 999.0, 1000.0));
        assert_eq!(Percentiles::of(&mut []).max, 0.0);
    }
}
