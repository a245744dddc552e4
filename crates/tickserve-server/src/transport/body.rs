//! An HTTP request body, read within `server.max_request_bytes`, for every
//! HTTP front end (v2 and TF Serving's REST API).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use tickserve_core::Error;

use tickserve_edge::Edge;

/// How much of an oversized body is read and dropped before the 413 goes out.
/// Closing a connection with unread request bytes makes the kernel reset it,
/// and the client then sees a reset instead of the 413; bodies up to this many
/// times the limit are drained so the client reads the answer.
const DRAIN_FACTOR: usize = 4;

/// How a body the listener cut off (over the byte budgets, past its
/// deadline) ends, on the HTTP port: the refusal, for [`read`] to answer.
#[derive(Debug)]
pub struct BodyRefused(pub Error);

impl std::fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyRefused {}

/// The refusal in a body's error, if the listener cut the body off.
fn refusal(error: axum::Error) -> Result<Error, axum::Error> {
    let inner = error.into_inner();
    match inner.downcast::<BodyRefused>() {
        Ok(refused) => Ok(refused.0),
        Err(other) => Err(axum::Error::new(other)),
    }
}

/// The body's declared length (`Content-Length`), when it has a readable one.
pub fn declared_length(headers: &HeaderMap) -> Option<usize> {
    length_of(headers.get(header::CONTENT_LENGTH))
}

/// The length a `Content-Length` value `v` declares, when readable.
pub fn length_of(v: Option<&HeaderValue>) -> Option<usize> {
    v.and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// Reads a request body of at most `limit` bytes. An oversized body is
/// answered 413; it is drained first unless it is far too large.
pub async fn read(
    model: &str,
    body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<bytes::Bytes, Error> {
    use http_body_util::BodyExt;
    let cap = limit.saturating_mul(DRAIN_FACTOR);
    if let Some(len) = declared.filter(|&len| len > cap) {
        return Err(Error::PayloadTooLarge { got: len, limit });
    }
    let mut body = body;
    // A body that comes in one frame is kept as it came (no copy); one in
    // several is gathered into one allocation, sized from Content-Length
    // when it fits.
    let mut first: Option<bytes::Bytes> = None;
    let mut buffer = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => match refusal(e) {
                // Over a byte budget: answered at once, while what is left of
                // the body is read and dropped (bounded) so that the client
                // reads the answer rather than a reset.
                Ok(refused) => {
                    tokio::spawn(drain(body, cap.saturating_sub(seen)));
                    return Err(refused);
                }
                Err(e) => {
                    return Err(Error::request(
                        model,
                        format!("cannot read the request body: {e}"),
                    ));
                }
            },
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen > limit {
            if seen > cap {
                break;
            }
            continue;
        }
        if seen == data.len() {
            first = Some(data);
            // All that Content-Length declared: hyper delivers no more, so
            // the end need not be waited for.
            if declared == Some(seen) {
                break;
            }
            continue;
        }
        if buffer.is_empty() {
            buffer.reserve(declared.unwrap_or(0).min(limit).max(seen));
            buffer.extend_from_slice(first.take().as_deref().unwrap_or_default());
        }
        buffer.extend_from_slice(&data);
    }
    if seen > limit {
        return Err(Error::PayloadTooLarge { got: seen, limit });
    }
    Ok(match first {
        Some(whole) if buffer.is_empty() => whole,
        _ => buffer.freeze(),
    })
}

/// Reads and drops at most `left` more bytes of `body`.
async fn drain(mut body: Body, mut left: usize) {
    use http_body_util::BodyExt;
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        left = left.saturating_sub(data.len());
        if left == 0 {
            break;
        }
    }
}

/// Reads an inference request's body for `model` within the server's
/// `max_request_bytes`, sized from its `Content-Length` value
/// (`content_length`). Every HTTP front end reads the body before anything
/// is refused: answering with unread bytes would reset the connection
/// instead.
pub async fn read_request(
    edge: &Edge,
    model: &str,
    content_length: Option<&HeaderValue>,
    body: Body,
) -> Result<bytes::Bytes, Error> {
    read(
        model,
        body,
        edge.max_request_bytes,
        length_of(content_length),
    )
    .await
}
