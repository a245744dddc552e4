//! What one connection is doing: the requests open on it (for the idle
//! timer), and the answers it has ready that its peer is not taking (for the
//! send timeout).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// The requests open on one connection, when the last one ended, and the
/// answers waiting for the peer.
#[derive(Debug)]
pub struct Activity {
    /// When the connection was accepted: the origin of `last_end_ns`.
    since: Instant,
    open: AtomicUsize,
    last_end_ns: AtomicU64,
    /// Answers with something to send that the connection has not taken,
    /// by answer number: since when.
    waiting: Mutex<HashMap<u64, Instant>>,
    next: AtomicU64,
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Activity {
        Activity {
            since: Instant::now(),
            open: AtomicUsize::new(0),
            last_end_ns: AtomicU64::new(0),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The earliest the connection can have been idle for `timeout`: that
    /// long after its last request ended (or from now, while one is open).
    pub fn idle_until(&self, timeout: Duration) -> Instant {
        let from = if self.open.load(Ordering::Acquire) > 0 {
            Instant::now()
        } else {
            self.since + Duration::from_nanos(self.last_end_ns.load(Ordering::Acquire))
        };
        from.checked_add(timeout).unwrap_or(from)
    }

    /// No request open, and none ended within `timeout`.
    pub fn idle_for(&self, timeout: Duration) -> bool {
        self.open.load(Ordering::Acquire) == 0 && self.idle_until(timeout) <= Instant::now()
    }

    /// How long the answer the peer has kept waiting longest has waited.
    pub fn longest_unsent(&self) -> Option<Duration> {
        let oldest = self.waiting().values().min().copied()?;
        Some(Instant::now().saturating_duration_since(oldest))
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

/// The answer of `answer`, counted as open on `activity` until its body has
/// been sent (a stream: until it ends), and as waiting for the peer whenever
/// it has something the connection has not taken.
pub async fn counted<F>(
    answer: F,
    activity: Arc<Activity>,
) -> Result<http::Response<OpenBody>, Infallible>
where
    F: Future<Output = Result<http::Response<axum::body::Body>, Infallible>>,
{
    let open = Open::new(Arc::clone(&activity));
    let response = answer.await?;
    let number = activity.next.fetch_add(1, Ordering::Relaxed);
    // The head is ready: the connection takes it, then asks for the body.
    activity.waiting().insert(number, Instant::now());
    Ok(response.map(|body| OpenBody { body, number, open }))
}

/// An answer's body that keeps its request counted as open, and says
/// whether the connection is taking what it has.
pub struct OpenBody {
    body: axum::body::Body,
    number: u64,
    open: Open,
}

impl OpenBody {
    fn set_waiting(&self, waiting: bool) {
        let activity = &self.open.0;
        let mut map = activity.waiting();
        if waiting {
            map.insert(self.number, Instant::now());
        } else {
            map.remove(&self.number);
        }
    }
}

impl Body for OpenBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        // A frame handed over that is not the last: the connection asks for
        // the next once the peer has taken room for it. Nothing ready (the
        // answer's producer has nothing yet) or the end: not waiting on the
        // peer.
        let waiting = matches!(polled, Poll::Ready(Some(Ok(_)))) && !self.body.is_end_stream();
        self.set_waiting(waiting);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for OpenBody {
    fn drop(&mut self) {
        self.set_waiting(false);
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

    #[tokio::test(start_paused = true)]
    async fn an_answer_the_connection_does_not_take_counts_as_waiting_on_the_peer() {
        let activity = Arc::new(Activity::new());
        assert_eq!(activity.longest_unsent(), None);
        let answer =
            async { Ok::<_, Infallible>(http::Response::new(axum::body::Body::from("x"))) };
        let response = counted(answer, Arc::clone(&activity)).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        // Never asked for its body (an HTTP/2 window kept shut).
        assert_eq!(activity.longest_unsent(), Some(Duration::from_secs(3)));
        let mut body = response.into_body();
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert!(frame.is_some());
        // Its only frame taken: nothing waits.
        assert_eq!(activity.longest_unsent(), None);
        drop(body);
        assert_eq!(activity.longest_unsent(), None);
    }
}
