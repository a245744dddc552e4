//! The W3C `traceparent` a request carries (an HTTP header, gRPC
//! metadata), kept for the journal. Only a well-formed one is kept
//! (`00-` 32 hex digits `-` 16 hex digits `-` 2 hex digits, 55 bytes):
//! a client's other bytes never reach a record.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The header (and gRPC metadata key) W3C Trace Context names.
pub const TRACEPARENT: &str = "traceparent";

/// [`TRACEPARENT`], parsed once.
pub static NAME: HeaderName = HeaderName::from_static(TRACEPARENT);

/// An HTTP request's `traceparent`, if well formed.
pub fn http(headers: &HeaderMap) -> Option<String> {
    of(headers.get(&NAME))
}

/// The `traceparent` header's value `v`, if well formed.
pub fn of(v: Option<&HeaderValue>) -> Option<String> {
    v.and_then(|v| v.to_str().ok()).and_then(well_formed)
}

/// A gRPC request's `traceparent`, if well formed.
pub fn grpc(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    http(metadata.as_ref())
}

/// `value` if it is a traceparent of version `00`'s form.
fn well_formed(value: &str) -> Option<String> {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match parts.as_slice() {
        [version, trace, parent, flags]
            if hex(version, 2) && hex(trace, 32) && hex(parent, 16) && hex(flags, 2) =>
        {
            Some(value.to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_traceparent_is_kept() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(well_formed(good).as_deref(), Some(good));
        assert_eq!(well_formed("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(well_formed(&format!("{good}-extra")), None);
        assert_eq!(well_formed(""), None);
    }
}
