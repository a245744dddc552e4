//! `[fleet]` in `tickserve.toml`: replicas that share an etcd cluster and a
//! prefix are one fleet (docs/deploy.md, "Scaling out"). Without it, one
//! process works alone and needs no etcd.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The shortest and longest `fleet.lease`.
pub const LEASE_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// The longest `fleet.handoff_wait`.
pub const MAX_HANDOFF_WAIT: Duration = Duration::from_secs(60);

/// The fleet's store and this replica's place in it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// etcd v3 client endpoints (`http://host:2379`, or `https://` with
    /// `ca_file`).
    pub endpoints: Vec<String>,
    /// The prefix of every key the fleet keeps: replicas with the same
    /// endpoints and prefix are one fleet.
    pub prefix: String,
    /// The TTL of this replica's lease: a replica that stops (or loses the
    /// store) longer than this loses its sequences, and stops answering them
    /// a margin before.
    #[serde(deserialize_with = "super::duration")]
    pub lease: Duration,
    /// How long a tick of a sequence another live replica keeps waits for
    /// it to be handed over (then a retryable error).
    #[serde(deserialize_with = "super::duration")]
    pub handoff_wait: Duration,
    /// The CA certificate (PEM) that signs etcd's server certificates.
    pub ca_file: Option<PathBuf>,
    /// This replica's client certificate (PEM), for etcd's mTLS.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
    /// The etcd user, with `password_file`.
    pub user: Option<String>,
    /// A file holding the user's password (its first line).
    pub password_file: Option<PathBuf>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            endpoints: Vec::new(),
            prefix: "tickserve".to_string(),
            lease: Duration::from_secs(3),
            handoff_wait: Duration::from_secs(5),
            ca_file: None,
            cert_file: None,
            key_file: None,
            user: None,
            password_file: None,
        }
    }
}

impl FleetConfig {
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("fleet.endpoints is empty: name the etcd cluster's client URLs".into());
        }
        for endpoint in &self.endpoints {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(format!(
                    "fleet.endpoints: '{endpoint}' is not an http:// or https:// URL"
                ));
            }
        }
        let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_./".contains(&b);
        if self.prefix.is_empty() || self.prefix.len() > 200 || !self.prefix.bytes().all(plain) {
            return Err(format!(
                "fleet.prefix '{}' must be 1 to 200 bytes of letters, digits, '-', '_', '.' and '/'",
                self.prefix
            ));
        }
        let (least, most) = LEASE_BOUNDS;
        if self.lease < least || self.lease > most {
            return Err(format!(
                "fleet.lease is {:?}; it must be {least:?} to {most:?}",
                self.lease
            ));
        }
        crate::durations::check("fleet.handoff_wait", self.handoff_wait, MAX_HANDOFF_WAIT)?;
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err("fleet.cert_file and fleet.key_file go together".into());
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err("fleet.user and fleet.password_file go together".into());
        }
        Ok(())
    }
}
