//! The fleet as one server, kept in etcd v3: replicas that share etcd
//! endpoints and a prefix (`[fleet]`) agree, through leases, transactions
//! and watches, on who keeps each sequence, hand sequences' states to each
//! other, and share their halts (docs/deploy.md, "Scaling out").
//!
//! | module | what it is for |
//! | --- | --- |
//! | `keys` | where each record lives under the prefix |
//! | `membership` | this replica's lease, kept alive, and the fence it proves |
//! | `follow` | a prefix read, then watched without a gap |
//! | `sequences` | ownership moved by transactions, hand-over, wants |
//! | `halts` | one key per halted version |
//!
//! [`Fleet`] implements the core's [`SequenceFleet`] and [`HaltsFleet`];
//! the server connects it at start and hands it to the runtime and the
//! edge. Nothing here runs for a stateless request.

mod clients;
mod follow;
mod halts;
mod keys;
mod membership;
mod sequences;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use tickserve_core::config::FleetConfig;
use tickserve_core::fleet::{
    Claimed, FleetError, FleetKey, HaltRecord, HaltsFleet, Pending, Propagation, SequenceFleet,
    Started,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use sequences::Asked;

/// The most bytes of one sequence's handed state: under etcd's default
/// request limit (1.5 MiB), with room for the transaction around it.
pub const MAX_STATE_BYTES: usize = 1024 * 1024;

/// The largest file read for `[fleet]` (certificates, keys, a password).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// This replica's place in the fleet.
pub struct Fleet {
    clients: clients::Clients,
    keys: keys::Keys,
    membership: Arc<membership::Membership>,
    mirror: sequences::SharedMirror,
    /// What other replicas ask of this one: sent by the wants follower,
    /// taken once by the server ([`Fleet::asked`]); closed with the fleet.
    asked: Mutex<Option<mpsc::UnboundedReceiver<Asked>>>,
    asked_sender: mpsc::UnboundedSender<Asked>,
    /// The tasks that keep the lease and follow the store; aborted on drop.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Where fire-and-forget writes run (a release from an executor thread).
    runtime: tokio::runtime::Handle,
    config: FleetConfig,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
            .field("member", &self.membership.id())
            .finish_non_exhaustive()
    }
}

fn read_file(what: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("fleet.{what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "fleet.{what} {}: over {MAX_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

fn options(config: &FleetConfig) -> Result<ConnectOptions, String> {
    let timeout = (config.lease / 2).clamp(Duration::from_millis(500), Duration::from_secs(2));
    let mut options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(1), timeout)
        .with_keep_alive_while_idle(true);
    if let (Some(user), Some(file)) = (&config.user, &config.password_file) {
        let text = String::from_utf8(read_file("password_file", file)?)
            .map_err(|_| "fleet.password_file is not UTF-8".to_string())?;
        let password = text.lines().next().unwrap_or_default().to_string();
        options = options.with_user(user.clone(), password);
    }
    if let Some(ca) = &config.ca_file {
        let mut tls =
            TlsOptions::new().ca_certificate(Certificate::from_pem(read_file("ca_file", ca)?));
        if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
            tls = tls.identity(Identity::from_pem(
                read_file("cert_file", cert)?,
                read_file("key_file", key)?,
            ));
        }
        options = options.with_tls(tls);
    }
    Ok(options)
}

impl Fleet {
    /// Connects to the fleet's etcd and joins it (a lease, kept alive from
    /// now on), then follows its sequences and wants. Fails, naming the
    /// endpoints, when etcd cannot be reached: a replica does not serve
    /// without knowing the fleet's halts.
    pub async fn connect(config: &FleetConfig) -> Result<Arc<Fleet>, String> {
        let failed = |e: String| format!("fleet {:?}: {e}", config.endpoints);
        let clients = clients::Clients::connect(&config.endpoints, &options(config)?)
            .await
            .map_err(|e| failed(format!("cannot connect: {e}")))?;
        let keys = keys::Keys::new(&config.prefix);
        let membership = membership::join(&clients, &keys, config.lease)
            .await
            .map_err(failed)?;
        let (asked_sender, asked) = mpsc::unbounded_channel();
        let fleet = Arc::new(Fleet {
            clients: clients.clone(),
            keys: keys.clone(),
            membership: Arc::clone(&membership),
            mirror: Arc::default(),
            asked: Mutex::new(Some(asked)),
            asked_sender,
            tasks: Mutex::new(Vec::new()),
            runtime: tokio::runtime::Handle::current(),
            config: config.clone(),
        });
        let mut tasks = vec![tokio::spawn(membership::keep(
            clients.clone(),
            keys.clone(),
            membership,
        ))];
        let mirror = Arc::clone(&fleet.mirror);
        let mirror_keys = keys.clone();
        tasks.push(tokio::spawn(follow::follow(
            clients.clone(),
            keys.area("seq"),
            move |change, _| mirror.apply(&mirror_keys, change),
        )));
        let (wants_keys, me, give) = (
            keys.clone(),
            Arc::clone(&fleet.membership),
            fleet.asked_sender.clone(),
        );
        tasks.push(tokio::spawn(follow::follow(
            clients,
            keys.area("wants"),
            move |change, _| {
                sequences::asked_of(&wants_keys, &me.id(), change, |asked| {
                    let _ = give.send(asked);
                })
            },
        )));
        *fleet.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        tracing::info!(
            endpoints = ?config.endpoints,
            prefix = config.prefix,
            member = fleet.membership.id(),
            "joined the fleet"
        );
        Ok(fleet)
    }

    /// What other replicas ask this one to hand over, in the order asked;
    /// `None` after the first call.
    pub fn asked(&self) -> Option<mpsc::UnboundedReceiver<Asked>> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// This replica's member id (its lease's, in hex).
    pub fn member(&self) -> String {
        self.membership.id()
    }

    /// How long a tick waits for a live keeper (`fleet.handoff_wait`).
    pub fn handoff_wait(&self) -> Duration {
        self.config.handoff_wait
    }

    /// Leaves the fleet (after a drain has handed every sequence over): the
    /// lease is revoked, so this replica's member key and wants go at once.
    pub async fn leave(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
        let lease = self.membership.lease();
        let (_, client) = self.clients.pick();
        if let Err(e) = client.lease_client().revoke(lease).await {
            tracing::warn!(error = %e, "fleet: the lease could not be revoked (it ends by its TTL)");
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

impl SequenceFleet for Fleet {
    fn membership(&self) -> Result<u64, FleetError> {
        self.membership.check()
    }

    fn start<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        wait: Duration,
    ) -> Pending<'a, Result<Started, FleetError>> {
        Box::pin(self.start_here(key, version, wait))
    }

    fn claim<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        wait: Duration,
    ) -> Pending<'a, Result<Claimed, FleetError>> {
        Box::pin(self.claim_here(key, version, wait))
    }

    fn hand<'a>(
        &'a self,
        key: &'a FleetKey,
        version: &'a str,
        state: Vec<u8>,
    ) -> Pending<'a, Result<bool, FleetError>> {
        Box::pin(self.hand_over(key, version, state))
    }

    fn release(&self, key: FleetKey, version: String) {
        let clients = self.clients.clone();
        let (keys, membership) = (self.keys.clone(), Arc::clone(&self.membership));
        self.runtime.spawn(async move {
            let me = membership.id();
            if let Err(e) = sequences::release(clients, &keys, &me, &key, &version).await {
                tracing::warn!(model = key.model, error = %e,
                    "fleet: an ended sequence's record stays (its keeper answers for it when asked)");
            }
        });
    }

    fn version_of(&self, key: &FleetKey) -> Option<String> {
        self.mirror.version_of(key)
    }

    fn max_state_bytes(&self) -> usize {
        MAX_STATE_BYTES
    }
}

impl HaltsFleet for Fleet {
    fn write<'a>(&'a self, record: HaltRecord) -> Pending<'a, Result<Propagation, FleetError>> {
        Box::pin(self.write_halt(record))
    }

    fn follow(&self, apply: Box<dyn Fn(Vec<HaltRecord>, bool) + Send + Sync>) {
        let keys = self.keys.clone();
        let (clients, membership) = (self.clients.clone(), Arc::clone(&self.membership));
        let task = self.runtime.spawn(follow::follow(
            self.clients.clone(),
            self.keys.area("halts"),
            move |change, revision| {
                let (records, reset) = halts::records(&keys, change);
                apply(records, reset);
                halts::acknowledge(&clients, &keys, &membership, revision);
            },
        ));
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
    }
}
