//! The deadlines a transport carries beside the request: HTTP's
//! `tickserve-timeout` header and gRPC's `grpc-timeout`. A malformed one is
//! never ignored (the client meant a deadline): it comes back as the words
//! of the error, which the pipeline refuses once the model is known. The
//! `timeout` parameter is the parameter reader's; with both, the earlier
//! deadline wins.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};

/// The request header that sets a deadline on an HTTP inference request, as a
/// duration (`2ms`, `250us`); with the `timeout` parameter too, the earlier wins.
pub const TIMEOUT_HEADER: &str = "tickserve-timeout";

/// [`TIMEOUT_HEADER`] and `grpc-timeout`, parsed once (a lookup by `&str`
/// parses the name every time).
pub static TIMEOUT: HeaderName = HeaderName::from_static(TIMEOUT_HEADER);
static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The deadline an HTTP request's [`TIMEOUT_HEADER`] sets, where its value
/// `v` came (found with [`super::headers::InferHeaders`]).
pub fn timeout_of(v: Option<&HeaderValue>) -> Result<Option<Duration>, String> {
    let Some(v) = v else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| tickserve_core::durations::parse(s).ok())
        .map(Some)
        .ok_or_else(|| {
            format!(
                "the {TIMEOUT_HEADER} header must be a duration like \"2ms\" or \"250us\"; got {v:?}"
            )
        })
}

/// A gRPC request's `grpc-timeout`, if it has one.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Result<Option<Duration>, String> {
    match metadata.as_ref().get(&GRPC_TIMEOUT) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(parse_grpc_timeout)
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "the grpc-timeout header must be 1 to 8 digits and a unit (H, M, S, m, u, n); \
                     got {v:?}"
                )
            }),
    }
}

/// Parses a `grpc-timeout` header value as the gRPC spec writes it: 1 to 8
/// digits and a unit (`100m`, `5S`, `250u`); `None` for anything else.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("250u"), Some(Duration::from_micros(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout("10q"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("+5S"), None);
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(
            parse_grpc_timeout("123456789S"),
            None,
            "9 digits: over the spec's 8"
        );
        assert_eq!(parse_grpc_timeout("5é"), None);
    }
}
