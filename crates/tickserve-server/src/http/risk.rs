//! The kill switch over HTTP: `POST /v2/models/M/versions/V/halt` (body
//! `{"reason": "..."}`, optional) and `.../resume`, in the
//! `model-repository` key group. The gRPC side is `grpc::risk`.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tickserve_core::Error;
use tickserve_core::config::FrontEnd;
use tickserve_edge::{RiskAsk, version_of};

use super::{HttpError, SMALL_BODY_BYTES};
use crate::transport::body;
use crate::transport::routes::ModelRef;
use tickserve_edge::Edge;

/// `POST .../versions/V/halt`.
pub async fn halt(edge: &Edge, path: &ModelRef, body: Body) -> Result<Response, HttpError> {
    edge.risk
        .allows(FrontEnd::Http, &path.model, RiskAsk::Halt)?;
    let handle = version_of(edge, &path.model, path.version.as_deref())?;
    let (model, version) = (handle.name.clone(), handle.version.clone());
    let body = body::read(&model, body, SMALL_BODY_BYTES, None).await?;
    let reason = if body.is_empty() {
        String::new()
    } else {
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| Error::request(&model, format!("the body is not JSON: {e}")))?;
        if !value.is_object() {
            return Err(Error::request(
                &model,
                format!(
                    "a halt's body is a JSON object, {{\"reason\": \"...\"}}; got {}",
                    tickserve_core::text::clip_message(&value.to_string())
                ),
            )
            .into());
        }
        match value.get("reason") {
            None => String::new(),
            Some(Value::String(reason)) => reason.clone(),
            Some(other) => {
                return Err(Error::request(
                    &model,
                    format!("reason must be a string; got {other}"),
                )
                .into());
            }
        }
    };
    let changed = edge.halts.halt(&handle, &reason, "http").await;
    let halt = &changed.halt;
    Ok(axum::Json(json!({
        "model_name": model,
        "model_version": version,
        "halted": true,
        "reason": halt.reason,
        "by": halt.by,
        "since": halt.since,
        "kept": changed.kept.is_ok(),
        "fleet": fleet(changed.fleet),
    }))
    .into_response())
}

/// `POST .../versions/V/resume`.
pub async fn resume(edge: &Edge, path: &ModelRef, body: Body) -> Result<Response, HttpError> {
    let handle = version_of(edge, &path.model, path.version.as_deref())?;
    let (model, version) = (handle.name.clone(), handle.version.clone());
    let lifting = edge.halts.check(&model, &version);
    edge.risk
        .allows(FrontEnd::Http, &model, RiskAsk::Resume(lifting.as_ref()))?;
    let _ = body::read(&model, body, SMALL_BODY_BYTES, None).await?;
    let changed = edge.halts.resume(&handle, "http").await;
    Ok(axum::Json(json!({
        "model_name": model,
        "model_version": version,
        "resumed": changed.halt.is_some(),
        "kept": changed.kept.is_ok(),
        "fleet": fleet(changed.fleet),
    }))
    .into_response())
}

/// How far a halt or resume got across the fleet (`null` without one).
fn fleet(propagation: Option<tickserve_core::fleet::Propagation>) -> Value {
    propagation.map_or(Value::Null, |p| {
        json!({
            "replicas": p.replicas,
            "applied": p.applied,
            "waited_seconds": p.waited.as_secs_f64(),
        })
    })
}
