//! The one error type of the request path, and its classes.
//!
//! Every variant names the model and, where there is one, the input, what was
//! expected and what came. [`Error::kind`] maps each variant to exactly one
//! [`ErrorKind`]; what a kind becomes on the wire (a gRPC code, an HTTP
//! status, a shared-memory error byte) is each protocol's business, decided
//! once per protocol in the server's edge. Load-time failures are plain
//! strings collected per model; they never reach a request.

use std::time::Duration;

/// A request that could not be answered with a prediction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No model (or no such version of it) is in the repository.
    #[error("model '{model}'{}: not found{}", version_label(.version), known_label(.known))]
    ModelNotFound {
        /// The model asked for.
        model: String,
        /// The version asked for, if one was.
        version: Option<String>,
        /// What is there instead (versions of the model, or nothing).
        known: String,
    },
    /// A model control request could not load the model; what served before
    /// (if anything) still serves.
    #[error("model '{model}': load failed: {reason}")]
    LoadFailed {
        /// The model asked for.
        model: String,
        /// Why, per version.
        reason: String,
    },
    /// The model exists but cannot serve: its load failed or it is unloading.
    #[error("model '{model}' version {version} is not ready: {reason}")]
    ModelNotReady {
        /// The model asked for.
        model: String,
        /// Its version.
        version: String,
        /// Why it cannot serve.
        reason: String,
    },
    /// One input does not fit the model's signature.
    #[error("model '{model}', input '{input}': expected {expected}, got {got}")]
    InvalidInput {
        /// The model asked for.
        model: String,
        /// The input at fault.
        input: String,
        /// What the model expects.
        expected: String,
        /// What the request sent.
        got: String,
    },
    /// The request as a whole is malformed (bad JSON, missing or duplicate
    /// inputs, unknown outputs, bad parameters).
    #[error("model '{model}': {message}")]
    InvalidRequest {
        /// The model asked for (may be empty when the body could not be read).
        model: String,
        /// What is wrong, with what was expected and what came.
        message: String,
    },
    /// The request carries more rows than the model's `max_request_rows`.
    #[error(
        "model '{model}': request has {rows} rows, more than the limit of {limit} \
         (max_request_rows in the model's model.toml)"
    )]
    TooManyRows {
        /// The model asked for.
        model: String,
        /// Rows in the request.
        rows: usize,
        /// The model's limit.
        limit: usize,
    },
    /// The request body is larger than the server accepts.
    #[error(
        "request body of {got} bytes is over the limit of {limit} bytes (server.max_request_bytes)"
    )]
    PayloadTooLarge {
        /// Bytes received (at least).
        got: usize,
        /// The limit.
        limit: usize,
    },
    /// The model's queue cannot take the request's rows; it was not admitted.
    #[error(
        "model '{model}': queue is full ({queued} rows waiting, limit {limit}; this request has {rows}); retry later"
    )]
    QueueFull {
        /// The model asked for.
        model: String,
        /// Rows waiting when the request came.
        queued: usize,
        /// The request's rows.
        rows: usize,
        /// The model's `max_queue_rows`.
        limit: usize,
    },
    /// The model's queue cannot take the request's bytes; it was not admitted.
    #[error(
        "model '{model}': queue is full ({queued} bytes waiting, limit {limit}; this request has {bytes}); retry later"
    )]
    QueueBytesFull {
        /// The model asked for.
        model: String,
        /// Bytes of input waiting when the request came.
        queued: usize,
        /// The request's input bytes.
        bytes: usize,
        /// The model's `max_queue_bytes`.
        limit: usize,
    },
    /// The request's priority level already has `limit` requests waiting.
    #[error(
        "model '{model}': priority level {level} is full ({limit} requests waiting, its max_queue_size); retry later"
    )]
    PriorityQueueFull {
        /// The model asked for.
        model: String,
        /// The request's level.
        level: u32,
        /// The level's `max_queue_size`.
        limit: usize,
    },
    /// The request continues a sequence the model does not keep: never
    /// started, ended, dropped, or expired (one answer for all, so that it
    /// does not tell a client which ids exist).
    #[error(
        "model '{model}': sequence {sequence} is not active (never started, ended, dropped, or \
         idle past the model's max_sequence_idle); send its first request with \
         sequence_start = true"
    )]
    SequenceNotActive {
        /// The model asked for.
        model: String,
        /// The sequence id, as the client wrote it.
        sequence: String,
    },
    /// The model keeps as many sequences as it may, or one sequence has as
    /// many requests waiting for their turn as it may.
    #[error("model '{model}': {message}; retry later")]
    SequencesFull {
        /// The model asked for.
        model: String,
        /// Which bound, with its value.
        message: String,
    },
    /// The server holds `limit` bytes of requests in flight; this one was not admitted.
    #[error(
        "server is at its limit of {limit} bytes of requests in flight (server.max_inflight_bytes); retry later"
    )]
    OverloadedBytes {
        /// The server's `max_inflight_bytes`.
        limit: usize,
    },
    /// The connection holds `limit` bytes of request bodies; this one was cut off.
    #[error(
        "this connection holds its limit of {limit} bytes of request bodies \
         (server.max_connection_bytes); retry when its other requests are answered"
    )]
    ConnectionBytes {
        /// The server's `max_connection_bytes`.
        limit: usize,
    },
    /// A request body did not arrive within the time a body may take.
    #[error(
        "the request body did not arrive within {limit} (server.body_read_timeout: the whole \
         body, however it is split)"
    )]
    BodyTimeout {
        /// The server's `body_read_timeout`, for people.
        limit: String,
    },
    /// The server has `limit` inference requests in flight; this one was not admitted.
    #[error("server is at its limit of {limit} requests in flight; retry later")]
    Overloaded {
        /// The server's `max_inflight`.
        limit: usize,
    },
    /// The request's deadline passed before it was computed; it never ran.
    #[error(
        "model '{model}': deadline exceeded after waiting {waited:?}; the request was not computed"
    )]
    DeadlineExceeded {
        /// The model asked for.
        model: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// The server is shutting down and admits no new work.
    #[error(
        "server is shutting down: the request was not run; retry it (another replica takes over)"
    )]
    ShuttingDown,
    /// The sequence's state was kept by a replica that stopped without
    /// handing it over (killed, not drained).
    #[error(
        "model '{model}': sequence {sequence}'s state is lost ({reason}); start the sequence again: send its next request with sequence_start = true"
    )]
    SequenceLost {
        /// The model asked for.
        model: String,
        /// The sequence id, as the client wrote it.
        sequence: String,
        /// Where it was and what became of that replica.
        reason: String,
    },
    /// Another replica keeps the sequence and did not hand it over in time;
    /// the tick was not applied.
    #[error(
        "model '{model}': sequence {sequence} is kept by another replica of the fleet, which did not hand it over within {waited:?}; the request was not run: retry it"
    )]
    SequenceElsewhere {
        /// The model asked for.
        model: String,
        /// The sequence id, as the client wrote it.
        sequence: String,
        /// How long this replica waited.
        waited: Duration,
    },
    /// The sequence lives on another version of the model than the one the
    /// request reached; the tick was not applied.
    #[error(
        "model '{model}': sequence {sequence} lives on version {version} of the model; the request was not run: retry it (or name version {version})"
    )]
    SequenceOnVersion {
        /// The model asked for.
        model: String,
        /// The sequence id, as the client wrote it.
        sequence: String,
        /// The version that keeps it.
        version: String,
    },
    /// This replica cannot prove its membership of the fleet (its lease in
    /// the coordination store may have lapsed): it acts on no sequence
    /// until it can, so that two replicas never answer one sequence.
    #[error(
        "model '{model}': sequence {sequence} was not run: this replica cannot reach the fleet's store ({reason}); retry it"
    )]
    FleetUnavailable {
        /// The model asked for.
        model: String,
        /// The sequence id, as the client wrote it.
        sequence: String,
        /// What failed.
        reason: String,
    },
    /// The journal cannot keep this prediction's record, and the server
    /// answers no prediction unrecorded (`journal.when_full = "refuse"`).
    #[error(
        "model '{model}': not answered: its prediction cannot be journaled now ({reason}); \
         this server answers no prediction unrecorded (journal.when_full = \"refuse\")"
    )]
    JournalUnavailable {
        /// The model asked for.
        model: String,
        /// Why the journal cannot keep the record.
        reason: String,
    },
    /// Model control is off: clients may not load or unload models.
    #[error(
        "model '{model}': {operation} refused: model control is off \
         (security.model_control_mode = \"none\", Triton's --model-control-mode=none); \
         the repository index stays readable"
    )]
    ModelControlOff {
        /// The model asked for.
        model: String,
        /// `load` or `unload`.
        operation: &'static str,
    },
    /// Halt or resume refused: the `risk` group is closed, or a breaker's
    /// halt is lifted without the `risk` key.
    #[error("model '{model}': {operation} refused: {reason}")]
    RiskControl {
        /// The model asked for.
        model: String,
        /// `halt` or `resume`.
        operation: &'static str,
        /// Why, and how to open it.
        reason: &'static str,
    },
    /// The repository is polled: its files decide what serves, and clients
    /// may not load or unload.
    #[error(
        "model '{model}': {operation} refused: the model repository is polled \
         (security.model_control_mode = \"poll\", Triton's --model-control-mode=poll): \
         change its files instead; the repository index stays readable"
    )]
    ModelControlPolled {
        /// The model asked for.
        model: String,
        /// `load` or `unload`.
        operation: &'static str,
    },
    /// The engine failed on a request that passed validation. A bug or a
    /// resource failure, never the client's fault.
    #[error("model '{model}': internal error: {message}")]
    Internal {
        /// The model that failed.
        model: String,
        /// The engine's message.
        message: String,
    },
    /// The model's answer broke one of its output guards: it is withheld.
    /// Neither the client's mistake nor the server's fault (see
    /// [`ErrorKind::Withheld`]).
    /// Boxed: the other errors stay small on every path that returns one.
    #[error("{0}")]
    GuardTripped(Box<Withheld>),
    /// The version is halted (the kill switch, or its breaker): it answers
    /// nothing until resumed.
    #[error("model '{model}' version {version} is halted: {reason}")]
    Halted {
        /// The model.
        model: String,
        /// The version.
        version: String,
        /// Why, and by whom (`by the API: ...`, `by its breaker: ...`).
        reason: String,
    },
}

/// What a guard withheld: the model, the output, the bound and the element.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model '{model}' version {version}: guard on output '{output}' tripped: element {position:?} \
     of '{tensor}' is {value}, outside {bound}; the answer is withheld"
)]
pub struct Withheld {
    /// The model.
    pub model: String,
    /// Its version.
    pub version: String,
    /// The guarded output.
    pub output: String,
    /// The answered tensor whose element broke the bound (the output, or a
    /// Monte Carlo summary of it).
    pub tensor: String,
    /// The bound it broke (`max = 1`, `finite`).
    pub bound: String,
    /// The element's position, batch first.
    pub position: Vec<usize>,
    /// The element's value, as written (`NaN`, `1.5`).
    pub value: String,
}

fn version_label(version: &Option<String>) -> String {
    version
        .as_ref()
        .map(|v| format!(" version {v}"))
        .unwrap_or_default()
}

fn known_label(known: &str) -> String {
    if known.is_empty() {
        String::new()
    } else {
        format!(" ({known})")
    }
}

/// The class of an [`Error`], which fixes its protocol codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong; sending it again will not help.
    InvalidArgument,
    /// The model or version does not exist.
    NotFound,
    /// The request body is too large.
    PayloadTooLarge,
    /// The server or model cannot serve now.
    Unavailable,
    /// The server is at capacity; retry later.
    ResourceExhausted,
    /// The deadline passed before the request was computed.
    DeadlineExceeded,
    /// A failure inside the server.
    Internal,
    /// The server's settings do not allow the operation; no credential helps.
    FailedPrecondition,
    /// The model answered, and its answer broke a guard of its
    /// `model.toml`: withheld. Not the client's mistake and no fault of the
    /// server; sending it again gets the same answer (OUT_OF_RANGE, 422).
    Withheld,
    /// The version is halted (by an operator, or its breaker): nothing was
    /// run, and nothing will be until it is resumed. Not "retry it":
    /// balancers must not send it to another replica (FAILED_PRECONDITION,
    /// 423).
    Halted,
}

impl ErrorKind {
    /// Every kind, for the tables that map them.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::InvalidArgument,
        ErrorKind::NotFound,
        ErrorKind::PayloadTooLarge,
        ErrorKind::Unavailable,
        ErrorKind::ResourceExhausted,
        ErrorKind::DeadlineExceeded,
        ErrorKind::Internal,
        ErrorKind::FailedPrecondition,
        ErrorKind::Withheld,
        ErrorKind::Halted,
    ];

    /// A short label for metrics (`invalid_argument`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::Internal => "internal",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::Withheld => "withheld",
            ErrorKind::Halted => "halted",
        }
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::ModelNotFound { .. } => ErrorKind::NotFound,
            Error::ModelNotReady { .. }
            | Error::ShuttingDown
            | Error::SequenceElsewhere { .. }
            | Error::SequenceOnVersion { .. }
            | Error::FleetUnavailable { .. }
            | Error::JournalUnavailable { .. } => ErrorKind::Unavailable,
            Error::InvalidInput { .. }
            | Error::InvalidRequest { .. }
            | Error::BodyTimeout { .. }
            | Error::TooManyRows { .. }
            | Error::SequenceNotActive { .. }
            | Error::SequenceLost { .. }
            | Error::LoadFailed { .. } => ErrorKind::InvalidArgument,
            Error::PayloadTooLarge { .. } => ErrorKind::PayloadTooLarge,
            Error::QueueFull { .. }
            | Error::QueueBytesFull { .. }
            | Error::PriorityQueueFull { .. }
            | Error::SequencesFull { .. }
            | Error::Overloaded { .. }
            | Error::OverloadedBytes { .. }
            | Error::ConnectionBytes { .. } => ErrorKind::ResourceExhausted,
            Error::DeadlineExceeded { .. } => ErrorKind::DeadlineExceeded,
            Error::Internal { .. } => ErrorKind::Internal,
            Error::ModelControlOff { .. }
            | Error::ModelControlPolled { .. }
            | Error::RiskControl { .. } => ErrorKind::FailedPrecondition,
            Error::GuardTripped(_) => ErrorKind::Withheld,
            Error::Halted { .. } => ErrorKind::Halted,
        }
    }

    /// The message an answer carries: the error's text with any client
    /// string in it quoted short and the whole bounded
    /// ([`crate::text::clip_message`]).
    pub fn client_message(&self) -> String {
        crate::text::clip_message(&self.to_string())
    }

    /// Shorthand for [`Error::InvalidInput`].
    pub fn input(
        model: &str,
        input: &str,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Error {
        Error::InvalidInput {
            model: model.to_string(),
            input: input.to_string(),
            expected: expected.into(),
            got: got.into(),
        }
    }

    /// Shorthand for [`Error::InvalidRequest`].
    pub fn request(model: &str, message: impl Into<String>) -> Error {
        Error::InvalidRequest {
            model: model.to_string(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_model_input_expected_and_got() {
        let e = Error::input("alpha_mlp", "features", "datatype FP32", "FP64");
        assert_eq!(
            e.to_string(),
            "model 'alpha_mlp', input 'features': expected datatype FP32, got FP64"
        );
        let e = Error::ModelNotFound {
            model: "m".into(),
            version: Some("9".into()),
            known: "versions: 1, 2".into(),
        };
        assert_eq!(
            e.to_string(),
            "model 'm' version 9: not found (versions: 1, 2)"
        );
    }
}
