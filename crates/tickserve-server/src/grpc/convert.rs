//! Conversions between the v2 gRPC messages and the core's request and
//! response types.
//!
//! Inputs come either as `raw_input_contents` (little-endian bytes, taken
//! without a copy) or in the typed `contents` field matching the datatype
//! (converted, with range checks). A response uses `raw_output_contents` when
//! its request used raw inputs, and typed contents otherwise, as Triton does.

use std::time::{Duration, Instant};

use tickserve_core::durations;
use tickserve_core::monte_carlo::{self, ParamValue};
use tickserve_core::request::MAX_ID_BYTES;
use tickserve_core::validate::unknown_datatype;
use tickserve_core::{DataType, Error, InferRequest, InferResponse, InputTensor, Signature};
use tickserve_core::{priority, sequence};

use super::pb;

/// Decodes a ModelInfer request for a model with `signature` (which words
/// the error for a datatype tickserve does not know); `timeout` is the gRPC
/// deadline, if any.
pub fn decode(
    request: pb::ModelInferRequest,
    timeout: Option<Duration>,
    signature: &Signature,
) -> Result<(InferRequest, bool), Error> {
    let model = request.model_name;
    if request.id.len() > MAX_ID_BYTES {
        return Err(Error::request(
            &model,
            format!("the request id is longer than {MAX_ID_BYTES} bytes"),
        ));
    }
    let raw = !request.raw_input_contents.is_empty();
    if raw && request.raw_input_contents.len() != request.inputs.len() {
        return Err(Error::request(
            &model,
            format!(
                "raw_input_contents must hold one entry per input: expected {}, got {}",
                request.inputs.len(),
                request.raw_input_contents.len()
            ),
        ));
    }
    let mut raw_contents = request.raw_input_contents.into_iter();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        let Some(datatype) = DataType::parse(&input.datatype) else {
            return Err(unknown_datatype(
                &model,
                signature,
                &input.name,
                &input.datatype,
            ));
        };
        let data = match (raw_contents.next(), input.contents) {
            (Some(_), Some(c)) if !contents_empty(&c) => {
                return Err(Error::input(
                    &model,
                    &input.name,
                    "data in either raw_input_contents or contents",
                    "both",
                ));
            }
            (Some(bytes), _) => bytes,
            (None, Some(contents)) => {
                typed_to_bytes(&model, &input.name, datatype, &input.shape, &contents)?.into()
            }
            (None, None) => bytes::Bytes::new(),
        };
        inputs.push(InputTensor {
            name: input.name,
            datatype,
            shape: input.shape,
            data,
        });
    }
    let param_timeout = request
        .parameters
        .get("timeout")
        .and_then(|p| match p.parameter_choice {
            Some(pb::infer_parameter::ParameterChoice::Int64Param(us)) if us > 0 => {
                Some(Duration::from_micros(us as u64))
            }
            _ => None,
        });
    let deadline = [timeout, param_timeout]
        .into_iter()
        .flatten()
        .min()
        .map(|t| durations::deadline_after(Instant::now(), t));
    let param = |name: &str| {
        use pb::infer_parameter::ParameterChoice as P;
        Some(
            match request.parameters.get(name)?.parameter_choice.as_ref()? {
                P::BoolParam(b) => ParamValue::Bool(*b),
                P::Int64Param(i) => ParamValue::Int(*i),
                P::StringParam(s) => ParamValue::Str(s),
                P::DoubleParam(x) => ParamValue::Float(*x),
                P::Uint64Param(u) => ParamValue::Uint(*u),
            },
        )
    };
    let monte_carlo = monte_carlo::from_parameters(&model, param)?;
    let sequence = sequence::from_parameters(&model, param)?;
    let priority = priority::from_parameters(&model, param)?;
    let outputs = (!request.outputs.is_empty())
        .then(|| request.outputs.into_iter().map(|o| o.name).collect());
    let version = (!request.model_version.is_empty()).then_some(request.model_version);
    Ok((
        InferRequest {
            model,
            version,
            id: request.id,
            inputs,
            outputs,
            deadline,
            monte_carlo,
            priority,
            sequence,
        },
        raw,
    ))
}

fn contents_empty(c: &pb::InferTensorContents) -> bool {
    c.bool_contents.is_empty()
        && c.int_contents.is_empty()
        && c.int64_contents.is_empty()
        && c.uint_contents.is_empty()
        && c.uint64_contents.is_empty()
        && c.fp32_contents.is_empty()
        && c.fp64_contents.is_empty()
        && c.bytes_contents.is_empty()
}

/// Converts typed contents into little-endian bytes of `datatype`, after
/// checking that they hold as many values as `shape` asks for.
fn typed_to_bytes(
    model: &str,
    input: &str,
    datatype: DataType,
    shape: &[i64],
    c: &pb::InferTensorContents,
) -> Result<Vec<u8>, Error> {
    fn narrow<S: Copy + std::fmt::Display, T: TryFrom<S>>(
        values: &[S],
        model: &str,
        input: &str,
        datatype: DataType,
        to_le: impl Fn(T) -> Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(values.len() * datatype.size());
        for (i, &v) in values.iter().enumerate() {
            let t = T::try_from(v).map_err(|_| {
                Error::input(
                    model,
                    input,
                    format!("{datatype} values"),
                    format!("{v} (out of range) at element {i}"),
                )
            })?;
            out.extend(to_le(t));
        }
        Ok(out)
    }
    let field = match datatype {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
    };
    // The count first: contents that do not fill the shape are refused before
    // anything is converted (a wrong shape costs no copy).
    let count = match datatype {
        DataType::Bool => c.bool_contents.len(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => c.int_contents.len(),
        DataType::Int64 => c.int64_contents.len(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => c.uint_contents.len(),
        DataType::Uint64 => c.uint64_contents.len(),
        DataType::Fp32 => c.fp32_contents.len(),
        DataType::Fp64 => c.fp64_contents.len(),
    };
    if count > 0 {
        let expected = shape.iter().try_fold(1usize, |product, &dim| {
            usize::try_from(dim)
                .ok()
                .and_then(|dim| product.checked_mul(dim))
        });
        match expected {
            Some(expected) if expected == count => {}
            Some(expected) => {
                return Err(Error::input(
                    model,
                    input,
                    format!("{expected} values in contents.{field} (shape {shape:?})"),
                    count.to_string(),
                ));
            }
            None => {
                return Err(Error::input(
                    model,
                    input,
                    "a shape of non-negative dimensions with an element count that fits in memory",
                    format!("{shape:?}"),
                ));
            }
        }
    }
    let out = match datatype {
        DataType::Bool => c.bool_contents.iter().map(|&b| u8::from(b)).collect(),
        DataType::Int8 => narrow(&c.int_contents, model, input, datatype, |v: i8| {
            v.to_le_bytes().to_vec()
        })?,
        DataType::Int16 => narrow(&c.int_contents, model, input, datatype, |v: i16| {
            v.to_le_bytes().to_vec()
        })?,
        DataType::Int32 => c
            .int_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Int64 => c
            .int64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint8 => narrow(&c.uint_contents, model, input, datatype, |v: u8| {
            v.to_le_bytes().to_vec()
        })?,
        DataType::Uint16 => narrow(&c.uint_contents, model, input, datatype, |v: u16| {
            v.to_le_bytes().to_vec()
        })?,
        DataType::Uint32 => c
            .uint_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint64 => c
            .uint64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp32 => c
            .fp32_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp64 => c
            .fp64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    };
    if out.is_empty() && !contents_empty(c) {
        return Err(Error::input(
            model,
            input,
            format!("{datatype} data in contents.{field}"),
            "data in another contents field",
        ));
    }
    Ok(out)
}

/// Encodes a response: raw bytes when `raw`, typed contents otherwise.
pub fn encode(response: InferResponse, raw: bool) -> pb::ModelInferResponse {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut raw_output_contents = Vec::new();
    for o in response.outputs {
        let contents = if raw {
            raw_output_contents.push(o.data);
            None
        } else {
            Some(bytes_to_typed(o.datatype, &o.data))
        };
        outputs.push(pb::model_infer_response::InferOutputTensor {
            name: o.name,
            datatype: o.datatype.as_str().to_string(),
            shape: o.shape,
            parameters: Default::default(),
            contents,
        });
    }
    pb::ModelInferResponse {
        model_name: response.model,
        model_version: response.version,
        id: response.id,
        parameters: if response.sequence_restarted {
            [(
                "sequence_restarted".to_string(),
                pb::InferParameter {
                    parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(true)),
                },
            )]
            .into()
        } else {
            Default::default()
        },
        outputs,
        raw_output_contents,
    }
}

fn bytes_to_typed(datatype: DataType, data: &[u8]) -> pb::InferTensorContents {
    fn each<const N: usize, T>(data: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        data.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect()
    }
    let mut c = pb::InferTensorContents::default();
    match datatype {
        DataType::Bool => c.bool_contents = data.iter().map(|&b| b != 0).collect(),
        DataType::Int8 => c.int_contents = data.iter().map(|&b| b as i8 as i32).collect(),
        DataType::Int16 => c.int_contents = each(data, |a| i16::from_le_bytes(a) as i32),
        DataType::Int32 => c.int_contents = each(data, i32::from_le_bytes),
        DataType::Int64 => c.int64_contents = each(data, i64::from_le_bytes),
        DataType::Uint8 => c.uint_contents = data.iter().map(|&b| b as u32).collect(),
        DataType::Uint16 => c.uint_contents = each(data, |a| u16::from_le_bytes(a) as u32),
        DataType::Uint32 => c.uint_contents = each(data, u32::from_le_bytes),
        DataType::Uint64 => c.uint64_contents = each(data, u64::from_le_bytes),
        DataType::Fp32 => c.fp32_contents = each(data, f32::from_le_bytes),
        DataType::Fp64 => c.fp64_contents = each(data, f64::from_le_bytes),
    }
    c
}

/// A request's `grpc-timeout`: `Ok(None)` without one; a malformed one is
/// `Err` with what came, refused once the model is known (never ignored: the
/// client meant a deadline).
pub fn request_timeout(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Option<Duration>, String> {
    match metadata.get("grpc-timeout") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(parse_grpc_timeout)
            .map(Some)
            .ok_or_else(|| format!("{v:?}")),
    }
}

/// The error for a malformed `grpc-timeout` (`got`, from [`request_timeout`]).
pub fn malformed_timeout(model: &str, got: &str) -> Error {
    Error::request(
        model,
        format!(
            "the grpc-timeout header must be 1 to 8 digits and a unit (H, M, S, m, u, n); got {got}"
        ),
    )
}

/// Parses a `grpc-timeout` header value as the gRPC spec writes it: 1 to 8
/// digits and a unit (`100m`, `5S`, `250u`); `None` for anything else.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("250u"), Some(Duration::from_micros(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout("10q"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("+5S"), None);
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(
            parse_grpc_timeout("123456789S"),
            None,
            "9 digits: over the spec's 8"
        );
        assert_eq!(parse_grpc_timeout("5é"), None);
    }

    #[test]
    fn typed_contents_must_match_the_datatype() {
        let c = pb::InferTensorContents {
            fp64_contents: vec![1.0],
            ..Default::default()
        };
        let err = typed_to_bytes("m", "x", DataType::Fp32, &[1], &c).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected FP32 data in contents.fp32_contents"),
            "{err}"
        );
        let c = pb::InferTensorContents {
            int_contents: vec![1, 200],
            ..Default::default()
        };
        let err = typed_to_bytes("m", "x", DataType::Int8, &[2], &c).unwrap_err();
        assert!(
            err.to_string().contains("200 (out of range) at element 1"),
            "{err}"
        );
    }

    #[test]
    fn typed_contents_that_do_not_fill_the_shape_are_refused_before_conversion() {
        let c = pb::InferTensorContents {
            fp32_contents: vec![0.0; 7],
            ..Default::default()
        };
        let err = typed_to_bytes("m", "x", DataType::Fp32, &[1, 50], &c).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected 50 values in contents.fp32_contents (shape [1, 50]), got 7"),
            "{err}"
        );
        let err = typed_to_bytes("m", "x", DataType::Fp32, &[-1, 7], &c).unwrap_err();
        assert!(err.to_string().contains("non-negative"), "{err}");
        let err = typed_to_bytes("m", "x", DataType::Fp32, &[i64::MAX, i64::MAX], &c).unwrap_err();
        assert!(err.to_string().contains("non-negative"), "{err}");
        assert_eq!(
            typed_to_bytes("m", "x", DataType::Fp32, &[7], &c)
                .unwrap()
                .len(),
            28
        );
    }
}
