//! Reads ONNX model files for tickserve: the declared signature, fixing
//! dynamic dimensions from configuration, and rewriting a model so that every
//! input and output has a static batch dimension (one copy per bucket, compiled
//! once by an engine).
//!
//! The model loader calls [`OnnxModel::parse`] and [`OnnxModel::signature`];
//! engines call [`OnnxModel::with_static_batch`]. Parsing uses the ONNX
//! project's own protobuf definition (`proto/onnx/onnx-ml.proto`).

use std::collections::HashSet;

mod family_key;

use prost::Message;
use tickserve_core::config::ModelConfig;
use tickserve_core::{DataType, Signature, TensorSpec};

/// The ONNX protobuf types, generated from `onnx-ml.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

use proto::tensor_shape_proto::dimension::Value as DimValue;

pub use tickserve_core::Weight;

/// `model` as the bytes of an `.onnx` file (protobuf): for the tests and
/// fuzzers that write models of their own.
pub fn encode(model: &proto::ModelProto) -> Vec<u8> {
    use prost::Message;
    model.encode_to_vec()
}

/// Reads a stored tensor (an initializer or a `Constant`'s value) as a
/// [`Weight`]: raw data, or float / int64 data.
pub fn tensor_weight(t: &proto::TensorProto) -> Result<Weight, String> {
    let datatype = element_type(t.data_type()).ok_or_else(|| {
        format!(
            "weight '{}' has an element type tickserve does not serve",
            t.name()
        )
    })?;
    let data = if let Some(raw) = &t.raw_data {
        raw.clone()
    } else if datatype == DataType::Fp32 {
        t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else if datatype == DataType::Int64 {
        t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        return Err(format!(
            "weight '{}' is stored in a form tickserve does not read",
            t.name()
        ));
    };
    let dims = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| format!("weight '{}' has a negative dimension ({d})", t.name()))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    // Its element count, and its bytes, must be numbers: a file's dimensions
    // whose product wraps would pass any size check after it.
    let elements = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| n.checked_mul(datatype.size()).is_some())
        .ok_or_else(|| {
            format!(
                "weight '{}': its dimensions {dims:?} hold more elements than can be addressed",
                t.name()
            )
        })?;
    if data.len() != elements * datatype.size() {
        return Err(format!(
            "weight '{}' holds {} bytes, not the {} its dimensions {dims:?} need",
            t.name(),
            data.len(),
            elements * datatype.size()
        ));
    }
    Ok(Weight {
        name: t.name().to_string(),
        datatype,
        dims,
        data,
    })
}

/// One dimension as the ONNX file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A dynamic dimension with a symbolic name (`batch`, `seq`).
    Named(String),
    /// A dynamic dimension with no name.
    Unknown,
}

/// A parsed ONNX model.
#[derive(Debug, Clone)]
pub struct OnnxModel {
    model: proto::ModelProto,
}

/// A model's graph as an engine compiles it (the `G` of
/// [`tickserve_core::Engine`]): the ONNX graph, with its weights as constants
/// or as inputs, and the signature resolved from the file and `model.toml`.
#[derive(Debug, Clone)]
pub struct ModelGraph {
    /// The graph.
    pub onnx: OnnxModel,
    /// Its signature (output dimensions resolved by the engine's warm-up).
    pub signature: PartialSignature,
}

/// A signature whose output dimensions may still be unknown; the engine's
/// warm-up run resolves those.
#[derive(Debug, Clone)]
pub struct PartialSignature {
    /// Inputs, every dimension fixed.
    pub inputs: Vec<TensorSpec>,
    /// Outputs: name, datatype and non-batch dimensions where known.
    pub outputs: Vec<(String, DataType, Vec<Option<usize>>)>,
}

impl PartialSignature {
    /// The full signature, once every output dimension is known.
    pub fn complete(&self, outputs: Vec<Vec<usize>>) -> Signature {
        Signature {
            inputs: self.inputs.clone(),
            outputs: self
                .outputs
                .iter()
                .zip(outputs)
                .map(|((name, datatype, _), dims)| TensorSpec {
                    name: name.clone(),
                    datatype: *datatype,
                    dims,
                })
                .collect(),
        }
    }
}

impl OnnxModel {
    /// Parses the bytes of an `.onnx` file.
    pub fn parse(bytes: &[u8]) -> Result<OnnxModel, String> {
        let model = proto::ModelProto::decode(bytes)
            .map_err(|e| format!("not a valid ONNX model file: {e}"))?;
        if model.graph.is_none() {
            return Err("the ONNX file holds no graph".to_string());
        }
        Ok(OnnxModel { model })
    }

    fn graph(&self) -> &proto::GraphProto {
        // `parse` refuses models without a graph.
        self.model
            .graph
            .as_ref()
            .expect("parse checked the graph is present")
    }

    /// The graph's real inputs: graph inputs that are not initializers.
    fn graph_inputs(&self) -> impl Iterator<Item = &proto::ValueInfoProto> {
        let graph = self.graph();
        let weights: HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
        graph
            .input
            .iter()
            .filter(move |v| !weights.contains(v.name()))
    }

    /// The model's family key: equal for models whose graphs differ only in
    /// the values of their weights (see the `family_key` module).
    pub fn family_key(&self) -> String {
        family_key::family_key(&self.model)
    }

    /// This model with its weights turned into graph inputs (no initializers
    /// left), and the weights themselves: one graph for a whole family, each
    /// member's weights bound at run time. Weights must be stored as raw data
    /// or as float data.
    pub fn with_weights_as_inputs(&self) -> Result<(OnnxModel, Vec<Weight>), String> {
        let mut model = self.model.clone();
        let graph = model.graph.as_mut().ok_or("the ONNX file holds no graph")?;
        let initializers = std::mem::take(&mut graph.initializer);
        let mut weights = Vec::with_capacity(initializers.len());
        for t in initializers {
            let weight = tensor_weight(&t)?;
            graph.input.push(proto::ValueInfoProto {
                name: Some(t.name().to_string()),
                r#type: Some(proto::TypeProto {
                    value: Some(proto::type_proto::Value::TensorType(
                        proto::type_proto::Tensor {
                            elem_type: Some(t.data_type()),
                            shape: Some(proto::TensorShapeProto {
                                dim: t
                                    .dims
                                    .iter()
                                    .map(|&d| proto::tensor_shape_proto::Dimension {
                                        value: Some(DimValue::DimValue(d)),
                                        denotation: None,
                                    })
                                    .collect(),
                            }),
                        },
                    )),
                    denotation: None,
                }),
                doc_string: None,
                metadata_props: Vec::new(),
            });
            weights.push(weight);
        }
        Ok((OnnxModel { model }, weights))
    }

    /// The graph itself, for engines that import it op by op.
    pub fn graph_proto(&self) -> &proto::GraphProto {
        self.graph()
    }

    /// The opset version of the default (`ai.onnx`) domain.
    pub fn opset(&self) -> i64 {
        self.model
            .opset_import
            .iter()
            .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
            .map_or(1, |o| o.version())
    }

    /// True when the graph holds a tree-ensemble operator (`ai.onnx.ml`
    /// TreeEnsemble*), which reads NaN as a missing value.
    pub fn is_tree_ensemble(&self) -> bool {
        self.graph()
            .node
            .iter()
            .any(|n| n.domain() == "ai.onnx.ml" && n.op_type().starts_with("TreeEnsemble"))
    }

    /// The distinct operator types in the graph, as `domain::Op` (`Gemm` for the default domain).
    pub fn operators(&self) -> Vec<String> {
        let mut ops: Vec<String> = self
            .graph()
            .node
            .iter()
            .map(|n| {
                if n.domain().is_empty() || n.domain() == "ai.onnx" {
                    n.op_type().to_string()
                } else {
                    format!("{}::{}", n.domain(), n.op_type())
                }
            })
            .collect();
        ops.sort();
        ops.dedup();
        ops
    }

    /// Resolves the model's signature: datatypes from the file, the batch as
    /// the first dimension, every other input dimension fixed by the file or by
    /// `config` (`[dimensions]` by name, `[inputs.NAME] dims`). A dimension
    /// left dynamic is an error naming it and saying how to fix it.
    pub fn signature(&self, config: &ModelConfig) -> Result<PartialSignature, String> {
        let mut inputs = Vec::new();
        for value in self.graph_inputs() {
            let (datatype, dims) = tensor_type(value)?;
            let dims = resolve_input_dims(value.name(), &dims, config)?;
            inputs.push(TensorSpec {
                name: value.name().to_string(),
                datatype,
                dims,
            });
        }
        if inputs.is_empty() {
            return Err("the model has no inputs".to_string());
        }
        for name in config.inputs.keys() {
            if !inputs.iter().any(|t| &t.name == name) {
                return Err(format!(
                    "model.toml has [inputs.{name}] but the model has no input '{name}'"
                ));
            }
        }
        let mut outputs = Vec::new();
        for value in &self.graph().output {
            let (datatype, dims) = tensor_type(value)?;
            let resolved = match config.outputs.get(value.name()) {
                Some(o) => o.dims.iter().map(|&d| Some(d)).collect(),
                None => dims[1..]
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(v) if *v > 0 => Some(*v as usize),
                        Dim::Named(n) => config.dimensions.get(n).copied(),
                        _ => None,
                    })
                    .collect(),
            };
            outputs.push((value.name().to_string(), datatype, resolved));
        }
        Ok(PartialSignature { inputs, outputs })
    }

    /// This model with every input's and output's batch dimension set to
    /// `batch` and every input's other dimensions to `signature`'s, encoded.
    pub fn with_static_batch(&self, batch: usize, signature: &PartialSignature) -> Vec<u8> {
        let mut model = self.model.clone();
        let weights: HashSet<String> = self
            .graph()
            .initializer
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        if let Some(graph) = model.graph.as_mut() {
            for value in graph
                .input
                .iter_mut()
                .filter(|v| !weights.contains(v.name()))
            {
                if let Some(spec) = signature.inputs.iter().find(|s| s.name == value.name()) {
                    let dims =
                        std::iter::once(Some(batch)).chain(spec.dims.iter().map(|&d| Some(d)));
                    set_dims(value, dims);
                }
            }
            for value in graph.output.iter_mut() {
                if let Some((_, _, out_dims)) =
                    signature.outputs.iter().find(|o| o.0 == value.name())
                {
                    set_dims(
                        value,
                        std::iter::once(Some(batch)).chain(out_dims.iter().copied()),
                    );
                }
            }
        }
        model.encode_to_vec()
    }
}

fn set_dims(value: &mut proto::ValueInfoProto, dims: impl Iterator<Item = Option<usize>>) {
    use proto::type_proto::Value as TypeValue;
    let Some(TypeValue::TensorType(tensor)) = value.r#type.as_mut().and_then(|t| t.value.as_mut())
    else {
        return;
    };
    let shape = tensor.shape.get_or_insert_with(Default::default);
    let old = std::mem::take(&mut shape.dim);
    shape.dim = dims
        .zip(old.into_iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(new, old)| match new {
            Some(size) => proto::tensor_shape_proto::Dimension {
                value: Some(DimValue::DimValue(size as i64)),
                denotation: None,
            },
            None => old.unwrap_or_default(),
        })
        .collect();
}

/// Datatype and declared dimensions of a tensor-typed value.
fn tensor_type(value: &proto::ValueInfoProto) -> Result<(DataType, Vec<Dim>), String> {
    use proto::type_proto::Value as TypeValue;
    let name = value.name();
    let Some(TypeValue::TensorType(tensor)) = value.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Err(format!(
            "'{name}' is not a tensor; tickserve serves tensor inputs and outputs only"
        ));
    };
    let datatype = element_type(tensor.elem_type()).ok_or_else(|| {
        format!(
            "'{name}' has ONNX element type {}, which tickserve does not serve \
             (it serves BOOL, INT8..INT64, UINT8..UINT64, FP32, FP64)",
            element_type_name(tensor.elem_type())
        )
    })?;
    let Some(shape) = tensor.shape.as_ref() else {
        return Err(format!(
            "'{name}' has no declared shape; tickserve needs a fixed rank"
        ));
    };
    let dims: Vec<Dim> = shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(DimValue::DimValue(v)) => Dim::Fixed(*v),
            Some(DimValue::DimParam(p)) if !p.is_empty() => Dim::Named(p.clone()),
            _ => Dim::Unknown,
        })
        .collect();
    if dims.is_empty() {
        return Err(format!(
            "'{name}' is a scalar; tickserve needs the batch as the first dimension"
        ));
    }
    Ok((datatype, dims))
}

fn resolve_input_dims(
    name: &str,
    dims: &[Dim],
    config: &ModelConfig,
) -> Result<Vec<usize>, String> {
    if let Dim::Fixed(b) = dims[0] {
        return Err(format!(
            "input '{name}' has a fixed batch dimension of {b}; tickserve compiles one graph per \
             batch size and needs the first dimension dynamic: export the model with a dynamic \
             first dimension (e.g. dynamic_axes={{'{name}': {{0: 'batch'}}}})"
        ));
    }
    if let Some(over) = config.inputs.get(name) {
        if over.dims.len() != dims.len() - 1 {
            return Err(format!(
                "model.toml [inputs.{name}] dims has {} dimensions; the model's input has {} after the batch",
                over.dims.len(),
                dims.len() - 1
            ));
        }
        for (i, (&want, have)) in over.dims.iter().zip(&dims[1..]).enumerate() {
            if want == 0 || matches!(have, Dim::Fixed(v) if *v != want as i64) {
                return Err(format!(
                    "model.toml [inputs.{name}] dims[{i}] = {want} does not fit the model's {have:?}"
                ));
            }
        }
        return Ok(over.dims.clone());
    }
    dims[1..]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let position = i + 1;
            match d {
                Dim::Fixed(v) if *v > 0 => Ok(*v as usize),
                Dim::Fixed(v) => Err(format!("input '{name}' dimension {position} has size {v}")),
                Dim::Named(sym) => config.dimensions.get(sym).copied().ok_or_else(|| {
                    format!(
                        "input '{name}' dimension {position} ('{sym}') is dynamic; tickserve serves \
                         fixed signatures: fix it in the model's model.toml with\n  [dimensions]\n  {sym} = <size>"
                    )
                }),
                Dim::Unknown => Err(format!(
                    "input '{name}' dimension {position} is dynamic and unnamed; tickserve serves \
                     fixed signatures: fix it in the model's model.toml with\n  [inputs.{name}]\n  dims = [<every dimension after the batch>]"
                )),
            }
        })
        .collect()
}

fn element_type(t: i32) -> Option<DataType> {
    use proto::tensor_proto::DataType as E;
    Some(match E::try_from(t).ok()? {
        E::Float => DataType::Fp32,
        E::Double => DataType::Fp64,
        E::Uint8 => DataType::Uint8,
        E::Int8 => DataType::Int8,
        E::Uint16 => DataType::Uint16,
        E::Int16 => DataType::Int16,
        E::Int32 => DataType::Int32,
        E::Int64 => DataType::Int64,
        E::Uint32 => DataType::Uint32,
        E::Uint64 => DataType::Uint64,
        E::Bool => DataType::Bool,
        _ => return None,
    })
}

fn element_type_name(t: i32) -> String {
    proto::tensor_proto::DataType::try_from(t)
        .map(|e| e.as_str_name().to_string())
        .unwrap_or_else(|_| format!("#{t}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sample(name: &str) -> OnnxModel {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../config/models")
            .join(name)
            .join("1/model.onnx");
        OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn reads_sample_signatures() {
        let sig = sample("alpha_mlp")
            .signature(&ModelConfig::default())
            .unwrap();
        assert_eq!(sig.inputs[0].name, "features");
        assert_eq!(sig.inputs[0].dims, vec![50]);
        assert_eq!(sig.outputs[0].2, vec![Some(3)]);
        let sig = sample("seq_lstm")
            .signature(&ModelConfig::default())
            .unwrap();
        assert_eq!(sig.inputs[0].dims, vec![30, 8]);
        assert!(!sample("seq_lstm").is_tree_ensemble());
        assert!(sample("seq_lstm").operators().contains(&"LSTM".to_string()));
    }

    #[test]
    fn static_batch_rewrites_shapes() {
        let model = sample("alpha_mlp");
        let sig = model.signature(&ModelConfig::default()).unwrap();
        let bytes = model.with_static_batch(8, &sig);
        let again = OnnxModel::parse(&bytes).unwrap();
        let (_, dims) = tensor_type(&again.graph().input[0]).unwrap();
        assert_eq!(dims, vec![Dim::Fixed(8), Dim::Fixed(50)]);
        let (_, dims) = tensor_type(&again.graph().output[0]).unwrap();
        assert_eq!(dims, vec![Dim::Fixed(8), Dim::Fixed(3)]);
    }

    #[test]
    fn one_architecture_is_one_family() {
        let tick = sample("tick_000").family_key();
        for i in 1..8 {
            assert_eq!(
                sample(&format!("tick_{i:03}")).family_key(),
                tick,
                "tick_{i:03}"
            );
        }
        assert_ne!(sample("alpha_mlp").family_key(), tick);
        assert_ne!(sample("seq_lstm").family_key(), tick);
        assert_eq!(tick.len(), 16);
    }

    #[test]
    fn structure_changes_the_family_and_weight_values_do_not() {
        let base = sample("tick_000");
        let key = base.family_key();
        let mut other = base.clone();
        let graph = other.model.graph.as_mut().unwrap();
        graph.initializer[0].raw_data = Some(vec![0u8; graph.initializer[0].raw_data().len()]);
        assert_eq!(other.family_key(), key, "new weight values, same family");
        let mut other = base.clone();
        let graph = other.model.graph.as_mut().unwrap();
        graph.node[0].attribute.clear();
        assert_ne!(other.family_key(), key, "an attribute changed");
        let mut other = base.clone();
        let graph = other.model.graph.as_mut().unwrap();
        graph.node.swap(1, 2);
        assert_ne!(other.family_key(), key, "the topology changed");
        let mut other = base;
        let graph = other.model.graph.as_mut().unwrap();
        graph.initializer[0].dims[0] += 1;
        assert_ne!(other.family_key(), key, "a weight shape changed");
    }

    #[test]
    fn garbage_is_refused() {
        assert!(OnnxModel::parse(b"this is not an onnx model").is_err());
    }
}
