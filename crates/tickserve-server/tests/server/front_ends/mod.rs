//! Each front end against its own clients: KServe v2 over HTTP and gRPC
//! (Triton's Python clients, KServe's storage layout), TF Serving's REST and
//! gRPC, shared memory, gRPC streams, TLS, and the edge they share.

mod edge;
mod kserve;
mod model_config;
mod shm;
mod stream_answers;
mod streams;
mod tfserving;
mod tls;
mod tritonclient;
