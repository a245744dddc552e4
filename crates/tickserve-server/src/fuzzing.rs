//! Entry points for fuzzing what hostile bytes reach first: the HTTP/JSON
//! decoder (with and without the binary-tensor split), the gRPC request
//! conversion, the shared-memory protocol, TF Serving's JSON and TensorProto
//! decoding, the sequence snapshot reader, the configuration parsers, and a
//! model file read and imported by the CUDA engine. Each takes arbitrary bytes and
//! must return, never panic. The fast paths beside a library path (the
//! `fast` modules) are held to it too: whatever the HTTP header reader
//! reads, serde_json reads alike, and whatever answer header the HTTP
//! writer writes, serde_json writes alike (`http_binary`); whatever the gRPC message
//! is read as in place, prost decodes alike, field by field
//! (`grpc_request`); whatever TF Serving's one-pass reading reads, the
//! general reading reads alike (`tf_json`).
//!
//! The cargo-fuzz targets in `fuzz/` call these (nightly, libFuzzer); the
//! `fuzz_corpus` integration test replays the committed corpus through them on
//! stable, so every finding, once added to the corpus, stays a regression case.
//! Public for those two only (hidden from the docs): not an API.

use std::time::Duration;

use prost::Message;
use tickserve_core::config::{ModelConfig, ModelDefaults, ServerConfig};
use tickserve_core::validate::{Limits, validate, validate_for};
use tickserve_core::{DataType, Signature, TensorSpec};

use tickserve_proto::bounded;
use tickserve_proto::fast::view;
use tickserve_proto::inference as pb;

use crate::grpc::convert;
use crate::http::codec;
use crate::transport::deadline;

/// The signature requests are decoded and validated against: one input of
/// each kind a model may take.
fn signature() -> Signature {
    let spec = |name: &str, datatype, dims: Vec<usize>| TensorSpec {
        name: name.into(),
        datatype,
        dims,
    };
    Signature {
        inputs: vec![
            spec("features", DataType::Fp32, vec![4]),
            spec("ids", DataType::Int64, vec![3]),
            spec("mask", DataType::Bool, vec![3]),
        ],
        outputs: vec![spec("y", DataType::Fp32, vec![1])],
    }
}

fn limits() -> Limits {
    Limits {
        max_request_rows: 64,
        nan_policy: tickserve_core::config::NanPolicy::Reject,
    }
}

/// An HTTP/JSON request body, all JSON.
pub fn http_json(data: &[u8]) {
    let body = bytes::Bytes::copy_from_slice(data);
    if let Ok(decoded) = codec::decode("m", &body, None, &signature()) {
        let (request, _) = decoded.into_request(None);
        let _ = validate_for("m", &request, &signature(), &limits());
    }
}

/// An HTTP body with the binary tensor extension: the first two bytes give
/// the JSON header's length (`Inference-Header-Content-Length`), the rest is
/// the body.
pub fn http_binary(data: &[u8]) {
    let Some((length, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let header_length = usize::from(u16::from_le_bytes(*length));
    // The hand reader of the JSON header reads what serde_json reads.
    let text = &body[..header_length.min(body.len())];
    if let Some(plain) = crate::http::fast::reader::header(text) {
        let json = crate::http::request_header::json_header(text);
        let agree = json.as_ref().map(crate::http::request_header::comparable);
        assert!(
            agree.as_ref().ok() == Some(&crate::http::request_header::comparable(&plain)),
            "read by hand as {}, by serde_json as {agree:?}",
            crate::http::request_header::comparable(&plain)
        );
    }
    let body = bytes::Bytes::copy_from_slice(body);
    if let Ok(decoded) = codec::decode("m", &body, Some(header_length), &signature()) {
        let (request, _) = decoded.into_request(None);
        answers_alike(&request);
        let _ = validate_for("m", &request, &signature(), &limits());
    }
}

/// An answer made of `request`'s own id, names, shapes and bytes, every
/// output binary: where the hand writer of its JSON header writes it,
/// serde_json writes the same bytes.
fn answers_alike(request: &tickserve_core::ModelRequest) {
    let outputs: Vec<tickserve_core::OutputTensor> = request
        .inputs
        .iter()
        .map(|input| tickserve_core::OutputTensor {
            name: input.name.as_str().into(),
            datatype: input.datatype,
            shape: input.shape.clone(),
            data: input.data.clone(),
        })
        .collect();
    let binary = vec![true; outputs.len()];
    let response = tickserve_core::InferResponse {
        model: "m".into(),
        version: "1".into(),
        id: request.id.clone(),
        outputs,
        timing: tickserve_core::Timing {
            queue: Duration::ZERO,
            compute: Duration::ZERO,
        },
        sequence_restarted: false,
        bucket: 1,
        state_read: Vec::new(),
        window_ticks: None,
    };
    let mut hand = Vec::new();
    if crate::http::fast::writer::write(&response, &binary, &mut hand) {
        let mut library = Vec::new();
        codec::json_header_of(&response, &binary, &mut library);
        assert!(
            hand == library,
            "written by hand as {}, by serde_json as {}",
            String::from_utf8_lossy(&hand),
            String::from_utf8_lossy(&library)
        );
    }
}

/// A gRPC `ModelInferRequest` message as it comes off the wire, and a
/// `grpc-timeout` header made of the same bytes.
#[allow(clippy::disallowed_methods)] // a fuzz input's deadline is the machine's time
pub fn grpc_request(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = deadline::parse_grpc_timeout(text);
    }
    // What the unary path reads in place, prost decodes alike, every field.
    if let Some(view) = view::infer_request(data, tickserve_edge::MAX_TENSORS) {
        let decoded = pb::ModelInferRequest::decode(data);
        assert!(
            decoded.as_ref().is_ok_and(|m| view.agrees_with(data, m)),
            "read in place as {view:?}, decoded by prost as {decoded:?}"
        );
    }
    if bounded::check_entries(data).is_err() {
        return;
    }
    let Ok(request) = pb::ModelInferRequest::decode(data) else {
        return;
    };
    if let Ok(decoded) = convert::decode(request, "m", &signature()) {
        let deadline = std::time::Instant::now().checked_add(Duration::from_millis(5));
        let (request, _) = decoded.into_request(deadline);
        let _ = validate_for("m", &request, &signature(), &limits());
    }
}

/// A `model.toml` and a `tickserve.toml`, parsed, validated and resolved.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(model) = toml::from_str::<ModelConfig>(text) {
        let _ = tickserve_runtime::ModelSettings::resolve(
            &model,
            &ModelDefaults::default(),
            &signature().inputs,
            false,
        );
    }
    if let Ok(server) = toml::from_str::<ServerConfig>(text) {
        let _ = server.validate();
    }
}

/// `inputs` as a request's, validated against the fuzzing signature.
fn validate_inputs(inputs: Vec<tickserve_core::InputTensor>) {
    let request = tickserve_core::InferRequest {
        model: "m".into(),
        version: None,
        request: tickserve_core::ModelRequest {
            id: String::new(),
            inputs,
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        },
    };
    let _ = validate(&request, &signature(), &limits());
}

/// A shared-memory request as a client's sample holds it: parsed, its
/// parameters read and its inputs copied as the front end does, validated;
/// and the same bytes read as an answer, as the client does.
pub fn shm_request(data: &[u8]) {
    let _ = tickserve_shm_protocol::parse_answer(data);
    let owned = bytes::Bytes::copy_from_slice(data);
    let Ok(tickserve_shm_protocol::Request::Infer {
        parameters, inputs, ..
    }) = tickserve_shm_protocol::parse_request(&owned)
    else {
        return;
    };
    let copied = crate::shm::copy_inputs("m", &parameters, &inputs, &owned);
    if let (Ok(inputs), Ok(_)) = (copied.tensors, copied.parameters) {
        validate_inputs(inputs);
    }
}

/// A TF Serving `:predict` body (row or column format), decoded and
/// validated; and for a model of one input, the one-pass reading checked
/// against the general one (the same tensors, or the same refusal).
pub fn tf_json(data: &[u8]) {
    if let Ok(predict) = crate::tfserving::json::decode("m", &signature(), data) {
        validate_inputs(predict.inputs);
    }
    let signature = signature();
    let one_input = Signature {
        inputs: signature.inputs[..1].to_vec(),
        outputs: signature.outputs,
    };
    crate::tfserving::json::check_one_pass(&one_input, data);
}

/// A TF Serving gRPC `PredictRequest` message: each input's fill checked
/// and its `TensorProto` decoded, as the Predict handler does (within 1 MiB).
pub fn tf_tensor(data: &[u8]) {
    use tickserve_proto::tensorflow::serving::PredictRequest;
    let Ok(request) = PredictRequest::decode(data) else {
        return;
    };
    let signature = signature();
    for (name, tensor) in request.inputs {
        let Ok(spec) = crate::tfserving::input("m", &signature, &name) else {
            continue;
        };
        if crate::tfserving::tensor::expansion("m", spec, &tensor, &limits(), 1 << 20).is_ok() {
            let _ = crate::tfserving::tensor::decode("m", spec, tensor, 1 << 20);
        }
    }
}

/// A sequence snapshot file, read (with no model to restore into).
pub fn sequence_snapshot(data: &[u8]) {
    let _ = tickserve_runtime::testing::read_snapshot(data);
}

/// A model file (ONNX bytes) read, given its signature and imported by the
/// CUDA engine's importer: refused or imported, never a panic, and an
/// imported plan holds no more weight bytes than the file did.
pub fn model_file(data: &[u8]) {
    tickserve_runtime::fuzz_import(data);
}
