//! A sequence table's place in a fleet of replicas (`[fleet]`): what a
//! table asks of the fleet before it acts on a sequence it does not keep,
//! and what it gives up when another replica asks.
//!
//! A tick of a sequence not kept here claims it ([`Sequences::claim`]): the
//! keeper hands it over, or it was handed over (a drain), or it is lost (its
//! keeper died), never started, or lives on another version. A start or a
//! state write takes it over (a live keeper lets its copy go first). A
//! sequence kept here is answered here without a word to the store while
//! this replica's lease is proven; it is refused (retryably) while it is
//! not, and told lost once the lease lapsed (another replica may have it).
//! A sequence that ends here releases its record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tickserve_core::Error;
use tickserve_core::fleet::{Claimed, FleetError, FleetKey, SequenceFleet, Started};
use tickserve_core::sequence::SequenceId;

use super::{Gone, KeyIdOrd, Purpose, SequenceKey, Sequences, Snapshotted, snapshot};

/// A table's link to the fleet.
#[derive(Debug)]
pub(crate) struct Link {
    fleet: Arc<dyn SequenceFleet>,
    /// The model version the table belongs to (records and handed state
    /// name it).
    version: String,
    /// How long a claim waits for a live keeper.
    wait: Duration,
    /// Claims in flight on this table, by sequence: a second claim of the
    /// same sequence waits for the first (so that it finds it here).
    claiming: Mutex<HashMap<SequenceKey, Arc<tokio::sync::Mutex<()>>>>,
}

impl Link {
    /// This replica's membership now: its epoch, or the retryable refusal
    /// of sequence `id` of `model` while its lease is not proven.
    pub(crate) fn membership(&self, model: &str, id: &SequenceId) -> Result<u64, Error> {
        self.fleet
            .membership()
            .map_err(|reason| Error::FleetUnavailable {
                model: model.to_string(),
                sequence: id.to_string(),
                reason: reason.to_string(),
            })
    }
}

/// The most bytes of a handed state's framing beside its rows (names,
/// counts, the header of a one-sequence snapshot).
const FRAMING_BYTES: usize = 64 * 1024;

impl Sequences {
    /// Links this table (version `version`'s) to `fleet`, whose ticks wait
    /// at most `wait` for a live keeper. Refused when one sequence's state
    /// is more than the fleet's store takes. Set once.
    pub fn join_fleet(
        &self,
        fleet: Arc<dyn SequenceFleet>,
        version: &str,
        wait: Duration,
    ) -> Result<(), String> {
        let rows: usize = self.spec.initial_state().iter().map(|r| r.len()).sum();
        let most = fleet.max_state_bytes();
        if rows.saturating_add(FRAMING_BYTES) > most {
            return Err(format!(
                "a sequence's state is {rows} bytes (state pairs and windows); the fleet hands \
                 a state over through etcd, which takes at most {most} bytes with its framing: \
                 shorten the windows or the state, or serve the model without [fleet]"
            ));
        }
        let _ = self.fleet.set(Link {
            fleet,
            version: version.to_string(),
            wait,
            claiming: Mutex::new(HashMap::new()),
        });
        Ok(())
    }

    /// The membership epoch a sequence taken now is kept under (0 without a
    /// fleet, or while the membership is not proven: such a sequence is
    /// refused at its next tick).
    pub(super) fn epoch(&self) -> u64 {
        self.fleet
            .get()
            .and_then(|link| link.fleet.membership().ok())
            .unwrap_or(0)
    }

    /// Whether `key` is in this table, taken under membership `epoch`. A
    /// sequence kept under an earlier membership is let go here (another
    /// replica may keep it now).
    pub(super) fn kept_under(&self, key: &SequenceKey, epoch: u64) -> bool {
        let mut table = self.table();
        let Some(slot) = table.active.get(key).map(Arc::clone) else {
            return false;
        };
        let mut state = slot.lock();
        if state.epoch == epoch {
            return true;
        }
        if !state.busy {
            if state.state.is_ok() {
                self.lost();
            }
            state.state = Err(Gone::Ended);
            drop(state);
            table.active.remove(key);
        }
        false
    }

    /// Checks, as a tick begins, that the sequence is still this replica's:
    /// the lease is proven and the sequence was taken under it.
    pub(super) fn still_ours(&self, id: &SequenceId, epoch: u64) -> Result<(), Error> {
        let Some(link) = self.fleet.get() else {
            return Ok(());
        };
        if link.membership(&self.model, id)? == epoch {
            return Ok(());
        }
        Err(Error::SequenceLost {
            model: self.model.clone(),
            sequence: id.to_string(),
            reason: "this replica's lease in the fleet lapsed while it kept it".to_string(),
        })
    }

    /// The sequence's name across the fleet.
    fn fleet_key(&self, key: &SequenceKey) -> FleetKey {
        FleetKey {
            model: self.model.clone(),
            key: key_text(key),
        }
    }

    /// The version that keeps `key` anywhere in the fleet, as last seen.
    pub fn lives_on(&self, key: &SequenceKey) -> Option<String> {
        let link = self.fleet.get()?;
        link.fleet.version_of(&self.fleet_key(key))
    }

    /// Asks the fleet for sequence `key` before `purpose` acts on it here
    /// (waiting at most the fleet's `handoff_wait`, and not past
    /// `deadline`): a start or a write takes it over, a tick takes its
    /// state. Once this returns `Ok`, the sequence may be entered here.
    pub(crate) async fn claim(
        self: &Arc<Self>,
        key: &SequenceKey,
        purpose: Purpose,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let Some(link) = self.fleet.get() else {
            return Ok(());
        };
        // One claim of a sequence at a time on this table.
        let lock = {
            let mut claiming = link.claiming.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(claiming.entry(key.clone()).or_default())
        };
        let held = lock.lock().await;
        let outcome = self.claim_alone(link, key, purpose, deadline).await;
        drop(held);
        let mut claiming = link.claiming.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) <= 2 {
            claiming.remove(key);
        }
        outcome
    }

    async fn claim_alone(
        self: &Arc<Self>,
        link: &Link,
        key: &SequenceKey,
        purpose: Purpose,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let epoch = link.membership(&self.model, &key.id)?;
        if self.kept_under(key, epoch) {
            return Ok(()); // an earlier claim here took it
        }
        // A deadline is the machine's time, not the table's clock.
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        let wait = deadline.map_or(link.wait, |d| {
            link.wait.min(d.saturating_duration_since(now))
        });
        let fleet_key = self.fleet_key(key);
        let unavailable = |reason: FleetError| Error::FleetUnavailable {
            model: self.model.clone(),
            sequence: key.id.to_string(),
            reason: reason.to_string(),
        };
        let elsewhere = |waited| Error::SequenceElsewhere {
            model: self.model.clone(),
            sequence: key.id.to_string(),
            waited,
        };
        // A start, a write, or the tick that restarts an expired sequence
        // (`idle_action = "restart"`) begins afresh: it takes the sequence over.
        let restarts =
            purpose == (Purpose::Tick { start: false }) && self.table().expired.contains(key);
        let takes_over =
            restarts || matches!(purpose, Purpose::Tick { start: true } | Purpose::Write);
        if takes_over {
            return match link.fleet.start(&fleet_key, &link.version, wait).await {
                Ok(Started::Here) => Ok(()),
                Ok(Started::Busy(waited)) => Err(elsewhere(waited)),
                Err(reason) => Err(unavailable(reason)),
            };
        }
        let lost = |reason: &str| Error::SequenceLost {
            model: self.model.clone(),
            sequence: key.id.to_string(),
            reason: reason.to_string(),
        };
        match link.fleet.claim(&fleet_key, &link.version, wait).await {
            Ok(Claimed::State(bytes)) => self.take_handed(link, key, &fleet_key, bytes).await,
            Ok(Claimed::Mine) => {
                // The store says this replica keeps it, and it is not here:
                // it ended here and its record outlived it.
                link.fleet.release(fleet_key.clone(), link.version.clone());
                Err(self.not_active(&key.id))
            }
            Ok(Claimed::NeverHeld) => Err(self.not_active(&key.id)),
            Ok(Claimed::Lost) => Err(lost(
                "the replica that kept it stopped without handing it over",
            )),
            Ok(Claimed::OnVersion(version)) => Err(Error::SequenceOnVersion {
                model: self.model.clone(),
                sequence: key.id.to_string(),
                version,
            }),
            Ok(Claimed::Busy(waited)) => Err(elsewhere(waited)),
            Err(reason) => Err(unavailable(reason)),
        }
    }

    /// Puts a handed state into this table; gives it back to the store when
    /// there is no room here.
    async fn take_handed(
        self: &Arc<Self>,
        link: &Link,
        key: &SequenceKey,
        fleet_key: &FleetKey,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let lost = |reason: String| Error::SequenceLost {
            model: self.model.clone(),
            sequence: key.id.to_string(),
            reason,
        };
        let parts = snapshot::decode(&bytes)
            .map_err(|e| lost(format!("its handed state cannot be read: {e}")))?;
        let part = parts
            .into_iter()
            .next()
            .filter(|p| p.name == self.model && p.version == link.version && p.fits(&self.spec));
        let Some(part) = part else {
            return Err(lost(format!(
                "it was handed over by another version of the model than {}",
                link.version
            )));
        };
        let sequences: Vec<Snapshotted> = part
            .sequences
            .into_iter()
            .filter(|s| &s.id == key)
            .collect();
        if self.restore(sequences) == 0 && !self.holds(key) {
            // No room here (max_sequences): the state goes back to the
            // store for another replica, or this one once a sequence ends.
            return match link.fleet.hand(fleet_key, &link.version, bytes).await {
                Ok(_) => Err(Error::SequencesFull {
                    model: self.model.clone(),
                    message: format!(
                        "sequence {} was handed to this replica, which keeps {} sequences, its \
                         max_sequences; the tick was not run: retry it",
                        key.id, self.spec.max_sequences
                    ),
                }),
                Err(e) => Err(lost(format!(
                    "this replica had no room for it and could not give it back: {e}"
                ))),
            };
        }
        Ok(())
    }

    /// Hands sequence `key` over (after the requests before it) if this
    /// replica keeps it; its copy here is dropped once the store has the
    /// state, or when the store says it is not this replica's any more.
    /// True if handed over.
    pub async fn hand_over(self: &Arc<Self>, key: &SequenceKey) -> Result<bool, FleetError> {
        let Some(link) = self.fleet.get() else {
            return Ok(false);
        };
        let Ok(entry) = self.enter_here(key, Purpose::Drop) else {
            return Ok(false);
        };
        let Ok(turn) = entry.turn(&self.model, None).await else {
            return Ok(false);
        };
        let kept = {
            let state = turn.slot.lock();
            let Ok(rows) = &state.state else {
                return Ok(false);
            };
            Snapshotted {
                id: key.clone(),
                ticks: state.ticks,
                window_ticks: state.window_ticks,
                state: rows.clone(),
            }
        };
        let bytes = snapshot::encode_one(&self.model, &link.version, &self.spec, &[kept]);
        let handed = link
            .fleet
            .hand(&self.fleet_key(key), &link.version, bytes)
            .await?;
        let mut state = turn.slot.lock();
        if state.state.is_ok() {
            self.lost();
        }
        state.state = Err(Gone::Ended);
        state.restart_pending = false;
        Ok(handed)
    }

    /// Answers another replica's request for `key`: hands it over if it is
    /// here; waits for a claim of it in flight here first; releases a record
    /// that names this replica for a sequence that is not here.
    pub async fn hand_over_asked(self: &Arc<Self>, key: &SequenceKey) -> Result<bool, FleetError> {
        let Some(link) = self.fleet.get() else {
            return Ok(false);
        };
        let in_flight = link
            .claiming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(Arc::clone);
        if let Some(claim) = in_flight {
            drop(claim.lock().await);
        }
        if self.holds(key) {
            return self.hand_over(key).await;
        }
        link.fleet
            .release(self.fleet_key(key), link.version.clone());
        Ok(false)
    }

    /// Hands every sequence this replica keeps over (at a drain: every
    /// request before is answered first); returns how many.
    pub async fn hand_over_all(self: &Arc<Self>) -> usize {
        let keys: Vec<SequenceKey> = self.snapshot().into_iter().map(|k| k.id).collect();
        let mut handed = 0;
        for key in keys {
            match self.hand_over(&key).await {
                Ok(true) => handed += 1,
                Ok(false) => {}
                Err(e) => tracing::error!(model = self.model, error = %e, "hand-over failed"),
            }
        }
        handed
    }

    /// Tells the fleet that sequence `key` ended here.
    pub(super) fn ended_here(&self, key: &SequenceKey) {
        if let Some(link) = self.fleet.get() {
            link.fleet
                .release(self.fleet_key(key), link.version.clone());
        }
    }
}

/// A key as text: the owner's key id in hex or `-`, a newline, then `n`
/// and the number or `t` and the text.
pub fn key_text(key: &SequenceKey) -> String {
    let owner = key.owner.map_or_else(
        || "-".to_string(),
        |o| o.0.iter().map(|b| format!("{b:02x}")).collect(),
    );
    match &key.id {
        SequenceId::Number(n) => format!("{owner}\nn{n}"),
        SequenceId::Text(text) => format!("{owner}\nt{text}"),
    }
}

/// The key [`key_text`] wrote.
pub fn parse_key_text(text: &str) -> Option<SequenceKey> {
    let (owner, id) = text.split_once('\n')?;
    let owner = match owner {
        "-" => None,
        hexed => {
            if hexed.len() != 16 {
                return None;
            }
            let mut bytes = [0u8; 8];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(hexed.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some(KeyIdOrd(bytes))
        }
    };
    let id = if let Some(n) = id.strip_prefix('n') {
        SequenceId::Number(n.parse().ok()?)
    } else {
        SequenceId::Text(id.strip_prefix('t')?.to_string())
    };
    Some(SequenceKey { owner, id })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keys_survive_their_text() {
        for k in [
            SequenceKey {
                owner: None,
                id: SequenceId::Number(42),
            },
            SequenceKey {
                owner: Some(KeyIdOrd([7; 8])),
                id: SequenceId::Text("AAPL\nline two/..".into()),
            },
        ] {
            assert_eq!(parse_key_text(&key_text(&k)), Some(k.clone()));
        }
        assert_eq!(parse_key_text("zz\nn1"), None);
    }
}
