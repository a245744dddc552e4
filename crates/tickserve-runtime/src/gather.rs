//! Rows of one round, run together on the thread that holds the round.
//!
//! A front end that takes many requests at once on one thread (the
//! shared-memory front end's round: every request waiting now) polls each
//! request's future once between [`begin`] and [`run`]. A request that
//! reaches its family then parks there instead of running alone on this
//! thread ([`park`]), and [`run`] runs each family's parked requests
//! together on an idle executor, on this thread, as a queue's executor runs
//! a batch (one bucket run for rows that fit, in chunks of at most the rows
//! the family may run on a caller's thread). Polled again, the futures find
//! their answers: no queue, no other thread, no wake-up. Rows of different
//! sequences of one model meet in one run this way.
//!
//! What cannot park goes the usual way (`Family::submit`): a thread not
//! gathering, a family whose work stays on its executor threads (GPU), a
//! request of more rows than a caller's thread may run. What parked but
//! finds no idle executor, or requests of the family already queued (they
//! keep their turn), goes to the family's queue.

use std::cell::RefCell;
use std::sync::Arc;

use tickserve_core::{Error, InferResponse};
use tokio::sync::oneshot;

use crate::family::Family;
use crate::job::{Job, Submission};
use crate::member::Member;

/// A thread's gathering: whether it gathers (between [`begin`] and
/// [`run`]), and the jobs parked since [`begin`], with their families.
struct Parked {
    gathering: bool,
    jobs: Vec<(Arc<Family>, Job)>,
}

thread_local! {
    static PARKED: RefCell<Parked> = const {
        RefCell::new(Parked {
            gathering: false,
            jobs: Vec::new(),
        })
    };
}

/// From now until [`run`], requests that reach a family on this thread
/// park there (see the module's documentation).
pub fn begin() {
    PARKED.with_borrow_mut(|parked| parked.gathering = true);
}

/// Ends the gathering begun by [`begin`] and answers every parked request:
/// each family's together on an idle executor, on this thread, else through
/// the family's queue. Returns how many requests it answered on this thread.
pub fn run() -> usize {
    let mut jobs = PARKED.with_borrow_mut(|parked| {
        parked.gathering = false;
        std::mem::take(&mut parked.jobs)
    });
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
    // The thread's buffer back, emptied, for the next round.
    PARKED.with_borrow_mut(|parked| {
        if parked.jobs.capacity() < jobs.capacity() {
            parked.jobs = jobs;
        }
    });
    here
}

/// Whether this thread is gathering (between [`begin`] and [`run`]).
pub(crate) fn gathering() -> bool {
    PARKED.with_borrow(|parked| parked.gathering)
}

/// What [`park`] gives back: the answer to wait for, or the submission, not
/// parked.
pub(crate) enum Parking {
    /// Parked: its answer comes once [`run`] runs it.
    Parked(oneshot::Receiver<Result<InferResponse, Error>>),
    /// Not parked (see the module's documentation).
    No(Submission),
    /// Refused at admission (a full queue, say), as the queue would refuse it.
    Refused(Error),
}

/// Parks `submission` for `member` of `family` if this thread is gathering
/// and the family may run it on this thread.
pub(crate) fn park(family: &Arc<Family>, member: &Arc<Member>, submission: Submission) -> Parking {
    if !gathering() || !family.runs_here(submission.request.rows) {
        return Parking::No(submission);
    }
    match family.job(member, submission) {
        Ok((job, answer)) => {
            PARKED.with_borrow_mut(|parked| parked.jobs.push((Arc::clone(family), job)));
            Parking::Parked(answer)
        }
        Err(e) => Parking::Refused(e),
    }
}
