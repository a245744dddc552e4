//! What goes back to a client: an inference's answer, a refusal, each
//! written in the wire's layout into a sample loaned for it.

use std::time::Duration;

use tickserve_core::{Error, InferResponse, durations};
use tickserve_shm_protocol as wire;

use super::ActiveRequest;
use crate::transport::status;

/// Sends an inference's answer (or its error); an answer over `limit` bytes
/// is refused instead.
pub(super) fn respond(
    active: ActiveRequest,
    request_id: u64,
    result: Result<InferResponse, Error>,
    limit: usize,
) {
    let response = match result {
        Ok(response) => response,
        Err(error) => return respond_error(active, request_id, &error),
    };
    let codes: Vec<u8> = response
        .outputs
        .iter()
        .map(|o| wire::datatype_code(o.datatype.as_str()).unwrap_or(0))
        .collect();
    let outputs: Vec<wire::TensorOut<'_>> = response
        .outputs
        .iter()
        .zip(&codes)
        .map(|(o, &datatype)| wire::TensorOut {
            name: &o.name,
            datatype,
            dims: &o.shape,
            data: &o.data,
        })
        .collect();
    let len = wire::infer_answer_len(&outputs);
    if len > limit {
        let error = too_large(&response.model, "answer", len, limit);
        return respond_error(active, request_id, &error);
    }
    // The header's fields are 32-bit: a longer time reads as u32::MAX.
    let micros = |d: Duration| u32::try_from(durations::micros(d)).unwrap_or(u32::MAX);
    let mut answer = vec![0u8; len];
    wire::write_infer_answer(
        &mut answer,
        request_id,
        micros(response.timing.queue),
        micros(response.timing.compute),
        &outputs,
    );
    send(active, &answer);
}

/// The refusal of an answer (`what`: "answer" or "description") of `len`
/// bytes, over the front end's `limit`.
pub(super) fn too_large(model: &str, what: &str, len: usize, limit: usize) -> Error {
    Error::request(
        model,
        format!(
            "the {what} is {len} bytes; shared memory answers at most {limit} \
             (shm.max_answer_bytes): ask for fewer rows, or use gRPC or HTTP"
        ),
    )
}

pub(super) fn respond_error(active: ActiveRequest, request_id: u64, error: &Error) {
    let code = status::shm_code(error.kind());
    let message = error.client_message();
    let mut answer = vec![0u8; wire::error_answer_len(&message)];
    wire::write_error_answer(&mut answer, request_id, code, &message);
    send(active, &answer);
}

/// Copies `answer` into a sample loaned for the client and sends it. A
/// client that left (or never reads) costs nothing more: the send fails or
/// the sample is dropped with its connection.
pub(super) fn send(active: ActiveRequest, answer: &[u8]) {
    let sent = active
        .loan_slice_uninit(answer.len())
        .map(|sample| sample.write_from_slice(answer))
        .map_err(|e| format!("{e:?}"))
        .and_then(|sample| sample.send().map_err(|e| format!("{e:?}")));
    if let Err(e) = sent {
        tracing::debug!(error = %e, "a shared-memory answer was not delivered (its client left?)");
    }
}
