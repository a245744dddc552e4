//! A member: one model version inside a family, with what serving a request
//! for it needs besides the family's compiled graph.
//!
//! A family's compiled graph serves every member; a run binds one member's
//! weights by its [`MemberId`]. A member carries its model version's identity,
//! statistics and queue count (shared by the version's replicas) and its
//! metric handles. It leaves when the last reference to it goes (its model
//! unloaded and every request for it answered): its id goes into the family's
//! [`RetiredLog`], and each executor frees its weights before its next batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tickserve_core::{Device, MemberId, Name, metrics as names};

use crate::admission::ModelQueue;
use crate::stats::ModelStats;

/// Ids of members that left a family, in order; each executor reads what it
/// has not seen yet.
#[derive(Debug, Default)]
pub struct RetiredLog {
    ids: Mutex<Vec<MemberId>>,
    len: AtomicUsize,
}

impl RetiredLog {
    fn push(&self, id: MemberId) {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.push(id);
        self.len.store(ids.len(), Ordering::Release);
    }

    /// The ids retired after the first `seen`, if any (one atomic read when none).
    pub fn since(&self, seen: usize) -> Option<Vec<MemberId>> {
        if self.len.load(Ordering::Acquire) <= seen {
            return None;
        }
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        Some(ids.get(seen..).unwrap_or_default().to_vec())
    }
}

/// Metric handles of one member, made once when it joins.
#[derive(Debug)]
pub struct MemberMetrics {
    /// Engine run time, per bucket index.
    pub compute: Vec<metrics::Histogram>,
    /// Time from admission to being taken up.
    pub queue_wait: metrics::Histogram,
    /// Rows per run.
    pub batch_rows: metrics::Histogram,
    /// Padding rows per run.
    pub padded_rows: metrics::Histogram,
}

/// What a model version brings to the family it joins.
#[derive(Debug, Clone)]
pub struct Version {
    /// The model's name.
    pub name: String,
    /// The version, as the protocol spells it.
    pub version: String,
    /// Its statistics (shared by the version's replicas).
    pub stats: Arc<ModelStats>,
    /// Its rows waiting (shared by the version's replicas).
    pub queue: Arc<ModelQueue>,
}

/// One model version in its family.
#[derive(Debug)]
pub struct Member {
    /// Its id within the family; runs bind its weights by this id.
    pub id: MemberId,
    /// The model's name (shared by its answers).
    pub name: Name,
    /// The version, as the protocol spells it (shared by its answers).
    pub version: Name,
    /// Its statistics.
    pub stats: Arc<ModelStats>,
    /// Its rows waiting in the queues.
    pub queue: Arc<ModelQueue>,
    /// Its metric handles.
    pub metrics: MemberMetrics,
    retired: Arc<RetiredLog>,
}

impl Member {
    /// Member `id` of a family compiled for `buckets` on `device`, which
    /// logs its retirement in `retired`.
    pub fn new(
        id: MemberId,
        version: Version,
        buckets: &[usize],
        device: Device,
        retired: Arc<RetiredLog>,
    ) -> Member {
        let name = version.name.as_str();
        let metrics = MemberMetrics {
            compute: buckets
                .iter()
                .map(|size| {
                    metrics::histogram!(names::COMPUTE_DURATION, "model" => name.to_string(),
                        "bucket" => size.to_string(), "device" => device.to_string())
                })
                .collect(),
            queue_wait: metrics::histogram!(names::QUEUE_DURATION, "model" => name.to_string()),
            batch_rows: metrics::histogram!(names::BATCH_ROWS, "model" => name.to_string()),
            padded_rows: metrics::histogram!(names::PADDED_ROWS, "model" => name.to_string()),
        };
        Member {
            id,
            name: Name::from(version.name),
            version: Name::from(version.version),
            stats: version.stats,
            queue: version.queue,
            metrics,
            retired,
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.retired.push(self.id);
    }
}
