//! Families and their members.
//!
//! A [`Family`] is one compiled graph per bucket on one device, the executors
//! that own it, and the one queue they share. Models whose graphs differ only in
//! their weight values share a family when sharing is on: the graph is compiled
//! once with its weights as inputs, and each model is a [`Member`] whose weights
//! the engine holds and binds per run. A model that does not share (sharing
//! off, for the server or for that model) is a family of one, compiled with its
//! weights as constants.
//!
//! A member added to a live family compiles nothing: each executor copies its
//! weights once and makes one binding per bucket ([`Family::add_member`]). A
//! member leaves when the last reference to it goes (its model unloaded and
//! every request for it answered): its id goes into the family's retired log,
//! and each executor frees its weights before its next batch.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use tickserve_core::{MemberId, Signature, Weight, metrics as names};

use crate::executor::{Executor, ExecutorShared, Job};
use crate::settings::ModelSettings;
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

/// One model version in its family: what serving a request for it needs
/// besides the family's compiled graph.
#[derive(Debug)]
pub struct Member {
    /// Its id within the family; runs bind its weights by this id.
    pub id: MemberId,
    /// The model's name.
    pub name: String,
    /// The version, as the protocol spells it.
    pub version: String,
    /// Its statistics and queue accounting.
    pub stats: Arc<ModelStats>,
    /// Its metric handles.
    pub metrics: MemberMetrics,
    retired: Arc<RetiredLog>,
}

impl Member {
    /// A member `id` of a family compiled for `buckets` on `device`; `stats`
    /// are its model version's (shared by the version's replicas).
    pub fn new(
        id: MemberId,
        name: &str,
        version: &str,
        buckets: &[usize],
        device: &str,
        retired: Arc<RetiredLog>,
        stats: Arc<ModelStats>,
    ) -> Member {
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
            name: name.to_string(),
            version: version.to_string(),
            stats,
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

/// One family on one device: its executors (each owning the compiled graph
/// for every bucket) and the queue they share.
#[derive(Debug)]
pub struct Family {
    /// The family key (a hash of the graph's structure).
    pub key: String,
    /// True when members bind their weights per run (sharing on); false for
    /// a model compiled alone with constant weights.
    pub shared: bool,
    /// The signature every member serves.
    pub signature: Signature,
    /// Settings that shape the compiled graph and the queue: buckets,
    /// executors, max_queue_delay (equal for every member).
    pub settings: ModelSettings,
    /// Where it runs.
    pub device: String,
    /// The shared queue; dropping the family (or [`Family::close`]) closes
    /// it, and the executors stop once they have answered what it held.
    queue: Mutex<Option<Sender<Job>>>,
    /// The executors: each locked by its own thread for each batch, by a
    /// caller that finds it idle with nothing queued, and by a member joining.
    pub(crate) executors: Vec<Arc<Mutex<Executor>>>,
    /// Rows queued for any member (the inline path runs only when none are).
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) retired: Arc<RetiredLog>,
    /// Bucket runs by its executors.
    runs: Arc<AtomicU64>,
    /// The most rows a request may have to run on its caller's thread when
    /// an executor is idle (the least over its executors; 0 for GPU
    /// families, whose work stays on the executor threads).
    pub(crate) inline_rows: usize,
    next_member: AtomicU32,
}

impl Family {
    /// A family whose executors have loaded; its first member is id 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        key: String,
        shared: bool,
        signature: Signature,
        settings: ModelSettings,
        device: String,
        queue: Sender<Job>,
        executors: Vec<Arc<Mutex<Executor>>>,
        state: ExecutorShared,
    ) -> Family {
        let inline_rows = executors
            .iter()
            .map(|e| e.lock().unwrap_or_else(|p| p.into_inner()).inline_rows())
            .min()
            .unwrap_or(0);
        Family {
            key,
            shared,
            signature,
            settings,
            device,
            queue: Mutex::new(Some(queue)),
            executors,
            queued: state.queued,
            retired: state.retired,
            runs: state.runs,
            inline_rows,
            next_member: AtomicU32::new(1),
        }
    }

    /// The first member (the model the family was compiled from).
    pub(crate) fn first_member(&self, name: &str, version: &str, stats: Arc<ModelStats>) -> Member {
        self.member(tickserve_core::SOLE_MEMBER, name, version, stats)
    }

    fn member(&self, id: MemberId, name: &str, version: &str, stats: Arc<ModelStats>) -> Member {
        Member::new(
            id,
            name,
            version,
            self.settings.buckets.sizes(),
            &self.device,
            Arc::clone(&self.retired),
            stats,
        )
    }

    /// Bucket runs by its executors so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Adds a member with `weights` to every executor: no compilation, one
    /// copy of the weights per executor, one binding per bucket. Each
    /// executor pauses for it between batches.
    pub(crate) fn add_member(
        &self,
        name: &str,
        version: &str,
        weights: &[Weight],
        stats: Arc<ModelStats>,
    ) -> Result<Member, String> {
        if !self.shared {
            return Err(format!(
                "family {} does not share its graph (weights are constants)",
                self.key
            ));
        }
        let id = self.next_member.fetch_add(1, Ordering::Relaxed);
        for (index, executor) in self.executors.iter().enumerate() {
            let added = executor
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add_member(id, weights);
            if let Err(e) = added {
                for done in &self.executors[..index] {
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove_member(id);
                }
                return Err(e);
            }
        }
        Ok(self.member(id, name, version, stats))
    }

    /// Queues `job` for the executors; false (the job dropped) if the queue
    /// is closed.
    pub(crate) fn send(&self, job: Job) -> bool {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.as_ref().is_some_and(|queue| queue.send(job).is_ok())
    }

    /// Closes the queue: nothing more is admitted, and the executors stop
    /// after answering what is queued.
    pub(crate) fn close(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Rows queued for any member now.
    pub fn queued_rows(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}
