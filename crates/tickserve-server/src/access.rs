//! Keys per endpoint group, on both front ends: which group a request
//! belongs to, whether that group needs a key on this front end, and whether
//! the request carries it.
//!
//! A key comes either in the restriction's own header (Triton's syntax: the
//! header `KEY` over HTTP, the metadata `triton-grpc-protocol-KEY` over gRPC)
//! or as `Authorization: Bearer VALUE`. No key: HTTP 401 (with
//! `WWW-Authenticate`) or gRPC UNAUTHENTICATED; a wrong key: HTTP 403 or
//! PERMISSION_DENIED. Each refusal is counted by front end, group and reason.
//! Keys are compared in constant time and never logged or echoed.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq;
use tickserve_core::config::{EndpointGroup, FrontEnd, KeySource, SecurityConfig};
use tickserve_core::metrics as names;

/// The gRPC metadata prefix of Triton's restricted-protocol keys.
pub const GRPC_KEY_PREFIX: &str = "triton-grpc-protocol-";

/// The groups that need a key on one front end.
#[derive(Debug)]
pub struct Access {
    front_end: FrontEnd,
    guards: Vec<Guard>,
}

/// One restricted group: the header its key comes in, and the key.
#[derive(Debug)]
struct Guard {
    group: EndpointGroup,
    header: HeaderName,
    key: tickserve_core::config::Secret,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It carried no key for its group.
    MissingKey,
    /// It carried a key, and not the right one.
    WrongKey,
}

impl Refusal {
    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingKey => "missing_key",
            Refusal::WrongKey => "wrong_key",
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
            let key = source.read()?;
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
                    key: key.clone(),
                });
            }
        }
        Ok(Access { front_end, guards })
    }

    /// Whether any group needs a key on this front end.
    pub fn restricts_anything(&self) -> bool {
        !self.guards.is_empty()
    }

    /// Whether a request of `group` with `headers` may go on.
    pub fn check(&self, group: EndpointGroup, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(guard) = self.guards.iter().find(|g| g.group == group) else {
            return Ok(());
        };
        let own = headers.get(&guard.header).map(HeaderValue::as_bytes);
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if own.is_none() && bearer.is_none() {
            return Err(Refusal::MissingKey);
        }
        let expected = guard.key.expose();
        let matches = |sent: Option<&[u8]>| sent.is_some_and(|s| bool::from(s.ct_eq(expected)));
        if matches(own) || matches(bearer) {
            Ok(())
        } else {
            Err(Refusal::WrongKey)
        }
    }

    /// The answer to a refused request, as this front end words it.
    fn refuse(&self, group: EndpointGroup, refusal: Refusal) -> Response {
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
        let header = self
            .guards
            .iter()
            .find(|g| g.group == group)
            .map_or("", |g| g.header.as_str());
        let message = match refusal {
            Refusal::MissingKey => format!(
                "the {} endpoints need a key: send it as '{header}: KEY' or \
                 'Authorization: Bearer KEY'",
                group.as_str()
            ),
            Refusal::WrongKey => format!(
                "the key sent for the {} endpoints is not the right one",
                group.as_str()
            ),
        };
        match (self.front_end, refusal) {
            (FrontEnd::Http, Refusal::MissingKey) => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"tickserve\"")],
                axum::Json(json!({ "error": message })),
            )
                .into_response(),
            (FrontEnd::Http, Refusal::WrongKey) => (
                StatusCode::FORBIDDEN,
                axum::Json(json!({ "error": message })),
            )
                .into_response(),
            (FrontEnd::Grpc, Refusal::MissingKey) => {
                tonic::Status::unauthenticated(message).into_http::<axum::body::Body>()
            }
            (FrontEnd::Grpc, Refusal::WrongKey) => {
                tonic::Status::permission_denied(message).into_http::<axum::body::Body>()
            }
        }
    }
}

/// The group of an HTTP request path; `None` for paths tickserve does not
/// serve (they answer 404 whatever the key).
pub fn http_group(path: &str) -> Option<EndpointGroup> {
    let path = path.strip_suffix('/').unwrap_or(path);
    if path == "/metrics" {
        return Some(EndpointGroup::Metrics);
    }
    if path == "/v2" {
        return Some(EndpointGroup::Metadata);
    }
    if path.starts_with("/v2/health/") {
        return Some(EndpointGroup::Health);
    }
    if path.starts_with("/v2/repository/") {
        return Some(EndpointGroup::ModelRepository);
    }
    if let Some(tf_path) = path.strip_prefix("/v1/models/") {
        // TF Serving's REST API, read by the same parser as its handlers.
        let target = crate::tfserving::rest::parse(tf_path).ok()?;
        return Some(if target.verb.is_some() {
            EndpointGroup::Inference
        } else if target.metadata {
            EndpointGroup::Metadata
        } else {
            EndpointGroup::Health
        });
    }
    let rest = path.strip_prefix("/v2/models/")?;
    if rest == "stats" {
        return Some(EndpointGroup::Statistics);
    }
    let mut parts = rest.split('/');
    let _model = parts.next()?;
    let tail: Vec<&str> = parts.collect();
    // The sequence-state API: [versions, V] then sequences[/read|write|drop].
    let sequence_api = match tail.as_slice() {
        ["versions", _, "sequences", rest @ ..] | ["sequences", rest @ ..] => Some(rest),
        _ => None,
    };
    if let Some(rest) = sequence_api {
        return matches!(rest, [] | ["read" | "write" | "drop"])
            .then_some(EndpointGroup::ModelRepository);
    }
    // [versions, V] then the endpoint's own segment, if any.
    let last = match tail.as_slice() {
        ["versions", _] | [] => None,
        ["versions", _, last] | [last] => Some(*last),
        _ => return None,
    };
    Some(match last {
        None => EndpointGroup::Metadata,
        Some("ready") => EndpointGroup::Health,
        Some("infer") => EndpointGroup::Inference,
        Some("config") => EndpointGroup::ModelConfig,
        Some("stats") => EndpointGroup::Statistics,
        Some(_) => return None,
    })
}

/// The group of a gRPC method path (`/inference.GRPCInferenceService/ModelInfer`).
pub fn grpc_group(path: &str) -> Option<EndpointGroup> {
    if path.starts_with("/grpc.health.v1.Health/") {
        return Some(EndpointGroup::Health);
    }
    match path {
        "/tensorflow.serving.PredictionService/Predict" => return Some(EndpointGroup::Inference),
        "/tensorflow.serving.PredictionService/GetModelMetadata" => {
            return Some(EndpointGroup::Metadata);
        }
        "/tensorflow.serving.ModelService/GetModelStatus" => return Some(EndpointGroup::Health),
        _ => {}
    }
    if path.starts_with("/tickserve.SequenceService/") {
        return Some(EndpointGroup::ModelRepository);
    }
    let method = path.strip_prefix("/inference.GRPCInferenceService/")?;
    Some(match method {
        "ServerLive" | "ServerReady" | "ModelReady" => EndpointGroup::Health,
        "ServerMetadata" | "ModelMetadata" => EndpointGroup::Metadata,
        "ModelInfer" | "ModelStreamInfer" => EndpointGroup::Inference,
        "ModelConfig" => EndpointGroup::ModelConfig,
        "ModelStatistics" => EndpointGroup::Statistics,
        "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
            EndpointGroup::ModelRepository
        }
        _ => return None,
    })
}

/// The middleware: refuses a request of a restricted group without its key.
pub async fn guard(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let group = match access.front_end {
        FrontEnd::Http => http_group(path),
        FrontEnd::Grpc => grpc_group(path),
    };
    if let Some(group) = group
        && let Err(refusal) = access.check(group, request.headers())
    {
        return access.refuse(group, refusal);
    }
    next.run(request).await
}

/// `router` behind `access` (unchanged when nothing is restricted).
pub fn apply(router: axum::Router, access: Arc<Access>) -> axum::Router {
    if access.restricts_anything() {
        router.layer(axum::middleware::from_fn_with_state(access, guard))
    } else {
        router
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tickserve_core::config::Restriction;

    #[test]
    fn every_served_path_has_its_group() {
        use EndpointGroup as G;
        for (path, group) in [
            ("/v2/health/live", Some(G::Health)),
            ("/v2/health/ready", Some(G::Health)),
            ("/v2/models/m/ready", Some(G::Health)),
            ("/v2/models/m/versions/2/ready", Some(G::Health)),
            ("/v2", Some(G::Metadata)),
            ("/v2/models/m", Some(G::Metadata)),
            ("/v2/models/m/versions/2", Some(G::Metadata)),
            ("/v2/models/m/infer", Some(G::Inference)),
            ("/v2/models/m/versions/2/infer", Some(G::Inference)),
            ("/v2/models/m/config", Some(G::ModelConfig)),
            ("/v2/models/m/stats", Some(G::Statistics)),
            ("/v2/models/stats", Some(G::Statistics)),
            ("/v2/repository/index", Some(G::ModelRepository)),
            ("/v2/repository/models/m/unload", Some(G::ModelRepository)),
            ("/v2/models/m/sequences", Some(G::ModelRepository)),
            ("/v2/models/m/sequences/read", Some(G::ModelRepository)),
            (
                "/v2/models/m/versions/2/sequences/write",
                Some(G::ModelRepository),
            ),
            ("/v2/models/m/sequences/drop", Some(G::ModelRepository)),
            ("/v2/models/m/sequences/other", None),
            ("/metrics", Some(G::Metrics)),
            ("/v1/models/m:predict", Some(G::Inference)),
            ("/v1/models/m/versions/3:predict", Some(G::Inference)),
            ("/v1/models/m/metadata", Some(G::Metadata)),
            ("/v1/models/m", Some(G::Health)),
            ("/v1/models/m/versions/3", Some(G::Health)),
            ("/v1/models/m/bogus/path", None),
            ("/v2/models/m/bogus", None),
            ("/elsewhere", None),
        ] {
            assert_eq!(http_group(path), group, "{path}");
        }
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/ModelStreamInfer"),
            Some(G::Inference)
        );
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/RepositoryModelUnload"),
            Some(G::ModelRepository)
        );
        assert_eq!(
            grpc_group("/tickserve.SequenceService/SequenceStateWrite"),
            Some(G::ModelRepository)
        );
        assert_eq!(grpc_group("/grpc.health.v1.Health/Check"), Some(G::Health));
        assert_eq!(
            grpc_group("/tensorflow.serving.PredictionService/Predict"),
            Some(G::Inference)
        );
        assert_eq!(
            grpc_group("/tensorflow.serving.ModelService/GetModelStatus"),
            Some(G::Health)
        );
    }

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
        assert_eq!(access.check(group, &headers(&[])), Err(Refusal::MissingKey));
        assert_eq!(
            access.check(
                group,
                &headers(&[("triton-grpc-protocol-admin-key", "s3cret")])
            ),
            Ok(())
        );
        assert_eq!(
            access.check(group, &headers(&[("authorization", "Bearer s3cret")])),
            Ok(())
        );
        for wrong in ["s3cre", "s3cret2", ""] {
            assert_eq!(
                access.check(
                    group,
                    &headers(&[("triton-grpc-protocol-admin-key", wrong)])
                ),
                Err(Refusal::WrongKey),
                "{wrong}"
            );
        }
        assert_eq!(
            access.check(group, &headers(&[("admin-key", "s3cret")])),
            Err(Refusal::MissingKey),
            "over gRPC the header carries Triton's prefix"
        );
        assert_eq!(access.check(EndpointGroup::Health, &headers(&[])), Ok(()));
    }
}
