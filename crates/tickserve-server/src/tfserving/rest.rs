//! TF Serving's REST API on the HTTP port:
//!
//! - `POST /v1/models/NAME[/versions/N]:predict` (row or column format),
//! - `GET /v1/models/NAME[/versions/N]` (model status),
//! - `GET /v1/models/NAME[/versions/N]/metadata` (the signature).
//!
//! The HTTP port's route table reads the path ([`crate::transport::routes`]);
//! inference goes through the edge's pipeline. Errors are `{"error": "..."}`
//! with the status of their kind (TF Serving's mapping agrees: bad input 400,
//! unknown model 404, overload 429, deadline 504, not ready 503).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tickserve_core::{Error, TensorSpec};
use tickserve_runtime::ModelHandle;

use super::json::{self as tfjson, Format};
use super::{PREDICT_METHOD, SIGNATURE_NAME, alias, tf_dtype, tf_dtype_name};
use crate::transport::headers::InferHeaders;
use crate::transport::routes::TfRoute;
use crate::transport::status::HttpError;
use crate::transport::{body, entrance::Entrance};
use tickserve_edge::observe::Protocol;
use tickserve_edge::params::Parameters;
use tickserve_edge::{Decoded, Edge, Payload};

/// A path under `/v1/models/` TF Serving would not read: 400 with its words.
pub fn malformed(message: &str) -> Response {
    HttpError(Error::request("_tfserving", message)).into_response()
}

/// `GET /v1/models/...`: model status or metadata.
pub fn get(edge: &Edge, t: &TfRoute) -> Response {
    let result = (|| {
        if let Some(verb) = &t.verb {
            return Err(HttpError(Error::request(
                &t.model,
                format!("malformed request: GET with :{verb}; use POST"),
            )));
        }
        if t.metadata {
            let handle = edge.runtime.model(&t.model, t.asked())?;
            Ok(axum::Json(metadata(&handle)).into_response())
        } else {
            Ok(axum::Json(status(edge, &t.model, t.asked())?).into_response())
        }
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The model status: each version (or the one asked for) and its state.
fn status(edge: &Edge, model: &str, version: Option<&str>) -> Result<Value, Error> {
    let versions: Vec<Value> = super::version_statuses(&edge.runtime, model, version)?
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

/// A `:predict` body, undecoded.
struct PredictBody(bytes::Bytes);

impl Payload for PredictBody {
    type Encoding = Format;

    fn decode_bytes(&self) -> usize {
        self.0.len()
    }

    /// The copy the reading of bare `NaN`/`Infinity` tokens makes.
    fn expansion(&self, _: &ModelHandle) -> Result<usize, Error> {
        Ok(tfjson::expansion(&self.0))
    }

    fn decode(self, handle: &ModelHandle) -> Result<Decoded<Format>, Error> {
        let predict = tfjson::decode(&handle.name, &handle.signature, &self.0)?;
        // TF Serving's API has no request parameters: a request gets the
        // model's defaults (docs/tfserving.md).
        Ok(Decoded {
            id: String::new(),
            inputs: predict.inputs,
            outputs: None,
            parameters: Parameters::default(),
            encoding: predict.format,
        })
    }
}

/// `POST /v1/models/...:predict` (or a path TF Serving answers with an error).
#[allow(clippy::disallowed_methods)] // request latency is the machine's time
pub async fn post(
    edge: &Arc<Edge>,
    t: &TfRoute,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
    body: Body,
) -> Response {
    let started = Instant::now();
    let found = InferHeaders::of(headers, None);
    let refuse = |e| HttpError(edge.refuse(Protocol::TfServingRest, &t.model, started, e));
    let body = match body::read_request(edge, &t.model, found.content_length, body).await {
        Ok(body) => body,
        Err(e) => return refuse(e).into_response(),
    };
    if let Err(e) = check_verb(t) {
        return refuse(e).into_response();
    }
    let call = Entrance::http(&found, extensions, body.len(), started).call(
        Protocol::TfServingRest,
        &t.model,
        t.asked(),
        || 0,
    );
    match edge.infer(call, PredictBody(body)).await {
        Ok(answer) => {
            let encoded = tfjson::encode(&answer.response, answer.encoding);
            let mut reply = Response::new(Body::from(encoded));
            reply.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            reply
        }
        Err(e) => HttpError(e).into_response(),
    }
}

/// Refuses what TF Serving refuses before it looks for the model: a verb
/// other than `:predict`, a `POST` without a verb.
fn check_verb(t: &TfRoute) -> Result<(), Error> {
    match t.verb.as_deref() {
        Some("predict") => Ok(()),
        Some(verb @ ("classify" | "regress")) => Err(Error::request(
            &t.model,
            format!(
                ":{verb} takes tf.Example inputs, which an ONNX model does not have; \
                 tickserve serves :predict"
            ),
        )),
        _ => Err(Error::request(
            &t.model,
            "malformed request: POST /v1/models/NAME[/versions/N | /labels/L]:predict",
        )),
    }
}

/// A TF Serving route: `GET` for status and metadata, `POST` for `:predict`.
pub async fn serve(
    edge: &Arc<Edge>,
    (method, headers, extensions): (&Method, &HeaderMap, &axum::http::Extensions),
    t: &TfRoute,
    body: Body,
) -> Response {
    if method == Method::POST {
        post(edge, t, headers, extensions, body).await
    } else if method == Method::GET || method == Method::HEAD {
        get(edge, t)
    } else {
        crate::transport::status::Refusal::WrongMethod {
            path: format!("/v1/models/{}", t.model),
            method: method.to_string(),
        }
        .http()
    }
}
