//! A family: one compiled graph per bucket on one device, the executors that
//! own it, and the one queue they share; [`Family::submit`] is where a request
//! either runs at once or is admitted to that queue.
//!
//! Models whose graphs differ only in their weight values share a family when
//! sharing is on: the graph is compiled once with its weights as inputs, and
//! each model is a [`Member`] whose weights the engine holds and binds per
//! run. A model that does not share (sharing off, for the server or for that
//! model) is a family of one, compiled with its weights as constants. A member
//! added to a live family compiles nothing: each executor copies its weights
//! once and makes one binding per bucket ([`Family::add_member`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use tickserve_core::{Device, EngineError, Error, InferResponse, Signature, Weight};
use tokio::sync::oneshot;

use crate::admission::{FamilyRows, Refused, Ticket};
use crate::executor::{Executor, FamilyHealth, FamilyLinks};
use crate::job::{Job, Submission};
use crate::member::{Member, RetiredLog, Version};
use crate::settings::ModelSettings;

/// One family on one device.
#[derive(Debug)]
pub struct Family {
    /// The family key (a hash of the graph's structure).
    pub key: String,
    /// True when members bind their weights per run (sharing on); false for
    /// a model compiled alone with constant weights.
    pub shares_graph: bool,
    /// The signature every member serves.
    pub signature: Signature,
    /// Settings that shape the compiled graph and the queue: buckets,
    /// executors, max_queue_delay (equal for every member).
    pub settings: ModelSettings,
    /// Where it runs.
    pub device: Device,
    /// The engine's Triton platform and backend names (`onnxruntime_onnx`,
    /// `onnxruntime`).
    pub engine: (&'static str, &'static str),
    /// Why the compiled CPU engine was not chosen, where it was allowed.
    pub engine_note: Option<String>,
    /// Whether its ticks run resident on a GPU (`gpu_mode`), and if not
    /// why.
    pub gpu_note: Option<String>,
    /// The queue's sending half; the executor threads hold the receiving
    /// half (the intake). Dropping the family (or [`Family::close`]) closes
    /// it, and the executors stop once they have answered what it held.
    queue: Mutex<Option<Sender<Job>>>,
    /// The lane of the executors reserved for level 1
    /// (`priority.reserved_executors`), when there are any.
    lane: Mutex<Option<Sender<Job>>>,
    /// The executors: each locked by its own thread for each batch, by a
    /// caller that finds it idle with nothing queued, and by a member joining.
    /// The first `shared` take every level from the queue; the rest are the
    /// reserved ones, serving the lane.
    executors: Vec<Arc<Mutex<Executor>>>,
    shared: usize,
    /// Rows queued for any member: raised by [`Family::submit`] through each
    /// job's ticket, lowered when an executor takes the job out.
    rows: Arc<FamilyRows>,
    retired: Arc<RetiredLog>,
    /// Bucket runs by its executors.
    runs: Arc<AtomicU64>,
    /// Whether it can still run (an executor marks it failed).
    health: Arc<FamilyHealth>,
    /// The most rows a request may have to run on its caller's thread when
    /// an executor is idle (the least over its executors; 0 for GPU
    /// families, whose work stays on the executor threads).
    inline_rows: usize,
    next_member: AtomicU32,
}

/// What a family is made of once its executors have compiled.
#[derive(Debug)]
pub struct FamilyParts {
    /// The family key.
    pub key: String,
    /// Whether members bind their weights per run.
    pub shares_graph: bool,
    /// The full signature the executors reported.
    pub signature: Signature,
    /// The founding member's settings.
    pub settings: ModelSettings,
    /// Where it runs.
    pub device: Device,
    /// The engine's Triton platform and backend names.
    pub engine: (&'static str, &'static str),
    /// Why the compiled CPU engine was not chosen, where it was allowed.
    pub engine_note: Option<String>,
    /// Whether its ticks run resident on a GPU (`gpu_mode`), and if not
    /// why.
    pub gpu_note: Option<String>,
    /// The queue's sending half.
    pub queue: Sender<Job>,
    /// The reserved executors' lane, when there are any: they are the last
    /// `settings.priorities.reserved_executors` of `executors`.
    pub lane: Option<Sender<Job>>,
    /// The executors that compiled, in the order they were started.
    pub executors: Vec<Arc<Mutex<Executor>>>,
    /// What the executors share with the family.
    pub links: FamilyLinks,
}

impl Family {
    /// A family whose executors have loaded; its first member is id 0.
    pub fn new(parts: FamilyParts) -> Family {
        let inline_rows = parts
            .executors
            .iter()
            .map(|e| e.lock().unwrap_or_else(|p| p.into_inner()).inline_rows())
            .min()
            .unwrap_or(0);
        let reserved = if parts.lane.is_some() {
            parts.settings.priorities.reserved_executors
        } else {
            0
        };
        let shared = parts.executors.len().saturating_sub(reserved);
        Family {
            key: parts.key,
            shares_graph: parts.shares_graph,
            signature: parts.signature,
            settings: parts.settings,
            device: parts.device,
            engine: parts.engine,
            engine_note: parts.engine_note,
            gpu_note: parts.gpu_note,
            queue: Mutex::new(Some(parts.queue)),
            shared,
            lane: Mutex::new(parts.lane),
            executors: parts.executors,
            rows: Arc::new(FamilyRows::default()),
            retired: parts.links.retired,
            runs: parts.links.runs,
            health: parts.links.health,
            inline_rows,
            next_member: AtomicU32::new(1),
        }
    }

    /// The first member (the model the family was compiled from).
    pub fn first_member(&self, version: Version) -> Member {
        self.member(tickserve_core::SOLE_MEMBER, version)
    }

    fn member(&self, id: tickserve_core::MemberId, version: Version) -> Member {
        Member::new(
            id,
            version,
            self.settings.buckets.sizes(),
            self.device,
            Arc::clone(&self.retired),
        )
    }

    /// Bucket runs by its executors so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Why it cannot run any more (its device was lost), if it cannot.
    pub fn failure(&self) -> Option<&str> {
        self.health.failure()
    }

    /// Rows queued for any member now.
    pub fn queued_rows(&self) -> usize {
        self.rows.rows()
    }

    /// The most rows a request may have to run on its caller's thread.
    pub fn inline_rows(&self) -> usize {
        self.inline_rows
    }

    /// Adds a member with `weights` to every executor: no compilation, one
    /// copy of the weights per executor, one binding per bucket. Each
    /// executor pauses for it between batches.
    pub fn add_member(&self, version: Version, weights: &[Weight]) -> Result<Member, EngineError> {
        if !self.shares_graph {
            return Err(EngineError::InvalidModel(format!(
                "family {} does not share its graph (weights are constants)",
                self.key
            )));
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
        let member = self.member(id, version);
        self.warm_member(id)?;
        Ok(member)
    }

    /// Runs every bucket of every executor once with member `id`'s weights
    /// (see [`Executor::warm_member`]), one run per lock, so requests of the
    /// family's other members go between them: a new member is never slow
    /// on its first requests.
    fn warm_member(&self, id: tickserve_core::MemberId) -> Result<(), EngineError> {
        for executor in &self.executors {
            let buckets = executor
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .warm_buckets();
            for bucket in 0..buckets {
                executor
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .warm_member(bucket, id)?;
            }
        }
        Ok(())
    }

    /// Runs the smallest bucket of every executor once with `member`'s
    /// weights, on this thread, where requests may run on their caller's
    /// thread (run at once): a thread that takes requests has then run the
    /// model before its first one. An executor busy with a run is skipped.
    /// Not a request: nothing is counted. A failure changes nothing (the
    /// model's load already ran every bucket).
    pub fn warm_here(&self, member: &Member) {
        if self.inline_rows == 0 {
            return;
        }
        for executor in &self.executors {
            // A busy executor is warm already, and this thread (a
            // front-end thread, maybe polling for its next request) does not
            // wait for it.
            let mut executor = match executor.try_lock() {
                Ok(executor) => executor,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            if executor.warm_buckets() > 0
                && let Err(e) = executor.warm_member(0, member.id)
            {
                tracing::debug!(family = %self.key, error = %e, "warm-up run failed");
            }
        }
    }

    /// Answers `submission` for `member`: at once on the caller's thread when
    /// an executor is idle and nothing is queued, else through the queue (a
    /// full queue answers at once), awaiting the executor's answer.
    pub async fn submit(
        &self,
        member: &Arc<Member>,
        submission: Submission,
    ) -> Result<InferResponse, Error> {
        // Latency first: an idle executor with nothing queued (for any member)
        // runs the request right here, on the caller's thread, with no thread
        // handoff (about 45 µs of wake-ups saved on loopback; docs/performance.md).
        // Queued requests keep their turn: with anything queued, this one
        // queues too. Only requests whose bucket ran within the inline budget
        // at load run here, so an async worker (serving other connections
        // meanwhile) is never held for long; GPU families keep all their work
        // on their executor threads.
        let mut submission = submission;
        if let Some(answer) = self.run_at_once(member, &mut submission) {
            return answer;
        }
        let (job, answer) = self.job(member, submission)?;
        if !self.enqueue(job) {
            return Err(self.stopped(member));
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Internal {
                model: member.name.to_string(),
                message: "the executor dropped the request".to_string(),
            })
        })
    }

    /// Sends `job` to the executors; false (the job dropped) once they have
    /// stopped. Admission bounded the queue; only a stopped executor refuses
    /// the send (and the job's ticket gives its rows back as it drops). A
    /// level-1 job goes to a reserved executor when one is idle; else it
    /// waits in the queue, ahead of every lower level.
    fn enqueue(&self, job: Job) -> bool {
        if job.submission.level == 1 && self.reserved_idle() {
            Self::send(&self.lane, job)
        } else {
            Self::send(&self.queue, job)
        }
    }

    /// Why a job could not be sent: the family's executors have stopped.
    fn stopped(&self, member: &Member) -> Error {
        Error::ModelNotReady {
            model: member.name.to_string(),
            version: member.version.to_string(),
            reason: "its executors have stopped".to_string(),
        }
    }

    /// `submission` admitted to the queue's counts as a job for `member`
    /// (refused as a full queue refuses it), and where its answer comes.
    pub(crate) fn job(
        &self,
        member: &Arc<Member>,
        submission: Submission,
    ) -> Result<(Job, oneshot::Receiver<Result<InferResponse, Error>>), Error> {
        let rows = submission.request.rows;
        let bytes = submission.request.inputs.iter().map(|d| d.len()).sum();
        let level = submission.level;
        let ticket =
            Ticket::admit(&member.queue, &self.rows, rows, bytes, level).map_err(|refused| {
                match refused {
                    Refused::Level(queued) => Error::PriorityQueueFull {
                        model: member.name.to_string(),
                        level,
                        limit: queued,
                    },
                    Refused::Rows(queued) => Error::QueueFull {
                        model: member.name.to_string(),
                        queued,
                        rows,
                        limit: member.queue.limit(),
                    },
                    Refused::Bytes(queued) => Error::QueueBytesFull {
                        model: member.name.to_string(),
                        queued,
                        bytes,
                        limit: member.queue.byte_limit(),
                    },
                }
            })?;
        let (reply, answer) = oneshot::channel();
        let job = Job {
            member: Arc::clone(member),
            submission,
            ticket,
            reply,
        };
        Ok((job, answer))
    }

    /// Whether a request of `rows` rows may run on its caller's thread (its
    /// bucket ran within `runtime.inline_budget` at load; never on a GPU).
    pub(crate) fn runs_here(&self, rows: usize) -> bool {
        rows <= self.inline_rows
    }

    /// Answers `jobs` (emptied), parked on this thread by a gathering front
    /// end (`gather`): on an idle shared executor, here, each member's
    /// requests together in runs of at most `inline_rows` rows; through the
    /// queue when requests of the family are already queued (they keep
    /// their turn) or no executor is idle. Returns how many it answered here.
    pub(crate) fn run_parked(&self, jobs: &mut Vec<Job>) -> usize {
        let mut here = 0;
        // The parked jobs are in the queue's counts: anything more is
        // queued (or parked by another thread) and keeps its turn.
        let parked: usize = jobs.iter().map(|j| j.submission.request.rows).sum();
        if self.queued_rows() <= parked {
            for executor in &self.executors[..self.shared] {
                let Ok(mut executor) = executor.try_lock() else {
                    continue;
                };
                executor.forget_retired();
                let mut run = Vec::with_capacity(jobs.len());
                while let Some(first) = jobs.first() {
                    // The first job's member's requests, in arrival order,
                    // up to the rows a caller's thread may run at once.
                    let member = Arc::clone(&first.member);
                    let mut rows = 0usize;
                    let mut i = 0;
                    while i < jobs.len() {
                        let job_rows = jobs[i].submission.request.rows;
                        // A parked job's rows fit `inline_rows` (`runs_here`).
                        if Arc::ptr_eq(&jobs[i].member, &member)
                            && rows.saturating_add(job_rows) <= self.inline_rows
                        {
                            rows += job_rows;
                            run.push(jobs.remove(i));
                        } else {
                            i += 1;
                        }
                        if rows >= self.inline_rows {
                            break;
                        }
                    }
                    here += run.len();
                    // Each job leaves the queue's counts as it runs.
                    for job in &mut run {
                        job.ticket.release();
                    }
                    executor.answer_batch(&mut run);
                }
                return here;
            }
        }
        for job in jobs.drain(..) {
            let member = Arc::clone(&job.member);
            if !self.enqueue(job) {
                // Its reply went with the job: the caller is told the
                // executor dropped the request; say why in the log.
                tracing::warn!(model = %member.name, error = %self.stopped(&member), "a parked request was not run");
            }
        }
        here
    }

    /// Runs `submission` on the caller's thread if it may (see
    /// [`Family::submit`]) and answers; `None` (the submission untouched)
    /// when it may not.
    pub(crate) fn run_at_once(
        &self,
        member: &Member,
        submission: &mut Submission,
    ) -> Option<Result<InferResponse, Error>> {
        if submission.request.rows > self.inline_rows || self.queued_rows() > 0 {
            return None;
        }
        // Lower levels never take a reserved executor.
        let allowed = if submission.level == 1 {
            &self.executors[..]
        } else {
            &self.executors[..self.shared]
        };
        for executor in allowed {
            if let Ok(mut executor) = executor.try_lock() {
                executor.forget_retired();
                return Some(executor.answer(member, submission));
            }
        }
        None
    }

    /// Runs a shadow's `submission` on an idle shared executor, on this
    /// thread, when nothing is queued; `None` (not run) otherwise: a shadow
    /// never waits in the queue and never takes a reserved executor. For CPU
    /// families only (a GPU family's runs stay on its executor threads).
    pub fn run_if_idle(
        &self,
        member: &Member,
        mut submission: Submission,
    ) -> Option<Result<InferResponse, Error>> {
        if !shadow_may_run(self.queued_rows(), self.device) {
            return None;
        }
        for executor in &self.executors[..self.shared] {
            if let Ok(mut executor) = executor.try_lock() {
                executor.forget_retired();
                return Some(executor.answer(member, &mut submission));
            }
        }
        None
    }

    /// Whether a reserved executor is idle now (none: false).
    fn reserved_idle(&self) -> bool {
        self.executors[self.shared..]
            .iter()
            .any(|executor| executor.try_lock().is_ok())
    }

    /// Sends `job` to `queue` (the queue or the lane); false (the job
    /// dropped) if it is closed or absent.
    fn send(queue: &Mutex<Option<Sender<Job>>>, job: Job) -> bool {
        let queue = queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.as_ref().is_some_and(|queue| queue.send(job).is_ok())
    }

    /// Closes the queue and the lane: nothing more is admitted, and the
    /// executors stop after answering what is queued.
    pub fn close(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.lane.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// Whether a shadow may take an idle executor of a family on `device` that
/// has `queued_rows` waiting: only on the CPU (a GPU family's runs stay on its
/// executor threads), and only when no row waits, for a queued request may be
/// about to take that executor.
fn shadow_may_run(queued_rows: usize, device: Device) -> bool {
    queued_rows == 0 && device == Device::Cpu
}

#[cfg(test)]
mod tests {
    use super::{Device, shadow_may_run};

    #[test]
    fn a_shadow_never_takes_an_executor_a_queued_row_waits_for() {
        assert!(shadow_may_run(0, Device::Cpu));
        assert!(!shadow_may_run(1, Device::Cpu), "a row waits");
        assert!(!shadow_may_run(0, Device::Gpu(0)), "a GPU family");
    }
}
