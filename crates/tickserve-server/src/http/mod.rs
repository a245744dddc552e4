//! The HTTP front end: KServe v2 REST (`/v2/...`), Triton's model-config and
//! statistics extensions, and `/metrics` for Prometheus.
//!
//! Handlers decode with [`codec`], call the runtime, and encode; errors are
//! `{"error": "..."}` with the status of their kind.

pub mod codec;
pub mod sequences;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tickserve_core::durations;
use tickserve_core::{Error, ErrorKind};
use tickserve_runtime::ModelHandle;
use tokio::sync::watch;

use crate::access::Access;
use crate::listen::{self, ConnectionLimits};
use crate::model_view::{ModelConfigView, StatisticsView};
use crate::observe::{self, Protocol};
use crate::tls::Tls;
use crate::{
    COMPUTE_TIME_HEADER, EXTENSIONS, QUEUE_TIME_HEADER, SERVER_NAME, SERVER_VERSION, Shared,
    control,
};

/// Serves HTTP on `listener` behind `access`, over `tls` when
/// given, within `limits`, until `stop`
/// turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    access: Arc<Access>,
    tls: Option<Arc<Tls>>,
    limits: Arc<ConnectionLimits>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let router = crate::access::apply(router(shared), access);
    listen::serve(listener, router, tls, limits, "http", stop).await
}

/// The HTTP routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready),
        )
        .route("/v2/models/{model}/config", get(model_config))
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(model_config),
        )
        .route("/v2/models/{model}/stats", get(model_stats))
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(model_stats),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .route("/v2/models/{model}/sequences", get(sequences::list))
        .route(
            "/v2/models/{model}/versions/{version}/sequences",
            get(sequences::list),
        )
        .route("/v2/models/{model}/sequences/read", post(sequences::read))
        .route(
            "/v2/models/{model}/versions/{version}/sequences/read",
            post(sequences::read),
        )
        .route("/v2/models/{model}/sequences/write", post(sequences::write))
        .route(
            "/v2/models/{model}/versions/{version}/sequences/write",
            post(sequences::write),
        )
        .route(
            "/v2/models/{model}/sequences/drop",
            post(sequences::drop_sequence),
        )
        .route(
            "/v2/models/{model}/versions/{version}/sequences/drop",
            post(sequences::drop_sequence),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(repository_load))
        .route(
            "/v2/repository/models/{model}/unload",
            post(repository_unload),
        )
        .route(
            "/v1/models/{*path}",
            get(crate::tfserving::rest::get).post(crate::tfserving::rest::post),
        )
        .route(
            "/metrics",
            get(|State(shared): State<Arc<Shared>>| async move {
                shared.runtime.refresh_readiness();
                observe::render()
            }),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(shared)
}

/// 404 for a path tickserve does not serve, with the JSON error body every
/// other error has.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let message = format!("no endpoint {method} {}", uri.path());
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": message })),
    )
        .into_response()
}

/// 405 for a method an endpoint does not take (a GET on an infer URL, say),
/// with the JSON error body.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let message = format!(
        "{} does not take {method}; see docs/protocol.md for each endpoint's method",
        uri.path()
    );
    (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(json!({ "error": message })),
    )
        .into_response()
}

/// How much of an oversized body is read and dropped before the 413 goes out.
/// Closing a connection with unread request bytes makes the kernel reset it,
/// and the client then sees a reset instead of the 413; bodies up to this many
/// times the limit are drained so the client reads the answer.
const DRAIN_FACTOR: usize = 4;

/// Reads a request body of at most `limit` bytes. An oversized body is
/// answered 413; it is drained first unless it is far too large.
pub(crate) async fn read_body(
    model: &str,
    body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<bytes::Bytes, Error> {
    use http_body_util::BodyExt;
    let cap = limit.saturating_mul(DRAIN_FACTOR);
    if let Some(len) = declared.filter(|&len| len > cap) {
        return Err(Error::PayloadTooLarge { got: len, limit });
    }
    let mut body = body;
    // One allocation per request, sized from Content-Length when it fits.
    let mut buffer = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| Error::request(model, format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if seen <= limit {
            buffer.extend_from_slice(&data);
        } else if seen > cap {
            break;
        }
    }
    if seen > limit {
        return Err(Error::PayloadTooLarge { got: seen, limit });
    }
    Ok(buffer.freeze())
}

/// Bodies up to this size are decoded on the async worker that read them;
/// larger ones on a blocking thread.
pub(crate) const DECODE_IN_PLACE_BYTES: usize = 256 * 1024;

/// The request header that sets a deadline on an HTTP inference request, as a
/// duration (`2ms`, `250us`); with the `timeout` parameter too, the earlier wins.
pub const TIMEOUT_HEADER: &str = "tickserve-timeout";

#[derive(Deserialize)]
pub(crate) struct ModelPath {
    pub(crate) model: String,
    pub(crate) version: Option<String>,
}

/// The deadline a request's [`TIMEOUT_HEADER`] sets, if it has one.
pub(crate) fn timeout_header(
    model: &str,
    headers: &HeaderMap,
) -> Result<Option<std::time::Duration>, Error> {
    let Some(v) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| humantime::parse_duration(s.trim()).ok())
        .map(Some)
        .ok_or_else(|| {
            Error::request(
                model,
                format!(
                    "the {TIMEOUT_HEADER} header must be a duration like \"2ms\" or \"250us\"; got {v:?}"
                ),
            )
        })
}

/// An error as an HTTP response: `{"error": "..."}` with its kind's status.
pub(crate) struct HttpError(pub(crate) Error);

impl From<Error> for HttpError {
    fn from(e: Error) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let kind = self.0.kind();
        let status =
            StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response =
            (status, axum::Json(json!({ "error": self.0.to_string() }))).into_response();
        if kind == ErrorKind::ResourceExhausted {
            // Shedding is momentary: a client may come back in a second.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

async fn server_ready(State(shared): State<Arc<Shared>>) -> StatusCode {
    if shared.server_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn server_metadata() -> axum::Json<Value> {
    axum::Json(json!({ "name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS }))
}

fn lookup(shared: &Shared, path: &ModelPath) -> Result<Arc<ModelHandle>, HttpError> {
    Ok(shared.runtime.model(&path.model, path.version.as_deref())?)
}

async fn model_metadata(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<ModelPath>,
) -> Result<Response, HttpError> {
    let handle = lookup(&shared, &path)?;
    let models = shared.runtime.models();
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

async fn model_ready(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<ModelPath>,
) -> Result<StatusCode, HttpError> {
    let handle = lookup(&shared, &path)?;
    Ok(if shared.ready() && handle.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    })
}

async fn model_config(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<ModelPath>,
) -> Result<axum::Json<ModelConfigView>, HttpError> {
    let handle = lookup(&shared, &path)?;
    Ok(axum::Json(ModelConfigView::of(
        &handle.name,
        &handle.loaded,
    )))
}

async fn model_stats(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<ModelPath>,
) -> Result<axum::Json<Value>, HttpError> {
    let handle = lookup(&shared, &path)?;
    Ok(axum::Json(
        json!({ "model_stats": [StatisticsView::of(&handle)] }),
    ))
}

async fn all_stats(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    let stats: Vec<StatisticsView> = shared
        .runtime
        .ready_handles()
        .iter()
        .map(|h| StatisticsView::of(h))
        .collect();
    axum::Json(json!({ "model_stats": stats }))
}

async fn infer(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    // The one lookup of this request's model (its error waits until the body
    // is read: answering with unread bytes would reset the connection).
    let handle = shared.runtime.model(&path.model, path.version.as_deref());
    let label = match &handle {
        Ok(h) => h.name.clone(),
        Err(_) => shared.runtime.model_label(&path.model),
    };
    let result = infer_inner(&shared, handle, path, &headers, body).await;
    observe::record_request(Protocol::Http, &label, started, &result);
    match result {
        Ok(response) => response,
        Err(e) => HttpError(e).into_response(),
    }
}

async fn infer_inner(
    shared: &Shared,
    handle: Result<Arc<ModelHandle>, Error>,
    path: ModelPath,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    if !shared.ready() {
        return Err(Error::ShuttingDown);
    }
    let limit = shared.max_request_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let body = read_body(&path.model, body, limit, declared).await?;
    // Admitted after the body is read: refusing with unread bytes would reset
    // the connection instead of answering 429.
    let _slot = shared.admit()?;
    let _bytes = shared.admit_bytes(body.len())?;
    let handle = handle?;
    let header_length = match headers.get(codec::HEADER_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(|| {
                    Error::request(
                        &path.model,
                        format!("the {} header is not a byte count", codec::HEADER_LENGTH),
                    )
                })?,
        ),
    };
    let header_timeout = timeout_header(&path.model, headers)?;
    let mut decoded = if body.len() <= DECODE_IN_PLACE_BYTES {
        codec::decode(
            &path.model,
            path.version,
            &body,
            header_length,
            &handle.signature,
        )?
    } else {
        // A large body is decoded off the async workers, so that it does not
        // hold up every other connection meanwhile.
        let handle = Arc::clone(&handle);
        let model = path.model.clone();
        tokio::task::spawn_blocking(move || {
            codec::decode(
                &model,
                path.version,
                &body,
                header_length,
                &handle.signature,
            )
        })
        .await
        .map_err(|e| Error::Internal {
            model: path.model.clone(),
            message: format!("decoding the request failed: {e}"),
        })??
    };
    if let Some(timeout) = header_timeout {
        let by_header = durations::deadline_after(Instant::now(), timeout);
        decoded.request.deadline = Some(
            decoded
                .request
                .deadline
                .map_or(by_header, |d| d.min(by_header)),
        );
    }
    let response = handle.infer(decoded.request).await?;
    let binary: Vec<bool> = match decoded.binary_outputs {
        Some(flags) => flags,
        None => vec![decoded.binary_default; response.outputs.len()],
    };
    let encoded = codec::encode(&response, &binary);
    let mut reply = Response::new(Body::from(encoded.body));
    let h = reply.headers_mut();
    h.insert(
        QUEUE_TIME_HEADER,
        never_indexed(response.timing.queue.as_micros() as u64),
    );
    h.insert(
        COMPUTE_TIME_HEADER,
        never_indexed(response.timing.compute.as_micros() as u64),
    );
    match encoded.header_length {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(codec::HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    Ok(reply)
}

/// `POST /v2/repository/index`: every model of the repository with its state;
/// a body `{"ready": true}` keeps only the versions that serve.
async fn repository_index(
    State(shared): State<Arc<Shared>>,
    body: bytes::Bytes,
) -> Result<axum::Json<Value>, HttpError> {
    let ready_only = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("ready").and_then(Value::as_bool))
        .unwrap_or(false);
    let entries = control::index(&shared, ready_only).await?;
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
    )))
}

/// `POST /v2/repository/models/{model}/load`: loads or reloads the model;
/// a failed load leaves what served before serving (400 with the reason).
async fn repository_load(
    State(shared): State<Arc<Shared>>,
    Path(model): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    control::change(&shared, Protocol::Http, control::Operation::Load, model).await?;
    Ok(axum::Json(json!({})))
}

/// `POST /v2/repository/models/{model}/unload`: stops serving the model once
/// its requests in flight are answered.
async fn repository_unload(
    State(shared): State<Arc<Shared>>,
    Path(model): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    control::change(&shared, Protocol::Http, control::Operation::Unload, model).await?;
    Ok(axum::Json(json!({})))
}

/// A header value that changes with every answer (a timing): marked so
/// HTTP/2's header compression never keeps it in its table, where it would
/// only push useful entries out and keep each answer's value alive for the
/// next hundred answers.
fn never_indexed(value: u64) -> HeaderValue {
    let mut value = HeaderValue::from(value);
    value.set_sensitive(true);
    value
}
