//! Cumulative per-model statistics, as Triton's ModelStatistics reports them.
//!
//! Executors add to them after each request and run (relaxed atomics, no
//! locks); front ends read them for `/v2/models/{m}/stats` and the gRPC
//! ModelStatistics RPC.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and a total duration.
#[derive(Debug, Default)]
pub struct DurationStat {
    count: AtomicU64,
    nanos: AtomicU64,
}

impl DurationStat {
    /// Adds one occurrence lasting `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// `(count, total nanoseconds)`.
    pub fn read(&self) -> (u64, u64) {
        (
            self.count.load(Ordering::Relaxed),
            self.nanos.load(Ordering::Relaxed),
        )
    }
}

/// Statistics of one model version.
#[derive(Debug)]
pub struct ModelStats {
    /// Requests answered with a prediction, and their time in the executor.
    pub success: DurationStat,
    /// Requests that failed after admission.
    pub fail: DurationStat,
    /// Time requests waited before their first run.
    pub queue: DurationStat,
    /// Time copying rows into bucket buffers.
    pub compute_input: DurationStat,
    /// Engine run time.
    pub compute_infer: DurationStat,
    /// Time copying rows out of bucket buffers.
    pub compute_output: DurationStat,
    /// Runs per bucket, with their engine time (index: bucket index).
    pub per_bucket: Vec<DurationStat>,
    /// Rows answered.
    pub inference_count: AtomicU64,
    /// Engine runs.
    pub execution_count: AtomicU64,
    /// Milliseconds since the epoch of the last answered request.
    pub last_inference_ms: AtomicU64,
    /// Requests in the executor's queue: raised by the caller before it
    /// queues one, lowered by the executor thread when it takes one.
    pub queued: AtomicUsize,
}

impl ModelStats {
    /// Empty statistics for a model with `buckets` buckets.
    pub fn new(buckets: usize) -> ModelStats {
        ModelStats {
            success: DurationStat::default(),
            fail: DurationStat::default(),
            queue: DurationStat::default(),
            compute_input: DurationStat::default(),
            compute_infer: DurationStat::default(),
            compute_output: DurationStat::default(),
            per_bucket: (0..buckets).map(|_| DurationStat::default()).collect(),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            last_inference_ms: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
        }
    }

    /// Marks a request of `rows` rows answered now.
    pub fn answered(&self, rows: usize) {
        self.inference_count
            .fetch_add(rows as u64, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.last_inference_ms.store(now, Ordering::Relaxed);
    }
}
