//! Serving a front end's routes on its listener, with the connection limits
//! a server reachable by other teams needs: a cap on open connections (both
//! front ends together) and on those of one source address, a time limit on reading each request's headers (which
//! also closes a kept-alive HTTP/1 connection left idle that long), one
//! deadline for each request body however it is split ([`budget`]), every
//! body's bytes counted as they arrive against the server's budget and its
//! connection's ([`budget`]), a cap on concurrent HTTP/2 streams per
//! connection, an idle timeout (a connection with no request open that long
//! is closed gracefully; HTTP/2: GOAWAY), and a send timeout: a connection
//! whose peer leaves an answer untaken that long (a full socket: [`stall`];
//! an HTTP/2 window kept shut: [`activity`]) is closed, and counted. Dead
//! HTTP/2 peers are found by keep-alive pings. With TLS, the handshake is
//! held to the header-read time too, and a failed one is counted.
//!
//! `http::serve` and `grpc::serve` call [`serve`]; it accepts until the stop
//! signal, then stops accepting and lets the open connections finish what
//! they are answering (`Server::shutdown` bounds that wait).

mod activity;
pub mod budget;
mod stall;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tickserve_core::config::ListenConfig;
use tickserve_core::metrics as names;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::tls::Tls;
use crate::transport::first_answer::FirstAnswer;
use activity::Activity;
use budget::BodyRules;
use stall::{Watched, WriteStall};
use tickserve_edge::ConnectionBudget;
use tickserve_edge::Edge;

/// The most an HTTP/1 connection reads ahead of its handler (hyper's read
/// buffer; its default is about 400 KiB).
const READ_AHEAD_BYTES: usize = 64 * 1024;

/// The limits every connection of both front ends is held to.
#[derive(Debug)]
pub struct ConnectionLimits {
    /// Open connections, both front ends together: a permit per connection.
    open: Arc<Semaphore>,
    max_connections: usize,
    /// Open connections by source address, both front ends together (an
    /// address leaves the map with its last connection), and the most one
    /// address may hold. Locked once as a connection opens and once as it
    /// closes; hashed with FxHash: it holds at most `max_connections`
    /// addresses, so even addresses chosen to collide cost a connection no
    /// more than that many comparisons.
    peers: std::sync::Mutex<HashMap<IpAddr, usize, rustc_hash::FxBuildHasher>>,
    max_per_peer: usize,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    send_timeout: Duration,
    max_connection_bytes: usize,
    max_concurrent_streams: u32,
    http2_keep_alive: Duration,
    idle_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits of `config` (`[server]` in `tickserve.toml`).
    pub fn new(config: &ListenConfig) -> ConnectionLimits {
        ConnectionLimits {
            // `validate` bounds it; a config that skipped validation (tests
            // build theirs) still cannot make the semaphore panic.
            open: Arc::new(Semaphore::new(
                config.max_connections.min(Semaphore::MAX_PERMITS),
            )),
            max_connections: config.max_connections,
            peers: std::sync::Mutex::new(HashMap::default()),
            max_per_peer: config.max_connections_per_peer.min(config.max_connections),
            header_read_timeout: config.header_read_timeout,
            body_read_timeout: config.body_read_timeout,
            send_timeout: config.send_timeout,
            max_connection_bytes: config.max_connection_bytes,
            max_concurrent_streams: config.max_concurrent_streams,
            http2_keep_alive: config.http2_keep_alive,
            idle_timeout: config.idle_timeout,
        }
    }
}

impl ConnectionLimits {
    /// A place for one more connection from `peer`, or `None` when it holds
    /// `max_connections_per_peer` already.
    fn admit_peer(self: &Arc<Self>, peer: IpAddr) -> Option<PeerSlot> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let open = peers.entry(peer).or_insert(0);
        if *open >= self.max_per_peer {
            return None;
        }
        *open += 1;
        Some(PeerSlot {
            limits: Arc::clone(self),
            peer,
        })
    }
}

/// One open connection's place in its address's count; given back when
/// dropped (the connection closed).
struct PeerSlot {
    limits: Arc<ConnectionLimits>,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = self.limits.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = peers.get_mut(&self.peer) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// A connection's byte stream: TCP, or TLS over TCP.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for S {}

/// Why a connection is closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Open.
    No,
    /// The server stops: what it answers finishes (the shutdown bounds it).
    Stop,
    /// Idle: nothing is open; the close may take at most `send_timeout`.
    Idle(Instant),
}

/// Serves `router` on `listener` (over `tls` when given) within `limits`,
/// every body counted into `edge`'s budget by `rules`, until `stop` turns
/// true. `protocol` labels the log lines and the connection metrics.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    (edge, rules): (Arc<Edge>, BodyRules),
    tls: Option<Arc<Tls>>,
    limits: Arc<ConnectionLimits>,
    protocol: &'static str,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // What one HTTP/1 connection reads ahead of its handler: bodies are
        // counted as the handler takes them, so this is the most a
        // connection holds uncounted.
        .max_buf_size(READ_AHEAD_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(limits.http2_keep_alive)
        .keep_alive_timeout(limits.http2_keep_alive);
    let refused = metrics::counter!(names::CONNECTIONS_REFUSED, "protocol" => protocol,
        "reason" => "max_connections");
    let refused_per_peer = metrics::counter!(names::CONNECTIONS_REFUSED, "protocol" => protocol,
        "reason" => "max_connections_per_peer");
    let handshake_failed = metrics::counter!(names::TLS_HANDSHAKE_FAILURES, "protocol" => protocol);
    let send_timeouts = metrics::counter!(names::SEND_TIMEOUTS, "protocol" => protocol);
    let mut connections = JoinSet::new();
    loop {
        // Finished connections leave the set as new ones come.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let (tcp, peer) = match accepted {
            Ok((tcp, address)) => (tcp, address.ip().to_canonical()),
            Err(e) => {
                // Out of file descriptors, most likely: wait for some to close
                // rather than spin.
                tracing::warn!(protocol, error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&limits.open).try_acquire_owned() else {
            // At the limit: close at once, before reading anything.
            refused.increment(1);
            tracing::debug!(
                protocol,
                limit = limits.max_connections,
                "connection refused: server.max_connections open"
            );
            drop(tcp);
            continue;
        };
        let Some(peer_slot) = limits.admit_peer(peer) else {
            // This address holds its share: close at once; others are served.
            refused_per_peer.increment(1);
            tracing::debug!(
                protocol,
                limit = limits.max_per_peer,
                "connection refused: server.max_connections_per_peer open from its address"
            );
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let builder = builder.clone();
        let activity = Arc::new(Activity::new());
        let budget = Arc::new(ConnectionBudget::new(limits.max_connection_bytes));
        let body_timeout = limits.body_read_timeout;
        let counting = {
            let edge = Arc::clone(&edge);
            let budget = Arc::clone(&budget);
            let first = Arc::new(FirstAnswer::default());
            move |mut request: http::Request<_>| {
                request.extensions_mut().insert(Arc::clone(&first));
                budget::count(request, &edge, &budget, body_timeout, rules)
            }
        };
        let service =
            tower::util::MapFuture::new(tower::util::MapRequest::new(router.clone(), counting), {
                let activity = Arc::clone(&activity);
                move |answer| activity::counted(answer, Arc::clone(&activity))
            });
        let first_bytes_within = limits.header_read_timeout;
        let idle_timeout = limits.idle_timeout;
        let send_timeout = limits.send_timeout;
        let mut stop = stop.clone();
        let tls = tls.clone();
        let handshake_failed = handshake_failed.clone();
        let send_timeouts = send_timeouts.clone();
        connections.spawn(async move {
            // A connection that sends nothing at all (not even which HTTP
            // version it speaks, which hyper's own timers do not cover) is
            // closed after header_read_timeout.
            let mut first = [0u8; 1];
            match tokio::time::timeout(first_bytes_within, tcp.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let stall = Arc::new(WriteStall::new());
            let tcp = Watched::new(tcp, Arc::clone(&stall));
            let stream: Box<dyn Stream> = match tls {
                None => Box::new(tcp),
                // The handshake is held to the same time as the first bytes.
                Some(tls) => {
                    let accepted =
                        tokio::time::timeout(first_bytes_within, tls.acceptor().accept(tcp)).await;
                    match accepted {
                        Ok(Ok(stream)) => Box::new(stream),
                        Ok(Err(e)) => {
                            handshake_failed.increment(1);
                            tracing::debug!(protocol, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            handshake_failed.increment(1);
                            tracing::debug!(protocol, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            let connection = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(service),
            );
            tokio::pin!(connection);
            let mut closing = Closing::No;
            let check_every = (send_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
            loop {
                let idle_until = activity.idle_until(idle_timeout);
                tokio::select! {
                    // A client that misbehaves (or a timeout) ends only its
                    // connection.
                    _ = connection.as_mut() => break,
                    _ = stop.wait_for(|stopped| *stopped), if closing == Closing::No => {
                        connection.as_mut().graceful_shutdown();
                        closing = Closing::Stop;
                    }
                    _ = tokio::time::sleep_until(idle_until), if closing == Closing::No => {
                        if activity.idle_for(idle_timeout) {
                            tracing::debug!(protocol, "closing a connection idle for server.idle_timeout");
                            connection.as_mut().graceful_shutdown();
                            closing = Closing::Idle(Instant::now());
                        }
                    }
                    _ = tokio::time::sleep(check_every) => {
                        // The peer takes nothing: its socket refuses every
                        // write, or an answer waits for room it never gives.
                        let unsent = [stall.stalled_for(), activity.longest_unsent()]
                            .into_iter()
                            .flatten()
                            .max();
                        let idle_close_overdue = matches!(closing,
                            Closing::Idle(at) if at.elapsed() > send_timeout);
                        if unsent.is_some_and(|d| d > send_timeout) || idle_close_overdue {
                            send_timeouts.increment(1);
                            tracing::debug!(protocol, ?unsent,
                                "closing a connection whose peer does not take its answers (server.send_timeout)");
                            break;
                        }
                    }
                }
            }
            drop(peer_slot);
            drop(permit);
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}
