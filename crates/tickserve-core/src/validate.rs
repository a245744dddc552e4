//! Request validation against a model's signature, at the edge.
//!
//! Front ends call [`validate`] after decoding and before anything is queued:
//! a request that does not fit is refused here with a message that names the
//! model, the input, what was expected and what came, and never reaches an
//! executor. What passes is a [`ValidRequest`]: inputs in signature order,
//! a row count, and the outputs asked for.

use bytes::Bytes;

use serde::Deserialize;

use crate::{Error, InferRequest, Signature, TensorSpec};

/// What to do with NaN and infinity in float inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NanPolicy {
    /// Refuse the request (INVALID_ARGUMENT / 400).
    Reject,
    /// Pass them to the model (tree ensembles read NaN as "missing").
    Allow,
}

/// The limits a request is checked against, from the model's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most rows one request may carry.
    pub max_request_rows: usize,
    /// Whether NaN and infinity are refused in float inputs.
    pub nan_policy: NanPolicy,
}

/// A request that fits its model's signature.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// Rows (the batch dimension shared by every input).
    pub rows: usize,
    /// Input data in signature order, each `rows * row_bytes` long.
    pub inputs: Vec<Bytes>,
    /// Indices of the outputs to return, in the order asked.
    pub outputs: Vec<usize>,
    /// The smallest bucket (in rows) it may run in; 0: the smallest that
    /// holds its rows. Set only by a journal replay, which reruns a record
    /// in the bucket it ran in (bucket sizes change results in their last
    /// bits).
    pub bucket_rows: usize,
}

/// Checks `request` against `signature` and `limits`; errors name the
/// request's model.
pub fn validate(
    request: &InferRequest,
    signature: &Signature,
    limits: &Limits,
) -> Result<ValidRequest, Error> {
    validate_for(&request.model, request, signature, limits)
}

/// [`validate`] for a request of `model` (errors name it, whatever the
/// request's own `model` says).
pub fn validate_for(
    model: &str,
    request: &InferRequest,
    signature: &Signature,
    limits: &Limits,
) -> Result<ValidRequest, Error> {
    // Inline for up to eight inputs: no allocation for a typical model.
    let mut slots: smallvec::SmallVec<[Option<&crate::InputTensor>; 8]> =
        smallvec::smallvec![None; signature.inputs.len()];
    for tensor in &request.inputs {
        let Some(index) = signature.input_index(&tensor.name) else {
            return Err(Error::input(
                model,
                &tensor.name,
                format!("one of the model's inputs ({})", names(&signature.inputs)),
                "an input the model does not have",
            ));
        };
        if slots[index].replace(tensor).is_some() {
            return Err(Error::input(
                model,
                &tensor.name,
                "each input once",
                "it more than once",
            ));
        }
    }

    let mut rows: Option<(usize, &str)> = None;
    let mut inputs = Vec::with_capacity(slots.len());
    for (spec, slot) in signature.inputs.iter().zip(&slots) {
        let Some(tensor) = slot else {
            return Err(Error::input(
                model,
                &spec.name,
                format!("a tensor {} {}", spec.datatype, spec.display_shape()),
                "no such input in the request",
            ));
        };
        let tensor_rows = check_tensor(model, spec, tensor, limits)?;
        match rows {
            None => rows = Some((tensor_rows, spec.name.as_str())),
            Some((first, first_name)) if first != tensor_rows => {
                return Err(Error::input(
                    model,
                    &spec.name,
                    format!("{first} rows, as input '{first_name}' has"),
                    format!("{tensor_rows} rows"),
                ));
            }
            Some(_) => {}
        }
        inputs.push(if spec.datatype == crate::DataType::Bool {
            normalized_bools(&tensor.data)
        } else {
            tensor.data.clone()
        });
    }
    let rows = rows.map(|(r, _)| r).unwrap_or(0);
    if rows > limits.max_request_rows {
        return Err(Error::TooManyRows {
            model: model.to_string(),
            rows,
            limit: limits.max_request_rows,
        });
    }

    let outputs = match &request.outputs {
        // An empty list asks for every output, as no list does (Triton's
        // reading; gRPC cannot tell the two apart).
        None => (0..signature.outputs.len()).collect(),
        Some(asked) if asked.is_empty() => (0..signature.outputs.len()).collect(),
        Some(asked) => {
            let mut outputs = Vec::with_capacity(asked.len());
            for name in asked {
                let Some(index) = signature.output_index(name) else {
                    return Err(Error::request(
                        model,
                        format!(
                            "unknown output '{name}': expected one of the model's outputs ({}), got '{name}'",
                            names(&signature.outputs)
                        ),
                    ));
                };
                if outputs.contains(&index) {
                    return Err(Error::request(
                        model,
                        format!("output '{name}' is asked for more than once"),
                    ));
                }
                outputs.push(index);
            }
            outputs
        }
    };
    Ok(ValidRequest {
        rows,
        inputs,
        outputs,
        bucket_rows: 0,
    })
}

/// The error for an input whose declared datatype tickserve does not know
/// (`FP16`, `BYTES`, a typo), found while decoding, before [`validate`]:
/// names the datatype `signature` expects of that input, or every datatype
/// tickserve serves when the model has no such input.
pub fn unknown_datatype(model: &str, signature: &Signature, input: &str, got: &str) -> Error {
    let expected = match signature.input_index(input) {
        Some(index) => format!("datatype {}", signature.inputs[index].datatype),
        None => {
            let all: Vec<&str> = crate::DataType::ALL.iter().map(|d| d.as_str()).collect();
            format!("one of the datatypes tickserve serves ({})", all.join(", "))
        }
    };
    Error::input(model, input, expected, got)
}

/// Checks a shape a client declared for input `spec` (rank, every dimension
/// positive, the dimensions after the batch, at most `max_request_rows`
/// rows) and returns its rows: what a decoder checks before it makes a
/// tensor of that shape.
pub fn check_shape(
    model: &str,
    spec: &TensorSpec,
    shape: &[i64],
    limits: &Limits,
) -> Result<usize, Error> {
    let name = spec.name.as_str();
    let expected_shape = || format!("shape {}", spec.display_shape());
    if shape.len() != spec.dims.len() + 1 {
        return Err(Error::input(
            model,
            name,
            format!("{} (rank {})", expected_shape(), spec.dims.len() + 1),
            format!("shape {shape:?} (rank {})", shape.len()),
        ));
    }
    if shape.iter().any(|&d| d <= 0) {
        return Err(Error::input(
            model,
            name,
            format!("{} with every dimension positive", expected_shape()),
            format!("shape {shape:?}"),
        ));
    }
    if shape[1..]
        .iter()
        .zip(&spec.dims)
        .any(|(&got, &want)| got as u64 != want as u64)
    {
        return Err(Error::input(
            model,
            name,
            expected_shape(),
            format!("shape {shape:?}"),
        ));
    }
    let rows = usize::try_from(shape[0]).unwrap_or(usize::MAX);
    if rows > limits.max_request_rows {
        return Err(Error::TooManyRows {
            model: model.to_string(),
            rows,
            limit: limits.max_request_rows,
        });
    }
    Ok(rows)
}

/// Checks one tensor and returns its row count.
fn check_tensor(
    model: &str,
    spec: &TensorSpec,
    tensor: &crate::InputTensor,
    limits: &Limits,
) -> Result<usize, Error> {
    let name = spec.name.as_str();
    if tensor.datatype != spec.datatype {
        return Err(Error::input(
            model,
            name,
            format!("datatype {}", spec.datatype),
            tensor.datatype.as_str(),
        ));
    }
    let shape = &tensor.shape;
    let rows = check_shape(model, spec, shape, limits)?;
    // rows ≤ max_request_rows and row_bytes is fixed at load: no overflow.
    let want_bytes = rows * spec.row_bytes();
    if tensor.data.len() != want_bytes {
        let size = spec.datatype.size();
        return Err(Error::input(
            model,
            name,
            format!(
                "{} elements ({want_bytes} bytes) for shape {shape:?} of {}",
                want_bytes / size,
                spec.datatype
            ),
            format!(
                "{} bytes ({} elements)",
                tensor.data.len(),
                tensor.data.len() as f64 / size as f64
            ),
        ));
    }
    if limits.nan_policy == NanPolicy::Reject
        && spec.datatype.is_float()
        && let Some((index, value)) = first_non_finite(spec.datatype.size(), &tensor.data)
    {
        return Err(Error::input(
            model,
            name,
            "finite values (the model's nan_policy is \"reject\")",
            format!("{value} at element {index}"),
        ));
    }
    Ok(rows)
}

/// BOOL data as engines read it (C++ `bool`: 0 or 1, anything else is
/// undefined behaviour in their kernels): any non-zero byte is true. The bytes
/// are copied only when one is neither 0 nor 1.
fn normalized_bools(data: &Bytes) -> Bytes {
    if data.iter().all(|&b| b <= 1) {
        return data.clone();
    }
    data.iter()
        .map(|&b| u8::from(b != 0))
        .collect::<Vec<u8>>()
        .into()
}

/// The first NaN or infinity in little-endian float data of elements of
/// `size` bytes (4 or 8), with its index.
pub fn first_non_finite(size: usize, data: &[u8]) -> Option<(usize, f64)> {
    if all_finite(size, data) {
        return None;
    }
    if size == 4 {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .enumerate()
            .find(|(_, v)| !v.is_finite())
    } else {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite())
    }
}

/// Whether no element of `data` (as in [`first_non_finite`]) is a NaN or an
/// infinity: an element is one when its exponent bits are all set. One pass
/// without a branch per element (the compiler makes it vector code), for the
/// usual answer; [`first_non_finite`] looks for the index only when it is no.
fn all_finite(size: usize, data: &[u8]) -> bool {
    if size == 4 {
        const EXPONENT: u32 = 0x7f80_0000;
        !data.chunks_exact(4).fold(false, |found, c| {
            found | (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & EXPONENT == EXPONENT)
        })
    } else {
        const EXPONENT: u64 = 0x7ff0_0000_0000_0000;
        !data.chunks_exact(8).fold(false, |found, c| {
            let bits = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            found | (bits & EXPONENT == EXPONENT)
        })
    }
}

fn names(specs: &[TensorSpec]) -> String {
    specs
        .iter()
        .map(|t| format!("'{}'", t.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_bytes_other_than_0_and_1_are_read_as_true() {
        let signature = Signature {
            inputs: vec![TensorSpec {
                name: "mask".into(),
                datatype: crate::DataType::Bool,
                dims: vec![4],
            }],
            outputs: Vec::new(),
        };
        let request = InferRequest {
            model: "m".into(),
            version: None,
            id: String::new(),
            inputs: vec![crate::InputTensor {
                name: "mask".into(),
                datatype: crate::DataType::Bool,
                shape: vec![1, 4],
                data: Bytes::from_static(&[0, 1, 2, 255]),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        };
        let limits = Limits {
            max_request_rows: 8,
            nan_policy: NanPolicy::Reject,
        };
        let valid = validate(&request, &signature, &limits).unwrap();
        assert_eq!(&valid.inputs[0][..], &[0, 1, 1, 1]);
    }
    use crate::{DataType, InputTensor};

    fn signature() -> Signature {
        Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                datatype: DataType::Fp32,
                dims: vec![2],
            }],
            outputs: vec![TensorSpec {
                name: "y".into(),
                datatype: DataType::Fp32,
                dims: vec![1],
            }],
        }
    }

    fn request(shape: Vec<i64>, values: &[f32]) -> InferRequest {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        InferRequest {
            model: "m".into(),
            version: None,
            id: String::new(),
            inputs: vec![InputTensor {
                name: "x".into(),
                datatype: DataType::Fp32,
                shape,
                data: data.into(),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        }
    }

    const LIMITS: Limits = Limits {
        max_request_rows: 4,
        nan_policy: NanPolicy::Reject,
    };

    #[test]
    fn accepts_a_fitting_request() {
        let valid = validate(&request(vec![2, 2], &[1.0; 4]), &signature(), &LIMITS).unwrap();
        assert_eq!(valid.rows, 2);
        assert_eq!(valid.outputs, vec![0]);
    }

    #[test]
    fn refuses_with_named_problems() {
        let cases: Vec<(InferRequest, &str)> = vec![
            (
                request(vec![1, 3], &[1.0; 3]),
                "expected shape [batch, 2], got shape [1, 3]",
            ),
            (request(vec![2], &[1.0; 2]), "rank 2"),
            (request(vec![0, 2], &[]), "every dimension positive"),
            (request(vec![2, 2], &[1.0; 3]), "got 12 bytes"),
            (request(vec![5, 2], &[1.0; 10]), "more than the limit of 4"),
            (request(vec![1, 2], &[1.0, f32::NAN]), "NaN at element 1"),
            (
                request(vec![1, 2], &[f32::INFINITY, 1.0]),
                "inf at element 0",
            ),
        ];
        for (req, needle) in cases {
            let err = validate(&req, &signature(), &LIMITS).unwrap_err();
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
            assert!(err.to_string().contains("model 'm'"), "{err}");
        }
    }

    #[test]
    fn nan_allowed_when_policy_allows() {
        let limits = Limits {
            nan_policy: NanPolicy::Allow,
            ..LIMITS
        };
        assert!(
            validate(
                &request(vec![1, 2], &[f32::NAN, 1.0]),
                &signature(),
                &limits
            )
            .is_ok()
        );
    }

    #[test]
    fn unknown_missing_duplicate_inputs_and_outputs() {
        let mut req = request(vec![1, 2], &[1.0; 2]);
        req.inputs.push(req.inputs[0].clone());
        assert!(
            validate(&req, &signature(), &LIMITS)
                .unwrap_err()
                .to_string()
                .contains("more than once")
        );
        req.inputs[1].name = "z".into();
        assert!(
            validate(&req, &signature(), &LIMITS)
                .unwrap_err()
                .to_string()
                .contains("input 'z'")
        );
        req.inputs.clear();
        assert!(
            validate(&req, &signature(), &LIMITS)
                .unwrap_err()
                .to_string()
                .contains("no such input")
        );
        let mut req = request(vec![1, 2], &[1.0; 2]);
        req.outputs = Some(vec!["w".into()]);
        assert!(
            validate(&req, &signature(), &LIMITS)
                .unwrap_err()
                .to_string()
                .contains("unknown output 'w'")
        );
        req.inputs[0].datatype = DataType::Fp64;
        assert!(
            validate(&req, &signature(), &LIMITS)
                .unwrap_err()
                .to_string()
                .contains("expected datatype FP32, got FP64")
        );
    }

    /// Both sides of `max_request_rows`: exactly the limit passes, one more
    /// row is refused.
    #[test]
    fn exactly_max_request_rows_pass_and_one_more_is_refused() {
        let valid = validate(&request(vec![4, 2], &[1.0; 8]), &signature(), &LIMITS).unwrap();
        assert_eq!(valid.rows, 4);
        let err = validate(&request(vec![5, 2], &[1.0; 10]), &signature(), &LIMITS).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooManyRows {
                    rows: 5,
                    limit: 4,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// Every input carries the same rows; the error names both inputs.
    #[test]
    fn inputs_of_different_rows_are_refused() {
        let signature = Signature {
            inputs: vec![
                TensorSpec {
                    name: "x".into(),
                    datatype: DataType::Fp32,
                    dims: vec![2],
                },
                TensorSpec {
                    name: "w".into(),
                    datatype: DataType::Fp32,
                    dims: vec![1],
                },
            ],
            outputs: signature().outputs,
        };
        let mut req = request(vec![2, 2], &[1.0; 4]);
        let three_rows: Vec<u8> = [1f32; 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        req.inputs.push(InputTensor {
            name: "w".into(),
            datatype: DataType::Fp32,
            shape: vec![3, 1],
            data: three_rows.into(),
        });
        let err = validate(&req, &signature, &LIMITS).unwrap_err().to_string();
        assert!(
            err.contains("input 'w': expected 2 rows, as input 'x' has, got 3 rows"),
            "{err}"
        );
        let two_rows: Vec<u8> = [1f32; 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        req.inputs[1].shape = vec![2, 1];
        req.inputs[1].data = two_rows.into();
        assert_eq!(validate(&req, &signature, &LIMITS).unwrap().rows, 2);
    }

    /// A BOOL tensor whose every byte is over 1 is normalized too.
    #[test]
    fn bool_bytes_all_over_1_are_read_as_true() {
        assert_eq!(
            &normalized_bools(&Bytes::from_static(&[2, 255, 7, 9]))[..],
            &[1, 1, 1, 1]
        );
        assert_eq!(
            &normalized_bools(&Bytes::from_static(&[0, 1, 1, 0]))[..],
            &[0, 1, 1, 0]
        );
    }

    /// The all-finite pass agrees with `is_finite` on the edges of both
    /// widths: the largest finite value, the smallest subnormal, -0, the
    /// infinities, quiet and signalling NaNs, found at any place.
    #[test]
    fn every_non_finite_value_is_found_wherever_it_is() {
        let f32s = [f32::MAX, f32::MIN, f32::from_bits(1), -0.0, 1.0];
        let bad32 = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc0_0000),
        ];
        let f64s = [f64::MAX, f64::MIN, f64::from_bits(1), -0.0, 1.0];
        let bad64 = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0xfff8_0000_0000_0000),
        ];
        for len in [1usize, 7, 8, 9, 33] {
            let good: Vec<f32> = (0..len).map(|i| f32s[i % f32s.len()]).collect();
            let bytes: Vec<u8> = good.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(first_non_finite(4, &bytes), None, "{good:?}");
            let good: Vec<f64> = (0..len).map(|i| f64s[i % f64s.len()]).collect();
            let bytes: Vec<u8> = good.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(first_non_finite(8, &bytes), None, "{good:?}");
            for at in 0..len {
                for bad in bad32 {
                    let mut values: Vec<f32> = (0..len).map(|i| f32s[i % f32s.len()]).collect();
                    values[at] = bad;
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let (index, _) = first_non_finite(4, &bytes).expect("found");
                    assert_eq!(index, at, "{bad} among {len}");
                }
                for bad in bad64 {
                    let mut values: Vec<f64> = (0..len).map(|i| f64s[i % f64s.len()]).collect();
                    values[at] = bad;
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let (index, _) = first_non_finite(8, &bytes).expect("found");
                    assert_eq!(index, at, "{bad} among {len}");
                }
            }
        }
    }

    /// NaN and infinity are found in FP64 data as in FP32, at their index.
    #[test]
    fn non_finite_fp64_values_are_found_at_their_index() {
        let data: Vec<u8> = [1.0f64, 2.0, f64::NAN, f64::INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let (index, value) = first_non_finite(8, &data).unwrap();
        assert_eq!(index, 2);
        assert!(value.is_nan());
        let finite: Vec<u8> = [1.0f64, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(8, &finite), None);
    }

    /// An unknown input or output is answered with the model's own names.
    #[test]
    fn unknown_names_are_answered_with_the_model_s_names() {
        let mut req = request(vec![1, 2], &[1.0; 2]);
        req.inputs[0].name = "z".into();
        let err = validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string();
        assert!(err.contains("one of the model's inputs ('x')"), "{err}");
        let mut req = request(vec![1, 2], &[1.0; 2]);
        req.outputs = Some(vec!["w".into()]);
        let err = validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string();
        assert!(err.contains("one of the model's outputs ('y')"), "{err}");
    }
}
