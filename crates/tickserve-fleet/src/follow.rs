//! A prefix of the store followed: every key under it read once, then each
//! change in order from the next revision on (etcd's watch has no gap);
//! after a lost stream or a compaction the prefix is read again whole.

use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};

use crate::clients::Clients;

/// What changed under the prefix.
#[derive(Debug)]
pub(crate) enum Change {
    /// Everything under it now (a first read, or a read again).
    Reset(Vec<(Vec<u8>, Vec<u8>)>),
    /// A key written.
    Put(Vec<u8>, Vec<u8>),
    /// A key gone (deleted, or its lease ended).
    Delete(Vec<u8>),
}

/// How long to wait before reading again after the store failed.
const RETRY: Duration = Duration::from_millis(100);

/// Follows `prefix` for as long as the task runs, giving each change to
/// `apply` in order, with the store's revision it brings the copy up to.
pub(crate) async fn follow(clients: Clients, prefix: String, mut apply: impl FnMut(Change, i64)) {
    loop {
        let (at, mut client) = clients.pick();
        let read = client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await;
        let got = match read {
            Ok(got) => got,
            Err(e) => {
                tracing::debug!(prefix, error = %e, "fleet: cannot read a prefix yet");
                clients.failed(at);
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let revision = got.header().map_or(0, |h| h.revision());
        apply(
            Change::Reset(
                got.kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                    .collect(),
            ),
            revision,
        );
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision.saturating_add(1));
        let mut stream = match client.watch(prefix.clone(), Some(options)).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(prefix, error = %e, "fleet: cannot watch a prefix yet");
                clients.failed(at);
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        while let Ok(Some(answer)) = stream.message().await {
            if answer.canceled() {
                break;
            }
            let at = answer.header().map_or(0, |h| h.revision());
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let revision = kv.mod_revision().max(at);
                match event.event_type() {
                    EventType::Put => apply(
                        Change::Put(kv.key().to_vec(), kv.value().to_vec()),
                        revision,
                    ),
                    EventType::Delete => apply(Change::Delete(kv.key().to_vec()), revision),
                }
            }
        }
        clients.failed(at);
        tokio::time::sleep(RETRY).await;
    }
}
