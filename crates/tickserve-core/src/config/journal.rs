//! `[journal]` in `tickserve.toml`: the prediction journal (docs/journal.md).
//!
//! Off unless `enabled`. Every prediction of a model that is journaled
//! (`model_defaults.journal`, a model's own `journal`) becomes a typed record
//! in Arrow IPC stream files under `directory`, written off the request path.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The longest `rotate_interval` and `fsync` interval: a day.
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The journal's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// Record predictions (off by default).
    pub enabled: bool,
    /// Where the files go (made if missing): `MODEL/VERSION/*.arrows` below it.
    pub directory: PathBuf,
    /// A file is closed and the next begun once it holds this many bytes.
    pub rotate_bytes: u64,
    /// ... or once it is this old.
    #[serde(deserialize_with = "interval")]
    pub rotate_interval: Duration,
    /// How often written records are made durable (`fsync`): an interval
    /// (`"1s"`), or `"never"` (left to the operating system).
    pub fsync: Fsync,
    /// The fraction of predictions recorded, 0 to 1 (1: every one).
    pub sample: f64,
    /// The most bytes of records waiting for the writer; beyond it, what
    /// `when_full` says.
    pub max_queued_bytes: usize,
    /// What a prediction gets when its record cannot be kept (the queue is
    /// full, or the journal cannot write).
    pub when_full: WhenFull,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            enabled: false,
            directory: PathBuf::from("journal"),
            rotate_bytes: 256 * 1024 * 1024,
            rotate_interval: Duration::from_secs(3600),
            fsync: Fsync::Every(Duration::from_secs(1)),
            sample: 1.0,
            max_queued_bytes: 64 * 1024 * 1024,
            when_full: WhenFull::Drop,
        }
    }
}

impl JournalConfig {
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample) {
            return Err(format!(
                "journal.sample is {}; it must be 0 to 1",
                self.sample
            ));
        }
        if self.rotate_bytes < 64 * 1024 {
            return Err("journal.rotate_bytes must be at least 65536".into());
        }
        if self.max_queued_bytes < 64 * 1024 {
            return Err("journal.max_queued_bytes must be at least 65536".into());
        }
        for (key, value) in [
            ("journal.rotate_interval", Some(self.rotate_interval)),
            ("journal.fsync", self.fsync.interval()),
        ] {
            if let Some(value) = value
                && (value.is_zero() || value > MAX_INTERVAL)
            {
                return Err(format!(
                    "{key} is {value:?}; it must be positive and at most a day"
                ));
            }
        }
        if self.enabled && self.directory.as_os_str().is_empty() {
            return Err("journal.directory must name a directory".into());
        }
        Ok(())
    }
}

/// When written records are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// `fsync` at most this long after a record is written.
    Every(Duration),
    /// Never: the operating system writes back when it will.
    Never,
}

impl Fsync {
    /// The interval; `None` for never.
    pub fn interval(self) -> Option<Duration> {
        match self {
            Fsync::Every(d) => Some(d),
            Fsync::Never => None,
        }
    }
}

impl<'de> Deserialize<'de> for Fsync {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "never" {
            return Ok(Fsync::Never);
        }
        crate::durations::parse(&s)
            .map(Fsync::Every)
            .map_err(|e| serde::de::Error::custom(format!("journal.fsync: {e}, or \"never\"")))
    }
}

/// What a prediction gets when its record cannot be kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenFull {
    /// It is served; the record is dropped and counted.
    #[default]
    Drop,
    /// It is refused (503 / UNAVAILABLE): no prediction leaves the server
    /// unrecorded. A request is refused before it computes when the queue is
    /// full or the journal cannot write; an answer waits until its record is
    /// written.
    Refuse,
}

fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    crate::durations::deserialize(d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fsync_takes_an_interval_or_never() {
        let c: JournalConfig = toml::from_str("fsync = \"never\"").unwrap();
        assert_eq!(c.fsync, Fsync::Never);
        let c: JournalConfig = toml::from_str("fsync = \"250ms\"").unwrap();
        assert_eq!(c.fsync, Fsync::Every(Duration::from_millis(250)));
        let e = toml::from_str::<JournalConfig>("fsync = \"sometimes\"").unwrap_err();
        assert!(e.to_string().contains("\"never\""), "{e}");
    }

    #[test]
    fn a_sample_outside_zero_to_one_is_refused() {
        let c: JournalConfig = toml::from_str("sample = 1.5").unwrap();
        assert!(c.validate().unwrap_err().contains("journal.sample"));
        let c: JournalConfig = toml::from_str("sample = 0.0").unwrap();
        c.validate().unwrap();
    }
}
