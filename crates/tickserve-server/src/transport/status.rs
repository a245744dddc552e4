//! What a failure becomes on each protocol: one table per protocol, in one
//! place, for every front end and every refusal (the core's errors, the key
//! checks, and the route table's 404 and 405).
//!
//! | kind | gRPC | HTTP | shared memory |
//! | --- | --- | --- | --- |
//! | invalid argument | INVALID_ARGUMENT | 400 | 1 |
//! | not found | NOT_FOUND | 404 | 2 |
//! | payload too large | INVALID_ARGUMENT | 413 | 3 |
//! | unavailable | UNAVAILABLE | 503 | 4 |
//! | resource exhausted | RESOURCE_EXHAUSTED | 429 (with `Retry-After: 1`) | 5 |
//! | deadline exceeded | DEADLINE_EXCEEDED | 504 | 6 |
//! | internal | INTERNAL | 500 | 7 |
//! | failed precondition | FAILED_PRECONDITION | 403 | 8 |
//! | withheld (a guard tripped) | OUT_OF_RANGE | 422 | 9 |
//!
//! The edge's own refusals: no key UNAUTHENTICATED / 401 (with
//! `WWW-Authenticate`), a wrong key PERMISSION_DENIED / 403, no such endpoint
//! UNIMPLEMENTED / 404, a method the endpoint does not take 405; tonic's
//! OUT_OF_RANGE for a message over the size limit is INVALID_ARGUMENT, as
//! every other bad request. Every HTTP error body is `{"error": "..."}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tickserve_core::{Error, ErrorKind};
use tickserve_shm_protocol::ErrorCode;

/// The HTTP status of an error kind.
pub const fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::FailedPrecondition => StatusCode::FORBIDDEN,
        ErrorKind::Withheld => StatusCode::UNPROCESSABLE_ENTITY,
        // Locked by an operator or a breaker: a 4xx, so that no balancer
        // retries it on another replica (each refuses it the same way).
        ErrorKind::Halted => StatusCode::LOCKED,
    }
}

/// The gRPC code of an error kind.
pub const fn grpc_code(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::PayloadTooLarge => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorKind::Internal => tonic::Code::Internal,
        ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorKind::Withheld => tonic::Code::OutOfRange,
        ErrorKind::Halted => tonic::Code::FailedPrecondition,
    }
}

/// The shared-memory error byte of an error kind.
pub const fn shm_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
        ErrorKind::NotFound => ErrorCode::NotFound,
        ErrorKind::PayloadTooLarge => ErrorCode::PayloadTooLarge,
        ErrorKind::Unavailable => ErrorCode::Unavailable,
        ErrorKind::ResourceExhausted => ErrorCode::ResourceExhausted,
        ErrorKind::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        ErrorKind::Internal => ErrorCode::Internal,
        ErrorKind::FailedPrecondition => ErrorCode::FailedPrecondition,
        ErrorKind::Withheld => ErrorCode::Withheld,
        ErrorKind::Halted => ErrorCode::FailedPrecondition,
    }
}

/// An error as a gRPC status: its kind's code and its message. A withheld
/// answer's status also carries `tickserve-withheld: guard` (the one
/// OUT_OF_RANGE tickserve answers; see
/// [`grpc_oversized_is_invalid_argument`]).
pub fn grpc(error: &Error) -> tonic::Status {
    let kind = error.kind();
    let mut status = tonic::Status::new(grpc_code(kind), error.client_message());
    if kind == ErrorKind::Withheld {
        status.metadata_mut().insert(
            WITHHELD.as_str(),
            tonic::metadata::MetadataValue::from_static("guard"),
        );
    }
    status
}

/// An HTTP error answer: `status` with the JSON body `{"error": message}`.
pub fn http_answer(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// An error as an HTTP answer, with its kind's status; a shed request is
/// told when to come back.
pub fn http(error: &Error) -> Response {
    let kind = error.kind();
    let mut response = http_answer(http_status(kind), &error.client_message());
    if kind == ErrorKind::ResourceExhausted {
        // Shedding is momentary: a client may come back in a second.
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// An error that answers an HTTP request as [`http`] words it; handlers
/// return `Result<_, HttpError>` and `?` core errors into it.
pub struct HttpError(pub Error);

impl From<Error> for HttpError {
    fn from(e: Error) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        http(&self.0)
    }
}

/// The edge's own refusals, before any handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No endpoint at this path (`what`: the method and path, for the message).
    NoRoute(String),
    /// The endpoint does not take this method.
    WrongMethod {
        /// The path.
        path: String,
        /// The method that came.
        method: String,
    },
    /// The request carried no key for its group.
    MissingKey {
        /// The group.
        group: &'static str,
        /// The header the key goes in.
        header: String,
    },
    /// The request carried a key, and not the right one.
    WrongKey {
        /// The group.
        group: &'static str,
    },
}

impl Refusal {
    /// What the refused client reads.
    pub fn message(&self) -> String {
        // A path is the client's text: quoted short, as every client text.
        let path = |p: &str| tickserve_core::text::clip(p, tickserve_core::text::MAX_QUOTED_BYTES);
        match self {
            Refusal::NoRoute(what) => format!("no endpoint {}", path(what)),
            Refusal::WrongMethod { path: p, method } => format!(
                "{} does not take {}; see docs/protocol.md for each endpoint's method",
                path(p),
                path(method)
            ),
            Refusal::MissingKey { group, header } => format!(
                "the {group} endpoints need a key: send it as '{header}: KEY' or \
                 'Authorization: Bearer KEY'"
            ),
            Refusal::WrongKey { group } => {
                format!("the key sent for the {group} endpoints is not the right one")
            }
        }
    }

    /// The refusal as an HTTP answer.
    pub fn http(&self) -> Response {
        let status = match self {
            Refusal::NoRoute(_) => StatusCode::NOT_FOUND,
            Refusal::WrongMethod { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::MissingKey { .. } => StatusCode::UNAUTHORIZED,
            Refusal::WrongKey { .. } => StatusCode::FORBIDDEN,
        };
        let mut response = http_answer(status, &self.message());
        if matches!(self, Refusal::MissingKey { .. }) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tickserve\""),
            );
        }
        response
    }

    /// The refusal as a gRPC status.
    pub fn grpc(&self) -> tonic::Status {
        let code = match self {
            Refusal::NoRoute(_) | Refusal::WrongMethod { .. } => tonic::Code::Unimplemented,
            Refusal::MissingKey { .. } => tonic::Code::Unauthenticated,
            Refusal::WrongKey { .. } => tonic::Code::PermissionDenied,
        };
        tonic::Status::new(code, self.message())
    }
}

/// tonic refuses a message over `max_decoding_message_size` (and a body that
/// ends inside a message) with OUT_OF_RANGE before any handler runs;
/// tickserve answers every bad request with INVALID_ARGUMENT, so that status
/// is rewritten (its message, which names the size and the limit, is kept).
/// The one OUT_OF_RANGE tickserve answers itself, a withheld answer, carries
/// `tickserve-withheld` and is left as it is.
pub fn grpc_oversized_is_invalid_argument<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let out_of_range = headers
        .get(&GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        == Some(tonic::Code::OutOfRange as i32)
        && !headers.contains_key(&WITHHELD);
    if out_of_range {
        headers.insert(
            GRPC_STATUS.clone(),
            HeaderValue::from(tonic::Code::InvalidArgument as i32),
        );
    }
    response
}

/// tonic answers a unary call whose body ended before its message with
/// INTERNAL "Missing request message." before any handler runs: it is the
/// client's mistake, so it becomes INVALID_ARGUMENT saying what was missing,
/// counted among `method`'s requests as refused for a bad request. Other
/// answers are returned as they are.
#[allow(clippy::disallowed_methods)] // a deadline is the machine's time
pub fn grpc_missing_message_is_invalid_argument(
    response: http::Response<axum::body::Body>,
    method: &str,
) -> http::Response<axum::body::Body> {
    let headers = response.headers();
    let code = headers
        .get(&GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok());
    let missing = code == Some(tonic::Code::Internal as i32)
        && headers
            .get("grpc-message")
            .is_some_and(|m| m.as_bytes() == b"Missing%20request%20message.");
    if !missing {
        return response;
    }
    let error = Error::request(
        "_unknown",
        format!("the call carried no request message; {method} takes one"),
    );
    let protocol = if method.starts_with("/tensorflow.") {
        tickserve_edge::observe::Protocol::TfServingGrpc
    } else {
        tickserve_edge::observe::Protocol::Grpc
    };
    // Refused before anything ran: its duration is nothing worth a clock read
    // on every call's way.
    let now = std::time::Instant::now();
    tickserve_edge::observe::record_request(protocol, "_unknown", now, Some(&error));
    grpc(&error).into_http::<axum::body::Body>()
}

/// `grpc-status`, parsed once: every gRPC answer is looked at.
static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The metadata key of a withheld answer's status.
static WITHHELD: http::HeaderName = http::HeaderName::from_static("tickserve-withheld");

#[cfg(test)]
mod tests {
    use super::*;

    /// The one table: kind → (gRPC code, HTTP status, shared-memory byte). A
    /// change here is a change of the wire contract.
    #[test]
    fn kind_table_is_pinned() {
        let table = [
            (ErrorKind::InvalidArgument, 3, 400, 1),
            (ErrorKind::NotFound, 5, 404, 2),
            (ErrorKind::PayloadTooLarge, 3, 413, 3),
            (ErrorKind::Unavailable, 14, 503, 4),
            (ErrorKind::ResourceExhausted, 8, 429, 5),
            (ErrorKind::DeadlineExceeded, 4, 504, 6),
            (ErrorKind::Internal, 13, 500, 7),
            (ErrorKind::FailedPrecondition, 9, 403, 8),
            (ErrorKind::Withheld, 11, 422, 9),
            (ErrorKind::Halted, 9, 423, 8),
        ];
        assert_eq!(table.len(), ErrorKind::ALL.len());
        for (kind, grpc, http, shm) in table {
            assert_eq!(
                (
                    grpc_code(kind) as i32,
                    http_status(kind).as_u16(),
                    shm_code(kind) as u8
                ),
                (grpc, http, shm),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn refusals_have_their_own_codes() {
        let missing = Refusal::MissingKey {
            group: "inference",
            header: "admin-key".into(),
        };
        assert_eq!(missing.http().status(), StatusCode::UNAUTHORIZED);
        assert!(
            missing
                .http()
                .headers()
                .contains_key(header::WWW_AUTHENTICATE)
        );
        assert_eq!(missing.grpc().code(), tonic::Code::Unauthenticated);
        let wrong = Refusal::WrongKey { group: "inference" };
        assert_eq!(wrong.http().status(), StatusCode::FORBIDDEN);
        assert_eq!(wrong.grpc().code(), tonic::Code::PermissionDenied);
        let none = Refusal::NoRoute("GET /v3".into());
        assert_eq!(none.http().status(), StatusCode::NOT_FOUND);
        assert_eq!(none.grpc().code(), tonic::Code::Unimplemented);
        let method = Refusal::WrongMethod {
            path: "/v2/models/m/infer".into(),
            method: "GET".into(),
        };
        assert_eq!(method.http().status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}
