//! The fleet as the runtime and the edge see it: what replicas behind one
//! balancer must agree on (who keeps a sequence, a state handed between
//! them, halts), asked of a coordination store through these traits. The
//! store (etcd, `tickserve-fleet`) is wired in by the server; without
//! `[fleet]` there is none and one process works alone.
//!
//! Nothing here is called for a stateless request. A sequence's tick on
//! the replica that keeps it asks only [`SequenceFleet::membership`] (an
//! atomic load); a start, a hand-over and a halt pay one write to the store.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A future the store answers, boxed so that the traits stay object-safe.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the fleet's store did not answer. Every one is retryable: the
/// store comes back, or the lease is renewed or replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetError {
    /// This replica's lease may have lapsed: it cannot prove that it is a
    /// member, so it may not act for the fleet.
    Lapsed(String),
    /// The store was unreachable, refused the call, or did not answer in
    /// time.
    Store(String),
}

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetError::Lapsed(why) | FleetError::Store(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for FleetError {}

/// A sequence's name across the fleet: its model and its key's text (the
/// runtime's `SequenceKey`, written as text; opaque here).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FleetKey {
    /// The model's name.
    pub model: String,
    /// The sequence's key, as text.
    pub key: String,
}

/// What a replica found when it claimed a sequence it does not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The sequence was handed over and is this replica's now: its state
    /// (a one-sequence snapshot's bytes).
    State(Vec<u8>),
    /// The store says this replica keeps it already (a claim of the same
    /// sequence on this replica won the race).
    Mine,
    /// No replica keeps it: never started, or ended.
    NeverHeld,
    /// The replica that kept it stopped without handing it over: its state
    /// is lost.
    Lost,
    /// It lives on this other version of the model; nothing was moved.
    OnVersion(String),
    /// A live replica keeps it and did not hand it over within the wait.
    Busy(Duration),
}

/// What a start found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// This replica keeps the sequence now (any other copy was let go).
    Here,
    /// A live replica keeps it and did not let it go within the wait.
    Busy(Duration),
}

/// Sequence ownership across the fleet. Each operation that moves a
/// sequence is a transaction in the store; errors are the store's (it is
/// unreachable, or this replica's lease lapsed) and are retryable.
pub trait SequenceFleet: Send + Sync + std::fmt::Debug {
    /// This replica's membership: `Ok(epoch)` while its lease is proven
    /// (the epoch changes when a lapsed lease is replaced: every sequence
    /// kept under an earlier epoch may belong to another replica now),
    /// `Err(FleetError::Lapsed)` when it may have lapsed. An atomic load.
    fn membership(&self) -> Result<u64, FleetError>;

    /// Makes this replica the keeper of `key` on `version` for a start: a
    /// live keeper elsewhere is asked to let it go first (its state is not
    /// taken), waiting at most `wait`.
    fn start<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        wait: Duration,
    ) -> Pending<'a, Result<Started, FleetError>>;

    /// Takes `key`, kept on `version` by another replica or handed over,
    /// waiting at most `wait` for a live keeper to hand it over.
    fn claim<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        wait: Duration,
    ) -> Pending<'a, Result<Claimed, FleetError>>;

    /// Hands `key` (kept here on `version`) over: its `state` goes to the
    /// store and no replica keeps it until one claims it. `Ok(false)` when
    /// the store says this replica no longer keeps it (the copy is stale:
    /// drop it).
    fn hand<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        state: Vec<u8>,
    ) -> Pending<'a, Result<bool, FleetError>>;

    /// `key` ended here (an end, a drop, an expiry): its record goes if it
    /// still names this replica. Returns at once (the store's write runs on
    /// the fleet's own task), from any thread.
    fn release(&self, key: FleetKey, version: String);

    /// The version that keeps `key` anywhere in the fleet, as last seen (a
    /// local copy of the store, for routing; a claim checks the store).
    fn version_of(&self, key: &FleetKey) -> Option<String>;

    /// The most bytes of one sequence's handed state the store takes.
    fn max_state_bytes(&self) -> usize;
}

/// A halt as the store keeps it: one key per version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaltRecord {
    /// The model.
    pub model: String,
    /// The version.
    pub version: String,
    /// The halt, as the edge writes it (JSON); `None` for a resume.
    pub halt: Option<Vec<u8>>,
}

/// How far a halt or resume got across the fleet before its write
/// returned: every replica acknowledges each change it applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagation {
    /// Live replicas when the change was written.
    pub replicas: usize,
    /// Of those, the ones that had applied it when the write returned.
    pub applied: usize,
    /// How long the write waited for them.
    pub waited: Duration,
}

/// Halts kept for the whole fleet: written to the store, and every
/// replica's copy follows the store's changes.
pub trait HaltsFleet: Send + Sync + std::fmt::Debug {
    /// Writes `halt` (`None`: resumes) for `model` `version`, and waits
    /// (at most the lease's TTL) until every live replica applied it.
    fn write<'a>(&'a self, record: HaltRecord) -> Pending<'a, Result<Propagation, FleetError>>;

    /// Every halt in the store now, and from then on each change, given to
    /// `apply` in order (on the store's watcher task).
    fn follow(&self, apply: Box<dyn Fn(Vec<HaltRecord>, bool) + Send + Sync>);
}
