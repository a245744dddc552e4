//! The v2 HTTP/JSON inference format, with Triton's binary tensor extension:
//! [`decode`] reads a request body into the edge's [`Decoded`] (its inputs,
//! the outputs asked for, its parameters, and [`Binary`]: which outputs go
//! back binary); [`encode`] writes an [`InferResponse`] as a body.
//!
//! The JSON header is read by hand where it is plain (`fast::reader`: binary
//! inputs, plain parameters), by serde_json otherwise (`request_header`).
//!
//! Tensor `data` may be flat or nested (row-major); it is converted straight
//! into little-endian bytes of the declared datatype, with range checks. With
//! the binary extension (`Inference-Header-Content-Length`), inputs whose
//! `parameters.binary_data_size` is set take their bytes from after the JSON
//! header, in order; outputs asked for with `binary_data` come back that way.

use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};
use serde_json::{Map, Value};
use tickserve_core::validate::declared_datatype;
use tickserve_core::{DataType, Error, InferResponse, InputTensor, OutputTensor, Signature};

use super::request_header::{Entries, Params, json_header, json_parameters};
use crate::scalar::json_to_bytes;
use tickserve_edge::Decoded;
use tickserve_edge::params::{self, Param, Parameters};

/// The header that splits a binary-extension body into JSON and tensor bytes.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// [`HEADER_LENGTH`], parsed once (a lookup by `&str` parses the name every
/// time).
pub static HEADER_LENGTH_NAME: axum::http::HeaderName =
    axum::http::HeaderName::from_static(HEADER_LENGTH);

pub use tickserve_core::request::MAX_ID_BYTES;

/// A `parameters` object's entries; its text is parsed only when it is
/// small: by hand where its values are plain ([`super::fast::reader::parameters`]),
/// by serde_json otherwise.
fn parameters(params: Option<Params<'_>>) -> Result<Option<Entries<'_>>, String> {
    match params {
        None => Ok(None),
        Some(Params::Read(entries)) => Ok(Some(entries)),
        Some(Params::Text(text)) => match super::fast::reader::parameters(text) {
            Some(entries) => Ok(Some(entries)),
            None => json_parameters(text).map(Some),
        },
    }
}

/// How a request's answer must be encoded: which outputs go back binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    /// Per output asked for (or `None`: every output), whether it goes back binary.
    pub outputs: Option<Vec<bool>>,
    /// Whether outputs not listed go back binary (`binary_data_output`).
    pub default: bool,
}

impl Binary {
    /// One flag per output of an answer with `outputs` outputs. A Monte
    /// Carlo answer has as many outputs per output asked for (`y_mean`,
    /// `y_std`, in the order asked): each takes its output's flag.
    pub fn flags(self, outputs: usize) -> Vec<bool> {
        match self.outputs {
            None => vec![self.default; outputs],
            Some(asked) if asked.is_empty() => Vec::new(),
            Some(asked) => {
                let each = (outputs / asked.len()).max(1);
                asked
                    .iter()
                    .flat_map(|&flag| std::iter::repeat_n(flag, each))
                    .collect()
            }
        }
    }
}

/// Decodes a request body for model `model`, whose `signature` words the
/// error for a datatype tickserve does not know. `header_length` is the
/// binary extension's JSON length.
pub fn decode(
    model: &str,
    body: &bytes::Bytes,
    header_length: Option<usize>,
    signature: &Signature,
) -> Result<Decoded<Binary>, Error> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(Error::request(
            model,
            format!(
                "the {HEADER_LENGTH} header says {json_len} bytes of JSON; the body has {} bytes",
                body.len()
            ),
        ));
    }
    let text = &body[..json_len];
    // Without binary data every input holds JSON `data`, which only
    // serde_json reads.
    let plain = header_length.and_then(|_| super::fast::reader::header(text));
    let parsed = match plain {
        Some(header) => header,
        None => json_header(text)
            .map_err(|e| Error::request(model, format!("malformed JSON request body: {e}")))?,
    };
    if parsed.id.as_ref().is_some_and(|id| id.len() > MAX_ID_BYTES) {
        return Err(Error::request(
            model,
            format!("the request id is longer than {MAX_ID_BYTES} bytes"),
        ));
    }
    let mut binary = body.slice(json_len..);
    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    for input in parsed.inputs {
        let datatype = declared_datatype(model, signature, &input.name, &input.datatype)?;
        let input_parameters = parameters(input.parameters)
            .map_err(|e| Error::input(model, &input.name, "small parameters", e))?;
        let binary_size = params::byte_count(
            model,
            params::BINARY_DATA_SIZE,
            entry(input_parameters.as_ref(), params::BINARY_DATA_SIZE),
        )?;
        let data = match (binary_size, input.data) {
            (Some(size), None) => {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > binary.len() {
                    return Err(Error::input(
                        model,
                        &input.name,
                        format!("{size} bytes of binary data (binary_data_size)"),
                        format!("{} bytes left in the body", binary.len()),
                    ));
                }
                binary.split_to(size)
            }
            (None, Some(raw)) => {
                json_to_bytes(model, &input.name, datatype, &input.shape, raw)?.into()
            }
            (Some(_), Some(_)) => {
                return Err(Error::input(
                    model,
                    &input.name,
                    "either 'data' or parameters.binary_data_size",
                    "both",
                ));
            }
            (None, None) => {
                return Err(Error::input(
                    model,
                    &input.name,
                    "'data' or parameters.binary_data_size",
                    "neither",
                ));
            }
        };
        inputs.push(InputTensor {
            name: input.name,
            datatype,
            shape: input.shape,
            data,
        });
    }
    if !binary.is_empty() {
        return Err(Error::request(
            model,
            format!(
                "the body has {} bytes of binary data that no input's binary_data_size claims",
                binary.len()
            ),
        ));
    }
    let request_parameters = parameters(parsed.parameters).map_err(|e| Error::request(model, e))?;
    let request_parameters = request_parameters.as_ref();
    let binary_default = params::flag(
        model,
        params::BINARY_DATA_OUTPUT,
        entry(request_parameters, params::BINARY_DATA_OUTPUT),
    )?
    .unwrap_or(false);
    let (outputs, binary_outputs) = match parsed.outputs {
        None => (None, None),
        Some(list) => {
            let mut flags = Vec::with_capacity(list.len());
            let mut names = Vec::with_capacity(list.len());
            for output in list {
                let output_parameters = parameters(output.parameters)
                    .map_err(|e| Error::request(model, format!("output '{}': {e}", output.name)))?;
                flags.push(
                    params::flag(
                        model,
                        params::BINARY_DATA,
                        entry(output_parameters.as_ref(), params::BINARY_DATA),
                    )?
                    .unwrap_or(binary_default),
                );
                names.push(output.name);
            }
            (Some(names), Some(flags))
        }
    };
    let given = request_parameters
        .into_iter()
        .flat_map(|entries| entries.0.iter());
    let parameters = Parameters::read(model, given.map(|(name, value)| (&**name, param(value))))?;
    Ok(Decoded {
        id: parsed.id.unwrap_or_default(),
        inputs,
        outputs,
        parameters,
        encoding: Binary {
            outputs: binary_outputs,
            default: binary_default,
        },
    })
}

/// The parameter `name` of a JSON `parameters` object, as the parameter
/// reader takes it.
pub fn get<'a>(parameters: Option<&'a Map<String, Value>>, name: &str) -> Option<Param<'a>> {
    parameters?.get(name).map(param)
}

/// [`get`] for an inference request's [`Entries`].
fn entry<'a>(parameters: Option<&'a Entries<'_>>, name: &str) -> Option<Param<'a>> {
    parameters?.get(name).map(param)
}

/// A JSON value as a parameter: an object, list or null is named as what it
/// is, and refused by every parameter that reads it.
pub fn param(value: &Value) -> Param<'_> {
    match value {
        Value::Bool(b) => Param::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Param::Int(i),
            (None, Some(u), _) => Param::Uint(u),
            (None, None, Some(x)) => Param::Float(x),
            _ => Param::Other("a number JSON cannot hold"),
        },
        Value::String(s) => Param::Str(s),
        Value::Object(_) => Param::Other("a JSON object"),
        Value::Array(_) => Param::Other("a JSON list"),
        Value::Null => Param::Other("JSON null"),
    }
}

/// Little-endian tensor bytes, serialized as a flat JSON array.
struct JsonData<'a>(DataType, &'a [u8]);

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let JsonData(datatype, bytes) = *self;
        let mut seq = s.serialize_seq(Some(bytes.len() / datatype.size()))?;
        macro_rules! each {
            ($t:ty, $n:expr) => {
                for c in bytes.chunks_exact($n) {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    seq.serialize_element(&<$t>::from_le_bytes(a))?;
                }
            };
        }
        match datatype {
            DataType::Bool => {
                for &b in bytes {
                    seq.serialize_element(&(b != 0))?;
                }
            }
            DataType::Uint8 => each!(u8, 1),
            DataType::Uint16 => each!(u16, 2),
            DataType::Uint32 => each!(u32, 4),
            DataType::Uint64 => each!(u64, 8),
            DataType::Int8 => each!(i8, 1),
            DataType::Int16 => each!(i16, 2),
            DataType::Int32 => each!(i32, 4),
            DataType::Int64 => each!(i64, 8),
            DataType::Fp32 => each!(f32, 4),
            DataType::Fp64 => each!(f64, 8),
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<ResponseParameters>,
    outputs: Vec<OutputJsonOut<'a>>,
}

/// The response parameters: set only when there is something to say.
#[derive(Serialize)]
struct ResponseParameters {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    sequence_restarted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence_window_ticks: Option<u64>,
}

#[derive(Serialize)]
struct OutputJsonOut<'a> {
    name: &'a str,
    datatype: &'a str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinarySize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonData<'a>>,
}

#[derive(Serialize)]
struct BinarySize {
    binary_data_size: usize,
}

/// One tensor as the JSON of a response's output (`name`, `datatype`,
/// `shape`, `data`).
pub fn tensor_json(tensor: &OutputTensor) -> Value {
    serde_json::to_value(OutputJsonOut {
        name: &tensor.name,
        datatype: tensor.datatype.as_str(),
        shape: &tensor.shape,
        parameters: None,
        data: Some(JsonData(tensor.datatype, &tensor.data)),
    })
    .unwrap_or(Value::Null)
}

/// An encoded response body and, for the binary extension, its JSON length.
pub struct Encoded {
    /// The body.
    pub body: Vec<u8>,
    /// `Some(json length)` when binary tensor data follows the JSON.
    pub header_length: Option<usize>,
}

/// Encodes `response`; outputs whose flag in `binary` is set go as binary data.
pub fn encode(response: &InferResponse, binary: &[bool]) -> Encoded {
    // Sized up front: a body that grows as it is written copies itself
    // each time (serde_json starts at 128 bytes).
    let mut body = Vec::with_capacity(encoded_size(response, binary));
    if !super::fast::writer::write(response, binary, &mut body) {
        json_header_of(response, binary, &mut body);
    }
    if !binary.iter().any(|&b| b) {
        return Encoded {
            body,
            header_length: None,
        };
    }
    let json_len = body.len();
    for (o, _) in response.outputs.iter().zip(binary).filter(|(_, b)| **b) {
        body.extend_from_slice(&o.data);
    }
    Encoded {
        body,
        header_length: Some(json_len),
    }
}

/// Writes `response`'s JSON (its header, with the binary extension) to
/// `body` with serde_json.
pub(crate) fn json_header_of(response: &InferResponse, binary: &[bool], body: &mut Vec<u8>) {
    let outputs = response
        .outputs
        .iter()
        .zip(binary.iter().copied().chain(std::iter::repeat(false)))
        .map(|(o, bin)| OutputJsonOut {
            name: &o.name,
            datatype: o.datatype.as_str(),
            shape: &o.shape,
            parameters: bin.then_some(BinarySize {
                binary_data_size: o.data.len(),
            }),
            data: (!bin).then_some(JsonData(o.datatype, &o.data)),
        })
        .collect();
    let json = ResponseJson {
        model_name: &response.model,
        model_version: &response.version,
        id: &response.id,
        parameters: (response.sequence_restarted || response.window_ticks.is_some()).then_some(
            ResponseParameters {
                sequence_restarted: response.sequence_restarted,
                sequence_window_ticks: response.window_ticks,
            },
        ),
        outputs,
    };
    // Serializing plain structs of strings and numbers into a Vec cannot fail.
    if serde_json::to_writer(&mut *body, &json).is_err() {
        body.clear();
    }
}

/// A close guess, from above for binary outputs, of the bytes
/// [`encode`] writes for `response`: the JSON header's names and shapes,
/// binary outputs' bytes, JSON outputs' numbers at about four characters a
/// byte of data.
fn encoded_size(response: &InferResponse, binary: &[bool]) -> usize {
    let flags = binary.iter().copied().chain(std::iter::repeat(false));
    let outputs = response
        .outputs
        .iter()
        .zip(flags)
        .fold(0usize, |sum, (o, bin)| {
            let data = if bin {
                o.data.len()
            } else {
                o.data.len().saturating_mul(4)
            };
            sum.saturating_add(96)
                .saturating_add(o.name.len())
                .saturating_add(o.shape.len().saturating_mul(21))
                .saturating_add(data)
        });
    [
        response.model.len(),
        response.version.len(),
        response.id.len(),
        128,
    ]
    .into_iter()
    .fold(outputs, usize::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with no inputs: a datatype decoding does not know is worded
    /// with every datatype tickserve serves.
    fn no_type() -> Signature {
        Signature {
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    #[test]
    fn nested_and_flat_data_decode_alike() {
        let flat = br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4]}]}"#;
        let nested =
            br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}"#;
        let a = decode("m", &bytes::Bytes::from_static(flat), None, &no_type()).unwrap();
        let b = decode("m", &bytes::Bytes::from_static(nested), None, &no_type()).unwrap();
        assert_eq!(a.inputs[0].data, b.inputs[0].data);
        assert_eq!(&a.inputs[0].data[4..8], &2f32.to_le_bytes());
    }

    /// A `parameters` object read as entries: escaped names read, the last
    /// of a repeated name wins, anything but an object is refused.
    #[test]
    fn parameters_read_as_a_json_object_would_be() {
        let raw =
            |text: &str| serde_json::from_str::<Box<serde_json::value::RawValue>>(text).unwrap();
        let object = raw(r#"{"a": 1, "b\u0021": "x", "a": true}"#);
        let entries = parameters(Some(Params::Text(object.get())))
            .unwrap()
            .unwrap();
        assert!(matches!(
            entry(Some(&entries), "a"),
            Some(Param::Bool(true))
        ));
        assert!(matches!(entry(Some(&entries), "b!"), Some(Param::Str("x"))));
        assert!(entry(Some(&entries), "c").is_none());
        for other in ["5", "[1]", "null", r#""s""#] {
            let e = parameters(Some(Params::Text(raw(other).get())))
                .err()
                .unwrap();
            assert!(
                e.starts_with("parameters must be a JSON object: invalid type"),
                "{other}: {e}"
            );
        }
    }

    #[test]
    fn out_of_range_integers_are_refused() {
        let body = br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}"#;
        let err = decode("m", &bytes::Bytes::from_static(body), None, &no_type())
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("expected INT8 values, got 300 (out of range) at element 0"),
            "{err}"
        );
    }

    #[test]
    fn binary_extension_round_trip() {
        let json = br#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
        let mut body = json.to_vec();
        body.extend(1f32.to_le_bytes());
        body.extend(2f32.to_le_bytes());
        let d = decode("m", &body.into(), Some(json.len()), &no_type()).unwrap();
        assert_eq!(d.inputs[0].data.len(), 8);
        let response = InferResponse {
            model: "m".into(),
            version: "1".into(),
            id: String::new(),
            outputs: vec![tickserve_core::OutputTensor {
                name: "y".into(),
                datatype: DataType::Fp32,
                shape: vec![1, 1],
                data: bytes::Bytes::copy_from_slice(&5f32.to_le_bytes()),
            }],
            timing: Default::default(),
            sequence_restarted: false,
            bucket: 1,
            state_read: Vec::new(),
            window_ticks: None,
        };
        let e = encode(&response, &[true]);
        let n = e.header_length.unwrap();
        assert!(
            String::from_utf8_lossy(&e.body[..n])
                .contains(r#""parameters":{"binary_data_size":4}"#)
        );
        assert_eq!(&e.body[n..], &5f32.to_le_bytes());
        let e = encode(&response, &[false]);
        assert_eq!(
            String::from_utf8(e.body).unwrap(),
            r#"{"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,1],"data":[5.0]}]}"#
        );
    }
}
