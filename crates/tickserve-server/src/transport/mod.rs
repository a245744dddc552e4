//! What knows the wire, for every front end of a transport: the edge
//! (`tickserve-edge`) takes a [`tickserve_edge::Call`] and knows no HTTP or
//! gRPC type.
//!
//! - [`routes`]: one route table per port, decoded once; it dispatches and
//!   names the key group;
//! - [`access`]: keys per group, checked on the route the handler serves;
//! - [`body`]: an HTTP body read within the byte limit;
//! - [`headers`]: the headers an HTTP inference request's path reads, found
//!   in one pass;
//! - [`deadline`], [`trace`], [`sequence_key`]: the deadline, the W3C
//!   `traceparent` and the sequence-id header as HTTP and gRPC carry them;
//! - [`entrance`]: a request's [`tickserve_edge::Call`], made once per
//!   transport;
//! - [`first_answer`]: whether an answer is its connection's first;
//! - [`status`]: what a failure becomes on each protocol.

pub mod access;
pub mod body;
pub mod deadline;
pub mod entrance;
pub mod first_answer;
pub mod headers;
pub mod routes;
pub mod sequence_key;
pub mod status;
pub mod trace;
