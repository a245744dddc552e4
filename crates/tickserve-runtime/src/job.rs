//! The job: one admitted request's envelope on its way from the caller to an
//! executor thread and back.
//!
//! [`crate::family::Family::submit`] makes a job when a request cannot run at
//! once and sends it down its family's queue; an executor thread takes it out
//! in a batch, releases its [`Ticket`] (the rows leave the queue counts), runs
//! it and answers on `reply`. Dropping a job anywhere is harmless: the ticket
//! gives its rows back, and the caller, whose receiver then closes, is told
//! the executor dropped the request.

use std::sync::Arc;
use std::time::Instant;

use tickserve_core::validate::ValidRequest;
use tickserve_core::{Error, InferResponse, MemberId};
use tokio::sync::oneshot;

use crate::admission::Ticket;
use crate::batcher::{DELAYED, Queued};
use crate::member::Member;

/// A validated request on its way into a family.
#[derive(Debug)]
pub struct Submission {
    /// The validated request.
    pub request: ValidRequest,
    /// The request id, echoed back.
    pub id: String,
    /// When it was admitted at the edge.
    pub admitted: Instant,
    /// When its answer stops being useful.
    pub deadline: Option<Instant>,
    /// Its priority level, 1 the highest.
    pub level: u32,
    /// When it moves behind every other request (its level's timeout, with
    /// the `delay` action).
    pub delay_at: Option<Instant>,
}

/// One admitted request, queued for its family's executors.
#[derive(Debug)]
pub struct Job {
    /// The model version it is for: whose weights, statistics and metrics.
    pub member: Arc<Member>,
    /// The request; its level becomes [`DELAYED`] once its level's timeout
    /// moved it behind every other request.
    pub submission: Submission,
    /// Its rows in the queue counts, until it leaves the queue.
    pub ticket: Ticket,
    /// Where the answer goes; the receiver may have been dropped (the caller left).
    pub reply: oneshot::Sender<Result<InferResponse, Error>>,
}

impl Queued for Job {
    fn rows(&self) -> usize {
        self.submission.request.rows
    }
    fn admitted(&self) -> Instant {
        self.submission.admitted
    }
    fn deadline(&self) -> Option<Instant> {
        self.submission.deadline
    }
    fn member(&self) -> MemberId {
        self.member.id
    }
    fn level(&self) -> u32 {
        self.submission.level
    }
    fn delay_at(&self) -> Option<Instant> {
        self.submission.delay_at
    }
    fn delay(&mut self) {
        self.submission.level = DELAYED;
        self.submission.delay_at = None;
    }
}
