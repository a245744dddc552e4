//! The sequence id as a header a load balancer can read:
//! `tickserve-sequence-id` (HTTP header, gRPC metadata of a unary call).
//! Several replicas behind a balancer that hashes on it (HAProxy
//! `balance hdr(tickserve-sequence-id)`, Envoy's ring hash) keep every tick of
//! a sequence on the replica that holds its state, without reading bodies.
//!
//! The request's body stays where the sequence is named: when both name it
//! they must agree (else INVALID_ARGUMENT); a request with only the header
//! continues the sequence it names (a number when it is a number's one
//! spelling: digits, no leading zero; else a string, so `0001007` is the
//! text id `"0001007"`, never the number 1007 that a balancer hashes
//! apart; `sequence_start` and `sequence_end` still need the body's
//! `sequence_id`). The answer to a sequence tick carries the header back.

use tickserve_core::Error;
use tickserve_core::sequence::SequenceId;

/// The header's (and the gRPC metadata's) name.
pub const NAME: &str = "tickserve-sequence-id";

/// The id the header names: a number when it is the number's canonical
/// spelling (what [`text`] writes), else a string. One header, one
/// sequence: the header and the body agree exactly when their texts do.
pub fn id(model: &str, key: &str) -> Result<SequenceId, Error> {
    // Digits only, and no leading zero (but `0` itself): what `text` writes.
    let canonical =
        key.bytes().all(|b| b.is_ascii_digit()) && (key == "0" || !key.starts_with('0'));
    match key.parse::<u64>() {
        Ok(n) if canonical => SequenceId::number(model, n),
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
        // A number spelt another way is the text it is: one reading, the
        // one a balancer hashes, and it agrees only with itself.
        assert_eq!(
            id("m", "0001007").unwrap(),
            SequenceId::Text("0001007".into())
        );
        assert!(!agrees("0001007", &SequenceId::Number(1007)));
        assert!(agrees("0001007", &SequenceId::Text("0001007".into())));
        assert_eq!(id("m", "00").unwrap(), SequenceId::Text("00".into()));
        assert!(agrees("7", &SequenceId::Number(7)));
        assert!(agrees("7", &SequenceId::Text("7".into())));
        assert!(!agrees("8", &SequenceId::Number(7)));
    }
}
