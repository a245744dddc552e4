//! The gRPC codec: prost's, behind a walk over each incoming message that
//! refuses, before prost builds anything, a message that would take far
//! more memory decoded than it weighs on the wire.
//!
//! prost decodes a message whole, and an entry can cost far more in memory
//! than on the wire: an empty `inputs` entry of a `ModelInferRequest` is 2
//! bytes on the wire and a few hundred in memory (a 14 MiB message of them
//! once raised the server's peak memory by 1.9 GiB); an empty
//! `bytes_contents` entry is 2 bytes and 24 in memory; a one-byte varint of
//! `shape` becomes 8. The walk reads only field keys and lengths and
//! allocates nothing:
//!
//! - a `ModelInferRequest` (unary or streamed) is walked through its schema
//!   (`REQUEST`): each repeated field has a count limit (inputs,
//!   outputs, raw contents: [`MAX_ENTRIES`]; dimensions: [`MAX_RANK`];
//!   parameters: [`MAX_PARAMETERS`] per map), and the bytes prost would
//!   allocate are estimated and held to [`AMPLIFICATION`] times the message's
//!   size plus [`SLACK_BYTES`];
//! - any other message: no top-level field may repeat more than
//!   [`MAX_ENTRIES`] times.
//!
//! A malformed message passes the walk and is left to prost's own error.
//! Decoding a large message moves the async worker's other tasks elsewhere
//! first (`block_in_place`), so a 16 MiB request does not stall the other
//! connections. Both the generated server and client use this codec
//! (`build.rs`: `codec_path`), so a client that decodes answers is held to
//! the same bounds.

use std::any::TypeId;
use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use tokio::runtime::{Handle, RuntimeFlavor};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::inference as pb;
use crate::tensorflow as tf;

/// The most entries one repeated (or map) field of a message may hold: far
/// above any real request (a model has a handful of inputs), far below what
/// would cost memory.
pub const MAX_ENTRIES: usize = 4096;

/// The most dimensions of one input's `shape`: every front end's limit.
pub use tickserve_core::MAX_RANK;

/// The most entries of one `parameters` map.
pub const MAX_PARAMETERS: usize = 256;

/// A `ModelInferRequest` may take at most this many times its size on the
/// wire in memory once decoded, plus [`SLACK_BYTES`]. 4 covers FP32 and FP64
/// contents (as many bytes as on the wire) and INT32 varints (a byte on the
/// wire, 4 in memory); what it refuses (small INT64 values in typed contents
/// over a few hundred thousand elements, many empty strings) belongs in
/// `raw_input_contents`, which is taken without a copy.
pub const AMPLIFICATION: usize = 4;

/// The fixed allowance beside [`AMPLIFICATION`], so a small message is never
/// refused for its proportions.
pub const SLACK_BYTES: usize = 1 << 20;

/// Messages from this size up are decoded with `block_in_place`: the async
/// worker hands its other tasks to another worker first.
const DECODE_BLOCKING_BYTES: usize = 256 * 1024;

/// prost's codec, with incoming messages checked by [`check_entries`].
#[derive(Debug)]
pub struct BoundedCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        BoundedCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder {
            inner: self.inner.decoder(),
            _message: PhantomData,
        }
    }
}

/// prost's decoder behind [`check_entries`].
#[derive(Debug)]
pub struct BoundedDecoder<U> {
    inner: ProstDecoder<U>,
    _message: PhantomData<U>,
}

impl<U: prost::Message + Default + 'static> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The frame is one contiguous buffer (tonic's DecodeBuf over BytesMut).
        if src.chunk().len() == src.remaining() {
            let message = TypeId::of::<U>();
            let checked = if message == TypeId::of::<pb::ModelInferRequest>() {
                check_infer_request(src.chunk())
            } else if message == TypeId::of::<tf::serving::PredictRequest>() {
                check_predict_request(src.chunk())
            } else {
                check_entries(src.chunk())
            };
            checked.map_err(Status::invalid_argument)?;
        }
        let remaining = src.remaining();
        let decode = || U::decode(src).map(Some).map_err(malformed);
        if remaining >= DECODE_BLOCKING_BYTES && multi_thread() {
            tokio::task::block_in_place(decode)
        } else {
            decode()
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// Decodes a `ModelInferRequest` from its bytes as the codec decodes one
/// off the wire: the walk ([`check_infer_request`]), then prost, with the
/// async worker's other tasks moved elsewhere first when it is large.
pub fn decode_infer_request(bytes: Bytes) -> Result<pb::ModelInferRequest, Status> {
    check_infer_request(&bytes).map_err(Status::invalid_argument)?;
    let large = bytes.len() >= DECODE_BLOCKING_BYTES;
    let decode = || prost::Message::decode(bytes).map_err(malformed);
    if large && multi_thread() {
        tokio::task::block_in_place(decode)
    } else {
        decode()
    }
}

/// Whether this thread runs in a multi-threaded tokio runtime (where
/// `block_in_place` may hand its other tasks elsewhere).
fn multi_thread() -> bool {
    Handle::try_current().is_ok_and(|handle| handle.runtime_flavor() == RuntimeFlavor::MultiThread)
}

/// prost's refusal of a malformed message: the client's fault, so
/// INVALID_ARGUMENT (tonic's own codec says INTERNAL).
fn malformed(error: prost::DecodeError) -> Status {
    Status::invalid_argument(format!("the message is not valid protobuf: {error}"))
}

/// Counts the entries of each top-level field of the protobuf message in
/// `bytes`; more than [`MAX_ENTRIES`] of one field is an error naming it.
/// A malformed message passes (prost refuses it with its own message).
pub fn check_entries(bytes: &[u8]) -> Result<(), String> {
    // Field numbers of the messages served are small; others share a slot.
    let mut counts = [0usize; 32];
    let mut at = 0;
    while at < bytes.len() {
        let Some((key, next)) = varint_at(bytes, at) else {
            return Ok(());
        };
        at = next;
        let field = key >> 3;
        let skip = match key & 7 {
            0 => match varint_at(bytes, at) {
                Some((_, next)) => next - at,
                None => return Ok(()),
            },
            1 => 8,
            2 => match varint_at(bytes, at) {
                Some((len, next)) => {
                    let Ok(len) = usize::try_from(len) else {
                        return Ok(());
                    };
                    (next - at).saturating_add(len)
                }
                None => return Ok(()),
            },
            5 => 4,
            _ => return Ok(()),
        };
        at = at.saturating_add(skip);
        let slot = usize::try_from(field).map_or(0, |f| f.min(counts.len() - 1));
        counts[slot] += 1;
        if counts[slot] > MAX_ENTRIES {
            return Err(format!(
                "field {field} of the message repeats more than {MAX_ENTRIES} times \
                 (tickserve's limit per repeated field)"
            ));
        }
    }
    Ok(())
}

/// How prost decodes a field, for [`check_infer_request`].
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A varint scalar, `width` bytes in memory.
    Varint { width: usize },
    /// A fixed-width scalar: as many bytes in memory as on the wire.
    Fixed { width: usize },
    /// A string or bytes: a vector and its bytes.
    Bytes,
    /// A nested message (a map entry is one).
    Message(&'static Schema),
}

/// A message as the walk sees it.
#[derive(Debug)]
struct Schema {
    /// Its name, for errors.
    name: &'static str,
    /// Its size in memory, without what it points to.
    size: usize,
    /// Field number, name, kind and the most entries one message may hold.
    fields: &'static [(u64, &'static str, Kind, usize)],
}

const fn varint(width: usize) -> Kind {
    Kind::Varint { width }
}

const PARAMETER: Schema = Schema {
    name: "InferParameter",
    size: size_of::<pb::InferParameter>(),
    fields: &[
        (1, "bool_param", varint(1), usize::MAX),
        (2, "int64_param", varint(8), usize::MAX),
        (3, "string_param", Kind::Bytes, usize::MAX),
        (4, "double_param", Kind::Fixed { width: 8 }, usize::MAX),
        (5, "uint64_param", varint(8), usize::MAX),
    ],
};

/// A `map<string, InferParameter>` entry: its key, value and a hash slot.
const PARAMETER_ENTRY: Schema = Schema {
    name: "parameters entry",
    size: size_of::<String>() + size_of::<pb::InferParameter>() + 16,
    fields: &[
        (1, "key", Kind::Bytes, usize::MAX),
        (2, "value", Kind::Message(&PARAMETER), usize::MAX),
    ],
};

const CONTENTS: Schema = Schema {
    name: "InferTensorContents",
    size: size_of::<pb::InferTensorContents>(),
    fields: &[
        (1, "bool_contents", varint(1), usize::MAX),
        (2, "int_contents", varint(4), usize::MAX),
        (3, "int64_contents", varint(8), usize::MAX),
        (4, "uint_contents", varint(4), usize::MAX),
        (5, "uint64_contents", varint(8), usize::MAX),
        (6, "fp32_contents", Kind::Fixed { width: 4 }, usize::MAX),
        (7, "fp64_contents", Kind::Fixed { width: 8 }, usize::MAX),
        (8, "bytes_contents", Kind::Bytes, usize::MAX),
    ],
};

const INPUT: Schema = Schema {
    name: "InferInputTensor",
    size: size_of::<pb::model_infer_request::InferInputTensor>(),
    fields: &[
        (1, "name", Kind::Bytes, usize::MAX),
        (2, "datatype", Kind::Bytes, usize::MAX),
        (3, "shape", varint(8), MAX_RANK),
        (
            4,
            "parameters",
            Kind::Message(&PARAMETER_ENTRY),
            MAX_PARAMETERS,
        ),
        (5, "contents", Kind::Message(&CONTENTS), usize::MAX),
    ],
};

const OUTPUT: Schema = Schema {
    name: "InferRequestedOutputTensor",
    size: size_of::<pb::model_infer_request::InferRequestedOutputTensor>(),
    fields: &[
        (1, "name", Kind::Bytes, usize::MAX),
        (
            2,
            "parameters",
            Kind::Message(&PARAMETER_ENTRY),
            MAX_PARAMETERS,
        ),
    ],
};

/// `inference.ModelInferRequest`, field numbers as in `proto/grpc_service.proto`.
const REQUEST: Schema = Schema {
    name: "ModelInferRequest",
    size: size_of::<pb::ModelInferRequest>(),
    fields: &[
        (1, "model_name", Kind::Bytes, usize::MAX),
        (2, "model_version", Kind::Bytes, usize::MAX),
        (3, "id", Kind::Bytes, usize::MAX),
        (
            4,
            "parameters",
            Kind::Message(&PARAMETER_ENTRY),
            MAX_PARAMETERS,
        ),
        (5, "inputs", Kind::Message(&INPUT), MAX_ENTRIES),
        (6, "outputs", Kind::Message(&OUTPUT), MAX_ENTRIES),
        (7, "raw_input_contents", Kind::Bytes, MAX_ENTRIES),
    ],
};

/// `tensorflow.TensorShapeProto.Dim`.
const TF_DIM: Schema = Schema {
    name: "TensorShapeProto.Dim",
    size: size_of::<tf::tensor_shape_proto::Dim>(),
    fields: &[
        (1, "size", varint(8), usize::MAX),
        (2, "name", Kind::Bytes, usize::MAX),
    ],
};

/// `tensorflow.TensorShapeProto`.
const TF_SHAPE: Schema = Schema {
    name: "TensorShapeProto",
    size: size_of::<tf::TensorShapeProto>(),
    fields: &[
        (2, "dim", Kind::Message(&TF_DIM), MAX_RANK),
        (3, "unknown_rank", varint(1), usize::MAX),
    ],
};

/// `tensorflow.TensorProto`, field numbers as in `proto/tensorflow/core/framework/tensor.proto`.
const TF_TENSOR: Schema = Schema {
    name: "TensorProto",
    size: size_of::<tf::TensorProto>(),
    fields: &[
        (1, "dtype", varint(4), usize::MAX),
        (2, "tensor_shape", Kind::Message(&TF_SHAPE), usize::MAX),
        (3, "version_number", varint(4), usize::MAX),
        (4, "tensor_content", Kind::Bytes, usize::MAX),
        (13, "half_val", varint(4), usize::MAX),
        (5, "float_val", Kind::Fixed { width: 4 }, usize::MAX),
        (6, "double_val", Kind::Fixed { width: 8 }, usize::MAX),
        (7, "int_val", varint(4), usize::MAX),
        (8, "string_val", Kind::Bytes, MAX_ENTRIES),
        (9, "scomplex_val", Kind::Fixed { width: 4 }, usize::MAX),
        (10, "int64_val", varint(8), usize::MAX),
        (11, "bool_val", varint(1), usize::MAX),
        (12, "dcomplex_val", Kind::Fixed { width: 8 }, usize::MAX),
        (16, "uint32_val", varint(4), usize::MAX),
        (17, "uint64_val", varint(8), usize::MAX),
        (18, "float8_val", Kind::Bytes, usize::MAX),
    ],
};

/// A `map<string, TensorProto>` entry: its key, value and a hash slot.
const TF_INPUT_ENTRY: Schema = Schema {
    name: "inputs entry",
    size: size_of::<String>() + size_of::<tf::TensorProto>() + 16,
    fields: &[
        (1, "key", Kind::Bytes, usize::MAX),
        (2, "value", Kind::Message(&TF_TENSOR), usize::MAX),
    ],
};

/// `google.protobuf.Int64Value`.
const TF_INT64_VALUE: Schema = Schema {
    name: "Int64Value",
    size: size_of::<i64>(),
    fields: &[(1, "value", varint(8), usize::MAX)],
};

/// `tensorflow.serving.ModelSpec`.
const TF_MODEL_SPEC: Schema = Schema {
    name: "ModelSpec",
    size: size_of::<tf::serving::ModelSpec>(),
    fields: &[
        (1, "name", Kind::Bytes, usize::MAX),
        (2, "version", Kind::Message(&TF_INT64_VALUE), usize::MAX),
        (3, "signature_name", Kind::Bytes, usize::MAX),
        (4, "version_label", Kind::Bytes, usize::MAX),
    ],
};

/// `tensorflow.serving.PredictRequest`, field numbers as in
/// `proto/tensorflow_serving/apis/predict.proto`.
const PREDICT_REQUEST: Schema = Schema {
    name: "PredictRequest",
    size: size_of::<tf::serving::PredictRequest>(),
    fields: &[
        (1, "model_spec", Kind::Message(&TF_MODEL_SPEC), usize::MAX),
        (2, "inputs", Kind::Message(&TF_INPUT_ENTRY), MAX_ENTRIES),
        (3, "output_filter", Kind::Bytes, MAX_ENTRIES),
    ],
};

/// Walks a `ModelInferRequest` through its schema: a repeated field over its
/// count limit, or a message whose decoded size would pass
/// [`AMPLIFICATION`] × its size + [`SLACK_BYTES`], is an error naming the
/// field. A malformed message passes (prost refuses it with its own message).
pub fn check_infer_request(bytes: &[u8]) -> Result<(), String> {
    check_message(bytes, &REQUEST, "raw_input_contents")
}

/// Walks a TF Serving `PredictRequest` as [`check_infer_request`] walks a
/// `ModelInferRequest`.
pub fn check_predict_request(bytes: &[u8]) -> Result<(), String> {
    check_message(bytes, &PREDICT_REQUEST, "tensor_content")
}

/// Walks `bytes` through `schema`; `raw_field` is where large tensors belong,
/// for the error.
fn check_message(
    bytes: &[u8],
    schema: &'static Schema,
    raw_field: &'static str,
) -> Result<(), String> {
    let budget = bytes
        .len()
        .saturating_mul(AMPLIFICATION)
        .saturating_add(SLACK_BYTES);
    let mut walk = Walk {
        budget,
        used: 0,
        raw_field,
    };
    match walk.message(bytes, schema) {
        Ok(()) | Err(Stop::Malformed) => Ok(()),
        Err(Stop::Refused(error)) => Err(error),
    }
}

/// Why a walk stopped early.
enum Stop {
    /// The bytes are not a well-formed message: prost will say so.
    Malformed,
    /// The message is refused, with the reason.
    Refused(String),
}

/// The estimate of a walk so far.
struct Walk {
    budget: usize,
    used: usize,
    /// The field large tensors belong in, for the error.
    raw_field: &'static str,
}

impl Walk {
    /// Adds `bytes` to the estimate; past the budget, an error naming `field`.
    fn spend(&mut self, bytes: usize, schema: &Schema, field: &str) -> Result<(), Stop> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.budget {
            return Err(Stop::Refused(format!(
                "the message would take more than {AMPLIFICATION} times its size (+{} KiB) \
                 in memory once decoded (reached at {}.{field}); send large tensors in \
                 {}",
                SLACK_BYTES >> 10,
                schema.name,
                self.raw_field,
            )));
        }
        Ok(())
    }

    fn message(&mut self, bytes: &[u8], schema: &'static Schema) -> Result<(), Stop> {
        let mut counts = [0usize; 24];
        let mut at = 0;
        while at < bytes.len() {
            let (key, next) = varint_at(bytes, at).ok_or(Stop::Malformed)?;
            at = next;
            let number = key >> 3;
            let wire = key & 7;
            let (start, end) = match wire {
                0 => {
                    let (_, next) = varint_at(bytes, at).ok_or(Stop::Malformed)?;
                    (at, next)
                }
                1 => (at, at.saturating_add(8)),
                2 => {
                    let (len, next) = varint_at(bytes, at).ok_or(Stop::Malformed)?;
                    let len = usize::try_from(len).map_err(|_| Stop::Malformed)?;
                    (next, next.saturating_add(len))
                }
                5 => (at, at.saturating_add(4)),
                _ => return Err(Stop::Malformed),
            };
            let value = bytes.get(start..end).ok_or(Stop::Malformed)?;
            at = end;
            let Some(index) = schema.fields.iter().position(|f| f.0 == number) else {
                continue; // prost skips unknown fields without keeping them
            };
            let (_, name, kind, limit) = schema.fields[index];
            let entries = match (kind, wire) {
                // A packed run of varints: one entry per final byte.
                (Kind::Varint { .. }, 2) => value.iter().filter(|b| *b & 0x80 == 0).count(),
                (Kind::Fixed { width }, 2) => value.len() / width,
                _ => 1,
            };
            let count = &mut counts[index.min(counts.len() - 1)];
            *count = count.saturating_add(entries);
            if *count > limit {
                return Err(Stop::Refused(format!(
                    "{}.{name} holds more than {limit} entries (tickserve's limit)",
                    schema.name
                )));
            }
            match (kind, wire) {
                (Kind::Varint { width }, _) => {
                    self.spend(entries.saturating_mul(width), schema, name)?
                }
                (Kind::Fixed { .. }, _) => self.spend(value.len(), schema, name)?,
                (Kind::Bytes, 2) => self.spend(
                    size_of::<Vec<u8>>().saturating_add(value.len()),
                    schema,
                    name,
                )?,
                (Kind::Message(nested), 2) => {
                    self.spend(nested.size, schema, name)?;
                    self.message(value, nested)?;
                }
                // A wire type prost will refuse.
                _ => return Err(Stop::Malformed),
            }
        }
        Ok(())
    }
}

/// The varint at `at` and the position after it; `None` past the end or
/// where prost refuses it (more than ten bytes, or a tenth byte above 1).
pub(crate) fn varint_at(bytes: &[u8], mut at: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *bytes.get(at)?;
        at += 1;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_empty_entries_are_refused_before_decoding() {
        // Field 5, length 0: one empty `inputs` entry, 2 bytes.
        let many: Vec<u8> = std::iter::repeat_n([0x2a, 0x00], MAX_ENTRIES + 1)
            .flatten()
            .collect();
        let error = check_entries(&many).unwrap_err();
        assert!(error.contains("field 5"), "{error}");
        let enough: Vec<u8> = std::iter::repeat_n([0x2a, 0x00], MAX_ENTRIES)
            .flatten()
            .collect();
        assert_eq!(check_entries(&enough), Ok(()));
    }

    #[test]
    fn a_real_request_passes_and_malformed_bytes_are_left_to_prost() {
        use prost::Message;
        let request = pb::ModelInferRequest {
            model_name: "alpha_mlp".into(),
            inputs: vec![Default::default(); 3],
            raw_input_contents: vec![vec![0u8; 200].into(); 3],
            ..Default::default()
        };
        assert_eq!(check_entries(&request.encode_to_vec()), Ok(()));
        assert_eq!(check_entries(&[0xff, 0xff]), Ok(()));
    }

    fn input(contents: pb::InferTensorContents, shape: Vec<i64>) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "alpha_mlp".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "features".into(),
                datatype: "FP32".into(),
                shape,
                contents: Some(contents),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_infer_request_of_real_proportions_passes_the_schema_walk() {
        use prost::Message;
        let mut request = input(
            pb::InferTensorContents {
                fp32_contents: vec![0.5; 1_000_000],
                ..Default::default()
            },
            vec![20_000, 50],
        );
        request.parameters.insert(
            "timeout".into(),
            pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(500)),
            },
        );
        request.outputs = vec![Default::default(); 2];
        assert_eq!(check_infer_request(&request.encode_to_vec()), Ok(()));
        // INT32 zeros: one byte on the wire, four in memory, within the bound.
        let request = input(
            pb::InferTensorContents {
                int_contents: vec![0; 4_000_000],
                ..Default::default()
            },
            vec![4_000_000],
        );
        assert_eq!(check_infer_request(&request.encode_to_vec()), Ok(()));
        assert_eq!(check_infer_request(&[0xff, 0xff]), Ok(()), "left to prost");
    }

    #[test]
    fn nested_amplification_is_refused_naming_the_field() {
        use prost::Message;
        // Empty strings: 2 bytes on the wire, 24 in memory.
        let strings = input(
            pb::InferTensorContents {
                bytes_contents: vec![Vec::new(); 1_000_000],
                ..Default::default()
            },
            vec![1_000_000],
        );
        let error = check_infer_request(&strings.encode_to_vec()).unwrap_err();
        assert!(
            error.contains("InferTensorContents.bytes_contents")
                && error.contains("raw_input_contents"),
            "{error}"
        );
        // Small INT64 values: 1 byte on the wire, 8 in memory.
        let small = input(
            pb::InferTensorContents {
                int64_contents: vec![1; 1_000_000],
                ..Default::default()
            },
            vec![1_000_000],
        );
        let error = check_infer_request(&small.encode_to_vec()).unwrap_err();
        assert!(error.contains("int64_contents"), "{error}");
        // A shape of many dimensions.
        let shape = input(Default::default(), vec![1; MAX_RANK + 1]);
        let error = check_infer_request(&shape.encode_to_vec()).unwrap_err();
        assert!(
            error.contains(&format!(
                "InferInputTensor.shape holds more than {MAX_RANK} entries"
            )),
            "{error}"
        );
        let mut dims = input(Default::default(), vec![1; MAX_RANK]);
        assert_eq!(check_infer_request(&dims.encode_to_vec()), Ok(()));
        // Many parameters on an input.
        dims.inputs[0].parameters = (0..=MAX_PARAMETERS)
            .map(|i| (i.to_string(), pb::InferParameter::default()))
            .collect();
        let error = check_infer_request(&dims.encode_to_vec()).unwrap_err();
        assert!(error.contains("parameters holds more than 256"), "{error}");
        // Many empty inputs.
        let many: Vec<u8> = std::iter::repeat_n([0x2a, 0x00], MAX_ENTRIES + 1)
            .flatten()
            .collect();
        let error = check_infer_request(&many).unwrap_err();
        assert!(error.contains("ModelInferRequest.inputs"), "{error}");
    }
}
