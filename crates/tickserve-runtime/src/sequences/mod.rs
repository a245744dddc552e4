//! The sequence table of a stateful model version: each sequence's state,
//! kept between its requests, and the order its requests run in.
//!
//! A sequence is a `Tracked`: its state rows (one per state pair), its tick
//! count, when it was last used, and a turn. Every operation on a sequence
//! (a tick, a read, a write, a drop) first takes the sequence's turn, in the
//! order the operations arrived ([`Sequences::enter`] is synchronous, so a
//! stream's requests queue in message order), and holds it until it is done:
//! a sequence runs one request at a time, strictly in arrival order, while
//! different sequences' requests are independent requests that batch
//! together in the family's queue as any others. A tick gathers its state
//! rows into its request ([`Turn::begin`]) and, once answered, writes the
//! new state back ([`Turn::finish`]); padding rows and other requests never
//! touch a sequence's state. A tick that fails, or whose caller leaves,
//! leaves the state as it was. The turn is in `turn.rs`; the state gathered
//! into a tick and scattered back out, `state.rs`; the snapshot, `snapshot.rs`;
//! the table's place in a fleet of replicas (ownership, hand-over), `fleet.rs`.
//!
//! Bounds: at most `max_sequences` sequences (a start beyond is refused), at
//! most [`MAX_PENDING_PER_SEQUENCE`] requests waiting for one sequence's turn.
//! With `max_sequence_idle` set, a sequence idle longer is ended: found when
//! anything next touches it (a tick, a read, a write, a drop, the list, a
//! snapshot), or by the sweep that runs before each metrics scrape and, as
//! new sequences start, every quarter of `max_sequence_idle`. With
//! `idle_action = "restart"` its id is remembered (as many as
//! `max_sequences`) so that its next tick restarts it. An expired sequence
//! is refused with the words of one never started: the answer does not tell
//! a client which ids exist.
//!
//! Every operation on the table is constant-time in the number of
//! sequences, save the sweep (linear, at most once per quarter of
//! `max_sequence_idle` on the request path) and the list and snapshot.

mod fleet;
mod held;
pub mod snapshot;

pub(crate) use fleet::parse_key_text;
mod state;
mod turn;

pub use held::HeldState;
pub(crate) use state::{take_state, tick_row_of, with_state};
pub use turn::{Claim, Entry, Turn};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tickserve_core::sequence::{
    IdleAction, KeyId, MAX_PENDING_PER_SEQUENCE, SequenceId, SequenceSpec,
};
use tickserve_core::{Clock, Error, metrics as names};
use tokio::sync::oneshot;

/// Metric handles of one stateful model.
#[derive(Debug)]
struct SequenceMetrics {
    active: metrics::Gauge,
    starts: metrics::Counter,
    ends: metrics::Counter,
    expiries: metrics::Counter,
}

/// Why a sequence's state is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// Never started (a slot made for a write or a restart, not yet filled).
    New,
    /// Its last request said `sequence_end`, or it was dropped.
    Ended,
    /// It sat idle past `max_sequence_idle`.
    Expired,
}

/// A sequence's place in its table: its id, and with `bind_to_key` the key
/// that started it (each key has ids of its own: another key's sequence 7
/// is another sequence, and no key can see, drive or probe another's).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceKey {
    /// The key that started it, when the model binds sequences to keys.
    pub owner: Option<KeyIdOrd>,
    /// The id its requests name.
    pub id: SequenceId,
}

/// A [`KeyId`] that sorts (for listings and snapshots in a fixed order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyIdOrd(pub [u8; 8]);

impl From<KeyId> for KeyIdOrd {
    fn from(key: KeyId) -> KeyIdOrd {
        KeyIdOrd(key.0)
    }
}

/// One sequence.
#[derive(Debug)]
struct Tracked {
    id: SequenceKey,
    inner: Mutex<TrackedState>,
}

#[derive(Debug)]
struct TrackedState {
    /// The state rows, one per state pair; `Err` once gone.
    state: Result<Vec<Bytes>, Gone>,
    /// Requests answered since it started.
    ticks: u64,
    /// The ticks its windows hold (at most the longest window's length).
    window_ticks: u64,
    /// When its last request finished (or it started).
    last_used: Instant,
    /// Someone holds its turn.
    busy: bool,
    /// Who waits for the turn, in arrival order.
    waiters: VecDeque<oneshot::Sender<Turn>>,
    /// Its next start is a restart after expiry (`idle_action = "restart"`).
    restart_pending: bool,
    /// The last answered values of the outputs a `max_step` guard watches
    /// (by name); not kept in snapshots.
    last_answer: Vec<(String, Bytes)>,
    /// The fleet membership it was taken under (0 without a fleet): kept
    /// under an earlier one, it may belong to another replica now.
    epoch: u64,
}

impl Tracked {
    fn lock(&self) -> MutexGuard<'_, TrackedState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Table {
    active: HashMap<SequenceKey, Arc<Tracked>>,
    /// Ids of sequences that expired and restart on their next tick.
    expired: Expired,
    last_sweep: Instant,
}

/// The ids of expired sequences, bounded, the oldest forgotten first; a
/// lookup, an insert and a removal are constant-time (amortised).
#[derive(Debug, Default)]
struct Expired {
    /// Each remembered id, with the number it was remembered under.
    ids: HashMap<SequenceKey, u64>,
    /// Ids in the order remembered; an entry whose number no longer matches
    /// `ids` was removed or remembered again, and is skipped.
    order: VecDeque<(SequenceKey, u64)>,
    next: u64,
}

impl Expired {
    fn contains(&self, id: &SequenceKey) -> bool {
        self.ids.contains_key(id)
    }

    fn remove(&mut self, id: &SequenceKey) -> bool {
        self.ids.remove(id).is_some()
    }

    /// Remembers `id`, forgetting the oldest beyond `capacity`.
    fn insert(&mut self, id: SequenceKey, capacity: usize) {
        while self.ids.len() >= capacity.max(1) {
            let Some((old, number)) = self.order.pop_front() else {
                break;
            };
            if self.ids.get(&old) == Some(&number) {
                self.ids.remove(&old);
            }
        }
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        self.ids.insert(id.clone(), number);
        self.order.push_back((id, number));
        // Stale entries are dropped once they outnumber the live ones, so
        // the order stays within twice the ids kept.
        if self.order.len() > 2 * self.ids.len().max(16) {
            let ids = &self.ids;
            self.order.retain(|(id, n)| ids.get(id) == Some(n));
        }
    }
}

/// What a caller means to do with a sequence: a tick may start it, a write
/// creates it, a read or a drop needs it to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// An inference request; `start` is its `sequence_start`.
    Tick {
        /// The request's `sequence_start`.
        start: bool,
    },
    /// Reading its state.
    Read,
    /// Writing its state (creates the sequence).
    Write,
    /// Dropping it.
    Drop,
}

/// A sequence's state as read out of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceState {
    /// Requests answered since it started (or since its state was written).
    pub ticks: u64,
    /// How long since its last request.
    pub idle: Duration,
    /// One row per state pair, then one window (N rows) per window, in the
    /// model's order.
    pub state: Vec<Bytes>,
    /// The ticks its windows hold.
    pub window_ticks: u64,
}

/// A sequence as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshotted {
    /// Where it is kept.
    pub id: SequenceKey,
    /// Requests answered since it started.
    pub ticks: u64,
    /// The ticks its windows hold.
    pub window_ticks: u64,
    /// One row per state pair, then one window per window.
    pub state: Vec<Bytes>,
}

/// One entry of [`Sequences::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSummary {
    /// The sequence.
    pub id: SequenceId,
    /// Requests answered since it started.
    pub ticks: u64,
    /// How long since its last request.
    pub idle: Duration,
}

/// The sequences of one stateful model version.
#[derive(Debug)]
pub struct Sequences {
    model: String,
    spec: Arc<SequenceSpec>,
    table: Mutex<Table>,
    /// Sequences with state now (the `tickserve_sequences_active` gauge).
    live: AtomicUsize,
    /// Sweeps of the whole table so far (each is linear in it).
    sweeps: AtomicUsize,
    metrics: SequenceMetrics,
    /// The fleet, with `[fleet]`.
    fleet: OnceLock<fleet::Link>,
    /// What the table ages sequences by (`last_used`, sweeps).
    clock: Clock,
}

impl Sequences {
    /// An empty table for model `model` with `spec`, ageing its sequences
    /// on `clock`.
    pub fn new(model: &str, spec: Arc<SequenceSpec>, clock: Clock) -> Sequences {
        let label = model.to_string();
        // Present from the load on, at zero, so dashboards have a series.
        metrics::gauge!(names::SEQUENCES_ACTIVE, "model" => label.clone()).set(0.0);
        Sequences {
            model: model.to_string(),
            spec,
            table: Mutex::new(Table {
                active: HashMap::new(),
                expired: Expired::default(),
                last_sweep: clock.now(),
            }),
            live: AtomicUsize::new(0),
            sweeps: AtomicUsize::new(0),
            metrics: SequenceMetrics {
                active: metrics::gauge!(names::SEQUENCES_ACTIVE, "model" => label.clone()),
                starts: metrics::counter!(names::SEQUENCE_STARTS, "model" => label.clone()),
                ends: metrics::counter!(names::SEQUENCE_ENDS, "model" => label.clone()),
                expiries: metrics::counter!(names::SEQUENCE_EXPIRIES, "model" => label),
            },
            fleet: OnceLock::new(),
            clock,
        }
    }

    /// The model's sequence settings.
    pub fn spec(&self) -> &SequenceSpec {
        &self.spec
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sequences with state now.
    pub fn active(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    fn gained(&self) {
        let now = self.live.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.active.set(now as f64);
    }

    fn lost(&self) {
        let now = self.live.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        self.metrics.active.set(now as f64);
    }

    /// Where sequence `id` of a request carrying `owner`'s key is kept:
    /// under the key too when the model binds sequences to keys.
    pub fn key(&self, id: &SequenceId, owner: Option<KeyId>) -> SequenceKey {
        SequenceKey {
            owner: owner.filter(|_| self.spec.bind_to_key).map(KeyIdOrd::from),
            id: id.clone(),
        }
    }

    /// True when sequence `key` lives here (active, or expired and
    /// remembered): a model whose requests are split among versions sends
    /// its next tick here.
    pub fn holds(&self, key: &SequenceKey) -> bool {
        let table = self.table();
        table.active.contains_key(key) || table.expired.contains(key)
    }

    /// Queues the caller for sequence `key`'s turn, in arrival order; refuses
    /// at once what cannot be served (an unknown or expired sequence, a
    /// full table, too many waiting).
    pub fn enter(self: &Arc<Self>, key: &SequenceKey, purpose: Purpose) -> Result<Entry, Error> {
        let Some(link) = self.fleet.get() else {
            return self.enter_here(key, purpose);
        };
        // In a fleet: a sequence kept here under this membership is this
        // replica's; anything else is asked of the fleet first.
        let epoch = link.membership(&self.model, &key.id)?;
        let kept = self.kept_under(key, epoch);
        let fleet_first = !kept && matches!(purpose, Purpose::Tick { .. } | Purpose::Write);
        if fleet_first {
            return Ok(Entry::Claim(Claim {
                sequences: Arc::clone(self),
                key: key.clone(),
                purpose,
            }));
        }
        self.enter_here(key, purpose)
    }

    /// [`Sequences::enter`] on this table alone.
    pub(crate) fn enter_here(
        self: &Arc<Self>,
        key: &SequenceKey,
        purpose: Purpose,
    ) -> Result<Entry, Error> {
        let id = key;
        let now = self.clock.now();
        let mut table = self.table();
        if let Some(slot) = table.active.get(id) {
            let slot = Arc::clone(slot);
            let mut state = slot.lock();
            if !state.busy {
                state.busy = true;
                drop(state);
                return Ok(Entry::Now(self.turn(slot)));
            }
            if state.waiters.len() >= MAX_PENDING_PER_SEQUENCE {
                return Err(Error::SequencesFull {
                    model: self.model.clone(),
                    message: format!(
                        "sequence {} already has {MAX_PENDING_PER_SEQUENCE} requests waiting \
                         for their turn (a sequence runs one request at a time)",
                        id.id
                    ),
                });
            }
            let (sender, receiver) = oneshot::channel();
            state.waiters.push_back(sender);
            return Ok(Entry::Waiting(receiver));
        }
        // Only a tick that is no start restarts an expired sequence.
        let restarts = purpose == Purpose::Tick { start: false } && table.expired.contains(id);
        let creates = match purpose {
            Purpose::Tick { start: true } | Purpose::Write => true,
            Purpose::Tick { start: false } => restarts,
            Purpose::Read | Purpose::Drop => false,
        };
        if !creates {
            return Err(self.not_active(&id.id));
        }
        // Idle sequences are swept as new ones start, every quarter of
        // max_sequence_idle (not at every start when the table is full: a
        // sweep is linear in the table, a start must not be).
        let sweep_due = self
            .spec
            .max_idle
            .is_some_and(|idle| now.saturating_duration_since(table.last_sweep) >= idle / 4);
        if sweep_due {
            self.sweep_locked(&mut table, now);
        }
        if table.active.len() >= self.spec.max_sequences {
            return Err(Error::SequencesFull {
                model: self.model.clone(),
                message: format!(
                    "it keeps {} sequences, its max_sequences; end some (sequence_end, or drop \
                     them) before starting more",
                    self.spec.max_sequences
                ),
            });
        }
        // A start or a write begins afresh: the id is no longer expired.
        table.expired.remove(id);
        let slot = Arc::new(Tracked {
            id: id.clone(),
            inner: Mutex::new(TrackedState {
                state: Err(Gone::New),
                ticks: 0,
                window_ticks: 0,
                last_used: now,
                busy: true,
                waiters: VecDeque::new(),
                restart_pending: restarts,
                last_answer: Vec::new(),
                epoch: self.epoch(),
            }),
        });
        table.active.insert(id.clone(), Arc::clone(&slot));
        drop(table);
        Ok(Entry::Now(self.turn(slot)))
    }

    fn turn(self: &Arc<Self>, slot: Arc<Tracked>) -> Turn {
        Turn {
            sequences: Arc::clone(self),
            slot,
            armed: true,
        }
    }

    /// The refusal of a sequence without state: the same words whether it
    /// never started, ended, was dropped or expired.
    fn not_active(&self, id: &SequenceId) -> Error {
        Error::SequenceNotActive {
            model: self.model.clone(),
            sequence: id.to_string(),
        }
    }

    /// Ends the sequence of `state` if it sat idle past `max_sequence_idle`
    /// (its state is dropped and it is counted as expired); true if it did.
    /// The caller removes it from the table (or its turn's drop does).
    fn expire_if_idle(&self, key: &SequenceKey, state: &mut TrackedState, now: Instant) -> bool {
        let idle = now.saturating_duration_since(state.last_used);
        if state.state.is_err() || self.spec.max_idle.is_none_or(|max| idle <= max) {
            return false;
        }
        state.state = Err(Gone::Expired);
        self.lost();
        self.metrics.expiries.increment(1);
        self.ended_here(key);
        true
    }

    /// Ends every sequence idle past `max_sequence_idle` that nobody is
    /// using (called before each metrics scrape).
    pub fn sweep(&self) {
        let mut table = self.table();
        self.sweep_locked(&mut table, self.clock.now());
    }

    fn sweep_locked(&self, table: &mut Table, now: Instant) {
        table.last_sweep = now;
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        if self.spec.max_idle.is_none() {
            return;
        }
        let mut expired = Vec::new();
        table.active.retain(|id, slot| {
            let mut state = slot.lock();
            if state.busy || !self.expire_if_idle(id, &mut state, now) {
                return true;
            }
            expired.push(id.clone());
            false
        });
        for id in expired {
            self.remember_expired(table, id);
        }
    }

    /// Remembers that `id` expired, if its model restarts expired sequences.
    fn remember_expired(&self, table: &mut Table, id: SequenceKey) {
        if self.spec.idle_action == IdleAction::Restart {
            table.expired.insert(id, self.spec.max_sequences);
        }
    }

    /// Every sequence kept now that a request carrying `owner`'s key sees
    /// (all, unless the model binds sequences to keys), with its tick count
    /// and idle time, by id.
    pub fn list(&self, owner: Option<KeyId>) -> Vec<SequenceSummary> {
        let now = self.clock.now();
        let table = self.table();
        let seen = self.key(&SequenceId::Number(0), owner).owner;
        let mut all: Vec<SequenceSummary> = table
            .active
            .values()
            .filter(|slot| !self.spec.bind_to_key || slot.id.owner == seen)
            .filter_map(|slot| {
                let state = slot.lock();
                let idle = now.saturating_duration_since(state.last_used);
                let live = state.state.is_ok() && self.spec.max_idle.is_none_or(|max| idle <= max);
                live.then(|| SequenceSummary {
                    id: slot.id.id.clone(),
                    ticks: state.ticks,
                    idle: now.saturating_duration_since(state.last_used),
                })
            })
            .collect();
        all.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Reads sequence `id`'s state, after the requests before it.
    pub async fn read(
        self: &Arc<Self>,
        id: &SequenceId,
        owner: Option<KeyId>,
        deadline: Option<Instant>,
    ) -> Result<SequenceState, Error> {
        let turn = self
            .enter(&self.key(id, owner), Purpose::Read)?
            .turn(&self.model, deadline)
            .await?;
        let mut state = turn.slot.lock();
        self.expire_if_idle(&turn.slot.id, &mut state, self.clock.now());
        match &state.state {
            Ok(rows) => Ok(SequenceState {
                ticks: state.ticks,
                idle: self.clock.since(state.last_used),
                state: rows.clone(),
                window_ticks: state.window_ticks,
            }),
            Err(_) => Err(self.not_active(id)),
        }
    }

    /// Writes sequence `id`'s state (one row per state pair, then one
    /// window per window, checked by the caller against the spec, as
    /// [`SequenceSpec::state_rows`] does) with its windows holding
    /// `window_ticks`, after the requests before it; starts the sequence if
    /// it is not kept.
    pub async fn write(
        self: &Arc<Self>,
        id: &SequenceId,
        rows: Vec<Bytes>,
        window_ticks: u64,
        owner: Option<KeyId>,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let turn = self
            .enter(&self.key(id, owner), Purpose::Write)?
            .turn(&self.model, deadline)
            .await?;
        let mut state = turn.slot.lock();
        let now = self.clock.now();
        self.expire_if_idle(&turn.slot.id, &mut state, now);
        if state.state.is_err() {
            self.gained();
            self.metrics.starts.increment(1);
        }
        state.state = Ok(rows);
        state.ticks = 0;
        state.window_ticks = window_ticks.min(self.spec.full_after());
        state.last_used = now;
        // The written state is what the next tick runs with, not a restart.
        state.restart_pending = false;
        Ok(())
    }

    /// Drops sequence `id` after the requests before it: its state is gone,
    /// and its next request must start it again.
    pub async fn remove(
        self: &Arc<Self>,
        id: &SequenceId,
        owner: Option<KeyId>,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let turn = self
            .enter(&self.key(id, owner), Purpose::Drop)?
            .turn(&self.model, deadline)
            .await?;
        let mut state = turn.slot.lock();
        self.expire_if_idle(&turn.slot.id, &mut state, self.clock.now());
        if state.state.is_err() {
            return Err(self.not_active(id));
        }
        state.state = Err(Gone::Ended);
        state.restart_pending = false;
        self.lost();
        self.metrics.ends.increment(1);
        drop(state);
        self.ended_here(&turn.slot.id);
        Ok(())
    }

    /// Every kept sequence and its state, for a snapshot (taken when no
    /// request is running: at shutdown, after the drain); sequences idle past
    /// `max_sequence_idle` are ended first, not kept.
    pub fn snapshot(&self) -> Vec<Snapshotted> {
        let mut table = self.table();
        self.sweep_locked(&mut table, self.clock.now());
        let mut all: Vec<Snapshotted> = table
            .active
            .values()
            .filter_map(|slot| {
                let state = slot.lock();
                let rows = state.state.as_ref().ok()?;
                Some(Snapshotted {
                    id: slot.id.clone(),
                    ticks: state.ticks,
                    window_ticks: state.window_ticks,
                    state: rows.clone(),
                })
            })
            .collect();
        all.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Puts sequences back from a snapshot (at load, before serving); each
    /// row was checked against the model's state pairs by the caller.
    /// Sequences beyond `max_sequences` are left out; returns how many came back.
    pub fn restore(&self, sequences: Vec<Snapshotted>) -> usize {
        let now = self.clock.now();
        let mut table = self.table();
        let mut restored = 0;
        for kept in sequences {
            let Snapshotted {
                id,
                ticks,
                window_ticks,
                state: rows,
            } = kept;
            if table.active.len() >= self.spec.max_sequences || table.active.contains_key(&id) {
                continue;
            }
            let slot = Tracked {
                id: id.clone(),
                inner: Mutex::new(TrackedState {
                    state: Ok(rows),
                    ticks,
                    window_ticks: window_ticks.min(self.spec.full_after()),
                    last_used: now,
                    busy: false,
                    waiters: VecDeque::new(),
                    restart_pending: false,
                    last_answer: Vec::new(),
                    epoch: self.epoch(),
                }),
            };
            table.active.insert(id, Arc::new(slot));
            self.gained();
            restored += 1;
        }
        restored
    }
}

#[cfg(test)]
mod tests;
