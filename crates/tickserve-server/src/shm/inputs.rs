//! A request's inputs and parameters, read from its copy of the client's
//! sample into the edge's terms.

use bytes::Bytes;
use tickserve_core::{DataType, Error, InputTensor};
use tickserve_edge::params::{Param, Parameters};
use tickserve_edge::{Decoded, Payload};
use tickserve_runtime::ModelHandle;
use tickserve_shm_protocol as wire;

/// A request's inputs, copied out of the client's sample (which goes back
/// to the client with the answer), and its parameters, read: each, or why
/// it cannot be.
pub(crate) struct Inputs {
    /// The tensors, or why they cannot be read.
    pub(crate) tensors: Result<Vec<InputTensor>, Error>,
    /// The parameters, or why they cannot be read.
    pub(crate) parameters: Result<Parameters, Error>,
}

impl Payload for Inputs {
    type Encoding = ();

    fn decode_bytes(&self) -> usize {
        0
    }

    fn decode(self, _: &ModelHandle) -> Result<Decoded<()>, Error> {
        Ok(Decoded {
            id: String::new(),
            inputs: self.tensors?,
            outputs: None,
            parameters: self.parameters?,
            encoding: (),
        })
    }
}

/// A parameter of the wire's block as the parameter reader takes it.
fn param<'a>(value: &wire::ParamValue<'a>) -> Param<'a> {
    match *value {
        wire::ParamValue::Bool(b) => Param::Bool(b),
        wire::ParamValue::Int(i) => Param::Int(i),
        wire::ParamValue::Uint(u) => Param::Uint(u),
        wire::ParamValue::Double(x) => Param::Float(x),
        wire::ParamValue::Str(s) => Param::Str(s),
    }
}

/// The inputs of a request for `name` (the wire's tensors, slices of
/// `owned`, the request's copy), and its parameters, read by the edge's one
/// reader.
pub(crate) fn copy_inputs(
    name: &str,
    parameters: &[wire::Parameter<'_>],
    inputs: &[wire::TensorRef<'_>],
    owned: &Bytes,
) -> Inputs {
    let parameters = Parameters::read(name, parameters.iter().map(|p| (p.name, param(&p.value))));
    let tensors = inputs
            .iter()
            .map(|t| {
                let datatype = wire::datatype_name(t.datatype)
                    .and_then(DataType::parse)
                    .ok_or_else(|| {
                        Error::input(
                            name,
                            t.name,
                            "a datatype tickserve serves (BOOL, UINT8..UINT64, INT8..INT64, FP32, FP64)",
                            wire::datatype_name(t.datatype)
                                .map_or_else(|| format!("datatype number {}", t.datatype), str::to_string),
                        )
                    })?;
                Ok(InputTensor {
                    name: t.name.to_string(),
                    datatype,
                    shape: t.dims.clone(),
                    data: owned.slice_ref(t.data),
                })
            })
            .collect();
    Inputs {
        tensors,
        parameters,
    }
}
