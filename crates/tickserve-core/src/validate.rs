//! Request validation against a model's signature, at the edge.
//!
//! Front ends call [`validate`] after decoding and before anything is queued:
//! a request that does not fit is refused here with a message that names the
//! model, the input, what was expected and what came, and never reaches an
//! executor. What passes is a [`ValidRequest`]: inputs in signature order,
//! a row count, and the outputs asked for.

use bytes::Bytes;

use serde::Deserialize;

use crate::{Error, InferRequest, ModelRequest, Signature, TensorSpec};

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
    validate_for(&request.model, &request.request, signature, limits)
}

/// [`validate`] for a request to `model` (errors name it).
pub fn validate_for(
    model: &str,
    request: &ModelRequest,
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

/// The datatype a request declares for `input` (`got`), read while
/// decoding, before [`validate`]; one tickserve does not know (`FP16`,
/// `BYTES`, a typo) is an error naming the datatype `signature` expects of
/// that input, or every datatype tickserve serves when the model has no
/// such input.
pub fn declared_datatype(
    model: &str,
    signature: &Signature,
    input: &str,
    got: &str,
) -> Result<crate::DataType, Error> {
    if let Some(datatype) = crate::DataType::parse(got) {
        return Ok(datatype);
    }
    let expected = match signature.input_index(input) {
        Some(index) => format!("datatype {}", signature.inputs[index].datatype),
        None => {
            let all: Vec<&str> = crate::DataType::ALL.iter().map(|d| d.as_str()).collect();
            format!("one of the datatypes tickserve serves ({})", all.join(", "))
        }
    };
    Err(Error::input(model, input, expected, got))
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
mod tests;
