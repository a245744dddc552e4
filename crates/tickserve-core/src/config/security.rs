//! `[security]` in `tickserve.toml`: whether clients may load and unload
//! models, which endpoint groups need a key, and TLS.
//!
//! Keys are read from a file or an environment variable named here, never
//! written in the file itself; [`Secret`] never prints its value.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Who may call what, and over which transport.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// Whether clients may load and unload models (Triton's
    /// `--model-control-mode`).
    pub model_control_mode: ModelControlMode,
    /// Endpoint groups that need a key (Triton's `--http-restricted-api` and
    /// `--grpc-restricted-protocol`).
    pub restricted: Vec<Restriction>,
    /// TLS on the front ends; absent: plain text.
    pub tls: Option<TlsConfig>,
}

/// Triton's model control modes that tickserve serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelControlMode {
    /// Every model of the repository loads at start; repository load and
    /// unload are refused (FAILED_PRECONDITION, HTTP 403). The default.
    #[default]
    None,
    /// Every model loads at start, and clients may load and unload models.
    Explicit,
    /// Every model loads at start, then the repository is read every
    /// `repository.poll_interval` and what changed on disk loads, reloads or
    /// unloads; clients' load and unload are refused (the files decide).
    Poll,
}

impl ModelControlMode {
    /// Parses Triton's spelling (`none`, `explicit`, `poll`).
    pub fn parse(text: &str) -> Option<ModelControlMode> {
        match text {
            "none" => Some(ModelControlMode::None),
            "explicit" => Some(ModelControlMode::Explicit),
            "poll" => Some(ModelControlMode::Poll),
            _ => None,
        }
    }

    /// The setting as written (`none`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ModelControlMode::None => "none",
            ModelControlMode::Explicit => "explicit",
            ModelControlMode::Poll => "poll",
        }
    }
}

/// A group of endpoints guarded together, named as Triton names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointGroup {
    /// Server live and ready, model ready, gRPC health checking.
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference, unary and streamed.
    Inference,
    /// Model configuration.
    ModelConfig,
    /// Model statistics.
    Statistics,
    /// Repository index, load and unload.
    ModelRepository,
    /// Prometheus metrics (`/metrics`, HTTP only).
    Metrics,
    /// The kill switch: halt and resume (closed unless it has a key, or
    /// `[risk] control = "open"`).
    Risk,
}

impl EndpointGroup {
    /// Every group.
    pub const ALL: [EndpointGroup; 8] = [
        EndpointGroup::Health,
        EndpointGroup::Metadata,
        EndpointGroup::Inference,
        EndpointGroup::ModelConfig,
        EndpointGroup::Statistics,
        EndpointGroup::ModelRepository,
        EndpointGroup::Metrics,
        EndpointGroup::Risk,
    ];

    /// The group's name (`model-repository`): in settings, errors and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            EndpointGroup::Health => "health",
            EndpointGroup::Metadata => "metadata",
            EndpointGroup::Inference => "inference",
            EndpointGroup::ModelConfig => "model-config",
            EndpointGroup::Statistics => "statistics",
            EndpointGroup::ModelRepository => "model-repository",
            EndpointGroup::Metrics => "metrics",
            EndpointGroup::Risk => "risk",
        }
    }

    /// The group named `name`.
    pub fn parse(name: &str) -> Option<EndpointGroup> {
        EndpointGroup::ALL.into_iter().find(|g| g.as_str() == name)
    }
}

/// A front end, as `[security]` settings name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontEnd {
    /// The HTTP/REST front end.
    Http,
    /// The gRPC front end.
    Grpc,
}

fn both_front_ends() -> Vec<FrontEnd> {
    vec![FrontEnd::Http, FrontEnd::Grpc]
}

/// Endpoint groups that answer only a request carrying a key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restriction {
    /// The groups guarded.
    pub groups: Vec<EndpointGroup>,
    /// The key's header, as Triton's `KEY` in `GROUPS:KEY=VALUE`: HTTP sends
    /// it as this header, gRPC as the metadata `triton-grpc-protocol-KEY`.
    /// `Authorization: Bearer VALUE` is accepted on both as well.
    pub header: String,
    /// A file holding the key (surrounding whitespace is dropped).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// An environment variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// The key itself, from a command line in Triton's syntax (never from a
    /// file: a key does not belong in `tickserve.toml`).
    #[serde(skip)]
    pub key_literal: Option<Secret>,
    /// The front ends it applies to (both unless given).
    #[serde(default = "both_front_ends")]
    pub front_ends: Vec<FrontEnd>,
}

/// Where a key's value is read from (once, at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding the key (surrounding whitespace is dropped).
    KeyFile(PathBuf),
    /// An environment variable holding the key.
    KeyEnv(String),
    /// The key itself, from a command line in Triton's syntax (accepted for
    /// compatibility; a warning says it is visible to every user of the host).
    Literal(Secret),
}

impl KeySource {
    /// Reads the key. An empty key is an error: it would let anyone in.
    pub fn read(&self) -> Result<Secret, String> {
        let value = match self {
            KeySource::KeyFile(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("the key file {}: {e}", path.display()))?
                .trim()
                .to_string(),
            KeySource::KeyEnv(name) => std::env::var(name)
                .map_err(|_| format!("the key variable {name} is not set (or not UTF-8)"))?
                .trim()
                .to_string(),
            KeySource::Literal(secret) => return Ok(secret.clone()),
        };
        if value.is_empty() {
            return Err(format!("{} holds an empty key", self.describe()));
        }
        Ok(Secret(value.into_bytes()))
    }

    /// Reads every key: a key file may hold several, one per line (each a
    /// client of its own: what binds to a key tells them apart); blank lines
    /// are skipped. An environment variable or a command line holds one.
    pub fn read_all(&self) -> Result<Vec<Secret>, String> {
        let KeySource::KeyFile(path) = self else {
            return self.read().map(|key| vec![key]);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the key file {}: {e}", path.display()))?;
        let keys: Vec<Secret> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(|line| Secret(line.as_bytes().to_vec()))
            .collect();
        if keys.is_empty() {
            return Err(format!("{} holds an empty key", self.describe()));
        }
        Ok(keys)
    }

    /// Where the key comes from, without its value.
    pub fn describe(&self) -> String {
        match self {
            KeySource::KeyFile(path) => format!("the key file {}", path.display()),
            KeySource::KeyEnv(name) => format!("the key variable {name}"),
            KeySource::Literal(_) => "a key given on the command line".to_string(),
        }
    }

    /// Triton's `VALUE`: `env:NAME` and `file:PATH` name where the key is;
    /// anything else is the key itself.
    pub fn parse_triton(value: &str) -> KeySource {
        if let Some(name) = value.strip_prefix("env:") {
            KeySource::KeyEnv(name.to_string())
        } else if let Some(path) = value.strip_prefix("file:") {
            KeySource::KeyFile(PathBuf::from(path))
        } else {
            KeySource::Literal(Secret(value.as_bytes().to_vec()))
        }
    }
}

/// A key's value. Its `Debug` prints no part of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The key's bytes, for a constant-time comparison.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Restriction {
    /// Parses Triton's `GROUPS:KEY=VALUE` (`model-repository,statistics:admin-key=env:ADMIN_KEY`)
    /// for `front_end`.
    pub fn parse_triton(text: &str, front_end: FrontEnd) -> Result<Restriction, String> {
        let (groups, credential) = text
            .split_once(':')
            .ok_or_else(|| format!("'{}': expected GROUPS:KEY=VALUE", redact(text)))?;
        let (header, value) = credential
            .split_once('=')
            .ok_or_else(|| format!("'{}': expected GROUPS:KEY=VALUE", redact(text)))?;
        let groups = groups
            .split(',')
            .map(|name| {
                EndpointGroup::parse(name.trim()).ok_or_else(|| {
                    format!(
                        "unknown endpoint group '{name}'; the groups: {}",
                        EndpointGroup::ALL.map(EndpointGroup::as_str).join(", ")
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut restriction = Restriction {
            groups,
            header: header.trim().to_string(),
            key_file: None,
            key_env: None,
            key_literal: None,
            front_ends: vec![front_end],
        };
        match KeySource::parse_triton(value) {
            KeySource::KeyFile(path) => restriction.key_file = Some(path),
            KeySource::KeyEnv(name) => restriction.key_env = Some(name),
            KeySource::Literal(secret) => restriction.key_literal = Some(secret),
        }
        Ok(restriction)
    }

    /// Where the key is: exactly one of `key_file`, `key_env` (or a key from
    /// the command line).
    pub fn key(&self) -> Result<KeySource, String> {
        match (&self.key_file, &self.key_env, &self.key_literal) {
            (Some(path), None, None) => Ok(KeySource::KeyFile(path.clone())),
            (None, Some(name), None) => Ok(KeySource::KeyEnv(name.clone())),
            (None, None, Some(secret)) => Ok(KeySource::Literal(secret.clone())),
            _ => Err(format!(
                "security.restricted ({}): give exactly one of key_file and key_env",
                self.groups
                    .iter()
                    .map(|g| g.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// `GROUPS:KEY=VALUE` with the value hidden, for error messages.
fn redact(text: &str) -> String {
    match text.split_once('=') {
        Some((before, _)) => format!("{before}=…"),
        None => text.to_string(),
    }
}

/// TLS on the front ends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Certificates of the CAs that sign client certificates (PEM). Given:
    /// mutual TLS, and a client without a certificate one of them signed is
    /// refused during the handshake.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// The front ends that speak TLS (both unless given).
    #[serde(default = "both_front_ends")]
    pub front_ends: Vec<FrontEnd>,
    /// How often the files are looked at; changed files are loaded for new
    /// connections (open ones keep theirs). SIGHUP loads them at once.
    #[serde(
        default = "default_reload_interval",
        deserialize_with = "super::duration"
    )]
    pub reload_interval: Duration,
}

fn default_reload_interval() -> Duration {
    Duration::from_secs(10)
}

impl SecurityConfig {
    /// Checks the settings that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        for front_end in [FrontEnd::Http, FrontEnd::Grpc] {
            let mut seen = Vec::new();
            for restriction in self
                .restricted
                .iter()
                .filter(|r| r.front_ends.contains(&front_end))
            {
                if restriction.header.is_empty()
                    || !restriction
                        .header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(format!(
                        "security.restricted: the header '{}' must be letters, digits, '-' and '_'",
                        restriction.header
                    ));
                }
                restriction.key()?;
                for group in &restriction.groups {
                    if seen.contains(group) {
                        return Err(format!(
                            "security.restricted: the group {} is restricted twice on {front_end:?}",
                            group.as_str()
                        ));
                    }
                    seen.push(*group);
                }
            }
        }
        if let Some(tls) = &self.tls {
            if tls.reload_interval.is_zero() {
                return Err("security.tls.reload_interval must be positive".into());
            }
            crate::durations::check(
                "security.tls.reload_interval",
                tls.reload_interval,
                crate::durations::MAX_TIMEOUT,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_syntax_parses_and_never_echoes_the_key() {
        let r = Restriction::parse_triton(
            "model-repository,statistics:admin-key=env:ADMIN_KEY",
            FrontEnd::Http,
        )
        .unwrap();
        assert_eq!(
            r.groups,
            [EndpointGroup::ModelRepository, EndpointGroup::Statistics]
        );
        assert_eq!(r.header, "admin-key");
        assert_eq!(r.key().unwrap(), KeySource::KeyEnv("ADMIN_KEY".into()));
        let literal = Restriction::parse_triton("inference:k=hunter2", FrontEnd::Grpc).unwrap();
        assert!(!format!("{literal:?}").contains("hunter2"));
        let error = Restriction::parse_triton("bogus:k=hunter2", FrontEnd::Grpc).unwrap_err();
        assert!(error.contains("unknown endpoint group 'bogus'"), "{error}");
        let error = Restriction::parse_triton("inference=hunter2", FrontEnd::Grpc).unwrap_err();
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn a_group_restricted_twice_and_an_empty_key_are_refused() {
        let config: SecurityConfig = toml::from_str(
            r#"
            [[restricted]]
            groups = ["inference"]
            header = "k"
            key_env = "A"
            [[restricted]]
            groups = ["inference", "metrics"]
            header = "j"
            key_env = "B"
            front_ends = ["http"]
            "#,
        )
        .unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.contains("inference is restricted twice"), "{error}");
        let empty = KeySource::KeyEnv("TICKSERVE_TEST_SURELY_UNSET".into());
        assert!(empty.read().unwrap_err().contains("not set"));
    }
}
