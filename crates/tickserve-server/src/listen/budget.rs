//! Every request body, counted as it arrives: its bytes held in the
//! server-wide budget and its connection's ([`BodyBytes`], put in the
//! request's extensions for the handler to take), and the whole body held to
//! one deadline (`server.body_read_timeout`), except on the routes that are
//! streams. A body that goes over a budget or the deadline ends with the
//! refusal, worded by the port (`refuse`).
//!
//! What a body says it will be is held as soon as it says so: an HTTP body's
//! `Content-Length` before its first byte is read, a gRPC message's length as
//! soon as its 5-byte prefix has come. A burst of large requests is then
//! admitted or refused request by request, rather than every one of them
//! holding a part of the budget and none of them fitting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tickserve_core::Error;
use tokio::time::Sleep;

use tickserve_edge::Edge;
use tickserve_edge::{BodyBytes, ConnectionBudget};

/// The error a body ends with, as a port's handlers read it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a port takes what its bodies are held to.
#[derive(Clone, Copy)]
pub struct BodyRules {
    /// The refusal as the port's handlers read a body error (a gRPC status,
    /// an HTTP handler's error).
    pub refuse: fn(Error) -> BoxError,
    /// Whether the request at this path is a stream (no body deadline).
    pub stream: fn(&str) -> bool,
    /// Whether bodies are gRPC messages (their lengths are held as their
    /// prefixes come); else a body's `Content-Length` is held up front.
    pub grpc: bool,
}

/// A request body counted as it arrives.
pub struct Counted<B> {
    inner: B,
    bytes: Arc<BodyBytes>,
    /// When the whole body must have come (none for a stream).
    deadline: Option<tokio::time::Instant>,
    /// The timer for it, set only once the body has to be waited for (most
    /// bodies come whole at the first poll and never need one).
    timer: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    refuse: fn(Error) -> BoxError,
    ended: bool,
    /// Refused for the budgets: what still comes passes uncounted, to be
    /// dropped by a reader that drains it.
    refused: bool,
    /// Bytes the body said it will send, not held yet (an HTTP body's
    /// `Content-Length`, held at the first poll).
    declared: usize,
    /// Bytes held ahead of their arrival, that arriving bytes use up.
    ahead: usize,
    /// gRPC's message framing, when the port's bodies carry it.
    framing: Option<Framing>,
}

/// Where a gRPC body is in its messages: each is a 5-byte prefix (a flag, a
/// big-endian u32 length) and that many bytes.
#[derive(Debug, Default)]
struct Framing {
    /// The most held ahead for one message (`max_request_bytes`: a longer
    /// one is refused for its size by the codec, not for the budget).
    cap: usize,
    prefix: [u8; 5],
    /// Prefix bytes seen of the next message.
    have: usize,
    /// Bytes of the current message still to come.
    left: usize,
}

impl Framing {
    /// Walks `data`; returns the bytes to hold now: the prefixes, and each
    /// message's whole length as its prefix completes (its bytes then come
    /// out of what was held ahead).
    fn walk(&mut self, mut data: &[u8], ahead: &mut usize) -> usize {
        let mut hold = 0usize;
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.left -= n;
                *ahead = ahead.saturating_sub(n);
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            hold = hold.saturating_add(n);
            data = &data[n..];
            if self.have == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as usize;
                self.have = 0;
                self.left = len;
                let held = len.min(self.cap);
                hold = hold.saturating_add(held);
                *ahead = ahead.saturating_add(held);
            }
        }
        hold
    }
}

/// `request`'s body counted into `edge`'s budget and `connection`'s, held to
/// `timeout` unless the route is a stream.
pub fn count<B>(
    request: http::Request<B>,
    edge: &Arc<Edge>,
    connection: &Arc<ConnectionBudget>,
    timeout: Duration,
    rules: BodyRules,
) -> http::Request<Counted<B>> {
    let bytes = Arc::new(BodyBytes::new(edge, Arc::clone(connection)));
    let stream = (rules.stream)(request.uri().path());
    let (mut parts, inner) = request.into_parts();
    parts.extensions.insert(Arc::clone(&bytes));
    let declared = if rules.grpc {
        0
    } else {
        // At most a request's limit: a larger body is refused for its size
        // (413) by its reader, not for the budget.
        crate::transport::body::declared_length(&parts.headers)
            .unwrap_or(0)
            .min(edge.max_request_bytes)
    };
    let body = Counted {
        inner,
        bytes,
        deadline: (!stream).then(|| tokio::time::Instant::now() + timeout),
        timer: None,
        timeout,
        refuse: rules.refuse,
        ended: false,
        refused: false,
        declared,
        ahead: 0,
        framing: rules.grpc.then(|| Framing {
            cap: edge.max_request_bytes,
            ..Framing::default()
        }),
    };
    http::Request::from_parts(parts, body)
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(timer) = self.timer.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            self.ended = true;
            let limit = humantime::format_duration(self.timeout).to_string();
            return Poll::Ready(Some(Err((self.refuse)(Error::BodyTimeout { limit }))));
        }
        if self.declared > 0 && !self.refused {
            // The whole declared body, held before any of it is read.
            let declared = std::mem::take(&mut self.declared);
            if let Err(refused) = self.bytes.add(declared) {
                self.refused = true;
                return Poll::Ready(Some(Err((self.refuse)(refused))));
            }
            self.ahead = declared;
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if !self.refused
                    && let Some(data) = frame.data_ref()
                {
                    let this = &mut *self;
                    let hold = match this.framing.as_mut() {
                        Some(framing) => framing.walk(data, &mut this.ahead),
                        None => {
                            let covered = this.ahead.min(data.len());
                            this.ahead -= covered;
                            data.len() - covered
                        }
                    };
                    // A frame the declared length held already adds nothing.
                    if hold > 0
                        && let Err(refused) = this.bytes.add(hold)
                    {
                        this.refused = true;
                        return Poll::Ready(Some(Err((this.refuse)(refused))));
                    }
                }
                if self.inner.is_end_stream() {
                    self.deadline = None;
                    self.timer = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                self.deadline = None;
                self.timer = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The body must be waited for: from now on its deadline
                // has a timer, which wakes this body when it passes.
                if self.timer.is_none()
                    && let Some(deadline) = self.deadline
                {
                    let mut timer = Box::pin(tokio::time::sleep_until(deadline));
                    if timer.as_mut().poll(cx).is_ready() {
                        self.ended = true;
                        let limit = humantime::format_duration(self.timeout).to_string();
                        return Poll::Ready(Some(Err((self.refuse)(Error::BodyTimeout { limit }))));
                    }
                    self.timer = Some(timer);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_message_is_held_whole_as_soon_as_its_prefix_has_come() {
        let mut framing = Framing {
            cap: 1 << 20,
            ..Framing::default()
        };
        let mut ahead = 0;
        // A prefix split over two frames, then the message's 1000 bytes.
        let prefix = [0u8, 0, 0, 0x03, 0xe8];
        assert_eq!(framing.walk(&prefix[..2], &mut ahead), 2);
        assert_eq!(framing.walk(&prefix[2..], &mut ahead), 3 + 1000);
        assert_eq!(ahead, 1000);
        assert_eq!(framing.walk(&[7u8; 600], &mut ahead), 0);
        assert_eq!(ahead, 400);
        // The rest of it and the next message's prefix in one frame.
        let mut frame = vec![7u8; 400];
        frame.extend_from_slice(&[0, 0, 0, 0, 10]);
        assert_eq!(framing.walk(&frame, &mut ahead), 5 + 10);
        assert_eq!(ahead, 10);
        // A prefix claiming 4 GiB holds at most the request limit.
        let mut framing = Framing {
            cap: 1 << 20,
            ..Framing::default()
        };
        let mut ahead = 0;
        assert_eq!(
            framing.walk(&[0, 0xff, 0xff, 0xff, 0xff], &mut ahead),
            5 + (1 << 20)
        );
    }
}
