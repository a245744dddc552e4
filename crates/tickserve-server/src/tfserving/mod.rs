//! TF Serving's API, so that clients written for TensorFlow Serving call
//! tickserve unchanged: the REST API (`/v1/models/...`, [`rest`]) on the HTTP
//! port and `tensorflow.serving.PredictionService` / `ModelService`
//! ([`grpc`]) on the gRPC port.
//!
//! Both go through the same runtime path as the v2 front ends (admission,
//! validation, batching, deadlines, metrics with their own `protocol` label,
//! the restricted-API groups). What is TF Serving's own lives here: names,
//! datatypes, signatures and errors.
//!
//! Names: a model has one signature, `serving_default`. Its inputs and outputs
//! are called by their ONNX names; tf2onnx names a graph's tensors after the
//! TensorFlow tensors (`x:0`), so a trailing `:0` is dropped from the name a
//! TF Serving client sees and uses (`x`), and either spelling is accepted.

pub mod grpc;
pub mod json;
pub mod rest;
pub mod tensor;

use tickserve_core::{DataType, Error, Signature, TensorSpec};
use tickserve_runtime::Runtime;
use tickserve_runtime::VersionState;

use tickserve_proto::tensorflow::error::Code;
use tickserve_proto::tensorflow::serving::model_version_status::State;

/// The one signature a tickserve model has, under TF Serving's default name.
pub const SIGNATURE_NAME: &str = "serving_default";

/// The `method_name` of that signature.
pub const PREDICT_METHOD: &str = "tensorflow/serving/predict";

/// The name a TF Serving client uses for a tensor: its ONNX name without a
/// trailing `:0`.
pub fn alias(onnx_name: &str) -> &str {
    onnx_name.strip_suffix(":0").unwrap_or(onnx_name)
}

/// The position of the tensor a client called `name` in `specs`: its ONNX
/// name or its [`alias`].
pub fn position(specs: &[TensorSpec], name: &str) -> Option<usize> {
    specs
        .iter()
        .position(|t| t.name == name)
        .or_else(|| specs.iter().position(|t| alias(&t.name) == name))
}

/// The aliases of `specs`, for error messages: `x, y`.
pub fn aliases(specs: &[TensorSpec]) -> String {
    specs
        .iter()
        .map(|t| alias(&t.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The input a client called `name`, or an error naming the model's inputs.
pub fn input<'s>(
    model: &str,
    signature: &'s Signature,
    name: &str,
) -> Result<&'s TensorSpec, Error> {
    position(&signature.inputs, name)
        .map(|i| &signature.inputs[i])
        .ok_or_else(|| {
            Error::request(
                model,
                format!(
                    "no input '{name}' in signature '{SIGNATURE_NAME}'; its inputs: {}",
                    aliases(&signature.inputs)
                ),
            )
        })
}

/// The ONNX name of the output a client called `name`, or an error naming the
/// model's outputs.
pub fn output(model: &str, signature: &Signature, name: &str) -> Result<String, Error> {
    position(&signature.outputs, name)
        .map(|i| signature.outputs[i].name.clone())
        .ok_or_else(|| {
            Error::request(
                model,
                format!(
                    "no output '{name}' in signature '{SIGNATURE_NAME}'; its outputs: {}",
                    aliases(&signature.outputs)
                ),
            )
        })
}

/// Refuses a signature other than the one a tickserve model has (empty means
/// the default, as in TF Serving).
pub fn check_signature(model: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name == SIGNATURE_NAME {
        Ok(())
    } else {
        Err(Error::request(
            model,
            format!(
                "serving signature name \"{name}\" not found; a tickserve model has one \
                 signature, \"{SIGNATURE_NAME}\""
            ),
        ))
    }
}

/// One version's state, as TF Serving's model status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionStatus {
    /// The version.
    pub version: u64,
    /// `AVAILABLE` when it serves; `END` when its load failed or its engine
    /// cannot run (until a reload).
    pub state: State,
    /// `OK`, or why it does not serve.
    pub code: Code,
    /// The reason, empty when it serves.
    pub message: String,
}

/// The status of every version of `model`, or of the one asked for.
pub fn version_statuses(
    runtime: &Runtime,
    model: &str,
    version: Option<&str>,
) -> Result<Vec<VersionStatus>, Error> {
    let models = runtime.models();
    let not_found = |known: String| Error::ModelNotFound {
        model: model.to_string(),
        version: version.map(str::to_string),
        known,
    };
    let entry = models.get(model).ok_or_else(|| not_found(String::new()))?;
    let wanted = match version.filter(|v| !v.is_empty()) {
        None => None,
        Some(asked) => Some(
            entry
                .resolve(asked)
                .ok_or_else(|| not_found(entry.known()))?,
        ),
    };
    let statuses: Vec<VersionStatus> = entry
        .versions
        .iter()
        .filter(|(v, _)| wanted.is_none_or(|w| w == **v))
        .map(|(&version, state)| {
            let (state, code, message) = match state {
                VersionState::Ready(h) => match h.failure() {
                    None if h.is_ready() => (State::Available, Code::Ok, String::new()),
                    failure => (
                        State::End,
                        Code::Unavailable,
                        failure.unwrap_or_else(|| "not ready".to_string()),
                    ),
                },
                VersionState::Failed(reason) => (State::End, Code::Unknown, reason.clone()),
            };
            VersionStatus {
                version,
                state,
                code,
                message,
            }
        })
        .collect();
    if statuses.is_empty() {
        let known: Vec<String> = entry.versions.keys().map(u64::to_string).collect();
        return Err(match &entry.error {
            Some(reason) if entry.versions.is_empty() => Error::ModelNotReady {
                model: model.to_string(),
                version: "default".into(),
                reason: format!("its load failed: {reason}"),
            },
            _ => not_found(format!("versions: {}", known.join(", "))),
        });
    }
    Ok(statuses)
}

/// TensorFlow's `DataType` number for a tickserve datatype.
pub const fn tf_dtype(datatype: DataType) -> i32 {
    use tickserve_proto::tensorflow::DataType as T;
    (match datatype {
        DataType::Bool => T::DtBool,
        DataType::Uint8 => T::DtUint8,
        DataType::Uint16 => T::DtUint16,
        DataType::Uint32 => T::DtUint32,
        DataType::Uint64 => T::DtUint64,
        DataType::Int8 => T::DtInt8,
        DataType::Int16 => T::DtInt16,
        DataType::Int32 => T::DtInt32,
        DataType::Int64 => T::DtInt64,
        DataType::Fp32 => T::DtFloat,
        DataType::Fp64 => T::DtDouble,
    }) as i32
}

/// The tickserve datatype for TensorFlow's `DataType` number; `None` for the
/// types tickserve does not serve (strings, halves, complex, quantized).
pub fn from_tf_dtype(dtype: i32) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| tf_dtype(d) == dtype)
}

/// TensorFlow's name for a `DataType` number (`DT_FLOAT`), for messages and
/// the REST metadata.
pub fn tf_dtype_name(dtype: i32) -> String {
    use tickserve_proto::tensorflow::DataType as T;
    T::try_from(dtype).map_or_else(
        |_| format!("DataType {dtype}"),
        |t| t.as_str_name().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_datatype_maps_both_ways() {
        for d in DataType::ALL {
            assert_eq!(from_tf_dtype(tf_dtype(d)), Some(d), "{d}");
        }
        assert_eq!(tf_dtype_name(tf_dtype(DataType::Fp32)), "DT_FLOAT");
        assert_eq!(from_tf_dtype(7), None, "DT_STRING");
        assert_eq!(from_tf_dtype(19), None, "DT_HALF");
    }

    #[test]
    fn a_client_may_drop_the_tensor_suffix() {
        let specs = vec![
            TensorSpec {
                name: "x:0".into(),
                datatype: DataType::Fp32,
                dims: vec![],
            },
            TensorSpec {
                name: "y".into(),
                datatype: DataType::Fp32,
                dims: vec![],
            },
        ];
        assert_eq!(position(&specs, "x"), Some(0));
        assert_eq!(position(&specs, "x:0"), Some(0));
        assert_eq!(position(&specs, "y"), Some(1));
        assert_eq!(position(&specs, "z"), None);
        assert_eq!(aliases(&specs), "x, y");
    }
}
