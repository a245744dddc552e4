//! The tickserve server: the front ends (KServe v2 over HTTP/JSON and gRPC,
//! TF Serving's REST and gRPC APIs, shared memory), what reads their wire
//! (`transport`), the Prometheus endpoint, and the `serve` and `check`
//! commands.
//!
//! Front ends are thin: they turn their bytes into the edge's request and
//! the edge's answer into their bytes; the edge (the `tickserve-edge` crate)
//! is the one request path (admission, lookup, parameters, the runtime call,
//! what follows an answer, metrics). `transport` holds what knows HTTP and
//! gRPC: routes and keys, body reading, header lookups, each transport's
//! entrance, and what an error becomes on each protocol. The ports
//! ([`ports`]) put each listener's front ends together. [`Server::start`] binds both listeners (port 0 picks a free
//! port, which the integration tests use) and serves until
//! [`Server::shutdown`].

/// jemalloc serves every allocation of a process that links the server (the
/// binary and the tests alike), ONNX Runtime's included: the
/// `unprefixed_malloc_on_supported_platforms` feature exports `malloc`, `free`
/// and the rest, which the dynamically loaded library binds to. Under glibc's
/// allocator the resident memory crept under steady load (docs/performance.md,
/// "Soak"); jemalloc also reports its live bytes (`tickserve_heap_*`).
#[cfg(all(feature = "jemalloc", target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod cli;
mod control;
#[doc(hidden)]
pub mod faults;
mod fleet;
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
mod http;
mod identity;
mod journal_cli;
mod listen;
mod model_view;
mod observe;
mod ports;
mod scalar;
mod server;
mod shm;
mod tfserving;
mod timing;
mod tls;
mod transport;
mod warm;

pub use observe::render as render_metrics;
pub use tickserve_edge::Edge;

pub use crate::identity::{EXTENSIONS, SERVER_NAME, SERVER_VERSION};
pub use crate::server::Server;
pub use crate::timing::{COMPUTE_TIME_HEADER, QUEUE_TIME_HEADER};
