//! Serving a front end's routes on its listener, with the connection limits
//! a server reachable by other teams needs: a cap on open connections (both
//! front ends together), a time limit on reading each request's headers (which
//! also closes a kept-alive HTTP/1 connection left idle that long), a time
//! limit between the pieces of a request body, and a cap on concurrent HTTP/2
//! streams per connection; dead HTTP/2 peers are found by keep-alive pings.
//!
//! `http::serve` and `grpc::serve` call [`serve`]; it accepts until the stop
//! signal, then stops accepting and lets the open connections finish what
//! they are answering (`Server::shutdown` bounds that wait).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tickserve_core::config::ListenConfig;
use tickserve_core::metrics as names;
use tokio::sync::{Semaphore, watch};
use tower::ServiceBuilder;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// The limits every connection of both front ends is held to.
#[derive(Debug)]
pub struct ConnectionLimits {
    /// Open connections, both front ends together: a permit per connection.
    open: Arc<Semaphore>,
    max_connections: usize,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    max_concurrent_streams: u32,
    http2_keep_alive: Duration,
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
            header_read_timeout: config.header_read_timeout,
            body_read_timeout: config.body_read_timeout,
            max_concurrent_streams: config.max_concurrent_streams,
            http2_keep_alive: config.http2_keep_alive,
        }
    }
}

/// Serves `router` on `listener` within `limits` until `stop` turns true.
/// `protocol` labels the log lines and the refused-connections metric.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Arc<ConnectionLimits>,
    protocol: &'static str,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let service = ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout))
        .service(router);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(limits.http2_keep_alive)
        .keep_alive_timeout(limits.http2_keep_alive);
    let refused = metrics::counter!(names::CONNECTIONS_REFUSED, "protocol" => protocol);
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
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
        let _ = tcp.set_nodelay(true);
        let builder = builder.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        let first_bytes_within = limits.header_read_timeout;
        tokio::spawn(async move {
            // A connection that sends nothing at all (not even which HTTP
            // version it speaks, which hyper's own timers do not cover) is
            // closed after header_read_timeout.
            let mut first = [0u8; 1];
            match tokio::time::timeout(first_bytes_within, tcp.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let connection = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(tcp),
                    TowerToHyperService::new(service),
                )
                .into_owned();
            // A client that misbehaves (or a timeout) ends only its connection.
            let _ = watcher.watch(connection).await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
