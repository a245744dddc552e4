//! TensorFlow's `TensorProto` to and from tickserve's tensors.
//!
//! A request tensor may carry its elements in `tensor_content` (raw
//! little-endian bytes, taken without a copy) or in the typed field of its
//! dtype (`float_val`, `int_val`, ...); in the typed fields, one element fills
//! the whole shape (TensorFlow's rule for version 0), within the request size
//! limit. Answers use the typed fields, as TF Serving's Predict does, so that
//! clients reading `outputs["y"].float_val` work unchanged.

use bytes::Bytes;
use tickserve_core::validate::{Limits, check_shape};
use tickserve_core::{DataType, Error, InputTensor, OutputTensor, TensorSpec};

use super::{alias, from_tf_dtype, tf_dtype, tf_dtype_name};
use tickserve_proto::tensorflow::{TensorProto, TensorShapeProto, tensor_shape_proto::Dim};

/// The typed field each datatype's values travel in.
const fn typed_field(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Fp32 => "float_val",
        DataType::Fp64 => "double_val",
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Uint8 | DataType::Uint16 => {
            "int_val"
        }
        DataType::Int64 => "int64_val",
        DataType::Uint32 => "uint32_val",
        DataType::Uint64 => "uint64_val",
        DataType::Bool => "bool_val",
    }
}

/// The typed fields that hold values, with their counts.
fn filled_fields(t: &TensorProto) -> Vec<(&'static str, usize)> {
    [
        ("half_val", t.half_val.len()),
        ("float_val", t.float_val.len()),
        ("double_val", t.double_val.len()),
        ("int_val", t.int_val.len()),
        ("string_val", t.string_val.len()),
        ("scomplex_val", t.scomplex_val.len()),
        ("int64_val", t.int64_val.len()),
        ("bool_val", t.bool_val.len()),
        ("dcomplex_val", t.dcomplex_val.len()),
        ("uint32_val", t.uint32_val.len()),
        ("uint64_val", t.uint64_val.len()),
        ("float8_val", t.float8_val.len()),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// The bytes decoding `tensor` for input `spec` will make beyond the
/// message's own: the whole tensor when its values come in a typed field
/// (where one value fills any shape), after its shape is checked against the
/// model's (rank, dimensions, `max_request_rows`) and its size against
/// `max_bytes`, so that nothing is filled for a shape the model refuses. 0
/// for `tensor_content` (taken without a copy) and for a shape decoding
/// refuses on its own (no shape, a negative dimension).
pub fn expansion(
    model: &str,
    spec: &TensorSpec,
    tensor: &TensorProto,
    limits: &Limits,
    max_bytes: usize,
) -> Result<usize, Error> {
    if !tensor.tensor_content.is_empty() {
        return Ok(0);
    }
    let Some(shape) = tensor.tensor_shape.as_ref().filter(|s| !s.unknown_rank) else {
        return Ok(0);
    };
    let dims: Vec<i64> = shape.dim.iter().map(|d| d.size).collect();
    if dims.iter().any(|&d| d < 0) {
        return Ok(0);
    }
    let rows = check_shape(model, spec, &dims, limits)?;
    let bytes = rows.saturating_mul(spec.row_bytes());
    if bytes > max_bytes {
        return Err(Error::input(
            model,
            alias(&spec.name),
            format!("at most {max_bytes} bytes of tensor (tickserve's request limit)"),
            format!("shape {dims:?}: {bytes} bytes"),
        ));
    }
    Ok(bytes)
}

/// The input `spec` from the tensor a client sent for it; `max_bytes` bounds
/// the decoded size (a one-element typed list may claim any shape).
pub fn decode(
    model: &str,
    spec: &TensorSpec,
    mut tensor: TensorProto,
    max_bytes: usize,
) -> Result<InputTensor, Error> {
    let name = alias(&spec.name);
    let fail = |expected: String, got: String| Error::input(model, name, expected, got);
    let Some(datatype) = from_tf_dtype(tensor.dtype) else {
        return Err(fail(
            tf_dtype_name(tf_dtype(spec.datatype)),
            format!(
                "{} (tickserve serves numeric and boolean tensors)",
                tf_dtype_name(tensor.dtype)
            ),
        ));
    };
    let shape_proto = tensor.tensor_shape.take().unwrap_or_default();
    if shape_proto.unknown_rank {
        return Err(fail("a tensor_shape".into(), "unknown_rank".into()));
    }
    let shape: Vec<i64> = shape_proto.dim.iter().map(|d| d.size).collect();
    let elements = shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
    });
    let Some(elements) = elements else {
        return Err(fail(
            "dimensions of 0 or more".into(),
            format!("shape {shape:?}"),
        ));
    };
    let bytes = elements
        .checked_mul(datatype.size())
        .filter(|&b| b <= max_bytes)
        .ok_or_else(|| {
            fail(
                format!("at most {max_bytes} bytes of tensor (tickserve's request limit)"),
                format!("shape {shape:?} of {}", tf_dtype_name(tensor.dtype)),
            )
        })?;
    let filled = filled_fields(&tensor);
    if !tensor.tensor_content.is_empty() {
        if let Some((field, _)) = filled.first() {
            return Err(fail(
                "tensor_content or a typed field".into(),
                format!("tensor_content and {field}"),
            ));
        }
        if tensor.tensor_content.len() != bytes {
            return Err(fail(
                format!("{bytes} bytes of tensor_content for shape {shape:?}"),
                format!("{} bytes", tensor.tensor_content.len()),
            ));
        }
        return Ok(InputTensor {
            name: spec.name.clone(),
            datatype,
            shape,
            data: tensor.tensor_content,
        });
    }
    let field = typed_field(datatype);
    if let Some((other, _)) = filled.iter().find(|(f, _)| *f != field) {
        return Err(fail(
            format!(
                "{} values in {field} or tensor_content",
                tf_dtype_name(tensor.dtype)
            ),
            (*other).to_string(),
        ));
    }
    let count = filled.first().map_or(0, |(_, n)| *n);
    if count != elements && !(count == 1 && elements > 1) {
        return Err(fail(
            format!("{elements} values in {field} for shape {shape:?} (or one, to fill it)"),
            format!("{count}"),
        ));
    }
    let mut data = Vec::with_capacity(bytes);
    let range = |v: i32| format!("{v} (out of range for {})", tf_dtype_name(tensor.dtype));
    for i in 0..elements {
        let at = if count == 1 { 0 } else { i };
        // An `int_val` entry as a narrower integer, range-checked.
        macro_rules! narrow {
            ($t:ty, $name:literal) => {{
                let v = tensor.int_val[at];
                <$t>::try_from(v).map_err(|_| fail(concat!($name, " values").into(), range(v)))?
            }};
        }
        match datatype {
            DataType::Fp32 => data.extend(tensor.float_val[at].to_le_bytes()),
            DataType::Fp64 => data.extend(tensor.double_val[at].to_le_bytes()),
            DataType::Int32 => data.extend(tensor.int_val[at].to_le_bytes()),
            DataType::Int16 => data.extend(narrow!(i16, "INT16").to_le_bytes()),
            DataType::Int8 => data.extend(narrow!(i8, "INT8").to_le_bytes()),
            DataType::Uint16 => data.extend(narrow!(u16, "UINT16").to_le_bytes()),
            DataType::Uint8 => data.push(narrow!(u8, "UINT8")),
            DataType::Int64 => data.extend(tensor.int64_val[at].to_le_bytes()),
            DataType::Uint32 => data.extend(tensor.uint32_val[at].to_le_bytes()),
            DataType::Uint64 => data.extend(tensor.uint64_val[at].to_le_bytes()),
            DataType::Bool => data.push(u8::from(tensor.bool_val[at])),
        }
    }
    Ok(InputTensor {
        name: spec.name.clone(),
        datatype,
        shape,
        data: Bytes::from(data),
    })
}

/// An answer's tensor, its values in the typed field of its dtype.
pub fn encode(output: &OutputTensor) -> TensorProto {
    let mut tensor = TensorProto {
        dtype: tf_dtype(output.datatype),
        tensor_shape: Some(shape(&output.shape)),
        ..Default::default()
    };
    let bytes = &output.data;
    macro_rules! fill {
        ($field:ident, $t:ty, $n:expr, $into:ty) => {
            tensor.$field = bytes
                .chunks_exact($n)
                .map(|c| {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    <$into>::from(<$t>::from_le_bytes(a))
                })
                .collect()
        };
    }
    match output.datatype {
        DataType::Fp32 => fill!(float_val, f32, 4, f32),
        DataType::Fp64 => fill!(double_val, f64, 8, f64),
        DataType::Int32 => fill!(int_val, i32, 4, i32),
        DataType::Int16 => fill!(int_val, i16, 2, i32),
        DataType::Int8 => fill!(int_val, i8, 1, i32),
        DataType::Uint16 => fill!(int_val, u16, 2, i32),
        DataType::Uint8 => fill!(int_val, u8, 1, i32),
        DataType::Int64 => fill!(int64_val, i64, 8, i64),
        DataType::Uint32 => fill!(uint32_val, u32, 4, u32),
        DataType::Uint64 => fill!(uint64_val, u64, 8, u64),
        DataType::Bool => tensor.bool_val = bytes.iter().map(|&b| b != 0).collect(),
    }
    tensor
}

/// A `TensorShapeProto` of `dims` (`-1` for a dimension that varies).
pub fn shape(dims: &[i64]) -> TensorShapeProto {
    TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(datatype: DataType, dims: Vec<usize>) -> TensorSpec {
        TensorSpec {
            name: "x:0".into(),
            datatype,
            dims,
        }
    }

    fn proto(dtype: DataType, dims: &[i64]) -> TensorProto {
        TensorProto {
            dtype: tf_dtype(dtype),
            tensor_shape: Some(shape(dims)),
            ..Default::default()
        }
    }

    #[test]
    fn typed_values_and_tensor_content_decode_alike() {
        let mut typed = proto(DataType::Fp32, &[2, 2]);
        typed.float_val = vec![1.0, 2.0, 3.0, 4.0];
        let mut raw = proto(DataType::Fp32, &[2, 2]);
        raw.tensor_content = [1f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into();
        let s = spec(DataType::Fp32, vec![2]);
        let a = decode("m", &s, typed, 1 << 20).unwrap();
        let b = decode("m", &s, raw, 1 << 20).unwrap();
        assert_eq!(a.data, b.data);
        assert_eq!(a.shape, vec![2, 2]);
        assert_eq!(a.name, "x:0");
    }

    #[test]
    fn one_typed_value_fills_the_shape_within_the_limit() {
        let mut t = proto(DataType::Int8, &[1, 3]);
        t.int_val = vec![-2];
        let d = decode("m", &spec(DataType::Int8, vec![3]), t, 1 << 20).unwrap();
        assert_eq!(&d.data[..], &[0xfe, 0xfe, 0xfe]);
        let mut huge = proto(DataType::Fp64, &[1 << 20, 1 << 20]);
        huge.double_val = vec![0.0];
        let e = decode("m", &spec(DataType::Fp64, vec![1 << 20]), huge, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("request limit"), "{e}");
    }

    #[test]
    fn wrong_fields_counts_and_ranges_are_named() {
        let s = spec(DataType::Int8, vec![2]);
        let mut t = proto(DataType::Int8, &[1, 2]);
        t.float_val = vec![1.0, 2.0];
        let e = decode("m", &s, t, 1 << 20).unwrap_err().to_string();
        assert!(
            e.contains("int_val") && e.contains("float_val") && e.contains("'x'"),
            "{e}"
        );
        let mut t = proto(DataType::Int8, &[1, 2]);
        t.int_val = vec![1, 300];
        let e = decode("m", &s, t, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("300 (out of range for DT_INT8)"), "{e}");
        let mut t = proto(DataType::Int8, &[1, 2]);
        t.int_val = vec![1, 2, 3];
        let e = decode("m", &s, t, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("2 values in int_val"), "{e}");
        let mut t = proto(DataType::Int8, &[1, -2]);
        t.int_val = vec![1];
        assert!(decode("m", &s, t, 1 << 20).is_err());
        let t = TensorProto {
            dtype: 7,
            ..Default::default()
        };
        let e = decode("m", &s, t, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("DT_STRING"), "{e}");
    }

    #[test]
    fn answers_use_the_typed_field() {
        let out = OutputTensor {
            name: "y".into(),
            datatype: DataType::Uint16,
            shape: vec![1, 2],
            data: [7u16, 65535].iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        let t = encode(&out);
        assert_eq!(t.int_val, vec![7, 65535]);
        assert_eq!(t.dtype, tf_dtype(DataType::Uint16));
        assert_eq!(t.tensor_shape.unwrap().dim.len(), 2);
    }
}
