//! The model handles the front end gives out: each model name and version
//! (canonical: as the model answers it) has one random 64-bit token this
//! process drew, which a lookup answers and an inference names.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

/// The most distinct models (name and version) clients may look up.
pub const MAX_HANDLES: usize = 4096;

/// The handles given out: each model name and version (canonical: as the
/// model answers it, so `1`, `01` and `+1` are one) has one random 64-bit
/// token.
pub(super) struct Handles {
    keys: Vec<(String, String)>,
    by_key: HashMap<(String, String), u64>,
    by_token: HashMap<u64, usize>,
    /// Keyed by the process's random state: tokens nobody outside can
    /// predict, different from any earlier run's.
    tokens: RandomState,
}

impl Handles {
    pub(super) fn new() -> Handles {
        Handles {
            keys: Vec::new(),
            by_key: HashMap::new(),
            by_token: HashMap::new(),
            tokens: RandomState::new(),
        }
    }

    /// The token of (`name`, `version`), made on its first lookup; `None`
    /// once [`MAX_HANDLES`] are out.
    pub(super) fn token(&mut self, name: &str, version: &str) -> Option<u64> {
        let key = (name.to_string(), version.to_string());
        if let Some(&token) = self.by_key.get(&key) {
            return Some(token);
        }
        if self.keys.len() >= MAX_HANDLES {
            return None;
        }
        let index = self.keys.len();
        // A fresh token for a fresh index; a (vanishingly rare) collision
        // draws again.
        let mut salt = 0u64;
        let token = loop {
            let token = self.tokens.hash_one((index, salt));
            if token != 0 && !self.by_token.contains_key(&token) {
                break token;
            }
            salt += 1;
        };
        self.keys.push(key.clone());
        self.by_key.insert(key, token);
        self.by_token.insert(token, index);
        Some(token)
    }

    /// The model name and version of `token`, if this process gave it out.
    pub(super) fn resolve(&self, token: u64) -> Option<(String, String)> {
        self.by_token
            .get(&token)
            .and_then(|&i| self.keys.get(i))
            .cloned()
    }
}

/// The version a handle is kept under: empty for "the default version" (it
/// follows the default as models load), else the version as the model
/// answers to it (`01` and `+1` are `1`).
pub(super) fn canonical_version<'a>(asked: &str, resolved: &'a str) -> &'a str {
    if asked.is_empty() { "" } else { resolved }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn spellings_of_one_version_share_one_handle() {
        // The runtime resolves `01` and `+1` to version "1"; the handle is
        // kept under what it resolved to (empty stays "the default").
        assert_eq!(canonical_version("01", "1"), "1");
        assert_eq!(canonical_version("+1", "1"), "1");
        assert_eq!(canonical_version("", "1"), "");
        let mut handles = Handles::new();
        let one = handles.token("m", canonical_version("1", "1")).unwrap();
        for spelling in ["01", "+1", "001"] {
            assert_eq!(
                handles.token("m", canonical_version(spelling, "1")),
                Some(one)
            );
        }
        assert_eq!(handles.keys.len(), 1);
    }

    #[test]
    fn handles_are_random_64_bit_tokens_of_this_process_only() {
        let mut handles = Handles::new();
        let tokens: Vec<u64> = (0..100)
            .map(|i| handles.token(&format!("m{i}"), "").unwrap())
            .collect();
        let distinct: std::collections::HashSet<u64> = tokens.iter().copied().collect();
        assert_eq!(distinct.len(), 100);
        // Not an index, nor a small number: the upper half is used.
        assert!(tokens.iter().any(|t| t >> 32 != 0));
        assert!((0..4096u64).all(|guess| handles.resolve(guess).is_none()));
        assert_eq!(
            handles.resolve(tokens[7]),
            Some(("m7".into(), String::new()))
        );
        // Another process (another random state) resolves none of them.
        let other = Handles::new();
        assert!(tokens.iter().all(|&t| other.resolve(t).is_none()));
    }

    #[test]
    fn the_handle_table_is_bounded() {
        let mut handles = Handles::new();
        for i in 0..MAX_HANDLES {
            assert!(handles.token(&format!("m{i}"), "").is_some());
        }
        assert!(handles.token("one-more", "").is_none());
        assert!(
            handles.token("m0", "").is_some(),
            "a known key keeps its handle"
        );
    }
}
