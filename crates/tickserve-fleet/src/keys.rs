//! Where the fleet's records live in etcd, under `fleet.prefix` (P):
//!
//! ```text
//! P/members/ID              a live replica (bound to its lease; ID is the lease's id)
//! P/seq/MODEL/KEY           who keeps a sequence, and on which version (not leased:
//!                           it outlives its keeper, so a lost sequence is told lost)
//! P/state/MODEL/KEY         a sequence's state, handed over, until a replica takes it
//! P/wants/ID/MODEL/KEY      a replica asks replica ID to hand a sequence over
//!                           (bound to the asker's lease)
//! P/halts/MODEL/VERSION     a halted version
//! ```
//!
//! Names are escaped into keys (every byte but letters, digits, `-`, `_`
//! and `.` as `%XX`), so a model or sequence name never adds a `/`.

/// The key prefix of one fleet.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys of the fleet named `prefix` (a trailing `/` is dropped).
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// Every key of `area` (`seq`, `wants`, `halts`, ...): the prefix to watch.
    pub(crate) fn area(&self, area: &str) -> String {
        format!("{}/{area}/", self.prefix)
    }

    pub(crate) fn member(&self, id: &str) -> String {
        format!("{}{}", self.area("members"), escape(id))
    }

    pub(crate) fn sequence(&self, model: &str, key: &str) -> String {
        format!("{}{}/{}", self.area("seq"), escape(model), escape(key))
    }

    pub(crate) fn state(&self, model: &str, key: &str) -> String {
        format!("{}{}/{}", self.area("state"), escape(model), escape(key))
    }

    pub(crate) fn want(&self, owner: &str, model: &str, key: &str) -> String {
        format!(
            "{}{}/{}/{}",
            self.area("wants"),
            escape(owner),
            escape(model),
            escape(key)
        )
    }

    /// Every want addressed to replica `owner`.
    pub(crate) fn wants_of(&self, owner: &str) -> String {
        format!("{}{}/", self.area("wants"), escape(owner))
    }

    pub(crate) fn halt(&self, model: &str, version: &str) -> String {
        format!(
            "{}{}/{}",
            self.area("halts"),
            escape(model),
            escape(version)
        )
    }

    /// The two names after `area`'s prefix in `key` (`MODEL/KEY`,
    /// `MODEL/VERSION`), unescaped; `None` for a key of another shape.
    pub(crate) fn split(&self, area: &str, key: &[u8]) -> Option<(String, String)> {
        let rest = key.strip_prefix(self.area(area).as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (first, second) = rest.split_once('/')?;
        Some((unescape(first)?, unescape(second)?))
    }
}

/// `name` with every byte but `[A-Za-z0-9._-]` written `%XX`.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn names_with_slashes_and_any_byte_stay_one_segment_and_come_back() {
        let keys = Keys::new("desk/a/");
        for (model, key) in [
            ("seq_lstm_step", "-\nn42"),
            ("../etc", "0102030405060708\ntAAPL/x %2F"),
            ("é", ""),
        ] {
            let k = keys.sequence(model, key);
            assert!(k.starts_with("desk/a/seq/"), "{k}");
            assert_eq!(k.matches('/').count(), 4, "{k}");
            assert_eq!(
                keys.split("seq", k.as_bytes()),
                Some((model.to_string(), key.to_string()))
            );
        }
        assert_eq!(keys.split("seq", b"desk/a/halts/m/1"), None);
        assert_eq!(keys.split("seq", b"desk/a/seq/m%ZZ/1"), None);
    }
}
