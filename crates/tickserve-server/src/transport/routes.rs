//! The route tables, one per port: what a request path asks for, decoded
//! once, and the key group it belongs to.
//!
//! The HTTP port's table ([`HttpRoute::parse`]) is the only reader of an
//! HTTP path: the key check and the handler both see the route it returns,
//! so no spelling of a path can reach a handler by a way the key check read
//! differently. Each segment is percent-decoded once, after the path is split
//! on `/` (so `%2F` is part of a name, never a separator). A path that does
//! not parse is answered 404 whatever its key; it is never waved through.
//!
//! The gRPC port's table ([`grpc_group`]) names every method of every
//! service it serves; a method not in it is answered UNIMPLEMENTED before any
//! service sees it.

use std::borrow::Cow;

use tickserve_core::config::EndpointGroup;

/// A model, and the version asked for (`None`: the default version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// The model's name.
    pub model: String,
    /// `/versions/V`, as given.
    pub version: Option<String>,
}

/// What a v2 endpoint under `/v2/models/NAME[/versions/V]` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelEndpoint {
    /// `GET` the model's metadata.
    Metadata,
    /// `GET .../ready`.
    Ready,
    /// `GET .../config`.
    Config,
    /// `GET .../stats`.
    Stats,
    /// `POST .../infer`.
    Infer,
    /// `GET .../sequences`: a stateful model's sequences.
    Sequences,
    /// `POST .../sequences/read`.
    SequenceRead,
    /// `POST .../sequences/write`.
    SequenceWrite,
    /// `POST .../sequences/drop`.
    SequenceDrop,
    /// `POST .../versions/V/halt`: the kill switch.
    Halt,
    /// `POST .../versions/V/resume`.
    Resume,
}

/// What a TF Serving path under `/v1/models/` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfRoute {
    /// The model.
    pub model: String,
    /// `/versions/N`, as given.
    pub version: Option<String>,
    /// `/labels/L`.
    pub label: Option<String>,
    /// `:predict`, `:classify`, `:regress`.
    pub verb: Option<String>,
    /// `/metadata`.
    pub metadata: bool,
}

impl TfRoute {
    /// The version asked for: `/versions/N` or `/labels/L` (the registry
    /// reads either), `None` for the default.
    pub fn asked(&self) -> Option<&str> {
        self.version.as_deref().or(self.label.as_deref())
    }
}

/// Which method an endpoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET` (and `HEAD`).
    Get,
    /// `POST`.
    Post,
    /// Either (TF Serving's paths: their handler words a wrong method the
    /// way TF Serving does).
    Any,
}

/// Every endpoint of the HTTP port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpRoute {
    /// `GET /v2/health/live`.
    Live,
    /// `GET /v2/health/ready`.
    Ready,
    /// `GET /v2`: server metadata.
    ServerMetadata,
    /// `GET /metrics`: Prometheus.
    Metrics,
    /// `GET /v2/models/stats`: every model's statistics.
    AllStats,
    /// An endpoint of one model.
    Model(ModelRef, ModelEndpoint),
    /// `POST /v2/repository/index`.
    RepositoryIndex,
    /// `POST /v2/repository/models/NAME/load`.
    RepositoryLoad(String),
    /// `POST /v2/repository/models/NAME/unload`.
    RepositoryUnload(String),
    /// TF Serving's REST API.
    TfServing(TfRoute),
    /// A path under `/v1/models/` TF Serving would not read: answered 400
    /// with TF Serving's words (nothing of a model is touched).
    TfMalformed(String),
}

/// Percent-decodes one path segment (borrowed when it has no escape);
/// `None` for a bad escape or bytes that are not UTF-8.
fn decode(segment: &str) -> Option<Cow<'_, str>> {
    let bytes = segment.as_bytes();
    if !bytes.contains(&b'%') {
        return Some(Cow::Borrowed(segment));
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

impl HttpRoute {
    /// The route of a request path (without its query), or `None` when
    /// tickserve serves nothing there.
    pub fn parse(path: &str) -> Option<HttpRoute> {
        let rest = path.strip_prefix('/')?;
        // One allocation for the list; a segment only when it was encoded.
        let segments: Vec<Cow<'_, str>> = rest.split('/').map(decode).collect::<Option<_>>()?;
        if segments.iter().any(|s| s.is_empty()) {
            return None;
        }
        let s: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
        Some(match s.as_slice() {
            ["metrics"] => HttpRoute::Metrics,
            ["v2"] => HttpRoute::ServerMetadata,
            ["v2", "health", "live"] => HttpRoute::Live,
            ["v2", "health", "ready"] => HttpRoute::Ready,
            ["v2", "models", "stats"] => HttpRoute::AllStats,
            ["v2", "repository", "index"] => HttpRoute::RepositoryIndex,
            ["v2", "repository", "models", model, "load"] => {
                HttpRoute::RepositoryLoad((*model).to_string())
            }
            ["v2", "repository", "models", model, "unload"] => {
                HttpRoute::RepositoryUnload((*model).to_string())
            }
            ["v2", "models", model, "versions", version, tail @ ..] => {
                let model = ModelRef {
                    model: (*model).to_string(),
                    version: Some((*version).to_string()),
                };
                HttpRoute::Model(model, model_endpoint(tail)?)
            }
            ["v2", "models", model, tail @ ..] => {
                let model = ModelRef {
                    model: (*model).to_string(),
                    version: None,
                };
                HttpRoute::Model(model, model_endpoint(tail)?)
            }
            ["v1", "models", tail @ ..] if !tail.is_empty() => match parse_tf(&tail.join("/")) {
                Ok(route) => HttpRoute::TfServing(route),
                Err(message) => HttpRoute::TfMalformed(message),
            },
            _ => return None,
        })
    }

    /// The key group the route belongs to.
    pub fn group(&self) -> EndpointGroup {
        match self {
            HttpRoute::Live | HttpRoute::Ready => EndpointGroup::Health,
            HttpRoute::ServerMetadata => EndpointGroup::Metadata,
            HttpRoute::Metrics => EndpointGroup::Metrics,
            HttpRoute::AllStats => EndpointGroup::Statistics,
            HttpRoute::RepositoryIndex
            | HttpRoute::RepositoryLoad(_)
            | HttpRoute::RepositoryUnload(_) => EndpointGroup::ModelRepository,
            HttpRoute::Model(_, endpoint) => match endpoint {
                ModelEndpoint::Metadata => EndpointGroup::Metadata,
                ModelEndpoint::Ready => EndpointGroup::Health,
                ModelEndpoint::Config => EndpointGroup::ModelConfig,
                ModelEndpoint::Stats => EndpointGroup::Statistics,
                ModelEndpoint::Infer => EndpointGroup::Inference,
                ModelEndpoint::Sequences
                | ModelEndpoint::SequenceRead
                | ModelEndpoint::SequenceWrite
                | ModelEndpoint::SequenceDrop => EndpointGroup::ModelRepository,
                ModelEndpoint::Halt | ModelEndpoint::Resume => EndpointGroup::Risk,
            },
            HttpRoute::TfServing(route) if route.verb.is_some() => EndpointGroup::Inference,
            HttpRoute::TfServing(route) if route.metadata => EndpointGroup::Metadata,
            HttpRoute::TfServing(_) => EndpointGroup::Health,
            // The strictest group: a malformed path reads nothing, and a
            // client without the inference key learns nothing from it.
            HttpRoute::TfMalformed(_) => EndpointGroup::Inference,
        }
    }

    /// The method the route's endpoint takes.
    pub fn method(&self) -> Method {
        match self {
            HttpRoute::Live
            | HttpRoute::Ready
            | HttpRoute::ServerMetadata
            | HttpRoute::Metrics
            | HttpRoute::AllStats => Method::Get,
            HttpRoute::RepositoryIndex
            | HttpRoute::RepositoryLoad(_)
            | HttpRoute::RepositoryUnload(_) => Method::Post,
            HttpRoute::Model(_, endpoint) => match endpoint {
                ModelEndpoint::Metadata
                | ModelEndpoint::Ready
                | ModelEndpoint::Config
                | ModelEndpoint::Stats
                | ModelEndpoint::Sequences => Method::Get,
                ModelEndpoint::Infer
                | ModelEndpoint::SequenceRead
                | ModelEndpoint::SequenceWrite
                | ModelEndpoint::SequenceDrop
                | ModelEndpoint::Halt
                | ModelEndpoint::Resume => Method::Post,
            },
            HttpRoute::TfServing(_) | HttpRoute::TfMalformed(_) => Method::Any,
        }
    }
}

/// The endpoint after `/v2/models/NAME[/versions/V]`.
fn model_endpoint(tail: &[&str]) -> Option<ModelEndpoint> {
    Some(match tail {
        [] => ModelEndpoint::Metadata,
        ["ready"] => ModelEndpoint::Ready,
        ["config"] => ModelEndpoint::Config,
        ["stats"] => ModelEndpoint::Stats,
        ["infer"] => ModelEndpoint::Infer,
        ["sequences"] => ModelEndpoint::Sequences,
        ["sequences", "read"] => ModelEndpoint::SequenceRead,
        ["sequences", "write"] => ModelEndpoint::SequenceWrite,
        ["sequences", "drop"] => ModelEndpoint::SequenceDrop,
        ["halt"] => ModelEndpoint::Halt,
        ["resume"] => ModelEndpoint::Resume,
        _ => return None,
    })
}

/// Parses the decoded part of a TF Serving path after `/v1/models/`, as TF
/// Serving reads it; `Err` with TF Serving's words when it would not.
pub fn parse_tf(path: &str) -> Result<TfRoute, String> {
    let malformed = || {
        format!(
            "malformed request: /v1/models/{path} (expected \
             /v1/models/NAME[/versions/N][:predict] or .../metadata)"
        )
    };
    let (rest, metadata) = match path.strip_suffix("/metadata") {
        Some(rest) => (rest, true),
        None => (path, false),
    };
    let (rest, verb) = match rest.rsplit_once(':') {
        Some((rest, verb)) => (rest, Some(verb.to_string())),
        None => (rest, None),
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let (model, version, label) = match segments.as_slice() {
        [model] => (*model, None, None),
        [model, "versions", n] => {
            if n.parse::<i64>().map_or(true, |n| n < 0) {
                return Err(format!(
                    "failed to convert version \"{n}\" of /v1/models/{path} to a version number"
                ));
            }
            (*model, Some((*n).to_string()), None)
        }
        [model, "labels", label] => (*model, None, Some((*label).to_string())),
        _ => return Err(malformed()),
    };
    if model.is_empty() || (metadata && verb.is_some()) {
        return Err(malformed());
    }
    Ok(TfRoute {
        model: model.to_string(),
        version,
        label,
        verb,
        metadata,
    })
}

/// Every gRPC method the gRPC port serves, with its key group: the port's
/// one table. `grpc.health.v1.Health` is matched by its service.
const GRPC_METHODS: [(&str, EndpointGroup); 21] = [
    (
        "/inference.GRPCInferenceService/ServerLive",
        EndpointGroup::Health,
    ),
    (
        "/inference.GRPCInferenceService/ServerReady",
        EndpointGroup::Health,
    ),
    (
        "/inference.GRPCInferenceService/ModelReady",
        EndpointGroup::Health,
    ),
    (
        "/inference.GRPCInferenceService/ServerMetadata",
        EndpointGroup::Metadata,
    ),
    (
        "/inference.GRPCInferenceService/ModelMetadata",
        EndpointGroup::Metadata,
    ),
    (
        "/inference.GRPCInferenceService/ModelInfer",
        EndpointGroup::Inference,
    ),
    (
        "/inference.GRPCInferenceService/ModelStreamInfer",
        EndpointGroup::Inference,
    ),
    (
        "/inference.GRPCInferenceService/ModelConfig",
        EndpointGroup::ModelConfig,
    ),
    (
        "/inference.GRPCInferenceService/ModelStatistics",
        EndpointGroup::Statistics,
    ),
    (
        "/inference.GRPCInferenceService/RepositoryIndex",
        EndpointGroup::ModelRepository,
    ),
    (
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        EndpointGroup::ModelRepository,
    ),
    (
        "/inference.GRPCInferenceService/RepositoryModelUnload",
        EndpointGroup::ModelRepository,
    ),
    (
        "/tensorflow.serving.PredictionService/Predict",
        EndpointGroup::Inference,
    ),
    (
        "/tensorflow.serving.PredictionService/GetModelMetadata",
        EndpointGroup::Metadata,
    ),
    (
        "/tensorflow.serving.ModelService/GetModelStatus",
        EndpointGroup::Health,
    ),
    (
        "/tickserve.SequenceService/SequenceList",
        EndpointGroup::ModelRepository,
    ),
    ("/tickserve.RiskService/ModelHalt", EndpointGroup::Risk),
    ("/tickserve.RiskService/ModelResume", EndpointGroup::Risk),
    (
        "/tickserve.SequenceService/SequenceStateRead",
        EndpointGroup::ModelRepository,
    ),
    (
        "/tickserve.SequenceService/SequenceStateWrite",
        EndpointGroup::ModelRepository,
    ),
    (
        "/tickserve.SequenceService/SequenceDrop",
        EndpointGroup::ModelRepository,
    ),
];

/// The gRPC health service, whose methods (Check, Watch) are all health.
const GRPC_HEALTH: &str = "/grpc.health.v1.Health/";

/// The key group of a gRPC method path, or `None` for a method the port
/// does not serve.
pub fn grpc_group(path: &str) -> Option<EndpointGroup> {
    if let Some(method) = path.strip_prefix(GRPC_HEALTH) {
        return matches!(method, "Check" | "Watch").then_some(EndpointGroup::Health);
    }
    GRPC_METHODS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, group)| *group)
}

/// Every gRPC method path of the table, health's included.
#[cfg(test)]
fn grpc_methods() -> impl Iterator<Item = (&'static str, EndpointGroup)> {
    GRPC_METHODS.iter().copied().chain([
        ("/grpc.health.v1.Health/Check", EndpointGroup::Health),
        ("/grpc.health.v1.Health/Watch", EndpointGroup::Health),
    ])
}

#[cfg(test)]
mod tests;
