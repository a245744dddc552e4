//! The HTTP side of the sequence-state API (docs/sequences.md): list a
//! stateful model's sequences, read a sequence's state, write it, drop it.
//! All four are in the `model_repository` group of the restricted APIs.
//!
//! `GET  /v2/models/{m}[/versions/{v}]/sequences` lists them; `POST
//! .../sequences/read`, `.../write` and `.../drop` name their sequence as an
//! inference request does (`{"parameters": {"sequence_id": 7}}`). A write
//! sends the state as an inference request sends inputs (JSON `data`, or the
//! binary extension), one tensor per state input of shape `[1, dims...]`; a
//! read answers with them as an inference response's `outputs`. Each
//! operation takes its turn after the sequence's requests already waiting.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tickserve_core::Error;
use tickserve_core::sequence::{KeyId, SequenceId};
use tickserve_runtime::ModelHandle;
use tickserve_runtime::Sequences;

use super::{SMALL_BODY_BYTES, codec};
use crate::transport::body;
use crate::transport::routes::ModelRef;
use crate::transport::status::HttpError;
use tickserve_edge::{Edge, params, state_turn_deadline};

/// The model asked for, which must keep sequences.
fn stateful(edge: &Edge, path: &ModelRef) -> Result<(Arc<ModelHandle>, Arc<Sequences>), Error> {
    edge.stateful(&path.model, path.version.as_deref())
}

/// The `sequence_id` of a `{"parameters": {...}}` object.
fn sequence_id(model: &str, parameters: Option<&Map<String, Value>>) -> Result<SequenceId, Error> {
    params::sequence(model, &|name: &str| codec::get(parameters, name))?
        .map(|control| control.id)
        .ok_or_else(|| {
            Error::request(
                model,
                "the body names no sequence: {\"parameters\": {\"sequence_id\": ...}}",
            )
        })
}

/// A small JSON body's `parameters` object.
async fn parameters(
    model: &str,
    edge: &Edge,
    body: Body,
) -> Result<Option<Map<String, Value>>, Error> {
    let body = body::read(
        model,
        body,
        edge.max_request_bytes.min(SMALL_BODY_BYTES),
        None,
    )
    .await?;
    if body.is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::request(model, format!("the body is not JSON: {e}")))?;
    match value.get("parameters") {
        None => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map.clone())),
        Some(other) => Err(Error::request(
            model,
            format!("parameters must be a JSON object; got {other}"),
        )),
    }
}

fn id_json(id: &SequenceId) -> Value {
    match id {
        SequenceId::Number(n) => json!(n),
        SequenceId::Text(s) => json!(s),
    }
}

/// The stateful model of `path` and the sequence a small JSON body names.
async fn named_sequence(
    edge: &Edge,
    path: &ModelRef,
    body: Body,
) -> Result<(Arc<ModelHandle>, Arc<Sequences>, SequenceId), Error> {
    let (handle, sequences) = stateful(edge, path)?;
    let params = parameters(&handle.name, edge, body).await?;
    let id = sequence_id(&handle.name, params.as_ref())?;
    Ok((handle, sequences, id))
}

/// `GET .../sequences`: every sequence the model keeps, by id.
pub fn list(edge: &Edge, path: &ModelRef, owner: Option<KeyId>) -> Result<Response, HttpError> {
    let (handle, sequences) = stateful(edge, path)?;
    let list: Vec<Value> = sequences
        .list(owner)
        .iter()
        .map(
            |s| json!({"sequence_id": id_json(&s.id), "ticks": s.ticks, "idle_us": tickserve_core::durations::micros(s.idle)}),
        )
        .collect();
    Ok(axum::Json(json!({
        "model_name": handle.name,
        "model_version": handle.version,
        "max_sequences": sequences.spec().max_sequences,
        "sequences": list,
    }))
    .into_response())
}

/// `POST .../sequences/read`: a sequence's state.
pub async fn read(
    edge: &Edge,
    path: &ModelRef,
    owner: Option<KeyId>,
    body: Body,
) -> Result<Response, HttpError> {
    let (handle, sequences, id) = named_sequence(edge, path, body).await?;
    let state = sequences.read(&id, owner, state_turn_deadline()).await?;
    let outputs: Vec<Value> = sequences
        .spec()
        .state_tensors(&state.state, state.window_ticks)
        .iter()
        .map(codec::tensor_json)
        .collect();
    let mut parameters = json!({
        "sequence_id": id_json(&id),
        "ticks": state.ticks,
        "idle_us": tickserve_core::durations::micros(state.idle),
    });
    if !sequences.spec().windows.is_empty() {
        parameters["sequence_window_ticks"] = json!(state.window_ticks);
    }
    Ok(axum::Json(json!({
        "model_name": handle.name,
        "model_version": handle.version,
        "parameters": parameters,
        "outputs": outputs,
    }))
    .into_response())
}

/// `POST .../sequences/write`: sets a sequence's state (starting it if it
/// is not kept); the body is an inference request whose inputs are the states.
pub async fn write(
    edge: &Edge,
    path: &ModelRef,
    headers: &HeaderMap,
    owner: Option<KeyId>,
    body: Body,
) -> Result<Response, HttpError> {
    let (handle, sequences) = stateful(edge, path)?;
    let declared = body::declared_length(headers);
    let body = body::read(&handle.name, body, edge.max_request_bytes, declared).await?;
    let header_length = headers
        .get(&codec::HEADER_LENGTH_NAME)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<usize>().ok());
    let spec = sequences.spec();
    let decoded = codec::decode(&handle.name, &body, header_length, &spec.state_signature())?;
    let id = decoded
        .parameters
        .sequence
        .as_ref()
        .map(|control| control.id.clone())
        .ok_or_else(|| {
            Error::request(
                &handle.name,
                "the body names no sequence: {\"parameters\": {\"sequence_id\": ...}}",
            )
        })?;
    let (rows, window_ticks) = spec.state_rows(&handle.name, decoded.inputs)?;
    sequences
        .write(&id, rows, window_ticks, owner, state_turn_deadline())
        .await?;
    Ok(axum::Json(json!({"sequence_id": id_json(&id), "written": true})).into_response())
}

/// `POST .../sequences/drop`: ends a sequence and drops its state.
pub async fn drop_sequence(
    edge: &Edge,
    path: &ModelRef,
    owner: Option<KeyId>,
    body: Body,
) -> Result<Response, HttpError> {
    let (_, sequences, id) = named_sequence(edge, path, body).await?;
    sequences.remove(&id, owner, state_turn_deadline()).await?;
    Ok(axum::Json(json!({"sequence_id": id_json(&id), "dropped": true})).into_response())
}
