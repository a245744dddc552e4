//! tickserve's core: the vocabulary every other crate shares.
//!
//! Datatypes and tensor signatures, signature buckets, the request and response
//! types the front ends decode into and encode from, request validation against
//! a signature, configuration files, the one error type, the engine interface
//! ([`Engine`] compiles, [`CompiledModel`] runs), and the metric names.
//! Nothing here knows a front end (axum, tonic, prost) or an engine (ort, CUDA).

pub mod breaker;
pub mod buckets;
pub mod clock;
pub mod config;
pub mod datatype;
pub mod durations;
pub mod engine;
pub mod error;
pub mod files;
pub mod fleet;
pub mod guard;
pub mod latency;
pub mod metrics;
pub mod monte_carlo;
pub mod name;
pub mod priority;
pub mod request;
pub mod sequence;
pub mod signature;
pub mod text;
pub mod validate;

pub use buckets::Buckets;
pub use clock::Clock;
pub use datatype::DataType;
pub use engine::{
    CompileRequest, CompiledModel, Device, Engine, EngineError, MemberId, ResidentRequest,
    SOLE_MEMBER, Weight,
};
pub use error::{Error, ErrorKind};
pub use name::Name;
pub use request::{
    InferRequest, InferResponse, InputTensor, MAX_RANK, ModelRequest, OutputTensor, Timing,
};
pub use signature::{Signature, TensorSpec};
