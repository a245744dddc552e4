//! One etcd client per endpoint, and the one in use: a call that fails goes
//! to the next endpoint (etcd's own Go client rotates so; the Rust client's
//! balanced channel keeps sending to a member that is down). Every member
//! answers for the whole cluster, so any live one will do.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::{Client, ConnectOptions, KvClient};
use tickserve_core::fleet::FleetError;

/// The clients, one per endpoint.
#[derive(Clone)]
pub(crate) struct Clients {
    all: std::sync::Arc<[Client]>,
    current: std::sync::Arc<AtomicUsize>,
}

impl Clients {
    /// A client for each of `endpoints` (each connects when first used,
    /// and again after a failure).
    pub(crate) async fn connect(
        endpoints: &[String],
        options: &ConnectOptions,
    ) -> Result<Clients, String> {
        let mut all = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let client = Client::connect([endpoint.as_str()], Some(options.clone()))
                .await
                .map_err(|e| format!("{endpoint}: {e}"))?;
            all.push(client);
        }
        if all.is_empty() {
            return Err("no endpoint".to_string());
        }
        Ok(Clients {
            all: all.into(),
            current: std::sync::Arc::default(),
        })
    }

    /// The client in use, and its place.
    pub(crate) fn pick(&self) -> (usize, Client) {
        let i = self.current.load(Ordering::Relaxed) % self.all.len();
        (i, self.all[i].clone())
    }

    /// Moves on from the client at `failed`, if it is still the one in use.
    pub(crate) fn failed(&self, failed: usize) {
        let next = (failed + 1) % self.all.len();
        let _ = self
            .current
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// `call` on the key-value client in use, then on each other endpoint
    /// in turn while it fails.
    pub(crate) async fn kv<T, F, Fut>(&self, call: F) -> Result<T, FleetError>
    where
        F: Fn(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = String::new();
        for _ in 0..self.all.len() {
            let (i, client) = self.pick();
            match call(client.kv_client()).await {
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    last = e.to_string();
                    self.failed(i);
                }
            }
        }
        Err(FleetError::Store(format!("etcd: {last}")))
    }
}
