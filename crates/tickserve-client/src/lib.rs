//! tickserve's Rust client: one typed API, `infer(model, &[Tensor]) ->
//! Vec<Tensor>`, over shared memory for a process on the server's host
//! ([`ShmClient`], blocking; [`AsyncShmClient`]) and over gRPC for the rest
//! ([`GrpcClient`], async; [`BlockingGrpcClient`]).
//!
//! ```no_run
//! use tickserve_client::{ShmClient, Tensor};
//!
//! let mut client = ShmClient::connect()?; // the server's [shm] enabled = true
//! let features = Tensor::from_f32("features", &[1, 50], &[0.1; 50]);
//! let outputs = client.infer("alpha_mlp", &[features])?;
//! let probabilities = outputs[0].to_f32();
//! # Ok::<(), tickserve_client::ClientError>(())
//! ```
//!
//! The shared-memory client looks a model up once (name → handle, and its
//! signature), then sends by handle. It waits for an answer by polling (a
//! co-located strategy process is latency-bound: see docs/shm.md for the
//! CPU this costs) up to its timeout. If the server goes away (restarted,
//! say), the call fails with [`ClientError::Disconnected`] and the next call
//! connects anew and looks its models up again.

mod grpc;
mod shm;
mod tensor;

pub use grpc::{BlockingGrpcClient, GrpcClient};
pub use shm::{AsyncShmClient, ShmClient};
pub use tensor::{DataType, Tensor};
pub use tickserve_shm_protocol::{ParamValue, Parameter};

/// Why a call gave no prediction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server refused or failed the request: `code` as gRPC spells it
    /// (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, ...) and its message, which
    /// names the model and the input.
    #[error("{code}: {message}")]
    Server {
        /// The error's class.
        code: String,
        /// What the server said.
        message: String,
    },
    /// No server is there (not started, or `[shm]` is off), or it went away
    /// while the request was in flight; the next call connects anew.
    #[error("no tickserve server: {0}")]
    Disconnected(String),
    /// No answer within the client's timeout.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The transport failed (shared memory, gRPC) or an answer was malformed.
    #[error("{0}")]
    Transport(String),
}
