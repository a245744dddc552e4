//! This replica's membership of the fleet: an etcd lease (TTL
//! `fleet.lease`) kept alive off the request path, and the fence every
//! sequence operation checks first.
//!
//! The fence: a keep-alive sent at `t` and acknowledged with a live TTL
//! proves the lease until `t + TTL` (etcd counts the TTL from when it
//! received the keep-alive, which is after `t`); this replica acts as a
//! sequence's keeper only until `t + 3/4 TTL`, so it stops answering a
//! quarter of the TTL before any other replica could be given its
//! sequences. A margin of rate, not of clock: both ends measure a duration
//! on a monotonic clock. A lease that lapsed anyway (the store was out of
//! reach longer than the TTL) is replaced by a new one with a new member id,
//! and the epoch moves on: every sequence kept under the old epoch is
//! refused as lost here, as it is everywhere else.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use etcd_client::PutOptions;
use tickserve_core::fleet::FleetError;

use crate::clients::Clients;

use crate::keys::Keys;

/// This replica's lease, its member id, and how long it is proven.
#[derive(Debug)]
pub(crate) struct Membership {
    base: Instant,
    /// Nanoseconds after `base` until which the lease is proven; 0: not now.
    proven_until: AtomicU64,
    /// Moves on each time a lapsed lease is replaced (from 1).
    epoch: AtomicU64,
    lease: AtomicI64,
    /// The member id: the lease's id in hex (unique in the etcd cluster,
    /// and saying nothing of the host or the process).
    id: RwLock<String>,
    ttl: Duration,
}

impl Membership {
    #[allow(clippy::disallowed_methods)] // the fence is the machine's monotonic time by design
    fn nanos(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// `Ok(epoch)` while the lease is proven.
    pub(crate) fn check(&self) -> Result<u64, FleetError> {
        if self.nanos() < self.proven_until.load(Ordering::Acquire) {
            Ok(self.epoch.load(Ordering::Acquire))
        } else {
            Err(FleetError::Lapsed(format!(
                "its lease (TTL {:?}) has not been renewed in the last {:?}",
                self.ttl,
                self.ttl * 3 / 4
            )))
        }
    }

    /// The member id now.
    pub(crate) fn id(&self) -> String {
        self.id.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The lease now.
    pub(crate) fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    fn proven_from(&self, sent: u64) {
        let until = sent.saturating_add(u64::try_from((self.ttl * 3 / 4).as_nanos()).unwrap_or(0));
        self.proven_until.fetch_max(until, Ordering::AcqRel);
    }

    fn unproven(&self) {
        self.proven_until.store(0, Ordering::Release);
    }
}

/// The lease's TTL in whole seconds, as etcd grants it (at least 1).
fn ttl_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX).max(1)
}

/// Grants a lease and registers the member it names.
async fn grant(clients: &Clients, keys: &Keys, ttl: Duration) -> Result<(i64, String), String> {
    let mut last = String::new();
    let mut granted = None;
    for _ in 0..3 {
        let (at, client) = clients.pick();
        match client.lease_client().grant(ttl_seconds(ttl), None).await {
            Ok(lease) => {
                granted = Some(lease.id());
                break;
            }
            Err(e) => {
                last = e.to_string();
                clients.failed(at);
            }
        }
    }
    let lease = granted.ok_or_else(|| format!("cannot grant a lease: {last}"))?;
    let id = format!("{lease:x}");
    let member = keys.member(&id);
    clients
        .kv(|mut kv| {
            let (member, id) = (member.clone(), id.clone());
            async move {
                kv.put(member, id, Some(PutOptions::new().with_lease(lease)))
                    .await
            }
        })
        .await
        .map_err(|e| format!("cannot register member {id}: {e}"))?;
    Ok((lease, id))
}

/// Joins the fleet: a lease, proven from now.
#[allow(clippy::disallowed_methods)] // the fence is the machine's monotonic time by design
pub(crate) async fn join(
    clients: &Clients,
    keys: &Keys,
    ttl: Duration,
) -> Result<Arc<Membership>, String> {
    let base = Instant::now();
    let (lease, id) = grant(clients, keys, ttl).await?;
    let membership = Membership {
        base,
        proven_until: AtomicU64::new(0),
        epoch: AtomicU64::new(1),
        lease: AtomicI64::new(lease),
        id: RwLock::new(id),
        ttl,
    };
    membership.proven_from(0);
    Ok(Arc::new(membership))
}

/// Keeps the lease alive, every third of the TTL, for as long as the task
/// runs; replaces a lapsed lease.
pub(crate) async fn keep(clients: Clients, keys: Keys, membership: Arc<Membership>) {
    let period = membership.ttl / 3;
    loop {
        let lease = membership.lease();
        let (at, mut client) = clients.pick();
        let (mut keeper, mut answers) = match client.lease_keep_alive(lease).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "fleet: cannot reach etcd to keep this replica's lease");
                clients.failed(at);
                tokio::time::sleep(period / 2).await;
                continue;
            }
        };
        loop {
            let sent = membership.nanos();
            if keeper.keep_alive().await.is_err() {
                clients.failed(at);
                break;
            }
            match tokio::time::timeout(period, answers.message()).await {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => membership.proven_from(sent),
                Ok(Ok(Some(_))) => {
                    membership.unproven();
                    tracing::error!(
                        member = membership.id(),
                        "fleet: this replica's lease lapsed; its sequences are lost, joining again"
                    );
                    rejoin(&clients, &keys, &membership).await;
                    break;
                }
                _ => {
                    tracing::warn!("fleet: a keep-alive of this replica's lease went unanswered");
                    clients.failed(at);
                    break;
                }
            }
            tokio::time::sleep(period).await;
        }
    }
}

async fn rejoin(clients: &Clients, keys: &Keys, membership: &Membership) {
    loop {
        let sent = membership.nanos();
        match grant(clients, keys, membership.ttl).await {
            Ok((lease, id)) => {
                *membership.id.write().unwrap_or_else(|p| p.into_inner()) = id.clone();
                membership.lease.store(lease, Ordering::Release);
                membership.epoch.fetch_add(1, Ordering::AcqRel);
                membership.proven_from(sent);
                tracing::warn!(member = id, "fleet: joined again");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "fleet: cannot join again yet");
                tokio::time::sleep(membership.ttl / 3).await;
            }
        }
    }
}
