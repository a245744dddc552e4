//! Halts for the whole fleet: one key per halted version
//! (`P/halts/MODEL/VERSION`, the halt's JSON as its value), not leased (a
//! halt outlives every replica), followed by every replica. Each replica
//! acknowledges the revision its copy has reached (`P/halts-seen/ID`, bound
//! to its lease), and a write returns once every live replica has
//! acknowledged it (or the lease's TTL has passed): after a halt's answer,
//! no live replica serves the version.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use tickserve_core::fleet::{FleetError, HaltRecord, Propagation};

use crate::Fleet;
use crate::clients::Clients;
use crate::follow::Change;
use crate::keys::Keys;
use crate::membership::Membership;

/// How often a write looks at the acknowledgements.
const LOOK_AGAIN: Duration = Duration::from_millis(2);

impl Fleet {
    #[allow(clippy::disallowed_methods)] // the wait for acknowledgements is the machine's time
    pub(crate) async fn write_halt(&self, record: HaltRecord) -> Result<Propagation, FleetError> {
        let began = Instant::now();
        let key = self.keys.halt(&record.model, &record.version);
        let revision = self
            .clients
            .kv(|mut kv| {
                let (key, halt) = (key.clone(), record.halt.clone());
                async move {
                    let header = match halt {
                        Some(halt) => kv
                            .put(key, halt, None::<PutOptions>)
                            .await
                            .map(|mut r| r.take_header()),
                        None => kv.delete(key, None).await.map(|mut r| r.take_header()),
                    };
                    header.map(|h| h.map_or(0, |h| h.revision()))
                }
            })
            .await?;
        let until = began + self.config.lease;
        loop {
            let members = self.prefix_values(&self.keys.area("members")).await?;
            let seen = self.prefix_values(&self.keys.area("halts-seen")).await?;
            let live: Vec<&String> = members.iter().map(|(_, id)| id).collect();
            let applied = live
                .iter()
                .filter(|id| {
                    seen.iter().any(|(k, v)| {
                        k.ends_with(&format!("/{}", crate::keys::escape(id)))
                            && v.parse::<i64>().is_ok_and(|r| r >= revision)
                    })
                })
                .count();
            let done = applied == live.len();
            if done || Instant::now() >= until {
                return Ok(Propagation {
                    replicas: live.len(),
                    applied,
                    waited: began.elapsed(),
                });
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }

    /// Every key and value (as text) under `prefix`.
    async fn prefix_values(&self, prefix: &str) -> Result<Vec<(String, String)>, FleetError> {
        let got = self
            .clients
            .kv(|mut kv| {
                let prefix = prefix.to_string();
                async move { kv.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(got
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )
            })
            .collect())
    }
}

/// Records (on the fleet's task) that this replica's copy of the halts has
/// reached `revision`.
pub(crate) fn acknowledge(
    clients: &Clients,
    keys: &Keys,
    membership: &Arc<Membership>,
    revision: i64,
) {
    let (clients, membership) = (clients.clone(), Arc::clone(membership));
    let key = format!(
        "{}{}",
        keys.area("halts-seen"),
        crate::keys::escape(&membership.id())
    );
    tokio::spawn(async move {
        let lease = membership.lease();
        let written = clients
            .kv(|mut kv| {
                let key = key.clone();
                async move {
                    kv.put(
                        key,
                        revision.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                    .await
                }
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "fleet: the halts this replica applied could not be acknowledged");
        }
    });
}

/// A change of `P/halts/` as halt records (`true`: they replace every halt
/// known so far).
pub(crate) fn records(keys: &crate::keys::Keys, change: Change) -> (Vec<HaltRecord>, bool) {
    let record = |key: &[u8], halt: Option<Vec<u8>>| {
        keys.split("halts", key).map(|(model, version)| HaltRecord {
            model,
            version,
            halt,
        })
    };
    match change {
        Change::Reset(all) => (
            all.into_iter()
                .filter_map(|(k, v)| record(&k, Some(v)))
                .collect(),
            true,
        ),
        Change::Put(key, value) => (record(&key, Some(value)).into_iter().collect(), false),
        Change::Delete(key) => (record(&key, None).into_iter().collect(), false),
    }
}
