//! Conversions between the v2 gRPC messages and the core's request and
//! response types.
//!
//! Inputs come either as `raw_input_contents` (little-endian bytes, taken
//! without a copy) or in the typed `contents` field matching the datatype
//! (converted, with range checks). A response uses `raw_output_contents` when
//! its request used raw inputs, and typed contents otherwise, as Triton does.

use tickserve_core::request::MAX_ID_BYTES;
use tickserve_core::validate::declared_datatype;
use tickserve_core::{DataType, Error, InferResponse, InputTensor, Signature};
use tickserve_runtime::ModelHandle;

use super::pb;
use tickserve_edge::params::{Param, Parameters};
use tickserve_edge::{Decoded, Payload};

/// A `ModelInferRequest` as tonic decoded it, for the edge to decode
/// against its model.
pub struct Message(pub pb::ModelInferRequest);

impl Payload for Message {
    /// Whether the answer goes back as `raw_output_contents`.
    type Encoding = bool;

    fn decode_bytes(&self) -> usize {
        // Raw contents are taken without a copy; typed contents were parsed
        // by prost already (off the async worker when large).
        0
    }

    fn decode(self, handle: &ModelHandle) -> Result<Decoded<bool>, Error> {
        decode(self.0, &handle.name, &handle.signature)
    }
}

/// An `InferParameter` as the parameter reader takes it.
pub fn param(parameter: &pb::InferParameter) -> Param<'_> {
    use pb::infer_parameter::ParameterChoice as P;
    match &parameter.parameter_choice {
        Some(P::BoolParam(b)) => Param::Bool(*b),
        Some(P::Int64Param(i)) => Param::Int(*i),
        Some(P::StringParam(s)) => Param::Str(s),
        Some(P::DoubleParam(x)) => Param::Float(*x),
        Some(P::Uint64Param(u)) => Param::Uint(*u),
        None => Param::Other("an InferParameter with no value"),
    }
}

/// Decodes a ModelInfer request for `model`, whose `signature` words the
/// error for a datatype tickserve does not know; the answer goes back raw
/// (`true`) when the request came raw.
pub fn decode(
    request: pb::ModelInferRequest,
    model: &str,
    signature: &Signature,
) -> Result<Decoded<bool>, Error> {
    if request.id.len() > MAX_ID_BYTES {
        return Err(Error::request(
            model,
            format!("the request id is longer than {MAX_ID_BYTES} bytes"),
        ));
    }
    let raw = !request.raw_input_contents.is_empty();
    if raw && request.raw_input_contents.len() != request.inputs.len() {
        return Err(Error::request(
            model,
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
        let datatype = declared_datatype(model, signature, &input.name, &input.datatype)?;
        let data = match (raw_contents.next(), input.contents) {
            (Some(_), Some(c)) if !contents_empty(&c) => {
                return Err(Error::input(
                    model,
                    &input.name,
                    "data in either raw_input_contents or contents",
                    "both",
                ));
            }
            (Some(bytes), _) => bytes,
            (None, Some(contents)) => {
                typed_to_bytes(model, &input.name, datatype, &input.shape, &contents)?.into()
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
    let given = request
        .parameters
        .iter()
        .map(|(name, value)| (name.as_str(), param(value)));
    let parameters = Parameters::read(model, given)?;
    let outputs = (!request.outputs.is_empty())
        .then(|| request.outputs.into_iter().map(|o| o.name).collect());
    Ok(Decoded {
        id: request.id,
        inputs,
        outputs,
        parameters,
        encoding: raw,
    })
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
            name: o.name.into(),
            datatype: o.datatype.as_str().to_string(),
            shape: o.shape,
            parameters: Default::default(),
            contents,
        });
    }
    pb::ModelInferResponse {
        model_name: response.model.into(),
        model_version: response.version.into(),
        id: response.id,
        parameters: response_parameters(response.sequence_restarted, response.window_ticks),
        outputs,
        raw_output_contents,
    }
}

/// A response's parameters: `sequence_restarted` when the sequence started
/// afresh, `sequence_window_ticks` for a windowed model's tick.
fn response_parameters(
    restarted: bool,
    window_ticks: Option<u64>,
) -> std::collections::HashMap<String, pb::InferParameter> {
    use pb::infer_parameter::ParameterChoice;
    let mut parameters = std::collections::HashMap::new();
    if restarted {
        parameters.insert(
            "sequence_restarted".to_string(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::BoolParam(true)),
            },
        );
    }
    if let Some(ticks) = window_ticks {
        parameters.insert(
            "sequence_window_ticks".to_string(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::Uint64Param(ticks)),
            },
        );
    }
    parameters
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

#[cfg(test)]
mod tests {
    use super::*;

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
