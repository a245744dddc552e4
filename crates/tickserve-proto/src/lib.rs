//! tickserve's wire protocols as generated code, built once and used by the
//! server and the client alike.
//!
//! - [`inference`]: the KServe v2 / Open Inference Protocol
//!   (`inference.GRPCInferenceService`, with Triton's model configuration
//!   and statistics), from `proto/grpc_service.proto`.
//! - [`tickserve`]: the sequence-state service (`tickserve.SequenceService`).
//! - [`tensorflow`]: TF Serving's `PredictionService` and `ModelService`,
//!   wire-compatible subsets of its protos.
//! - [`bounded`]: the codec every generated server and client decodes with:
//!   prost's, behind a walk that refuses messages that would take far more
//!   memory decoded than on the wire.
//! - [`fast`]: a `ModelInferRequest` of the common shape read in place, for
//!   the server's unary inference (a fenced fast path beside prost).
//!
//! Nothing here knows a model or a request path: these are messages, stubs
//! and the codec.

pub mod bounded;
pub mod fast;

/// The v2 inference protocol's messages, server and client.
#[allow(missing_docs, clippy::all)]
pub mod inference {
    tonic::include_proto!("inference");
}

/// The sequence-state service's messages, server and client.
#[allow(missing_docs, clippy::all)]
pub mod tickserve {
    tonic::include_proto!("tickserve");
}

/// TF Serving's messages, servers and clients, by protobuf package.
#[allow(missing_docs, clippy::all)]
pub mod tensorflow {
    tonic::include_proto!("tensorflow");

    /// `tensorflow.error`.
    pub mod error {
        tonic::include_proto!("tensorflow.error");
    }

    /// `tensorflow.serving`.
    pub mod serving {
        tonic::include_proto!("tensorflow.serving");
    }
}
