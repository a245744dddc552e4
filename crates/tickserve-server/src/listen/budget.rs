//! Every request body, counted as it arrives: its bytes held in the
//! server-wide budget and its connection's ([`BodyBytes`], put in the
//! request's extensions for the handler to take), and the whole body held to
//! one deadline (`server.body_read_timeout`), except on the routes that are
//! streams. A body that goes over a budget or the deadline ends with the
//! refusal, worded by the port (`refuse`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tickserve_core::Error;
use tokio::time::Sleep;

use crate::edge::Edge;
use crate::edge::admission::{BodyBytes, ConnectionBudget};

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
}

/// A request body counted as it arrives.
pub struct Counted<B> {
    inner: B,
    bytes: Arc<BodyBytes>,
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    refuse: fn(Error) -> BoxError,
    ended: bool,
    /// Refused for the budgets: what still comes passes uncounted, to be
    /// dropped by a reader that drains it.
    refused: bool,
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
    let body = Counted {
        inner,
        bytes,
        deadline: (!stream).then(|| Box::pin(tokio::time::sleep(timeout))),
        timeout,
        refuse: rules.refuse,
        ended: false,
        refused: false,
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
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            self.ended = true;
            let limit = humantime::format_duration(self.timeout).to_string();
            return Poll::Ready(Some(Err((self.refuse)(Error::BodyTimeout { limit }))));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if !self.refused
                    && let Some(data) = frame.data_ref()
                    && let Err(refused) = self.bytes.add(data.len())
                {
                    self.refused = true;
                    return Poll::Ready(Some(Err((self.refuse)(refused))));
                }
                if self.inner.is_end_stream() {
                    self.deadline = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                self.deadline = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
