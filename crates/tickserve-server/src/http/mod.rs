//! The HTTP front end of the KServe v2 protocol: `/v2/...`, with Triton's
//! model-config, statistics and repository extensions, and the
//! sequence-state API ([`sequences`]).
//!
//! Each handler takes the route the HTTP port's table parsed
//! ([`crate::transport::routes`]) and answers; inference goes through the edge's
//! pipeline ([`tickserve_edge::infer`]). Errors are `{"error": "..."}` with the
//! status of their kind ([`crate::transport::status`]).

pub mod codec;
pub(crate) mod fast;
mod reply;
pub(crate) mod request_header;
pub mod risk;
pub mod sequences;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tickserve_core::Error;
use tickserve_runtime::ModelHandle;

use crate::control;
use crate::identity::{EXTENSIONS, SERVER_NAME, SERVER_VERSION};
use crate::model_view::{ModelConfigView, StatisticsView};
use crate::transport::headers::InferHeaders;
use crate::transport::routes::ModelRef;
use crate::transport::status::HttpError;
use crate::transport::{body, entrance::Entrance, sequence_key};
use tickserve_edge::observe::Protocol;
use tickserve_edge::{Decoded, Edge, Payload};

/// The most bytes of a repository or sequence-state request's JSON body.
const SMALL_BODY_BYTES: usize = 64 * 1024;

/// `GET /v2/health/ready`.
pub fn server_ready(edge: &Edge) -> StatusCode {
    if edge.server_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// `GET /v2`.
pub fn server_metadata() -> Response {
    axum::Json(json!({ "name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS }))
        .into_response()
}

fn lookup(edge: &Edge, model: &ModelRef) -> Result<Arc<ModelHandle>, HttpError> {
    Ok(edge.runtime.model(&model.model, model.version.as_deref())?)
}

/// `GET /v2/models/NAME[/versions/V]`.
pub fn model_metadata(edge: &Edge, model: &ModelRef) -> Result<Response, HttpError> {
    let handle = lookup(edge, model)?;
    let models = edge.runtime.models();
    let tensors = |specs: &[tickserve_core::TensorSpec]| -> Vec<Value> {
        specs
            .iter()
            .map(|t| json!({ "name": t.name, "datatype": t.datatype.as_str(), "shape": t.protocol_shape() }))
            .collect()
    };
    Ok(axum::Json(json!({
        "name": handle.name,
        "versions": models.get(handle.name.as_str()).map(|m| m.ready_versions()).unwrap_or_default(),
        "platform": ModelConfigView::of(&handle.name, &handle.loaded).platform,
        "inputs": tensors(&handle.signature.inputs),
        "outputs": tensors(&handle.signature.outputs),
        "parameters": { "family": handle.family_key },
    }))
    .into_response())
}

/// `GET .../ready`.
pub fn model_ready(edge: &Edge, model: &ModelRef) -> Result<StatusCode, HttpError> {
    let handle = lookup(edge, model)?;
    Ok(if edge.model_ready(&handle) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    })
}

/// `GET .../config`.
pub fn model_config(edge: &Edge, model: &ModelRef) -> Result<Response, HttpError> {
    let handle = lookup(edge, model)?;
    Ok(axum::Json(ModelConfigView::of(&handle.name, &handle.loaded)).into_response())
}

/// `GET .../stats`.
pub fn model_stats(edge: &Edge, model: &ModelRef) -> Result<Response, HttpError> {
    let handle = lookup(edge, model)?;
    Ok(axum::Json(json!({ "model_stats": [StatisticsView::of(&handle)] })).into_response())
}

/// `GET /v2/models/stats`.
pub fn all_stats(edge: &Edge) -> Response {
    let stats: Vec<StatisticsView> = edge
        .runtime
        .ready_handles()
        .iter()
        .map(|h| StatisticsView::of(h))
        .collect();
    axum::Json(json!({ "model_stats": stats })).into_response()
}

/// A v2 JSON body (with the binary extension's split, if any), undecoded.
struct JsonBody {
    body: bytes::Bytes,
    /// The `Inference-Header-Content-Length` header, as it came.
    header_length: Option<HeaderValue>,
}

impl Payload for JsonBody {
    type Encoding = codec::Binary;

    fn decode_bytes(&self) -> usize {
        self.body.len()
    }

    fn decode(self, handle: &ModelHandle) -> Result<Decoded<codec::Binary>, Error> {
        let header_length = match self.header_length {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.parse::<usize>().ok())
                    .ok_or_else(|| {
                        Error::request(
                            &handle.name,
                            format!("the {} header is not a byte count", codec::HEADER_LENGTH),
                        )
                    })?,
            ),
        };
        codec::decode(&handle.name, &self.body, header_length, &handle.signature)
    }
}

/// `POST .../infer`.
#[allow(clippy::disallowed_methods)] // request latency is the machine's time
pub async fn infer(
    edge: &Arc<Edge>,
    model: &ModelRef,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
    body: Body,
) -> Response {
    let started = Instant::now();
    let found = InferHeaders::of(headers, Some(&codec::HEADER_LENGTH_NAME));
    let body = match body::read_request(edge, &model.model, found.content_length, body).await {
        Ok(body) => body,
        Err(e) => {
            return HttpError(edge.refuse(Protocol::Http, &model.model, started, e))
                .into_response();
        }
    };
    let entrance = Entrance::http(&found, extensions, body.len(), started);
    // An HTTP/2 connection's first answer may teach the timing names.
    let teach = entrance.first_on_connection();
    let call = entrance.call(Protocol::Http, &model.model, model.version.as_deref(), || 0);
    let payload = JsonBody {
        body,
        header_length: found.own.cloned(),
    };
    let answer = match edge.infer(call, payload).await {
        Ok(answer) => answer,
        Err(e) => return HttpError(e).into_response(),
    };
    let response = answer.response;
    let binary = answer.encoding.flags(response.outputs.len());
    let encoded = codec::encode(&response, &binary);
    let timing = edge.timing_headers.then_some((&response.timing, teach));
    let mut headers = reply::headers(encoded.body.len(), encoded.header_length, timing);
    if let Some(value) = answer
        .sequence
        .and_then(|s| axum::http::HeaderValue::from_str(&s).ok())
    {
        headers.insert(sequence_key::NAME.clone(), value);
    }
    let mut reply = Response::new(Body::from(encoded.body));
    *reply.headers_mut() = headers;
    reply
}

/// `POST /v2/repository/index`: every model of the repository with its state;
/// a body `{"ready": true}` keeps only the versions that serve.
pub async fn repository_index(
    edge: &Arc<Edge>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let body = body::read("", body, SMALL_BODY_BYTES, body::declared_length(headers)).await?;
    let ready_only = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("ready").and_then(Value::as_bool))
        .unwrap_or(false);
    let entries = control::index(edge, ready_only).await?;
    Ok(axum::Json(Value::Array(
        entries
            .into_iter()
            .map(|e| {
                let mut entry = json!({ "name": e.name, "state": e.state });
                if !e.version.is_empty() {
                    entry["version"] = json!(e.version);
                }
                if !e.reason.is_empty() {
                    entry["reason"] = json!(e.reason);
                }
                entry
            })
            .collect(),
    ))
    .into_response())
}

/// `POST /v2/repository/models/NAME/load` or `/unload`: loads (or reloads)
/// the model, or stops serving it once its requests in flight are answered;
/// a failed load leaves what served before serving (400 with the reason).
pub async fn repository_change(
    edge: &Arc<Edge>,
    operation: control::Operation,
    model: String,
) -> Result<Response, HttpError> {
    control::change(edge, Protocol::Http, operation, model).await?;
    Ok(axum::Json(json!({})).into_response())
}
