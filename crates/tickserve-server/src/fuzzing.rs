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
//! (`grpc_request`); whatever unary answer the gRPC writer writes, prost
//! writes alike (`grpc_answer`); whatever TF Serving's one-pass reading
//! reads, the general reading reads alike (`tf_json`).
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
use crate::grpc::fast::answer::UnaryAnswer;
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

/// A unary gRPC answer drawn from `data` (names, datatypes, shapes of any
/// dimensions, contents, raw or typed, with or without response
/// parameters): the fenced writer (`grpc::fast::answer`) writes prost's
/// bytes for it.
pub fn grpc_answer(data: &[u8]) {
    let mut draw = Draw(data);
    let flags = draw.byte();
    let raw = flags & 1 == 1;
    let sequence_restarted = flags & 2 == 2;
    let window_ticks = (flags & 4 == 4).then(|| u64::from(draw.byte()));
    let (model, version, id) = (draw.text(), draw.text(), draw.text());
    let outputs = (0..draw.byte() % 5)
        .map(|_| {
            let name = draw.text();
            let datatype = DataType::ALL[usize::from(draw.byte()) % DataType::ALL.len()];
            let shape = (0..draw.byte() % 5).map(|_| draw.dim()).collect();
            let wanted = usize::from(draw.byte() % 16) * datatype.size();
            let got = draw.bytes(wanted);
            let whole = got.len() / datatype.size() * datatype.size();
            tickserve_core::OutputTensor {
                name: name.as_str().into(),
                datatype,
                shape,
                data: bytes::Bytes::copy_from_slice(&got[..whole]),
            }
        })
        .collect();
    let response = tickserve_core::InferResponse {
        model: model.as_str().into(),
        version: version.as_str().into(),
        id,
        outputs,
        timing: tickserve_core::Timing::default(),
        sequence_restarted,
        bucket: 1,
        state_read: Vec::new(),
        window_ticks,
    };
    let answer = |response| UnaryAnswer { response, raw };
    let mut fast = Vec::new();
    answer(response.clone()).encode(&mut fast);
    let message = answer(response.clone()).message();
    let library = message.encode_to_vec();
    if message.parameters.is_empty() {
        assert_eq!(
            fast, library,
            "the fenced writer and prost differ on {response:?}"
        );
    } else {
        // A map's entries go in its (random) iteration order: the same
        // entries, and the same bytes for the rest (bytes: a NaN equals
        // itself there).
        let mut message = message;
        let mut fast = pb::ModelInferResponse::decode(fast.as_slice()).unwrap_or_else(|e| {
            panic!("the fenced writer's bytes do not decode ({e}) on {response:?}")
        });
        assert_eq!(fast.parameters, message.parameters, "on {response:?}");
        fast.parameters.clear();
        message.parameters.clear();
        assert_eq!(
            fast.encode_to_vec(),
            message.encode_to_vec(),
            "on {response:?}"
        );
    }
}

/// Values drawn from a fuzzer's bytes, zeros once they run out.
struct Draw<'a>(&'a [u8]);

impl Draw<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// Up to `n` bytes.
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    /// A name of up to 47 bytes (invalid UTF-8 replaced).
    fn text(&mut self) -> String {
        let n = usize::from(self.byte() % 48);
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }

    /// A dimension of any sign and size.
    fn dim(&mut self) -> i64 {
        let n = usize::from(self.byte() % 9);
        let mut le = [0u8; 8];
        let got = self.bytes(n);
        le[..got.len()].copy_from_slice(got);
        i64::from_le_bytes(le)
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
