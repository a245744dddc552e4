//! The `tickserve-sequence-id` header read from HTTP headers and gRPC
//! metadata ([`tickserve_edge::sequence_key`] says what it means).

use axum::http::{HeaderName, HeaderValue};
use tickserve_core::sequence::MAX_SEQUENCE_ID_BYTES;

/// The header's (and the gRPC metadata's) name.
pub static NAME: HeaderName = HeaderName::from_static(tickserve_edge::sequence_key::NAME);

/// The header among `values` (every value of its name): none, or the one
/// value; several values, an empty one, one that is not visible ASCII or
/// one longer than a sequence id may be are the words of a refusal.
pub fn of<'a>(mut values: impl Iterator<Item = &'a HeaderValue>) -> Result<Option<String>, String> {
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("{NAME} was sent more than once: send it once"));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_SEQUENCE_ID_BYTES {
        return Err(format!(
            "{NAME} must have 1 to {MAX_SEQUENCE_ID_BYTES} bytes; got {}",
            bytes.len()
        ));
    }
    if !bytes.iter().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{NAME} must be visible ASCII (no spaces)"));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn one_visible_value_is_the_key_and_anything_else_is_refused_saying_why() {
        let value = |v: &str| HeaderValue::from_str(v).unwrap();
        assert_eq!(of(std::iter::empty()), Ok(None));
        assert_eq!(of([value("EURUSD-7")].iter()), Ok(Some("EURUSD-7".into())));
        let twice = [value("1"), value("2")];
        assert!(of(twice.iter()).unwrap_err().contains("more than once"));
        assert!(of([value("")].iter()).unwrap_err().contains("1 to"));
        assert!(
            of([value("a b")].iter())
                .unwrap_err()
                .contains("visible ASCII")
        );
        let long = "x".repeat(MAX_SEQUENCE_ID_BYTES + 1);
        assert!(of([value(&long)].iter()).unwrap_err().contains("bytes"));
    }
}
