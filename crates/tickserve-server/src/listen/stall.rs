//! A connection's byte stream, watched for writes its peer does not take:
//! how long the socket has refused every byte (a peer that sends requests and
//! never reads its answers fills the socket's buffers, and then every write
//! waits).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Since when a connection's writes have all waited (0: they do not).
#[derive(Debug)]
pub struct WriteStall {
    origin: Instant,
    /// Nanoseconds after `origin`, plus one; 0 when writes are going out.
    since_ns: AtomicU64,
}

impl WriteStall {
    /// Writes going out, from now.
    pub fn new() -> WriteStall {
        WriteStall {
            origin: Instant::now(),
            since_ns: AtomicU64::new(0),
        }
    }

    fn waiting(&self) {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        let _ = self
            .since_ns
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
    }

    fn went_out(&self) {
        self.since_ns.store(0, Ordering::Release);
    }

    /// How long every write has waited, if one does now.
    pub fn stalled_for(&self) -> Option<Duration> {
        let since = self.since_ns.load(Ordering::Acquire);
        (since > 0).then(|| {
            let at = self.origin + Duration::from_nanos(since - 1);
            Instant::now().saturating_duration_since(at)
        })
    }
}

/// `S`, with its writes watched ([`WriteStall`]).
pub struct Watched<S> {
    inner: S,
    stall: Arc<WriteStall>,
}

impl<S> Watched<S> {
    /// `inner`, watched into `stall`.
    pub fn new(inner: S, stall: Arc<WriteStall>) -> Watched<S> {
        Watched { inner, stall }
    }

    fn note<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Pending => self.stall.waiting(),
            Poll::Ready(_) => self.stall.went_out(),
        }
        polled
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.note(polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_the_peer_does_not_take_is_timed_and_one_that_goes_out_clears_it() {
        // A pipe with room for 8 bytes and nobody reading its other end.
        let (client, server) = tokio::io::duplex(8);
        let stall = Arc::new(WriteStall::new());
        let mut watched = Watched::new(server, Arc::clone(&stall));
        watched.write_all(b"12345678").await.unwrap();
        assert_eq!(stall.stalled_for(), None);
        let blocked =
            tokio::time::timeout(Duration::from_millis(50), watched.write_all(b"9")).await;
        assert!(blocked.is_err(), "the pipe is full");
        assert!(stall.stalled_for().is_some());
        drop(client);
        // The peer is gone: the write fails, which is no stall.
        assert!(watched.write_all(b"9").await.is_err());
        assert_eq!(stall.stalled_for(), None);
    }
}
