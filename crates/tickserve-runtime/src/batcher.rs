//! The batcher's policy, as a plain struct: which queued requests run
//! together, and when. (Its channel half, [`crate::worker::Intake`], feeds
//! it what callers send and waits as it decides.)
//!
//! One queue serves a whole family (every member shares the compiled graph).
//! Where a run binds one member's weights, a batch holds requests of one
//! member; fairness comes from age: the next batch is always the oldest
//! request's member, so under skewed traffic a quiet member's request waits
//! behind at most the batches of requests that arrived before it, never
//! behind a hot member's later traffic. Where the engine runs each row with
//! its own member's weights ([`Batcher::mix_members`], the CUDA engine), a
//! batch is simply the oldest requests, whatever their members.
//!
//! Latency first: a request that finds an executor idle with nothing queued runs
//! at once, alone — on its caller's thread when its bucket is short enough (see
//! `Family::submit`), otherwise on the executor thread that was waiting for it
//! (`at_once` below). Requests that arrive while every executor is busy wait in
//! the model's queue. When an executor is free, [`Batcher::decide`] picks
//! the next batch: the oldest request's member's requests, in arrival order, as
//! many as fit together in the largest bucket.
//! The batch goes at once when the largest bucket is full, when the next request
//! would not fit anyway, or when the oldest request has waited `max_queue_delay`
//! (0, the default, means at once); otherwise the executor waits for company
//! until then. A request larger than the largest bucket goes alone, split across
//! bucket runs. Requests whose deadline has passed are taken out and refused
//! without being computed. While the queue closes (shutdown), everything left
//! goes at once.
//!
//! Priority levels (a model's `[priority]`): the queue is kept in level order,
//! arrival order within a level, so "the oldest request" above is the oldest
//! of the highest level that has any: strict priority between levels. A batch
//! is that request's member's requests in queue order, so lower levels fill
//! room the higher ones leave in the bucket. A request whose level's timeout
//! passes with the `delay` action moves behind every other request
//! ([`Batcher::delay_overdue`]).
//!
//! The struct holds no channel, thread or clock: time comes in as `now`, so the
//! policy is tested exactly, case by case, in the tests below.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tickserve_core::MemberId;

/// What the policy needs to know about a queued request.
pub trait Queued {
    /// Rows it carries.
    fn rows(&self) -> usize;
    /// When it was admitted.
    fn admitted(&self) -> Instant;
    /// When its answer stops being useful.
    fn deadline(&self) -> Option<Instant>;
    /// The family member whose weights it runs with.
    fn member(&self) -> MemberId;
    /// Its priority level, 1 the highest ([`DELAYED`] after its delay).
    fn level(&self) -> u32 {
        1
    }
    /// When its level's timeout moves it behind every other request.
    fn delay_at(&self) -> Option<Instant> {
        None
    }
    /// Moves it behind every level ([`DELAYED`]).
    fn delay(&mut self) {}
}

/// The level of a request whose level's timeout passed with the `delay`
/// action: after every real level.
pub const DELAYED: u32 = u32::MAX;

/// What an executor that is free should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run together this many of the oldest request's member's requests
    /// (of the oldest requests, when members mix), the first ones in
    /// queue order.
    Run(usize),
    /// Wait for more requests until this instant, then decide again.
    WaitUntil(Instant),
    /// The queue is empty: wait for a request.
    Empty,
}

/// A family's queue of admitted requests, in arrival order, and the policy
/// that takes batches out of it.
#[derive(Debug)]
pub struct Batcher<J> {
    entries: VecDeque<J>,
    largest: usize,
    max_delay: Duration,
    /// Never run two requests together (a model whose rows depend on each
    /// other): every batch is one request.
    one_per_run: bool,
    /// Requests of different members run together.
    mixed: bool,
}

impl<J: Queued> Batcher<J> {
    /// A queue for a model whose largest bucket holds `largest` rows.
    pub fn new(largest: usize, max_delay: Duration) -> Self {
        Batcher {
            entries: VecDeque::new(),
            largest,
            max_delay,
            one_per_run: false,
            mixed: false,
        }
    }

    /// A copy of the queue, for tests that look ahead.
    #[cfg(test)]
    fn clone_for_test(&self) -> Batcher<J>
    where
        J: Clone,
    {
        Batcher {
            entries: self.entries.clone(),
            largest: self.largest,
            max_delay: self.max_delay,
            one_per_run: self.one_per_run,
            mixed: self.mixed,
        }
    }

    /// From now on every batch is one request, never two together.
    pub fn one_request_per_run(&mut self) {
        self.one_per_run = true;
    }

    /// From now on a batch may hold requests of several members (the
    /// oldest requests, whatever their members): for an engine whose one run
    /// gives each row its own member's weights.
    pub fn mix_members(&mut self) {
        self.mixed = true;
    }

    /// Whether `job` may join a batch of `member`'s requests.
    fn joins(&self, job: &J, member: MemberId) -> bool {
        self.mixed || job.member() == member
    }

    /// Adds an admitted request behind every request of its level and the
    /// levels above, ahead of the levels below.
    pub fn push(&mut self, job: J) {
        let level = job.level();
        // Most pushes go to the back: search from there.
        let at = self
            .entries
            .iter()
            .rposition(|j| j.level() <= level)
            .map_or(0, |i| i + 1);
        self.entries.insert(at, job);
    }

    /// Moves every request whose delay time is at or before `now` behind all
    /// others (its level's timeout passed, with the `delay` action).
    pub fn delay_overdue(&mut self, now: Instant) {
        if self
            .entries
            .iter()
            .all(|j| j.delay_at().is_none_or(|d| d > now))
        {
            return;
        }
        let mut kept = VecDeque::with_capacity(self.entries.len());
        let mut delayed = Vec::new();
        for mut job in self.entries.drain(..) {
            if job.delay_at().is_some_and(|d| d <= now) {
                job.delay();
                delayed.push(job);
            } else {
                kept.push_back(job);
            }
        }
        self.entries = kept;
        for job in delayed {
            self.push(job);
        }
    }

    /// True when nothing is queued.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Takes out every request whose deadline is at or before `now`, into `expired`.
    pub fn take_expired(&mut self, now: Instant, expired: &mut Vec<J>) {
        if self
            .entries
            .iter()
            .all(|j| j.deadline().is_none_or(|d| d > now))
        {
            return;
        }
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for job in self.entries.drain(..) {
            if job.deadline().is_some_and(|d| d <= now) {
                expired.push(job);
            } else {
                kept.push_back(job);
            }
        }
        self.entries = kept;
    }

    /// Decides what a free executor does at `now`; `at_once` sends whatever
    /// is queued without waiting for company (the executor was idle when the
    /// oldest request came, or the queue is closing).
    pub fn decide(&self, now: Instant, at_once: bool) -> Decision {
        let Some(oldest) = self.entries.front() else {
            return Decision::Empty;
        };
        if oldest.rows() >= self.largest || self.one_per_run {
            return Decision::Run(1);
        }
        let member = oldest.member();
        let mut rows = 0;
        let mut count = 0;
        for job in self.entries.iter().filter(|j| self.joins(j, member)) {
            if rows + job.rows() > self.largest {
                // The next request cannot join: waiting would not fill the bucket more.
                return Decision::Run(count);
            }
            rows += job.rows();
            count += 1;
        }
        // max_queue_delay is at most a second (checked at load); should the
        // sum not fit, the batch goes now.
        let due = oldest.admitted().checked_add(self.max_delay).unwrap_or(now);
        if rows == self.largest || at_once || now >= due {
            Decision::Run(count)
        } else {
            Decision::WaitUntil(due)
        }
    }

    /// Takes the oldest request's member's first `count` requests (the
    /// first `count` requests, when members mix) out, into `batch`; the
    /// others keep their places.
    pub fn take(&mut self, count: usize, batch: &mut Vec<J>) {
        let Some(member) = self.entries.front().map(Queued::member) else {
            return;
        };
        let mut taken = 0;
        let mut index = 0;
        while taken < count && index < self.entries.len() {
            if self.joins(&self.entries[index], member) {
                if let Some(job) = self.entries.remove(index) {
                    batch.push(job);
                }
                taken += 1;
            } else {
                index += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
