//! A lookup: a model name and version turned into a handle and the
//! model's signature.

use std::time::Instant;

use tickserve_core::{Error, TensorSpec};
use tickserve_edge::observe::Protocol;
use tickserve_shm_protocol as wire;

use super::answer::{respond_error, send, too_large};
use super::handles::MAX_HANDLES;
use super::handles::canonical_version;
use super::{ActiveRequest, Context_};

/// Answers a lookup: the model's handle and signature.
#[allow(clippy::disallowed_methods)] // a request's latency is the machine's time
pub(super) fn lookup(
    context: &Context_,
    active: ActiveRequest,
    request_id: u64,
    name: String,
    version: String,
) {
    let started = Instant::now();
    let found = context
        .edge
        .runtime
        .model(&name, (!version.is_empty()).then_some(version.as_str()));
    let handle = match found {
        Ok(handle) => handle,
        Err(error) => {
            let error = context.edge.refuse(Protocol::Shm, &name, started, error);
            respond_error(active, request_id, &error);
            return;
        }
    };
    let token = context
        .handles
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .token(&name, canonical_version(&version, &handle.version));
    let Some(token) = token else {
        let error = Error::request(
            &handle.name,
            format!(
                "the shared-memory front end has handed out {MAX_HANDLES} model handles, its most"
            ),
        );
        respond_error(active, request_id, &error);
        return;
    };
    let describe = |specs: &[TensorSpec]| -> Vec<(String, u8, Vec<i64>)> {
        specs
            .iter()
            .map(|t| {
                let code = wire::datatype_code(t.datatype.as_str()).unwrap_or(0);
                (t.name.clone(), code, t.protocol_shape())
            })
            .collect()
    };
    let (inputs, outputs) = (
        describe(&handle.signature.inputs),
        describe(&handle.signature.outputs),
    );
    let (i, o) = (
        tensors_without_data(&inputs),
        tensors_without_data(&outputs),
    );
    let len = wire::lookup_answer_len(&i, &o);
    if len > context.max_answer_bytes {
        let error = too_large(&handle.name, "description", len, context.max_answer_bytes);
        return respond_error(active, request_id, &error);
    }
    let mut answer = vec![0u8; len];
    wire::write_lookup_answer(&mut answer, request_id, token, &i, &o);
    send(active, &answer);
}

/// A lookup answer's tensors: name, datatype number, protocol shape.
fn tensors_without_data(list: &[(String, u8, Vec<i64>)]) -> Vec<wire::TensorOut<'_>> {
    list.iter()
        .map(|(name, datatype, dims)| wire::TensorOut {
            name,
            datatype: *datatype,
            dims,
            data: &[],
        })
        .collect()
}
