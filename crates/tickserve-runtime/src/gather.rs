//! Rows of one round, run together on the thread that holds the round.
//!
//! A front end that takes many requests at once on one thread (the
//! shared-memory front end's round: every request waiting now) makes a
//! [`Round`], hands it to each request it takes ([`crate::Prepared::gather_in`])
//! and polls each request's future once. A request that reaches its family
//! then parks in the round instead of running alone, and [`Round::run`]
//! runs each family's parked requests together on an idle executor, on the
//! thread that calls it, as a queue's executor runs a batch (one bucket run for rows that fit, in chunks of at most the rows
//! the family may run on a caller's thread). Polled again, the futures find
//! their answers: no queue, no other thread, no wake-up. Rows of different
//! sequences of one model meet in one run this way.
//!
//! What cannot park goes the usual way (`Family::submit`): a request of no
//! round, or of a round that has run, a family whose work stays on its executor threads (GPU), a
//! request of more rows than a caller's thread may run. What parked but
//! finds no idle executor, or requests of the family already queued (they
//! keep their turn), goes to the family's queue.

use std::sync::{Arc, Mutex, PoisonError};

use tickserve_core::{Error, InferResponse};
use tokio::sync::oneshot;

use crate::family::Family;
use crate::job::{Job, Submission};
use crate::member::Member;

/// One round of a front-end thread: open from [`Round::new`] until
/// [`Round::run`]; the requests that carry it park in it meanwhile. Clones
/// are the same round.
#[derive(Debug, Clone, Default)]
pub struct Round {
    parked: Arc<Mutex<Parked>>,
}

/// A round's parked jobs, with their families, until it runs.
#[derive(Debug, Default)]
struct Parked {
    ran: bool,
    jobs: Vec<(Arc<Family>, Job)>,
}

impl Round {
    /// A new round, open: its requests park until [`Round::run`].
    pub fn new() -> Round {
        Round::default()
    }

    /// Ends the round and answers every request parked in it: each
    /// family's together on an idle executor, on this thread, else through
    /// the family's queue. Returns how many requests it answered on this
    /// thread. A request that comes later runs the usual way.
    pub fn run(&self) -> usize {
        let mut jobs = {
            let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
            parked.ran = true;
            std::mem::take(&mut parked.jobs)
        };
        let mut here = 0;
        let mut family_jobs = Vec::new();
        while let Some((family, _)) = jobs.first() {
            let family = Arc::clone(family);
            // This family's jobs, in arrival order; the others keep theirs.
            let mut i = 0;
            while i < jobs.len() {
                if Arc::ptr_eq(&jobs[i].0, &family) {
                    family_jobs.push(jobs.remove(i).1);
                } else {
                    i += 1;
                }
            }
            here += family.run_parked(&mut family_jobs);
        }
        here
    }

    /// Whether the round has not run yet: its requests park.
    pub(crate) fn open(&self) -> bool {
        !self
            .parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ran
    }

    /// Parks `submission` for `member` of `family` while the round is open
    /// and the family may run it on a caller's thread.
    pub(crate) fn park(
        &self,
        family: &Arc<Family>,
        member: &Arc<Member>,
        submission: Submission,
    ) -> Parking {
        if !family.runs_here(submission.request.rows) {
            return Parking::No(submission);
        }
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        if parked.ran {
            return Parking::No(submission);
        }
        match family.job(member, submission) {
            Ok((job, answer)) => {
                parked.jobs.push((Arc::clone(family), job));
                Parking::Parked(answer)
            }
            Err(e) => Parking::Refused(e),
        }
    }
}

/// What [`Round::park`] gives back: the answer to wait for, or the
/// submission, not parked.
pub(crate) enum Parking {
    /// Parked: its answer comes once the round runs it.
    Parked(oneshot::Receiver<Result<InferResponse, Error>>),
    /// Not parked (see the module's documentation).
    No(Submission),
    /// Refused at admission (a full queue, say), as the queue would refuse it.
    Refused(Error),
}
