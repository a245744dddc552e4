//! The v2 HTTP/JSON inference format, with Triton's binary tensor extension:
//! decoding a request body into an [`InferRequest`] and encoding an
//! [`InferResponse`] into a body.
//!
//! Tensor `data` may be flat or nested (row-major); it is converted straight
//! into little-endian bytes of the declared datatype, with range checks. With
//! the binary extension (`Inference-Header-Content-Length`), inputs whose
//! `parameters.binary_data_size` is set take their bytes from after the JSON
//! header, in order; outputs asked for with `binary_data` come back that way.

use std::time::{Duration, Instant};

use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tickserve_core::durations;
use tickserve_core::validate::unknown_datatype;
use tickserve_core::{DataType, Error, InferRequest, InferResponse, InputTensor, Signature};

/// The header that splits a binary-extension body into JSON and tensor bytes.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

#[derive(Deserialize)]
struct RequestJson {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

/// A decoded request and how its answer must be encoded.
pub struct Decoded {
    /// The request for the runtime.
    pub request: InferRequest,
    /// Per output asked for (or `None`: every output), whether it goes back binary.
    pub binary_outputs: Option<Vec<bool>>,
    /// Whether outputs not listed go back binary (`binary_data_output`).
    pub binary_default: bool,
}

/// Decodes a request body for model `model`, whose `signature` words the
/// error for a datatype tickserve does not know. `header_length` is the
/// binary extension's JSON length.
pub fn decode(
    model: &str,
    version: Option<String>,
    body: &bytes::Bytes,
    header_length: Option<usize>,
    signature: &Signature,
) -> Result<Decoded, Error> {
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
    let parsed: RequestJson = serde_json::from_slice(&body[..json_len])
        .map_err(|e| Error::request(model, format!("malformed JSON request body: {e}")))?;
    let mut binary = body.slice(json_len..);
    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    for input in parsed.inputs {
        let Some(datatype) = DataType::parse(&input.datatype) else {
            return Err(unknown_datatype(
                model,
                signature,
                &input.name,
                &input.datatype,
            ));
        };
        let binary_size = param_u64(input.parameters.as_ref(), "binary_data_size");
        let data = match (binary_size, input.data) {
            (Some(size), None) => {
                let size = size as usize;
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
            (None, Some(value)) => json_to_bytes(model, &input.name, datatype, &value)?.into(),
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
    let params = parsed.parameters.as_ref();
    let binary_default = param_bool(params, "binary_data_output").unwrap_or(false);
    let (outputs, binary_outputs) = match parsed.outputs {
        None => (None, None),
        Some(list) => {
            let flags = list
                .iter()
                .map(|o| param_bool(o.parameters.as_ref(), "binary_data").unwrap_or(binary_default))
                .collect();
            (
                Some(list.into_iter().map(|o| o.name).collect()),
                Some(flags),
            )
        }
    };
    let deadline = param_u64(params, "timeout")
        .map(|us| durations::deadline_after(Instant::now(), Duration::from_micros(us)));
    Ok(Decoded {
        request: InferRequest {
            model: model.to_string(),
            version,
            id: parsed.id.unwrap_or_default(),
            inputs,
            outputs,
            deadline,
        },
        binary_outputs,
        binary_default,
    })
}

fn param_u64(params: Option<&Map<String, Value>>, key: &str) -> Option<u64> {
    params?.get(key)?.as_u64()
}

fn param_bool(params: Option<&Map<String, Value>>, key: &str) -> Option<bool> {
    params?.get(key)?.as_bool()
}

/// Converts JSON tensor data (flat or nested) into little-endian bytes.
fn json_to_bytes(
    model: &str,
    input: &str,
    datatype: DataType,
    value: &Value,
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let mut stack = vec![value];
    let mut index = 0usize;
    // Depth-first, left to right: row-major order for nested arrays.
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items.iter().rev()),
            scalar => {
                push_scalar(&mut out, datatype, scalar).map_err(|what| {
                    Error::input(
                        model,
                        input,
                        format!("{datatype} values"),
                        format!("{what} at element {index}"),
                    )
                })?;
                index += 1;
            }
        }
    }
    Ok(out)
}

fn push_scalar(out: &mut Vec<u8>, datatype: DataType, v: &Value) -> Result<(), String> {
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Result<T, String> {
        let bad = || format!("{v}");
        if let Some(i) = v.as_i64() {
            T::try_from(i).map_err(|_| format!("{v} (out of range)"))
        } else if let Some(u) = v.as_u64() {
            T::try_from(u).map_err(|_| format!("{v} (out of range)"))
        } else {
            Err(bad())
        }
    }
    let float = |v: &Value| v.as_f64().ok_or_else(|| format!("{v}"));
    match datatype {
        DataType::Bool => match v {
            Value::Bool(b) => out.push(u8::from(*b)),
            other => return Err(format!("{other}")),
        },
        DataType::Uint8 => out.extend(int::<u8>(v)?.to_le_bytes()),
        DataType::Uint16 => out.extend(int::<u16>(v)?.to_le_bytes()),
        DataType::Uint32 => out.extend(int::<u32>(v)?.to_le_bytes()),
        DataType::Uint64 => out.extend(int::<u64>(v)?.to_le_bytes()),
        DataType::Int8 => out.extend(int::<i8>(v)?.to_le_bytes()),
        DataType::Int16 => out.extend(int::<i16>(v)?.to_le_bytes()),
        DataType::Int32 => out.extend(int::<i32>(v)?.to_le_bytes()),
        DataType::Int64 => out.extend(int::<i64>(v)?.to_le_bytes()),
        DataType::Fp32 => out.extend((float(v)? as f32).to_le_bytes()),
        DataType::Fp64 => out.extend(float(v)?.to_le_bytes()),
    }
    Ok(())
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
    outputs: Vec<OutputJsonOut<'a>>,
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

/// An encoded response body and, for the binary extension, its JSON length.
pub struct Encoded {
    /// The body.
    pub body: Vec<u8>,
    /// `Some(json length)` when binary tensor data follows the JSON.
    pub header_length: Option<usize>,
}

/// Encodes `response`; outputs whose flag in `binary` is set go as binary data.
pub fn encode(response: &InferResponse, binary: &[bool]) -> Encoded {
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
        outputs,
    };
    // Serializing plain structs of strings and numbers cannot fail.
    let mut body = serde_json::to_vec(&json).unwrap_or_default();
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
        let a = decode(
            "m",
            None,
            &bytes::Bytes::from_static(flat),
            None,
            &no_type(),
        )
        .unwrap();
        let b = decode(
            "m",
            None,
            &bytes::Bytes::from_static(nested),
            None,
            &no_type(),
        )
        .unwrap();
        assert_eq!(a.request.inputs[0].data, b.request.inputs[0].data);
        assert_eq!(&a.request.inputs[0].data[4..8], &2f32.to_le_bytes());
    }

    #[test]
    fn out_of_range_integers_are_refused() {
        let body = br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}"#;
        let err = decode(
            "m",
            None,
            &bytes::Bytes::from_static(body),
            None,
            &no_type(),
        )
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
        let d = decode("m", None, &body.into(), Some(json.len()), &no_type()).unwrap();
        assert_eq!(d.request.inputs[0].data.len(), 8);
        let response = InferResponse {
            model: "m".into(),
            version: "1".into(),
            id: String::new(),
            outputs: vec![tickserve_core::OutputTensor {
                name: "y".into(),
                datatype: DataType::Fp32,
                shape: vec![1, 1],
                data: 5f32.to_le_bytes().to_vec(),
            }],
            timing: Default::default(),
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
