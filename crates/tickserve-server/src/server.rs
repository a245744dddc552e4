//! The [`Server`]: the repository loaded, both ports bound and the
//! shared-memory front end started; stopped by a drain.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tickserve_core::config::{FrontEnd, ModelControlMode, ServerConfig};
use tickserve_edge::Edge;
use tickserve_runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::transport::access::Access;
use crate::{control, fleet, listen, observe, ports, shm, tls, warm};

/// The least time the front ends get to answer what they admitted, even
/// when `server.drain_timeout` is spent.
const DRAIN_FLOOR: std::time::Duration = std::time::Duration::from_millis(100);

/// How often shutdown looks whether the queues are empty.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// A running server.
pub struct Server {
    /// Where the HTTP front end listens.
    pub http_addr: SocketAddr,
    /// Where the gRPC front end listens.
    pub grpc_addr: SocketAddr,
    edge: Arc<Edge>,
    /// Set to true to stop both front ends; each holds a receiver.
    stop: watch::Sender<bool>,
    http_task: JoinHandle<anyhow::Result<()>>,
    grpc_task: JoinHandle<anyhow::Result<()>>,
    /// The shared-memory front end, when `shm.enabled`.
    shm: Option<shm::ShmFrontEnd>,
    /// The repository poll, in `poll` model control mode.
    poll_task: Option<JoinHandle<()>>,
    /// The fleet this replica joined, with `[fleet]`.
    fleet: Option<Arc<tickserve_fleet::Fleet>>,
    /// Answers other replicas' requests for sequences, with `[fleet]`.
    asked_task: Option<JoinHandle<()>>,
    /// `server.drain_timeout`: what a stop may take in all.
    drain_timeout: std::time::Duration,
}

/// `runtime.mlockall`: locks every page of the process, now and later, in
/// memory.
fn lock_memory() -> anyhow::Result<()> {
    // SAFETY: mlockall takes flags only and touches no memory of ours.
    let locked = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if locked != 0 {
        anyhow::bail!(
            "runtime.mlockall: mlockall failed ({}); raise the memory-lock limit (ulimit -l, \
             systemd LimitMEMLOCK=infinity, or CAP_IPC_LOCK) or set runtime.mlockall = false",
            std::io::Error::last_os_error()
        );
    }
    tracing::info!("memory locked (runtime.mlockall)");
    Ok(())
}

impl Server {
    /// Loads the repository, binds both front ends and starts serving.
    pub async fn start(config: &ServerConfig) -> anyhow::Result<Server> {
        observe::install_recorder();
        // The latency mode pins its polling threads; one left unpinned would
        // poll on a core another thread needs.
        if let Some(cpu) = tickserve_runtime::first_unavailable_cpu(&config.latency.cores) {
            anyhow::bail!(
                "latency.cores names core {cpu}, which this process may not run on (the \
                 machine's cores, less what taskset or the cgroup's cpuset leaves out)"
            );
        }
        let placed = config.with_latency_placement();
        let config = &placed;
        if config.latency.enabled() {
            tracing::info!(shm = ?config.shm.cpus, executors = ?config.runtime.executor_cpus,
                warm = ?config.latency.warm, "latency mode: these threads poll on their cores");
        }
        if config.runtime.mlockall {
            lock_memory()?;
        }
        // Before the models: a halts file that cannot be read stops the start
        // at once (a halt an operator set must not be dropped).
        let halts = tickserve_edge::Halts::open(config.risk.halts_file.clone())
            .map_err(anyhow::Error::msg)?;
        // The fleet too: a replica does not serve without its halts, and its
        // sequence tables join the fleet as they load.
        let fleet = match &config.fleet {
            Some(settings) => Some(
                tickserve_fleet::Fleet::connect(settings)
                    .await
                    .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        let runtime = {
            let mut owned = config.clone();
            owned.joined = fleet
                .clone()
                .map(|f| f as Arc<dyn tickserve_core::fleet::SequenceFleet>);
            tokio::task::spawn_blocking(move || Runtime::load(&owned))
                .await
                .context("model loading panicked")?
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{e} (repository.path = {})",
                        config.repository.path.display()
                    )
                })?
        };
        let journal = if config.journal.enabled {
            Some(
                tickserve_journal::Journal::start(
                    &config.journal,
                    &runtime.machine(),
                    &config.clock,
                )
                .map_err(anyhow::Error::msg)?,
            )
        } else {
            None
        };
        let edge = Arc::new(
            Edge::new(runtime, config)
                .with_journal(journal)
                .with_halts(halts),
        );
        let known = |model: &str, version: &str| edge.runtime.model(model, Some(version)).is_ok();
        edge.halts.unmatched(known);
        if let Some(fleet) = &fleet {
            edge.halts
                .follow_fleet(Arc::clone(fleet) as Arc<dyn tickserve_core::fleet::HaltsFleet>)
                .await
                .map_err(anyhow::Error::msg)?;
        }
        // Before anyone can reach a port: every thread that may run a
        // request at once has run each model.
        warm::workers(&edge).await;
        let host = &config.server.host;
        let http_listener = tokio::net::TcpListener::bind((host.as_str(), config.server.http_port))
            .await
            .with_context(|| format!("cannot bind HTTP to {host}:{}", config.server.http_port))?;
        let grpc_listener = tokio::net::TcpListener::bind((host.as_str(), config.server.grpc_port))
            .await
            .with_context(|| format!("cannot bind gRPC to {host}:{}", config.server.grpc_port))?;
        let http_addr = http_listener.local_addr()?;
        let grpc_addr = grpc_listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let limits = Arc::new(listen::ConnectionLimits::new(&config.server));
        let http_access =
            Access::new(&config.security, FrontEnd::Http).map_err(anyhow::Error::msg)?;
        let grpc_access =
            Access::new(&config.security, FrontEnd::Grpc).map_err(anyhow::Error::msg)?;
        let tls_for =
            |front_end: FrontEnd, alpn: &[&[u8]]| -> anyhow::Result<Option<Arc<tls::Tls>>> {
                match &config.security.tls {
                    Some(settings) if settings.front_ends.contains(&front_end) => Ok(Some(
                        Arc::new(tls::Tls::new(settings, alpn).map_err(anyhow::Error::msg)?),
                    )),
                    _ => Ok(None),
                }
            };
        let http_tls = tls_for(FrontEnd::Http, &[b"h2", b"http/1.1"])?;
        let grpc_tls = tls_for(FrontEnd::Grpc, &[b"h2"])?;
        let watched: Vec<_> = http_tls.iter().chain(grpc_tls.iter()).cloned().collect();
        tokio::spawn(tls::watch_files(watched, stopped.clone()));
        // The shared-memory front end is up before the HTTP front end answers
        // anything: a client that saw /v2/health/ready can connect at once.
        let shm = if config.shm.enabled {
            let edge = Arc::clone(&edge);
            let runtime = tokio::runtime::Handle::current();
            let (config, warm) = (config.shm.clone(), config.latency.warm);
            Some(
                tokio::task::spawn_blocking(move || {
                    shm::ShmFrontEnd::start(&config, warm, edge, runtime)
                })
                .await
                .context("the shared-memory front end panicked")??,
            )
        } else {
            None
        };
        let poll_task = (config.security.model_control_mode == ModelControlMode::Poll).then(|| {
            tokio::spawn(control::poll_repository(
                Arc::clone(&edge),
                config.repository.poll_interval,
                stopped.clone(),
            ))
        });
        let asked_task = fleet.as_ref().map(|fleet| {
            tokio::spawn(fleet::answer_asked(
                Arc::clone(&edge),
                Arc::clone(fleet),
                stopped.clone(),
            ))
        });
        let http_task = tokio::spawn(ports::http::serve(
            http_listener,
            Arc::clone(&edge),
            http_access,
            http_tls,
            Arc::clone(&limits),
            stopped.clone(),
        ));
        let grpc_task = tokio::spawn(ports::grpc::serve(
            grpc_listener,
            Arc::clone(&edge),
            grpc_access,
            grpc_tls,
            limits,
            config.server.max_health_watches,
            stopped,
        ));
        Ok(Server {
            http_addr,
            grpc_addr,
            edge,
            stop,
            http_task,
            grpc_task,
            shm,
            poll_task,
            fleet,
            asked_task,
            drain_timeout: config.server.drain_timeout,
        })
    }

    /// The edge: the models, readiness and the request path.
    pub fn edge(&self) -> &Arc<Edge> {
        &self.edge
    }

    /// Waits until either front end stops on its own, which only an error does.
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        tokio::select! {
            r = &mut self.http_task => r.context("HTTP front end panicked")?.context("HTTP front end"),
            r = &mut self.grpc_task => r.context("gRPC front end panicked")?.context("gRPC front end"),
        }
    }

    /// Stops admitting requests, stops both front ends, and stops the executors.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // 1. Admit nothing new: readiness turns false and new inference requests
        //    are answered UNAVAILABLE / 503 while connections stay open.
        self.edge.stop_accepting();
        // 2. Let every model's queue empty, so that what was admitted is
        //    answered before any connection closes. Every step from here
        //    takes what is left of `server.drain_timeout`.
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        let drained = tokio::time::timeout_at(deadline, async {
            while self
                .edge
                .runtime
                .ready_handles()
                .iter()
                .any(|h| h.queue.rows() > 0)
            {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "queues still held requests at server.drain_timeout ({:?}); stopping anyway",
                self.drain_timeout
            );
        }
        // 2b. Hand every sequence over to the other replicas of the fleet,
        //     while the front ends still answer (a tick now is refused as
        //     not run, and retried elsewhere), and leave it.
        let handed = match &self.fleet {
            Some(fleet) => {
                tokio::time::timeout_at(deadline, fleet::hand_over_all(&self.edge, fleet)).await
            }
            None => Ok(()),
        };
        if handed.is_err() {
            tracing::error!(
                "the hand-over did not finish within server.drain_timeout ({:?}): the sequences \
                 not handed over yet are lost to the other replicas",
                self.drain_timeout
            );
        }
        // 3. Stop the front ends; each finishes the requests it is answering.
        let _ = self.stop.send(true);
        if let Some(shm) = self.shm {
            tokio::task::spawn_blocking(move || shm.stop()).await?;
        }
        // Connections that stay open (an idle HTTP/2 client that does not
        // close after GOAWAY) must not keep the process alive past the drain.
        for (name, mut task) in [("HTTP", self.http_task), ("gRPC", self.grpc_task)] {
            // What is left, but a moment at least to answer what is in flight.
            let until = deadline.max(tokio::time::Instant::now() + DRAIN_FLOOR);
            match tokio::time::timeout_at(until, &mut task).await {
                Ok(result) => result.with_context(|| format!("{name} front end panicked"))??,
                Err(_) => {
                    tracing::warn!(
                        "{name} front end still had open connections at server.drain_timeout; closing them"
                    );
                    task.abort();
                }
            }
        }
        // A load the poll started finishes; no other starts.
        if let Some(poll) = self.poll_task {
            let _ = poll.await;
        }
        if let Some(asked) = self.asked_task {
            let _ = asked.await;
        }
        // 4. Nothing runs now: every record is handed over; the journal's
        //    files are ended and synced.
        if let Some(journal) = &self.edge.journal {
            let journal = Arc::clone(journal);
            tokio::task::spawn_blocking(move || journal.close()).await?;
        }
        // 5. Keep the sequences for the next start, if asked.
        match self.edge.runtime.write_sequence_snapshot() {
            Ok(0) => {}
            Ok(n) => tracing::info!(sequences = n, "sequence snapshot written"),
            Err(e) => tracing::error!(error = %e, "sequence snapshot not written"),
        }
        if let Ok(edge) = Arc::try_unwrap(self.edge) {
            tokio::task::spawn_blocking(move || edge.runtime.shutdown()).await?;
        }
        Ok(())
    }
}
