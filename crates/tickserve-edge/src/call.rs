//! One inference request as its front end describes it, before decoding
//! ([`Call`], whose bytes in the server-wide budget are a [`RequestBytes`]).
//! Each transport makes its `Call` once (the server's `transport::entrance`;
//! shared memory its own).

use std::time::{Duration, Instant};

use tickserve_core::sequence::KeyId;
use tickserve_runtime::gather::Round;

use crate::admission::HeldBytes;
use crate::observe::Protocol;

/// One inference request as its front end describes it, before decoding.
pub struct Call<'a> {
    /// The front end, for metrics.
    pub protocol: Protocol,
    /// The model asked for.
    pub model: &'a str,
    /// The version asked for (`None`: the default version).
    pub version: Option<&'a str>,
    /// The request's bytes as they came, held in `server.max_inflight_bytes`
    /// until it is answered.
    pub bytes: RequestBytes,
    /// The deadline the transport carried (`grpc-timeout`,
    /// `tickserve-timeout`), or the words for a malformed one.
    pub timeout: Result<Option<Duration>, String>,
    /// When the request came.
    pub started: Instant,
    /// The key it carried, where keys guard inference (a model with
    /// `bind_to_key` keeps its sequences apart by key).
    pub key: Option<KeyId>,
    /// The W3C `traceparent` it carried (valid, or left out), for the journal.
    pub traceparent: Option<String>,
    /// The `tickserve-sequence-id` header it carried ([`crate::sequence_key`]),
    /// or the words for a malformed one.
    pub sequence_key: Result<Option<String>, String>,
    /// The front-end round it runs with ([`tickserve_runtime::gather`]):
    /// the shared-memory front end's requests taken at once on one thread.
    pub round: Option<Round>,
}

/// A request's bytes in `server.max_inflight_bytes`.
pub enum RequestBytes {
    /// Held already, as they arrived (an HTTP body, a gRPC message).
    Held(HeldBytes),
    /// Not held yet (shared memory): admitted with the request.
    Count(usize),
}
