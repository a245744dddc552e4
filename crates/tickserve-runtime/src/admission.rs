//! Admission: how many rows wait, per model version and per family queue, and
//! the ticket each admitted request holds while it waits.
//!
//! Two counts, two questions. A model version's [`ModelQueue`] answers "may
//! this request wait?" (its `max_queue_rows` and `max_queue_bytes`, counted
//! over the version's replicas, with the queue-depth gauge and the rejection
//! counters: a queued request keeps its whole input alive, so rows alone
//! would not bound memory). A family's
//! [`FamilyRows`] answers "is anything waiting here?" (the run-at-once check
//! and the router's shortest queue). [`Ticket::admit`] raises both at once and
//! the ticket lowers both when it is released or dropped, so no path can raise
//! one and forget the other, and a job that is dropped anywhere (a closed
//! queue, a caller that left) gives its rows back by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tickserve_core::metrics as names;
use tickserve_core::priority::Priorities;

/// The rows of one model version waiting in its families' queues, with its
/// queue-depth gauge and its rejection counters, and the requests waiting at
/// each priority level.
#[derive(Debug)]
pub struct ModelQueue {
    rows: AtomicUsize,
    limit: usize,
    bytes: AtomicUsize,
    byte_limit: usize,
    depth: metrics::Gauge,
    full: metrics::Counter,
    bytes_full: metrics::Counter,
    expired: metrics::Counter,
    /// Index `level - 1`.
    levels: Vec<LevelQueue>,
}

/// The requests of one priority level waiting, and its bound.
#[derive(Debug)]
struct LevelQueue {
    waiting: AtomicUsize,
    /// Its `max_queue_size`; 0 for no bound of its own.
    limit: usize,
    depth: metrics::Gauge,
    full: metrics::Counter,
    expired: metrics::Counter,
}

/// Why a request could not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its rows would go over `max_queue_rows`; this many were waiting.
    Rows(usize),
    /// Its bytes would go over `max_queue_bytes`; this many were waiting.
    Bytes(usize),
    /// Its priority level already has its `max_queue_size` requests waiting.
    Level(usize),
}

impl ModelQueue {
    /// An empty queue count for model `model` (the metrics' label) that
    /// admits up to `limit` rows (its `max_queue_rows`) and `byte_limit`
    /// bytes of input (its `max_queue_bytes`), and at each priority level up
    /// to its `max_queue_size` requests.
    pub fn new(
        model: &str,
        limit: usize,
        byte_limit: usize,
        priorities: &Priorities,
    ) -> ModelQueue {
        let rejected = |reason: &'static str| metrics::counter!(names::REJECTIONS, "model" => model.to_string(), "reason" => reason);
        let levels = priorities
            .policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let level = (i + 1).to_string();
                let rejected = |reason: &'static str| {
                    metrics::counter!(names::PRIORITY_REJECTIONS, "model" => model.to_string(), "level" => level.clone(), "reason" => reason)
                };
                LevelQueue {
                    waiting: AtomicUsize::new(0),
                    limit: policy.max_queue_size,
                    depth: metrics::gauge!(names::PRIORITY_QUEUE_REQUESTS, "model" => model.to_string(), "level" => level.clone()),
                    full: rejected("queue_full"),
                    expired: rejected("timeout"),
                }
            })
            .collect();
        ModelQueue {
            levels,
            rows: AtomicUsize::new(0),
            limit,
            bytes: AtomicUsize::new(0),
            byte_limit,
            depth: metrics::gauge!(names::QUEUE_ROWS, "model" => model.to_string()),
            full: rejected("queue_full"),
            bytes_full: rejected("queue_bytes_full"),
            expired: rejected("deadline_exceeded"),
        }
    }

    /// Rows waiting now.
    pub fn rows(&self) -> usize {
        self.rows.load(Ordering::Acquire)
    }

    /// The most rows that may wait (`max_queue_rows`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The most bytes of input that may wait (`max_queue_bytes`).
    pub fn byte_limit(&self) -> usize {
        self.byte_limit
    }

    /// Bytes of input waiting now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// Counts a request of priority `level` refused because its deadline
    /// passed while it waited.
    pub fn expired(&self, level: u32) {
        self.expired.increment(1);
        if let Some(l) = self.level(level) {
            l.expired.increment(1);
        }
    }

    /// Requests of priority `level` waiting now.
    pub fn waiting_at(&self, level: u32) -> usize {
        self.level(level)
            .map_or(0, |l| l.waiting.load(Ordering::Acquire))
    }

    fn level(&self, level: u32) -> Option<&LevelQueue> {
        self.levels.get(level.checked_sub(1)? as usize)
    }

    fn leave(&self, rows: usize, bytes: usize, level: u32) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        let before = self.rows.fetch_sub(rows, Ordering::AcqRel);
        self.depth.set(before.saturating_sub(rows) as f64);
        if let Some(l) = self.level(level) {
            let before = l.waiting.fetch_sub(1, Ordering::AcqRel);
            l.depth.set(before.saturating_sub(1) as f64);
        }
    }
}

/// The rows waiting in one family's queue, for any of its members.
#[derive(Debug, Default)]
pub struct FamilyRows(AtomicUsize);

impl FamilyRows {
    /// Rows waiting now.
    pub fn rows(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// An admitted request's place in both counts: held by its job while it
/// waits; releasing or dropping it gives the rows back.
#[derive(Debug)]
pub struct Ticket {
    rows: usize,
    bytes: usize,
    /// Its priority level (0: the model has no levels).
    level: u32,
    /// Set by the first release; a second does nothing.
    released: bool,
    model: Arc<ModelQueue>,
    family: Arc<FamilyRows>,
}

impl Ticket {
    /// Admits `rows` rows of `bytes` bytes at priority `level` if the model's
    /// queue stays within its limits (rows, bytes, the level's requests);
    /// otherwise counts the rejection and says which limit and what was
    /// waiting.
    pub fn admit(
        model: &Arc<ModelQueue>,
        family: &Arc<FamilyRows>,
        rows: usize,
        bytes: usize,
        level: u32,
    ) -> Result<Ticket, Refused> {
        let queue = model.level(level);
        if let Some(l) = queue {
            let before = l.waiting.fetch_add(1, Ordering::AcqRel);
            if l.limit > 0 && before >= l.limit {
                l.waiting.fetch_sub(1, Ordering::AcqRel);
                l.full.increment(1);
                return Err(Refused::Level(before));
            }
        }
        let give_level_back = || {
            if let Some(l) = queue {
                l.waiting.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let before = model.rows.fetch_add(rows, Ordering::AcqRel);
        if before.saturating_add(rows) > model.limit {
            model.rows.fetch_sub(rows, Ordering::AcqRel);
            model.full.increment(1);
            give_level_back();
            return Err(Refused::Rows(before));
        }
        let bytes_before = model.bytes.fetch_add(bytes, Ordering::AcqRel);
        if bytes_before.saturating_add(bytes) > model.byte_limit {
            model.bytes.fetch_sub(bytes, Ordering::AcqRel);
            model.rows.fetch_sub(rows, Ordering::AcqRel);
            model.bytes_full.increment(1);
            give_level_back();
            return Err(Refused::Bytes(bytes_before));
        }
        model.depth.set((before + rows) as f64);
        if let Some(l) = queue {
            l.depth.set(l.waiting.load(Ordering::Acquire) as f64);
        }
        family.0.fetch_add(rows, Ordering::AcqRel);
        Ok(Ticket {
            rows,
            bytes,
            level: if queue.is_some() { level } else { 0 },
            released: false,
            model: Arc::clone(model),
            family: Arc::clone(family),
        })
    }

    /// Takes the rows out of both counts (the request left the queue: into a
    /// run, or refused); a second release does nothing.
    pub fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.model.leave(self.rows, self.bytes, self.level);
        self.family.0.fetch_sub(self.rows, Ordering::AcqRel);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests;
