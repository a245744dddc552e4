//! Keys per endpoint group, on both ports: whether a route's group needs a
//! key on this port, and whether the request carries it. The group comes
//! from the port's route table ([`super::routes`]), the same parse the
//! handler serves; the refusal's answer from [`super::status`].
//!
//! A key comes either in the restriction's own header (Triton's syntax: the
//! header `KEY` over HTTP, the metadata `triton-grpc-protocol-KEY` over gRPC)
//! or as `Authorization: Bearer VALUE` (the scheme's name in any case, RFC
//! 7235). No key: HTTP 401 (with `WWW-Authenticate`) or gRPC UNAUTHENTICATED;
//! a wrong key: HTTP 403 or PERMISSION_DENIED. Each refusal is counted by
//! front end, group and reason. Keys are never logged or echoed, and are
//! compared as SHA-256 digests in constant time: neither the time nor the
//! answer depends on how long the key is or how much of it a guess got right.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tickserve_core::config::{EndpointGroup, FrontEnd, KeySource, SecurityConfig};
use tickserve_core::metrics as names;
use tickserve_core::sequence::KeyId;

use super::status;

/// The gRPC metadata prefix of Triton's restricted-protocol keys.
pub const GRPC_KEY_PREFIX: &str = "triton-grpc-protocol-";

/// The groups that need a key on one front end.
#[derive(Debug)]
pub struct Access {
    front_end: FrontEnd,
    guards: Vec<Guard>,
}

/// One restricted group: the header its key comes in, and the digests of the
/// keys it takes (a key file may hold several, one per line: one per client,
/// each its own identity for what binds to a key).
#[derive(Debug)]
struct Guard {
    group: EndpointGroup,
    header: HeaderName,
    digests: Vec<[u8; 32]>,
}

/// The SHA-256 digest of `key`: what keys are compared as.
fn digest_of(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The credentials of an `Authorization` header of the `Bearer` scheme.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    rest.get(start..)
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    /// It carried no key for its group.
    MissingKey,
    /// It carried a key, and not the right one.
    WrongKey,
}

impl KeyRefusal {
    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            KeyRefusal::MissingKey => "missing_key",
            KeyRefusal::WrongKey => "wrong_key",
        }
    }
}

impl Access {
    /// The restrictions of `config` on `front_end`, with their keys read.
    /// A key given on the command line is accepted with a warning.
    pub fn new(config: &SecurityConfig, front_end: FrontEnd) -> Result<Access, String> {
        let mut guards = Vec::new();
        for restriction in config
            .restricted
            .iter()
            .filter(|r| r.front_ends.contains(&front_end))
        {
            let source = restriction.key()?;
            if matches!(source, KeySource::Literal(_)) {
                tracing::warn!(
                    groups = ?restriction.groups,
                    "a key given on the command line is visible to every user of this host \
                     (ps, /proc); write VALUE as env:NAME or file:PATH"
                );
            }
            let digests: Vec<[u8; 32]> = source
                .read_all()?
                .iter()
                .map(|key| digest_of(key.expose()))
                .collect();
            let name = match front_end {
                FrontEnd::Http => restriction.header.to_ascii_lowercase(),
                FrontEnd::Grpc => {
                    format!(
                        "{GRPC_KEY_PREFIX}{}",
                        restriction.header.to_ascii_lowercase()
                    )
                }
            };
            let header = HeaderName::try_from(name.as_str())
                .map_err(|e| format!("security.restricted: the header '{name}': {e}"))?;
            for &group in &restriction.groups {
                guards.push(Guard {
                    group,
                    header: header.clone(),
                    digests: digests.clone(),
                });
            }
        }
        Ok(Access { front_end, guards })
    }

    /// Whether a request of `group` with `headers` may go on, and with which
    /// key (`None`: the group needs none).
    pub fn check(
        &self,
        group: EndpointGroup,
        headers: &HeaderMap,
    ) -> Result<Option<KeyId>, KeyRefusal> {
        let Some(guard) = self.guards.iter().find(|g| g.group == group) else {
            return Ok(None);
        };
        let own = headers.get(&guard.header).map(HeaderValue::as_bytes);
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()));
        if own.is_none() && bearer.is_none() {
            return Err(KeyRefusal::MissingKey);
        }
        // Every key compared, whichever matches: the time tells nothing.
        let mut found = None;
        for sent in [own, bearer].into_iter().flatten() {
            let sent = digest_of(sent);
            for digest in &guard.digests {
                if bool::from(sent.ct_eq(digest)) {
                    found = Some(*digest);
                }
            }
        }
        match found {
            Some(digest) => {
                let mut id = [0u8; 8];
                id.copy_from_slice(&digest[..8]);
                Ok(Some(KeyId(id)))
            }
            None => Err(KeyRefusal::WrongKey),
        }
    }

    /// Checks a request of `group` with `headers`; a refusal is counted and
    /// comes back as the edge's [`status::Refusal`], for the port to word.
    pub fn admit(
        &self,
        group: EndpointGroup,
        headers: &HeaderMap,
    ) -> Result<Option<KeyId>, status::Refusal> {
        let refusal = match self.check(group, headers) {
            Ok(key) => return Ok(key),
            Err(refusal) => refusal,
        };
        let protocol = match self.front_end {
            FrontEnd::Http => "http",
            FrontEnd::Grpc => "grpc",
        };
        metrics::counter!(
            names::ACCESS_REFUSED,
            "protocol" => protocol,
            "group" => group.as_str(),
            "reason" => refusal.as_str()
        )
        .increment(1);
        Err(match refusal {
            KeyRefusal::MissingKey => status::Refusal::MissingKey {
                group: group.as_str(),
                header: self
                    .guards
                    .iter()
                    .find(|g| g.group == group)
                    .map_or_else(String::new, |g| g.header.as_str().to_string()),
            },
            KeyRefusal::WrongKey => status::Refusal::WrongKey {
                group: group.as_str(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tickserve_core::config::Restriction;

    #[test]
    fn a_key_is_taken_from_its_header_or_bearer_and_compared_whole() {
        let mut restriction =
            Restriction::parse_triton("inference:Admin-Key=file:/nonexistent", FrontEnd::Grpc)
                .unwrap();
        restriction.key_file = None;
        restriction.key_literal = Some(match KeySource::parse_triton("s3cret") {
            KeySource::Literal(secret) => secret,
            other => panic!("{other:?}"),
        });
        let config = SecurityConfig {
            restricted: vec![restriction],
            ..Default::default()
        };
        let access = Access::new(&config, FrontEnd::Grpc).unwrap();
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(
                    HeaderName::try_from(*k).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            map
        };
        let group = EndpointGroup::Inference;
        assert_eq!(
            access.check(group, &headers(&[])),
            Err(KeyRefusal::MissingKey)
        );
        assert_eq!(
            access.check(
                group,
                &headers(&[("triton-grpc-protocol-admin-key", "s3cret")])
            ),
            Ok(Some(KeyId(digest_of(b"s3cret")[..8].try_into().unwrap())))
        );
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            assert_eq!(
                access.check(
                    group,
                    &headers(&[("authorization", &format!("{scheme}  s3cret"))])
                ),
                Ok(Some(KeyId(digest_of(b"s3cret")[..8].try_into().unwrap()))),
                "{scheme}"
            );
        }
        for other in [
            "Basic s3cret",
            "Bearers3cret",
            "s3cret",
            "Bearer",
            "Bearer ",
        ] {
            assert_eq!(
                access.check(group, &headers(&[("authorization", other)])),
                Err(KeyRefusal::MissingKey),
                "{other}"
            );
        }
        assert_eq!(
            access.check(group, &headers(&[("authorization", "bearer s3cre")])),
            Err(KeyRefusal::WrongKey)
        );
        for wrong in ["s3cre", "s3cret2", ""] {
            assert_eq!(
                access.check(
                    group,
                    &headers(&[("triton-grpc-protocol-admin-key", wrong)])
                ),
                Err(KeyRefusal::WrongKey),
                "{wrong}"
            );
        }
        assert_eq!(
            access.check(group, &headers(&[("admin-key", "s3cret")])),
            Err(KeyRefusal::MissingKey),
            "over gRPC the header carries Triton's prefix"
        );
        assert_eq!(access.check(EndpointGroup::Health, &headers(&[])), Ok(None));
    }

    #[test]
    fn a_key_file_of_several_keys_gives_each_its_own_identity() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "desk-a\n\n  desk-b  \n").unwrap();
        let text = format!("inference:k=file:{}", file.path().display());
        let config = SecurityConfig {
            restricted: vec![Restriction::parse_triton(&text, FrontEnd::Http).unwrap()],
            ..Default::default()
        };
        let access = Access::new(&config, FrontEnd::Http).unwrap();
        let with = |key: &str| {
            let mut map = HeaderMap::new();
            map.insert(
                HeaderName::from_static("k"),
                HeaderValue::from_str(key).unwrap(),
            );
            access.check(EndpointGroup::Inference, &map)
        };
        let (a, b) = (with("desk-a").unwrap(), with("desk-b").unwrap());
        assert!(a.is_some() && b.is_some() && a != b, "{a:?} {b:?}");
        assert_eq!(with("desk-a").unwrap(), a, "one key, one identity");
        assert_eq!(with("desk-c"), Err(KeyRefusal::WrongKey));
        assert_eq!(with(""), Err(KeyRefusal::WrongKey));
    }

    /// Each group's refusal names the header of that group's guard, not
    /// another's.
    #[test]
    fn a_missing_key_is_refused_naming_its_own_groups_header() {
        let config = SecurityConfig {
            restricted: vec![
                Restriction::parse_triton("inference:Infer-Key=a", FrontEnd::Http).unwrap(),
                Restriction::parse_triton("health:Health-Key=b", FrontEnd::Http).unwrap(),
            ],
            ..Default::default()
        };
        let access = Access::new(&config, FrontEnd::Http).unwrap();
        for (group, named) in [
            (EndpointGroup::Inference, "infer-key"),
            (EndpointGroup::Health, "health-key"),
        ] {
            match access.admit(group, &HeaderMap::new()) {
                Err(status::Refusal::MissingKey { header, .. }) => {
                    assert_eq!(header, named, "{group:?}")
                }
                other => panic!("{group:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn keys_are_compared_as_fixed_length_digests() {
        assert_eq!(digest_of(b"s3cret"), digest_of(b"s3cret"));
        assert_ne!(digest_of(b"s3cret"), digest_of(b"s3cre"));
        assert_eq!(digest_of(b"").len(), digest_of(&[7u8; 4096]).len());
    }
}
