//! TF Serving's REST API on the HTTP port:
//!
//! - `POST /v1/models/NAME[/versions/N]:predict` (row or column format),
//! - `GET /v1/models/NAME[/versions/N]` (model status),
//! - `GET /v1/models/NAME[/versions/N]/metadata` (the signature).
//!
//! Errors are `{"error": "..."}` with the status of their kind (TF Serving's
//! mapping agrees: bad input 400, unknown model 404, overload 429, deadline
//! 504, not ready 503).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tickserve_core::{Error, TensorSpec, durations};
use tickserve_runtime::ModelHandle;

use super::json::{self as tfjson, Format};
use super::{PREDICT_METHOD, SIGNATURE_NAME, alias, no_labels, tf_dtype, tf_dtype_name};
use crate::Shared;
use crate::http::{DECODE_IN_PLACE_BYTES, HttpError, read_body, timeout_header};
use crate::observe::{self, Protocol};

/// What a `/v1/models/...` path asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
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

/// Parses the part of a path after `/v1/models/`.
pub fn parse(path: &str) -> Result<Target, String> {
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
    Ok(Target {
        model: model.to_string(),
        version,
        label,
        verb,
        metadata,
    })
}

fn json_response(value: Value) -> Response {
    axum::Json(value).into_response()
}

fn target(path: &str) -> Result<Target, HttpError> {
    parse(path).map_err(|m| HttpError(Error::request("_tfserving", m)))
}

/// `GET /v1/models/...`: model status or metadata.
pub async fn get(State(shared): State<Arc<Shared>>, Path(path): Path<String>) -> Response {
    let result = (|| {
        let t = target(&path)?;
        if let Some(verb) = &t.verb {
            return Err(HttpError(Error::request(
                &t.model,
                format!("malformed request: GET with :{verb}; use POST"),
            )));
        }
        if let Some(label) = &t.label {
            return Err(HttpError(no_labels(&t.model, label)));
        }
        if t.metadata {
            let handle = shared.runtime.model(&t.model, t.version.as_deref())?;
            Ok(json_response(metadata(&handle)))
        } else {
            Ok(json_response(status(
                &shared,
                &t.model,
                t.version.as_deref(),
            )?))
        }
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The model status: each version (or the one asked for) and its state.
fn status(shared: &Shared, model: &str, version: Option<&str>) -> Result<Value, Error> {
    let versions: Vec<Value> = super::version_statuses(&shared.runtime, model, version)?
        .into_iter()
        .map(|s| {
            json!({
                "version": s.version.to_string(),
                "state": s.state.as_str_name(),
                "status": { "error_code": s.code.as_str_name(), "error_message": s.message },
            })
        })
        .collect();
    Ok(json!({ "model_version_status": versions }))
}

/// A tensor's `TensorInfo`, as TF Serving's REST metadata writes it (int64
/// sizes as strings, the batch as -1).
fn tensor_info(spec: &TensorSpec) -> Value {
    let dims: Vec<Value> = spec
        .protocol_shape()
        .iter()
        .map(|d| json!({ "size": d.to_string(), "name": "" }))
        .collect();
    json!({
        "dtype": tf_dtype_name(tf_dtype(spec.datatype)),
        "tensor_shape": { "dim": dims, "unknown_rank": false },
        "name": spec.name,
    })
}

/// The model's metadata: its one signature, `serving_default`.
fn metadata(handle: &ModelHandle) -> Value {
    let map = |specs: &[TensorSpec]| -> serde_json::Map<String, Value> {
        specs
            .iter()
            .map(|t| (alias(&t.name).to_string(), tensor_info(t)))
            .collect()
    };
    json!({
        "model_spec": { "name": handle.name, "signature_name": "", "version": handle.version },
        "metadata": { "signature_def": { "signature_def": { SIGNATURE_NAME: {
            "inputs": map(&handle.signature.inputs),
            "outputs": map(&handle.signature.outputs),
            "method_name": PREDICT_METHOD,
        }}}},
    })
}

/// `POST /v1/models/...:predict`.
pub async fn post(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let t = match target(&path) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let handle = match &t.label {
        Some(label) => Err(no_labels(&t.model, label)),
        None => shared.runtime.model(&t.model, t.version.as_deref()),
    };
    let label = match &handle {
        Ok(h) => h.name.clone(),
        Err(_) => shared.runtime.model_label(&t.model),
    };
    let result = predict(&shared, handle, &t, &headers, body).await;
    observe::record_request(Protocol::TfServingRest, &label, started, &result);
    result.unwrap_or_else(|e| HttpError(e).into_response())
}

async fn predict(
    shared: &Shared,
    handle: Result<Arc<ModelHandle>, Error>,
    t: &Target,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    if !shared.ready() {
        return Err(Error::ShuttingDown);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // Read before anything is refused: answering with unread bytes would
    // reset the connection.
    let body = read_body(&t.model, body, shared.max_request_bytes, declared).await?;
    match t.verb.as_deref() {
        Some("predict") => {}
        Some(verb @ ("classify" | "regress")) => {
            return Err(Error::request(
                &t.model,
                format!(
                    ":{verb} takes tf.Example inputs, which an ONNX model does not have; \
                     tickserve serves :predict"
                ),
            ));
        }
        _ => {
            return Err(Error::request(
                &t.model,
                "malformed request: POST /v1/models/NAME[/versions/N]:predict",
            ));
        }
    }
    let _slot = shared.admit()?;
    let _bytes = shared.admit_bytes(body.len())?;
    let handle = handle?;
    let timeout = timeout_header(&handle.name, headers)?;
    let decoded = if body.len() <= DECODE_IN_PLACE_BYTES {
        tfjson::decode(&handle.name, &handle.signature, &body)?
    } else {
        // A large body is decoded off the async workers.
        let decoding = Arc::clone(&handle);
        tokio::task::spawn_blocking(move || {
            tfjson::decode(&decoding.name, &decoding.signature, &body)
        })
        .await
        .map_err(|e| Error::Internal {
            model: handle.name.clone(),
            message: format!("decoding the request failed: {e}"),
        })??
    };
    let request = tickserve_core::InferRequest {
        model: handle.name.clone(),
        version: Some(handle.version.clone()),
        id: String::new(),
        inputs: decoded.inputs,
        outputs: None,
        deadline: timeout.map(|d| durations::deadline_after(Instant::now(), d)),
        monte_carlo: None,
        priority: 0,
        sequence: None,
    };
    let response = handle.infer(request).await?;
    let format: Format = decoded.format;
    let mut reply = Response::new(Body::from(tfjson::encode(&response, format)));
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_as_tf_serving_reads_them() {
        let t = parse("half_plus_two:predict").unwrap();
        assert_eq!(
            (t.model.as_str(), t.verb.as_deref(), t.version, t.metadata),
            ("half_plus_two", Some("predict"), None, false)
        );
        let t = parse("m/versions/123:predict").unwrap();
        assert_eq!(t.version.as_deref(), Some("123"));
        let t = parse("m/versions/7/metadata").unwrap();
        assert!(t.metadata && t.verb.is_none());
        let t = parse("m/labels/stable").unwrap();
        assert_eq!(t.label.as_deref(), Some("stable"));
        assert!(
            parse("m/version/50:predict")
                .unwrap_err()
                .contains("malformed")
        );
        assert!(
            parse("m/versions/HELLO:regress")
                .unwrap_err()
                .contains("failed to convert")
        );
        assert!(
            parse("m/versions/18446744073709551615:predict")
                .unwrap_err()
                .contains("failed to convert")
        );
        assert!(parse(":predict").is_err());
        assert!(parse("m:predict/metadata").is_err());
    }
}
