//! Which versions of a model serve, and the names they go by: the version
//! policy (`version_policy` in `model.toml`, Triton's three kinds) and labels
//! (`[labels]` in `model.toml`, or a `labels.toml` beside it that the
//! repository poll reads without reloading the model).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Deserializer};

/// Which of a model's version directories load (Triton's `version_policy`).
///
/// ```toml
/// version_policy = { latest = 2 }      # the two highest (default: latest 1)
/// version_policy = "all"               # every version directory
/// version_policy = { specific = [3, 5] }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The `n` highest version numbers on disk.
    Latest(usize),
    /// Every version on disk.
    All,
    /// These versions, where they are on disk.
    Specific(Vec<u64>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        VersionPolicy::Latest(1)
    }
}

impl VersionPolicy {
    /// The versions of `on_disk` (ascending) that this policy serves, ascending.
    pub fn select(&self, on_disk: &[u64]) -> Vec<u64> {
        match self {
            VersionPolicy::All => on_disk.to_vec(),
            VersionPolicy::Latest(n) => on_disk[on_disk.len().saturating_sub(*n)..].to_vec(),
            VersionPolicy::Specific(wanted) => on_disk
                .iter()
                .copied()
                .filter(|v| wanted.contains(v))
                .collect(),
        }
    }
}

impl std::fmt::Display for VersionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VersionPolicy::All => f.write_str("all"),
            VersionPolicy::Latest(n) => write!(f, "latest {n}"),
            VersionPolicy::Specific(v) => write!(f, "specific {v:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for VersionPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Word(String),
            Table(BTreeMap<String, toml::Value>),
        }
        let expected = "expected \"all\", { latest = N } (N >= 1) or { specific = [versions] }";
        let bad =
            |what: String| serde::de::Error::custom(format!("version_policy: {what}; {expected}"));
        match Written::deserialize(d)? {
            Written::Word(word) if word == "all" => Ok(VersionPolicy::All),
            Written::Word(word) => Err(bad(format!("unknown policy \"{word}\""))),
            Written::Table(table) if table.len() != 1 => {
                Err(bad(format!("{} keys given", table.len())))
            }
            Written::Table(table) => {
                let Some((key, value)) = table.into_iter().next() else {
                    return Err(bad("no key given".to_string()));
                };
                match (key.as_str(), value) {
                    ("latest", toml::Value::Integer(n)) if n >= 1 => usize::try_from(n)
                        .map(VersionPolicy::Latest)
                        .map_err(|_| bad(format!("latest = {n} is too large"))),
                    ("specific", toml::Value::Array(items)) if !items.is_empty() => items
                        .iter()
                        .map(|v| v.as_integer().and_then(|n| u64::try_from(n).ok()))
                        .collect::<Option<Vec<u64>>>()
                        .map(VersionPolicy::Specific)
                        .ok_or_else(|| bad("specific holds something not a version number".into())),
                    (key, value) => Err(bad(format!("{key} = {value}"))),
                }
            }
        }
    }
}

/// Labels naming versions (`stable = 3`): a label is a letter followed by
/// letters, digits, `_` or `-` (so it is never read as a version number), at
/// most 64 characters.
pub type Labels = BTreeMap<String, u64>;

/// Checks every label's name; the error names the bad one.
pub fn check_labels(labels: &Labels) -> Result<(), String> {
    for name in labels.keys() {
        let mut chars = name.chars();
        let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
        if !starts_with_letter
            || name.len() > 64
            || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "label {}: expected a letter then letters, digits, '_' or '-', at most 64 characters",
                crate::text::quote(name)
            ));
        }
    }
    Ok(())
}

/// Checks a `[split]`: each key a version number or a label's name, and
/// some weight in all.
pub fn check_split(split: &BTreeMap<String, u32>) -> Result<(), String> {
    if split.is_empty() {
        return Ok(());
    }
    for key in split.keys().filter(|k| k.parse::<u64>().is_err()) {
        let mut one = Labels::new();
        one.insert(key.clone(), 0);
        check_labels(&one).map_err(|e| format!("[split]: {e} or a version number"))?;
    }
    if split.values().all(|w| *w == 0) {
        return Err("[split]: every weight is 0; give at least one version some".into());
    }
    Ok(())
}

/// A shadow version (`[[shadow]]` in `model.toml`): it gets a copy of a
/// fraction of another version's requests, computed after the primary's
/// answer on capacity no request waits for, and its answers are compared
/// with the primary's (docs/lifecycle.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The shadow: a version number or a label.
    pub version: String,
    /// Whose requests it mirrors: a version number or a label (default:
    /// every other version's).
    #[serde(default)]
    pub of: Option<String>,
    /// The fraction of those requests mirrored, 0 to 1 (default 1).
    #[serde(default = "one")]
    pub fraction: f64,
}

fn one() -> f64 {
    1.0
}

/// Checks every `[[shadow]]`: a fraction in 0..=1, a version or label
/// name each.
pub fn check_shadows(shadows: &[ShadowConfig]) -> Result<(), String> {
    for shadow in shadows {
        if !(0.0..=1.0).contains(&shadow.fraction) {
            return Err(format!(
                "[[shadow]] version {}: fraction {} is not between 0 and 1",
                crate::text::quote(&shadow.version),
                shadow.fraction
            ));
        }
        for name in std::iter::once(&shadow.version).chain(shadow.of.as_ref()) {
            if name.parse::<u64>().is_err() {
                let mut one = Labels::new();
                one.insert(name.clone(), 0);
                check_labels(&one).map_err(|e| format!("[[shadow]]: {e} or a version number"))?;
            }
        }
    }
    Ok(())
}

/// Reads `labels.toml` of the model directory `dir` (`stable = 3` lines;
/// no file is no labels), as [`crate::files::read`] reads; errors name the
/// file as `shown`.
pub fn load_labels(dir: &Path, shown: &str) -> Result<Labels, String> {
    let Some(text) =
        crate::files::read_text(dir, "labels.toml", shown, crate::files::MAX_CONFIG_BYTES)?
    else {
        return Ok(Labels::new());
    };
    let labels: Labels =
        toml::from_str(&text).map_err(|e| crate::files::toml_error(shown, &text, &e))?;
    check_labels(&labels).map_err(|e| format!("{shown}: {e}"))?;
    Ok(labels)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        version_policy: VersionPolicy,
    }

    fn policy(text: &str) -> Result<VersionPolicy, String> {
        toml::from_str::<Doc>(text)
            .map(|d| d.version_policy)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn policies_are_written_as_triton_names_them_and_select_from_what_is_on_disk() {
        let disk = [1, 2, 5, 9];
        assert_eq!(VersionPolicy::default().select(&disk), vec![9]);
        let latest = policy("version_policy = { latest = 2 }").unwrap();
        assert_eq!(latest.select(&disk), vec![5, 9]);
        assert_eq!(
            policy("version_policy = { latest = 9 }")
                .unwrap()
                .select(&disk),
            disk
        );
        assert_eq!(
            policy("version_policy = \"all\"").unwrap().select(&disk),
            disk
        );
        let specific = policy("version_policy = { specific = [2, 3, 9] }").unwrap();
        assert_eq!(specific.select(&disk), vec![2, 9]);
        assert_eq!(VersionPolicy::default().select(&[]), Vec::<u64>::new());
    }

    #[test]
    fn a_bad_policy_is_named_with_what_was_expected() {
        for (text, says) in [
            ("version_policy = \"newest\"", "unknown policy \"newest\""),
            ("version_policy = { latest = 0 }", "latest = 0"),
            ("version_policy = { latest = -3 }", "latest = -3"),
            ("version_policy = { specific = [] }", "specific = []"),
            (
                "version_policy = { specific = [-1] }",
                "not a version number",
            ),
            ("version_policy = { latest = 1, all = 1 }", "2 keys given"),
        ] {
            let error = policy(text).unwrap_err();
            assert!(
                error.contains(says) && error.contains("expected \"all\""),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn labels_are_never_numbers_and_a_bad_one_is_named() {
        let mut labels = Labels::new();
        labels.insert("stable".into(), 3);
        labels.insert("canary-2_b".into(), 4);
        assert_eq!(check_labels(&labels), Ok(()));
        for bad in ["3", "", "-x", "a b", &"x".repeat(65)] {
            let mut labels = Labels::new();
            labels.insert(bad.to_string(), 1);
            assert!(check_labels(&labels).is_err(), "{bad:?} accepted");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.toml");
        let load = || load_labels(dir.path(), "m/labels.toml");
        assert_eq!(load(), Ok(Labels::new()));
        std::fs::write(&path, "stable = 3\ncanary = 4\n").unwrap();
        assert_eq!(load().unwrap().get("canary"), Some(&4));
        std::fs::write(&path, "\"9\" = 3\n").unwrap();
        assert!(load().unwrap_err().contains("m/labels.toml: label \"9\""));
    }

    #[test]
    fn a_split_names_versions_or_labels_and_weighs_something() {
        let split = |pairs: &[(&str, u32)]| -> BTreeMap<String, u32> {
            pairs.iter().map(|(k, w)| (k.to_string(), *w)).collect()
        };
        assert_eq!(check_split(&split(&[])), Ok(()));
        assert_eq!(check_split(&split(&[("stable", 95), ("4", 5)])), Ok(()));
        assert!(
            check_split(&split(&[("stable", 0), ("4", 0)]))
                .unwrap_err()
                .contains("every weight is 0")
        );
        assert!(
            check_split(&split(&[("-x", 1)]))
                .unwrap_err()
                .contains("[split]: label \"-x\"")
        );
    }
}
