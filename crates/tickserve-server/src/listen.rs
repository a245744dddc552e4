//! Serving a front end's routes on its listener, with the connection limits
//! a server reachable by other teams needs: a cap on open connections (both
//! front ends together), a time limit on reading each request's headers (which
//! also closes a kept-alive HTTP/1 connection left idle that long), a time
//! limit between the pieces of a request body, a cap on concurrent HTTP/2
//! streams per connection, and an idle timeout: a connection with no request
//! open that long is closed gracefully (HTTP/2: GOAWAY). Dead HTTP/2 peers
//! are found by keep-alive pings. With TLS, the handshake is held to the
//! header-read time too, and a failed one is counted.
//!
//! `http::serve` and `grpc::serve` call [`serve`]; it accepts until the stop
//! signal, then stops accepting and lets the open connections finish what
//! they are answering (`Server::shutdown` bounds that wait).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tickserve_core::config::ListenConfig;
use tickserve_core::metrics as names;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::tls::Tls;
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
            header_read_timeout: config.header_read_timeout,
            body_read_timeout: config.body_read_timeout,
            max_concurrent_streams: config.max_concurrent_streams,
            http2_keep_alive: config.http2_keep_alive,
            idle_timeout: config.idle_timeout,
        }
    }
}

/// A connection's byte stream: TCP, or TLS over TCP.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for S {}

/// Serves `router` on `listener` (over `tls` when given) within `limits`
/// until `stop` turns true. `protocol` labels the log lines and the
/// connection metrics.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Option<Arc<Tls>>,
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
    let handshake_failed = metrics::counter!(names::TLS_HANDSHAKE_FAILURES, "protocol" => protocol);
    let mut connections = JoinSet::new();
    loop {
        // Finished connections leave the set as new ones come.
        while connections.try_join_next().is_some() {}
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
        let activity = Arc::new(Activity::new());
        let service = tower::util::MapFuture::new(service.clone(), {
            let activity = Arc::clone(&activity);
            move |answer| counted(answer, Open::new(Arc::clone(&activity)))
        });
        let first_bytes_within = limits.header_read_timeout;
        let idle_timeout = limits.idle_timeout;
        let mut stop = stop.clone();
        let tls = tls.clone();
        let handshake_failed = handshake_failed.clone();
        connections.spawn(async move {
            // A connection that sends nothing at all (not even which HTTP
            // version it speaks, which hyper's own timers do not cover) is
            // closed after header_read_timeout.
            let mut first = [0u8; 1];
            match tokio::time::timeout(first_bytes_within, tcp.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
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
            let mut closing = false;
            loop {
                let idle_until = activity.idle_until(idle_timeout);
                tokio::select! {
                    // A client that misbehaves (or a timeout) ends only its
                    // connection.
                    _ = connection.as_mut() => break,
                    _ = stop.wait_for(|stopped| *stopped), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    _ = tokio::time::sleep_until(idle_until), if !closing => {
                        if activity.idle_for(idle_timeout) {
                            tracing::debug!(protocol, "closing a connection idle for server.idle_timeout");
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                        }
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// The answer of `answer`, with `open` held until its body has been sent (a
/// stream: until it ends).
async fn counted<F>(answer: F, open: Open) -> Result<http::Response<OpenBody>, Infallible>
where
    F: Future<Output = Result<http::Response<axum::body::Body>, Infallible>>,
{
    let response = answer.await?;
    Ok(response.map(|body| OpenBody { body, _open: open }))
}

/// The requests open on one connection, and when the last one ended.
#[derive(Debug)]
struct Activity {
    /// When the connection was accepted: the origin of `last_end_ns`.
    since: Instant,
    open: AtomicUsize,
    last_end_ns: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            since: Instant::now(),
            open: AtomicUsize::new(0),
            last_end_ns: AtomicU64::new(0),
        }
    }

    /// The earliest the connection can have been idle for `timeout`: that
    /// long after its last request ended (or from now, while one is open).
    fn idle_until(&self, timeout: Duration) -> Instant {
        let from = if self.open.load(Ordering::Acquire) > 0 {
            Instant::now()
        } else {
            self.since + Duration::from_nanos(self.last_end_ns.load(Ordering::Acquire))
        };
        from.checked_add(timeout).unwrap_or(from)
    }

    /// No request open, and none ended within `timeout`.
    fn idle_for(&self, timeout: Duration) -> bool {
        self.open.load(Ordering::Acquire) == 0 && self.idle_until(timeout) <= Instant::now()
    }
}

/// One open request of a connection: counted from the call until its
/// answer's body has been sent or dropped.
#[derive(Debug)]
struct Open(Arc<Activity>);

impl Open {
    fn new(activity: Arc<Activity>) -> Open {
        activity.open.fetch_add(1, Ordering::AcqRel);
        Open(activity)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let ended = u64::try_from(self.0.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.last_end_ns.store(ended, Ordering::Release);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request counted as open.
struct OpenBody {
    body: axum::body::Body,
    _open: Open,
}

impl Body for OpenBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_nothing_open_for_the_timeout() {
        let timeout = Duration::from_millis(300);
        let activity = Arc::new(Activity::new());
        assert!(!activity.idle_for(timeout), "just accepted");
        tokio::time::advance(Duration::from_millis(301)).await;
        assert!(activity.idle_for(timeout), "nothing asked since accepted");
        let open = Open::new(Arc::clone(&activity));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!activity.idle_for(timeout), "a request (or stream) open");
        drop(open);
        assert!(!activity.idle_for(timeout), "it just ended");
        tokio::time::advance(Duration::from_millis(299)).await;
        assert!(!activity.idle_for(timeout));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(activity.idle_for(timeout));
    }
}
