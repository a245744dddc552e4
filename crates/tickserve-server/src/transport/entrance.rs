//! What a request carries beside its body, read once per transport: an
//! HTTP request's headers and connection ([`Entrance::http`]), or a gRPC
//! call's metadata and connection ([`Entrance::grpc`]). Each front end of a
//! transport makes its [`Call`] from it, so the request path's entrance is
//! written once per transport (shared memory, which carries none of it,
//! writes its own; a `ModelStreamInfer` stream's messages carry only their
//! own parameters).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tickserve_core::sequence::KeyId;
use tickserve_edge::BodyBytes;
use tickserve_edge::observe::Protocol;
use tickserve_edge::{Call, RequestBytes};

use super::first_answer::FirstAnswer;
use super::headers::InferHeaders;
use super::{deadline, sequence_key, trace};

/// A request's deadline, trace, key, routing header and bytes, as its
/// transport carried them.
pub struct Entrance {
    started: Instant,
    timeout: Result<Option<Duration>, String>,
    traceparent: Option<String>,
    key: Option<KeyId>,
    sequence_key: Result<Option<String>, String>,
    bytes: RequestBytes,
    first: Option<Arc<FirstAnswer>>,
}

impl Entrance {
    /// An HTTP request's: the headers `found` in it, its connection's
    /// `extensions`, its body of `len` bytes, read from `started` on.
    pub fn http(
        found: &InferHeaders<'_>,
        extensions: &http::Extensions,
        len: usize,
        started: Instant,
    ) -> Entrance {
        Entrance {
            started,
            timeout: deadline::timeout_of(found.timeout),
            traceparent: trace::of(found.traceparent),
            key: extensions.get().copied(),
            sequence_key: sequence_key::of(found.sequence_key.iter().copied()),
            bytes: request_bytes(extensions, len),
            first: extensions.get().cloned(),
        }
    }

    /// A gRPC call's, from its metadata and extensions (now: when it came).
    #[allow(clippy::disallowed_methods)] // request latency is the machine's time
    pub fn grpc<T>(request: &tonic::Request<T>) -> Entrance {
        Entrance {
            started: Instant::now(),
            timeout: deadline::grpc_timeout(request.metadata()),
            traceparent: trace::grpc(request.metadata()),
            key: request.extensions().get().copied(),
            sequence_key: sequence_key::of(
                request
                    .metadata()
                    .as_ref()
                    .get_all(&sequence_key::NAME)
                    .iter(),
            ),
            bytes: request_bytes(request.extensions(), 0),
            first: request.extensions().get().cloned(),
        }
    }

    /// When the request came.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// True for the first request on its connection that asks (see
    /// [`FirstAnswer`]); false for a request of no connection.
    pub fn first_on_connection(&self) -> bool {
        self.first.as_ref().is_some_and(|first| first.take())
    }

    /// The request's [`Call`] for `model` at `version` over `protocol`; `len`
    /// is the request's size where no listener counted its bytes. TF
    /// Serving's API names no sequences: its routing header is not read.
    pub fn call<'a>(
        self,
        protocol: Protocol,
        model: &'a str,
        version: Option<&'a str>,
        len: impl FnOnce() -> usize,
    ) -> Call<'a> {
        let names_sequences =
            !matches!(protocol, Protocol::TfServingRest | Protocol::TfServingGrpc);
        Call {
            protocol,
            model,
            version,
            bytes: match self.bytes {
                RequestBytes::Count(_) => RequestBytes::Count(len()),
                held => held,
            },
            timeout: self.timeout,
            started: self.started,
            key: self.key,
            traceparent: self.traceparent,
            sequence_key: if names_sequences {
                self.sequence_key
            } else {
                Ok(None)
            },
            round: None,
        }
    }
}

/// What the body of the request with `extensions` holds, taken from it (the
/// listener counts every body as it arrives); for a request that came
/// another way, its `len` bytes to admit.
fn request_bytes(extensions: &http::Extensions, len: usize) -> RequestBytes {
    match extensions.get::<Arc<BodyBytes>>() {
        Some(body) => RequestBytes::Held(body.take()),
        None => RequestBytes::Count(len),
    }
}
