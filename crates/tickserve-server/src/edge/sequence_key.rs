//! The sequence id as a header a load balancer can read:
//! `tickserve-sequence-id` (HTTP header, gRPC metadata of a unary call).
//! Several replicas behind a balancer that hashes on it (HAProxy
//! `balance hdr(tickserve-sequence-id)`, Envoy's ring hash) keep every tick of
//! a sequence on the replica that holds its state, without reading bodies.
//!
//! The request's body stays where the sequence is named: when both name it
//! they must agree (else INVALID_ARGUMENT); a request with only the header
//! continues the sequence it names (a number when it is all digits, else a
//! string; `sequence_start` and `sequence_end` still need the body's
//! `sequence_id`). The answer to a sequence tick carries the header back.

use axum::http::{HeaderName, HeaderValue};
use tickserve_core::Error;
use tickserve_core::sequence::{MAX_SEQUENCE_ID_BYTES, SequenceId};

/// The header's (and the gRPC metadata's) name.
pub static NAME: HeaderName = HeaderName::from_static("tickserve-sequence-id");

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

/// The id the header names: a number when it is all digits, else a string.
pub fn id(model: &str, key: &str) -> Result<SequenceId, Error> {
    match key.parse::<u64>() {
        Ok(n) if key.bytes().all(|b| b.is_ascii_digit()) => SequenceId::number(model, n),
        _ => SequenceId::text(model, key),
    }
}

/// The header's form of `id`, as a client sends it.
pub fn text(id: &SequenceId) -> String {
    match id {
        SequenceId::Number(n) => n.to_string(),
        SequenceId::Text(s) => s.clone(),
    }
}

/// Whether the header `key` and the body's `id` name one sequence (as text:
/// `7` agrees with 7 and with "7").
pub fn agrees(key: &str, id: &SequenceId) -> bool {
    key == text(id)
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

    #[test]
    fn digits_name_a_number_and_text_agrees_with_either_form() {
        assert_eq!(id("m", "42").unwrap(), SequenceId::Number(42));
        assert_eq!(id("m", "+42").unwrap(), SequenceId::Text("+42".into()));
        assert_eq!(
            id("m", "EURUSD").unwrap(),
            SequenceId::Text("EURUSD".into())
        );
        assert!(id("m", "0").is_err(), "0 names no sequence");
        assert!(agrees("7", &SequenceId::Number(7)));
        assert!(agrees("7", &SequenceId::Text("7".into())));
        assert!(!agrees("8", &SequenceId::Number(7)));
    }
}
