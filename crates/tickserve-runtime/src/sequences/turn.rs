//! A sequence's turn: the right to act on it now, taken in arrival order
//! ([`Entry`]), and what a tick does with it: gather the state it runs with
//! ([`Turn::begin`]), record its answer ([`Turn::finish`]), and pass the
//! turn on when dropped.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tickserve_core::Error;
use tickserve_core::sequence::{IdleAction, SequenceControl};
use tokio::sync::oneshot;

use super::{Gone, Sequences, Tracked};

/// The right to act on one sequence now; dropping it passes the turn to the
/// next waiter in arrival order.
#[derive(Debug)]
pub struct Turn {
    pub(super) sequences: Arc<Sequences>,
    pub(super) slot: Arc<Tracked>,
    /// False for a turn handed back by a caller that left (see `Drop`).
    pub(super) armed: bool,
}

/// Where a caller stands after [`Sequences::enter`].
#[derive(Debug)]
pub enum Entry {
    /// It holds the turn.
    Now(Turn),
    /// It waits behind earlier requests of the sequence.
    Waiting(oneshot::Receiver<Turn>),
    /// The sequence is not kept here: the fleet is asked first (its keeper
    /// hands it over, or a start takes it over; `[fleet]`).
    Claim(Claim),
}

/// A sequence to ask the fleet for before its turn (see [`Entry::Claim`]).
#[derive(Debug)]
pub struct Claim {
    pub(super) sequences: Arc<Sequences>,
    pub(super) key: super::SequenceKey,
    pub(super) purpose: super::Purpose,
}

impl Entry {
    /// Waits for the turn until `deadline` (DEADLINE_EXCEEDED after it);
    /// claims the sequence first where it is kept elsewhere.
    #[allow(clippy::disallowed_methods)] // waiting for a turn runs against the request's deadline, the machine's time
    pub async fn turn(self, model: &str, deadline: Option<Instant>) -> Result<Turn, Error> {
        let waiting = match self {
            Entry::Now(turn) => return Ok(turn),
            Entry::Waiting(receiver) => receiver,
            Entry::Claim(Claim {
                sequences,
                key,
                purpose,
            }) => {
                sequences.claim(&key, purpose, deadline).await?;
                // This replica's now: its turn, as any request's.
                return match sequences.enter_here(&key, purpose)? {
                    Entry::Claim(_) => Err(sequences.not_active(&key.id)),
                    entry => Box::pin(entry.turn(model, deadline)).await,
                };
            }
        };
        let started = Instant::now();
        let lost = || Error::Internal {
            model: model.to_string(),
            message: "a sequence's turn was lost".to_string(),
        };
        match deadline {
            None => waiting.await.map_err(|_| lost()),
            Some(deadline) => match tokio::time::timeout_at(deadline.into(), waiting).await {
                Ok(turn) => turn.map_err(|_| lost()),
                Err(_) => Err(Error::DeadlineExceeded {
                    model: model.to_string(),
                    waited: started.elapsed(),
                }),
            },
        }
    }
}

/// What a tick runs with: its state rows, and whether the sequence started
/// afresh after expiring.
#[derive(Debug)]
pub struct TickStart {
    /// One row per state pair, then one window per window.
    pub state: Vec<Bytes>,
    /// The ticks its windows held before this one (0 for a start).
    pub window_ticks: u64,
    /// The sequence expired and restarted (`idle_action = "restart"`).
    pub restarted: bool,
    /// The last answered values of the outputs a `max_step` guard watches;
    /// none for a start.
    pub last_answer: Vec<(String, Bytes)>,
}

impl Turn {
    /// The state a tick runs with: the initial state for a start, the kept
    /// state otherwise; refuses a sequence that is gone or expired.
    pub fn begin(&self, control: &SequenceControl) -> Result<TickStart, Error> {
        let sequences = &self.sequences;
        let spec = &sequences.spec;
        let initial = |restarted| TickStart {
            state: spec.initial_state(),
            window_ticks: 0,
            restarted,
            last_answer: Vec::new(),
        };
        let mut state = self.slot.lock();
        sequences.still_ours(&control.id, state.epoch)?;
        if control.start {
            return Ok(initial(false));
        }
        if state.restart_pending {
            return Ok(initial(true));
        }
        // Found idle past its limit before the sweep ended it: a restart,
        // or refused (the turn's drop takes it out of the table).
        if sequences.expire_if_idle(&self.slot.id, &mut state, sequences.clock.now())
            && spec.idle_action == IdleAction::Restart
        {
            state.restart_pending = true;
            return Ok(initial(true));
        }
        match &state.state {
            Ok(rows) => Ok(TickStart {
                state: rows.clone(),
                window_ticks: state.window_ticks,
                restarted: false,
                last_answer: state.last_answer.clone(),
            }),
            Err(_) => Err(sequences.not_active(&control.id)),
        }
    }

    /// Records a tick's answer: `next` is the new state (the tick was
    /// answered) with its windows holding `window_ticks`, `answered` the
    /// values it answered of the outputs a `max_step` guard watches, and
    /// `end` ends the sequence after it.
    pub fn finish(
        &self,
        control: &SequenceControl,
        next: Vec<Bytes>,
        window_ticks: u64,
        answered: Vec<(String, Bytes)>,
    ) {
        let sequences = &self.sequences;
        let mut state = self.slot.lock();
        let started = control.start || state.restart_pending;
        if started {
            sequences.metrics.starts.increment(1);
            state.ticks = 0;
            state.restart_pending = false;
            state.last_answer.clear();
        }
        for (name, values) in answered {
            match state.last_answer.iter_mut().find(|(n, _)| *n == name) {
                Some(kept) => kept.1 = values,
                None => state.last_answer.push((name, values)),
            }
        }
        let had_state = state.state.is_ok();
        state.ticks = state.ticks.saturating_add(1);
        state.last_used = sequences.clock.now();
        if control.end {
            state.state = Err(Gone::Ended);
            sequences.ended_here(&self.slot.id);
            sequences.metrics.ends.increment(1);
            if had_state {
                sequences.lost();
            }
        } else {
            state.state = Ok(next);
            state.window_ticks = window_ticks;
            if !had_state {
                sequences.gained();
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.slot.lock();
        // The next waiter whose caller is still there gets the turn.
        while let Some(waiter) = state.waiters.pop_front() {
            let next = Turn {
                sequences: Arc::clone(&self.sequences),
                slot: Arc::clone(&self.slot),
                armed: true,
            };
            if let Err(mut returned) = waiter.send(next) {
                // Its caller left: the turn comes back, disarmed (passing
                // it on from its own drop would lock this slot again).
                returned.armed = false;
                continue;
            }
            return;
        }
        state.busy = false;
        let gone = state.state.is_err();
        drop(state);
        if gone {
            // A sequence without state leaves the table (whatever left it so:
            // an end, a drop, an expiry, a start or a restart whose tick
            // failed); one that restarts on its next tick is remembered as
            // expired. Table, then slot: the order `enter` locks them in.
            let mut table = self.sequences.table();
            let state = self.slot.lock();
            let still_gone = !state.busy && state.state.is_err();
            if still_gone
                && table
                    .active
                    .get(&self.slot.id)
                    .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
            {
                table.active.remove(&self.slot.id);
                if state.restart_pending {
                    self.sequences
                        .remember_expired(&mut table, self.slot.id.clone());
                }
            }
        }
    }
}
