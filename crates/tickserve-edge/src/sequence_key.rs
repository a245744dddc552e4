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

use tickserve_core::Error;
use tickserve_core::sequence::SequenceId;

/// The header's (and the gRPC metadata's) name.
pub const NAME: &str = "tickserve-sequence-id";

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
