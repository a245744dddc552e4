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
}

/// Checks `request` against `signature` and `limits`.
pub fn validate(
    request: &InferRequest,
    signature: &Signature,
    limits: &Limits,
) -> Result<ValidRequest, Error> {
    let model = request.model.as_str();
    let mut slots: Vec<Option<&crate::InputTensor>> = vec![None; signature.inputs.len()];
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
        None => (0..signature.outputs.len()).collect(),
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

/// The first NaN or infinity in little-endian float data, with its index.
fn first_non_finite(size: usize, data: &[u8]) -> Option<(usize, f64)> {
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
}
