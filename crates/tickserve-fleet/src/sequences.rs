//! Sequence ownership in etcd: who keeps a sequence (`P/seq/MODEL/KEY`),
//! moved only by transactions that compare the record's revision (and the
//! old keeper's absence), and a state in flight (`P/state/MODEL/KEY`).
//!
//! A live keeper gives a sequence up only itself: a replica that wants it
//! writes a want (`P/wants/KEEPER/...`), and the keeper, once the requests
//! before are answered, hands it over in one transaction (the record says
//! "no keeper", the state is written, the want goes) and drops its copy.
//! The asker then takes it by a transaction on the record's revision. So at
//! any moment one replica keeps a sequence, or none does and its state is
//! in the store. A keeper whose lease ended is fenced (it stopped answering
//! before the lease could end) and its sequences are taken as lost: a start
//! takes the record over, a tick is told the state is lost.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tickserve_core::fleet::{Claimed, FleetError, FleetKey, Started};

use crate::Fleet;
use crate::follow::Change;

/// A sequence's record: its keeper's member id (empty while handed over)
/// and the version it lives on. Written by one serializer, so equal records
/// are equal bytes (transactions compare values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) owner: String,
    pub(crate) version: String,
}

impl Record {
    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn parse(bytes: &[u8]) -> Option<Record> {
        serde_json::from_slice(bytes).ok()
    }
}

/// A want's value: what is asked for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Want {
    pub(crate) model: String,
    pub(crate) key: String,
    pub(crate) version: String,
}

/// How long a claim waits between looks at a live keeper's record (it also
/// looks as soon as the record changes).
const LOOK_AGAIN: Duration = Duration::from_millis(25);

/// The versions sequences live on across the fleet, as last seen (a copy
/// of `P/seq/`), and a signal on every change.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    versions: RwLock<HashMap<FleetKey, String>>,
    pub(crate) changed: tokio::sync::Notify,
}

impl Mirror {
    pub(crate) fn version_of(&self, key: &FleetKey) -> Option<String> {
        self.versions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Applies a change of `P/seq/`.
    pub(crate) fn apply(&self, keys: &crate::keys::Keys, change: Change) {
        let parse = |key: &[u8]| {
            keys.split("seq", key)
                .map(|(model, key)| FleetKey { model, key })
        };
        {
            let mut versions = self.versions.write().unwrap_or_else(|p| p.into_inner());
            match change {
                Change::Reset(all) => {
                    versions.clear();
                    for (key, value) in all {
                        if let (Some(key), Some(record)) = (parse(&key), Record::parse(&value)) {
                            versions.insert(key, record.version);
                        }
                    }
                }
                Change::Put(key, value) => {
                    if let (Some(key), Some(record)) = (parse(&key), Record::parse(&value)) {
                        versions.insert(key, record.version);
                    }
                }
                Change::Delete(key) => {
                    if let Some(key) = parse(&key) {
                        versions.remove(&key);
                    }
                }
            }
        }
        self.changed.notify_waiters();
    }
}

/// A wait for a live keeper: since when, for how long at most, and
/// whether the keeper was asked yet.
struct KeeperWait {
    began: Instant,
    wait: Duration,
    asked: bool,
}

impl KeeperWait {
    #[allow(clippy::disallowed_methods)] // a claim waits for a live keeper at most a wait of the machine's time
    fn new(wait: Duration) -> KeeperWait {
        KeeperWait {
            began: Instant::now(),
            wait,
            asked: false,
        }
    }
}

/// A sequence's record as read, with its revision.
struct Read {
    record: Record,
    revision: i64,
}

impl Fleet {
    /// Runs `txn` on a live endpoint.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, FleetError> {
        self.clients
            .kv(|mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await
    }

    async fn read(&self, key: &FleetKey) -> Result<Option<Read>, FleetError> {
        let seq = self.keys.sequence(&key.model, &key.key);
        let got = self
            .clients
            .kv(|mut kv| {
                let seq = seq.clone();
                async move { kv.get(seq, None).await }
            })
            .await?;
        Ok(got.kvs().first().and_then(|kv| {
            Record::parse(kv.value()).map(|record| Read {
                record,
                revision: kv.mod_revision(),
            })
        }))
    }

    async fn alive(&self, member: &str) -> Result<bool, FleetError> {
        let member = self.keys.member(member);
        let got = self
            .clients
            .kv(|mut kv| {
                let member = member.clone();
                async move { kv.get(member, None).await }
            })
            .await?;
        Ok(!got.kvs().is_empty())
    }

    /// Asks `owner` to hand `key` over (the want ends with this replica's
    /// lease, or when the keeper answers it).
    async fn ask(&self, owner: &str, key: &FleetKey, version: &str) -> Result<(), FleetError> {
        let want = Want {
            model: key.model.clone(),
            key: key.key.clone(),
            version: version.to_string(),
        };
        let value = serde_json::to_vec(&want).map_err(|e| FleetError::Store(e.to_string()))?;
        let want = self.keys.want(owner, &key.model, &key.key);
        let lease = self.membership.lease();
        self.clients
            .kv(|mut kv| {
                let (want, value) = (want.clone(), value.clone());
                async move {
                    kv.put(want, value, Some(PutOptions::new().with_lease(lease)))
                        .await
                }
            })
            .await?;
        Ok(())
    }

    /// One step of a wait for live keeper `owner` to let `key` go: asks it
    /// (once), then waits until the record may have changed; once the wait
    /// has lasted its limit, how long it lasted.
    #[allow(clippy::disallowed_methods)] // a claim waits for a live keeper at most a wait of the machine's time
    async fn wait_for(
        &self,
        keeper: &mut KeeperWait,
        owner: &str,
        key: &FleetKey,
        version: &str,
    ) -> Result<Option<Duration>, FleetError> {
        if !keeper.asked {
            self.ask(owner, key, version).await?;
            keeper.asked = true;
        }
        let waited = keeper.began.elapsed();
        if waited >= keeper.wait {
            return Ok(Some(waited));
        }
        let _ = tokio::time::timeout(LOOK_AGAIN, self.mirror.changed.notified()).await;
        Ok(None)
    }

    /// The comparisons that say a record read at `read` is unchanged and,
    /// if it names a keeper, that keeper is gone.
    fn unchanged_and_free(&self, seq: &str, read: &Read) -> Vec<Compare> {
        let mut when = vec![Compare::mod_revision(seq, CompareOp::Equal, read.revision)];
        if !read.record.owner.is_empty() {
            when.push(Compare::create_revision(
                self.keys.member(&read.record.owner),
                CompareOp::Equal,
                0,
            ));
        }
        when
    }

    /// Whether a record names no live keeper (handed over, or its keeper's
    /// lease ended).
    async fn free(&self, read: &Read) -> Result<bool, FleetError> {
        Ok(read.record.owner.is_empty() || !self.alive(&read.record.owner).await?)
    }

    pub(crate) async fn start_here(
        &self,
        key: &FleetKey,
        version: &str,
        wait: Duration,
    ) -> Result<Started, FleetError> {
        let mut keeper = KeeperWait::new(wait);
        let seq = self.keys.sequence(&key.model, &key.key);
        let state = self.keys.state(&key.model, &key.key);
        loop {
            self.membership.check()?;
            let me = self.membership.id();
            let mine = Record {
                owner: me.clone(),
                version: version.to_string(),
            }
            .bytes();
            let txn = match self.read(key).await? {
                None => Txn::new()
                    .when([Compare::create_revision(seq.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(seq.as_str(), mine, None)]),
                Some(read) if read.record.owner == me => {
                    if read.record.version == version {
                        return Ok(Started::Here);
                    }
                    Txn::new()
                        .when([Compare::mod_revision(
                            seq.as_str(),
                            CompareOp::Equal,
                            read.revision,
                        )])
                        .and_then([TxnOp::put(seq.as_str(), mine, None)])
                }
                Some(read) if self.free(&read).await? => Txn::new()
                    .when(self.unchanged_and_free(&seq, &read))
                    .and_then([
                        TxnOp::put(seq.as_str(), mine, None),
                        TxnOp::delete(state.as_str(), None),
                    ]),
                Some(read) => {
                    // A live keeper lets it go itself (its copy is dropped
                    // before this start is answered).
                    let owner = &read.record.owner;
                    if let Some(waited) = self.wait_for(&mut keeper, owner, key, version).await? {
                        return Ok(Started::Busy(waited));
                    }
                    continue;
                }
            };
            let done = self.txn(txn).await?;
            if done.succeeded() {
                return Ok(Started::Here);
            }
        }
    }

    pub(crate) async fn claim_here(
        &self,
        key: &FleetKey,
        version: &str,
        wait: Duration,
    ) -> Result<Claimed, FleetError> {
        let mut keeper = KeeperWait::new(wait);
        let seq = self.keys.sequence(&key.model, &key.key);
        let state = self.keys.state(&key.model, &key.key);
        loop {
            self.membership.check()?;
            let me = self.membership.id();
            let Some(read) = self.read(key).await? else {
                return Ok(Claimed::NeverHeld);
            };
            if read.record.owner == me {
                return Ok(Claimed::Mine);
            }
            if read.record.version != version {
                return Ok(Claimed::OnVersion(read.record.version));
            }
            if !self.free(&read).await? {
                let owner = &read.record.owner;
                if let Some(waited) = self.wait_for(&mut keeper, owner, key, version).await? {
                    return Ok(Claimed::Busy(waited));
                }
                continue;
            }
            // No live keeper: its state is in the store (handed over), or lost.
            let mine = Record {
                owner: me,
                version: version.to_string(),
            }
            .bytes();
            let take = Txn::new()
                .when(self.unchanged_and_free(&seq, &read))
                .and_then([
                    TxnOp::get(state.as_str(), None),
                    TxnOp::txn(
                        Txn::new()
                            .when([Compare::create_revision(
                                state.as_str(),
                                CompareOp::Greater,
                                0,
                            )])
                            .and_then([
                                TxnOp::put(seq.as_str(), mine, None),
                                TxnOp::delete(state.as_str(), None),
                            ]),
                    ),
                ]);
            let done = self.txn(take).await?;
            if !done.succeeded() {
                continue; // the record moved, or its keeper came back: look again
            }
            let handed = done.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(got) => got.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            });
            return Ok(match handed {
                Some(bytes) => Claimed::State(bytes),
                None => Claimed::Lost,
            });
        }
    }

    pub(crate) async fn hand_over(
        &self,
        key: &FleetKey,
        version: &str,
        state: Vec<u8>,
    ) -> Result<bool, FleetError> {
        let me = self.membership.id();
        let seq = self.keys.sequence(&key.model, &key.key);
        let mine = Record {
            owner: me.clone(),
            version: version.to_string(),
        };
        let handed = Record {
            owner: String::new(),
            version: version.to_string(),
        };
        let txn = Txn::new()
            .when([Compare::value(seq.as_str(), CompareOp::Equal, mine.bytes())])
            .and_then([
                TxnOp::put(seq.as_str(), handed.bytes(), None),
                TxnOp::put(self.keys.state(&key.model, &key.key), state, None),
                TxnOp::delete(self.keys.want(&me, &key.model, &key.key), None),
            ])
            .or_else([TxnOp::delete(
                self.keys.want(&me, &key.model, &key.key),
                None,
            )]);
        let done = self.txn(txn).await?;
        Ok(done.succeeded())
    }
}

/// Deletes `key`'s record if it still names `me` (an end, a drop, an
/// expiry here), and any want of it addressed to `me`.
pub(crate) async fn release(
    clients: crate::clients::Clients,
    keys: &crate::keys::Keys,
    me: &str,
    key: &FleetKey,
    version: &str,
) -> Result<(), FleetError> {
    let seq = keys.sequence(&key.model, &key.key);
    let mine = Record {
        owner: me.to_string(),
        version: version.to_string(),
    };
    let want = keys.want(me, &key.model, &key.key);
    let txn = Txn::new()
        .when([Compare::value(seq.as_str(), CompareOp::Equal, mine.bytes())])
        .and_then([
            TxnOp::delete(seq.as_str(), None),
            TxnOp::delete(want.as_str(), None),
        ])
        .or_else([TxnOp::delete(want.as_str(), None)]);
    clients
        .kv(|mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await?;
    Ok(())
}

/// What another replica asked of this one: hand `key` over (it lives here
/// on `version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The sequence.
    pub key: FleetKey,
    /// The version its asker found it on.
    pub version: String,
}

/// Turns a change of `P/wants/` into what is asked of replica `me`.
pub(crate) fn asked_of(
    keys: &crate::keys::Keys,
    me: &str,
    change: Change,
    mut give: impl FnMut(Asked),
) {
    let mine = keys.wants_of(me);
    let mut one = |key: &[u8], value: &[u8]| {
        if !key.starts_with(mine.as_bytes()) {
            return;
        }
        if let Ok(want) = serde_json::from_slice::<Want>(value) {
            give(Asked {
                key: FleetKey {
                    model: want.model,
                    key: want.key,
                },
                version: want.version,
            });
        }
    };
    match change {
        Change::Reset(all) => all.iter().for_each(|(k, v)| one(k, v)),
        Change::Put(key, value) => one(&key, &value),
        Change::Delete(_) => {}
    }
}

/// Shared with the tasks that follow the store.
pub(crate) type SharedMirror = Arc<Mirror>;
