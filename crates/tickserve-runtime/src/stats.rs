//! Cumulative per-model statistics, as Triton's ModelStatistics reports them.
//! (What waits in the queues is counted by `admission`.)
//!
//! Executors record each request once, when it is answered, and each bucket
//! run; front ends read a consistent [`Snapshot`] for `/v2/models/{m}/stats`
//! and the gRPC ModelStatistics RPC. One short uncontended lock per record
//! keeps the counts of one request consistent with each other, which
//! perf_analyzer checks.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A count and a total duration in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// How many times.
    pub count: u64,
    /// Total nanoseconds.
    pub ns: u64,
}

impl Stat {
    fn add(&mut self, elapsed: Duration) {
        self.count += 1;
        self.ns += elapsed.as_nanos() as u64;
    }
}

/// The statistics of one model version at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Requests answered with a prediction, and their time in the executor.
    pub success: Stat,
    /// Requests that failed after admission (deadline, engine error).
    pub fail: Stat,
    /// Time requests waited before they were taken up.
    pub queue: Stat,
    /// Time copying rows into bucket buffers, per request.
    pub compute_input: Stat,
    /// Engine run time, per request.
    pub compute_infer: Stat,
    /// Time copying rows out of bucket buffers, per request.
    pub compute_output: Stat,
    /// Engine runs and their time, per bucket (index: bucket index).
    pub batches: Vec<Stat>,
    /// Rows answered.
    pub inference_count: u64,
    /// Engine runs.
    pub execution_count: u64,
    /// Milliseconds since the epoch of the last answered request (0:
    /// none yet), on the wall clock when the snapshot was taken.
    pub last_inference_ms: u64,
    /// When the last answered request was answered.
    last_inference: Option<Instant>,
}

/// What answering one request cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestCost {
    /// Time from admission to being taken up.
    pub waited: Duration,
    /// Time from being taken up to the answer.
    pub total: Duration,
    /// Copying rows in, over all its runs.
    pub input: Duration,
    /// Engine time, over all its runs.
    pub infer: Duration,
    /// Copying rows out, over all its runs.
    pub output: Duration,
    /// Rows in the request.
    pub rows: usize,
    /// When it was taken up (`total` runs from there), once it was.
    pub started: Option<Instant>,
    /// Whether it was computed and answered with a prediction.
    pub ok: bool,
}

impl RequestCost {
    /// The queue and compute times reported to the client. Set once the
    /// request has been computed (the split path fills the compute parts as it runs).
    pub fn timing(&self) -> tickserve_core::Timing {
        tickserve_core::Timing {
            queue: self.waited,
            compute: self.input + self.infer + self.output,
        }
    }
}

/// `at` on the wall clock, in milliseconds since the epoch.
#[allow(clippy::disallowed_methods)] // Triton's statistics give the last inference on the wall clock: read when they are asked for, not per request
fn wall_ms(at: Instant) -> u64 {
    let wall = SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(UNIX_EPOCH);
    wall.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Statistics of one model version (shared by its replicas).
#[derive(Debug)]
pub struct ModelStats {
    counters: Mutex<Snapshot>,
}

impl ModelStats {
    /// Empty statistics for a model with `buckets` buckets.
    pub fn new(buckets: usize) -> ModelStats {
        ModelStats {
            counters: Mutex::new(Snapshot {
                batches: vec![Stat::default(); buckets],
                ..Snapshot::default()
            }),
        }
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        // Plain counters stay valid even if a holder panicked.
        self.counters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one engine run of bucket `bucket`.
    pub fn record_run(&self, bucket: usize, elapsed: Duration) {
        let mut c = self.counters();
        if let Some(stat) = c.batches.get_mut(bucket) {
            stat.add(elapsed);
        }
        c.execution_count += 1;
    }

    /// Records one answered (or refused after admission) request.
    pub fn record_request(&self, cost: &RequestCost) {
        let mut c = self.counters();
        c.queue.add(cost.waited);
        if cost.ok {
            c.success.add(cost.waited + cost.total);
            c.compute_input.add(cost.input);
            c.compute_infer.add(cost.infer);
            c.compute_output.add(cost.output);
            c.inference_count += cost.rows as u64;
            if let Some(started) = cost.started {
                c.last_inference = Some(started + cost.total);
            }
        } else {
            c.fail.add(cost.waited + cost.total);
        }
    }

    /// A consistent copy of every counter.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = self.counters().clone();
        snapshot.last_inference_ms = snapshot.last_inference.map_or(0, wall_ms);
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // the wall clock is what is checked
    fn wall_now_ms() -> u64 {
        wall_ms(Instant::now())
    }

    /// The last inference is an answered request's time, on the wall clock
    /// (Triton's `last_inference`), read when the statistics are: 0 before
    /// any; a refused request leaves it.
    #[allow(clippy::disallowed_methods)] // a request taken up now
    #[test]
    fn the_last_inference_is_the_last_answer_on_the_wall_clock() {
        let stats = ModelStats::new(1);
        assert_eq!(stats.snapshot().last_inference_ms, 0);
        let before = wall_now_ms();
        let answered = RequestCost {
            ok: true,
            started: Some(Instant::now()),
            ..RequestCost::default()
        };
        stats.record_request(&answered);
        let after = wall_now_ms();
        let at = stats.snapshot().last_inference_ms;
        assert!(
            before.saturating_sub(1) <= at && at <= after + 1,
            "{before} <= {at} <= {after}"
        );
        stats.record_request(&RequestCost {
            started: Some(Instant::now() + Duration::from_secs(60)),
            ..RequestCost::default()
        });
        assert!(stats.snapshot().last_inference_ms <= after + 1);
    }
}
