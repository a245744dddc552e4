//! What the runtime's facade answers when it cannot do what it was asked
//! outside a request: start, read its repository, keep its sequences. A
//! request's own failures are [`tickserve_core::Error`]s.

/// Why the runtime could not start, read its repository or write its
/// sequence snapshot. Each says what and where in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// An engine could not start (ONNX Runtime's library, say).
    #[error("{0}")]
    Engine(String),
    /// A placement names devices this machine does not have
    /// (`model_defaults.devices`, or a model's `devices`).
    #[error("{0}")]
    Placement(String),
    /// The model repository could not be read.
    #[error("{0}")]
    Repository(String),
    /// The sequence snapshot (`runtime.sequence_snapshot`) could not be
    /// written.
    #[error("{0}")]
    Snapshot(String),
}
