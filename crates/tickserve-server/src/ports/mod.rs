//! The ports: each listener's front ends put together behind its route
//! table and key check. The HTTP port serves the v2 REST front end, TF
//! Serving's REST API and `/metrics`; the gRPC port serves v2 gRPC, TF
//! Serving's gRPC services, the sequence-state service and gRPC health.
//! This is the only place that knows every front end; no front end knows
//! another.

pub mod grpc;
pub mod http;
