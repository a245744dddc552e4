//! ONNX → [`Plan`]: the ops of MLP-style and recurrent trading models.
//!
//! Supported: Gemm, MatMul (activation × weight), Add, Sub, Mul, Div (an
//! activation with a broadcast weight, or two activations of one shape), Relu,
//! LeakyRelu, Tanh, Sigmoid, Softmax (over the last axis), Identity, Flatten
//! (axis 1), Reshape (to a constant shape that keeps the batch first),
//! BatchNormalization and LayerNormalization (inference), Constant, Conv over
//! one axis ([`dense`]);
//! Transpose, Squeeze, Unsqueeze, Slice, Gather and Concat on activations, and
//! the static shape arithmetic exporters write around them (Shape, Cast,
//! ConstantOfShape, Expand, folded at import) ([`layout`]); forward LSTM and
//! GRU ([`recurrent`]). Every activation is fp32. Anything else is an
//! [`Unsupported`] naming the node and the op: the model then runs on ONNX
//! Runtime, and the server says so.
//!
//! An activation is stored batch-first (the batch's rows one after another),
//! but may be seen with the batch at another axis ([`View`]): ONNX's LSTM
//! wants `[steps, batch, features]`, and a Transpose that only moves the
//! batch, a Squeeze or an Unsqueeze changes the view, not the floats.
//!
//! Elementwise nodes are fused into the step that made their input when that
//! step's result has no other reader, so `Gemm → Relu` is one product and one
//! epilogue kernel.

mod dense;
mod layout;
mod recurrent;

use std::collections::HashMap;

use tickserve_core::{DataType, TensorSpec, Weight};
use tickserve_onnx::OnnxModel;
use tickserve_onnx::proto::{AttributeProto, NodeProto};

use crate::plan::{Op, Plan, Step, Value, ValueId, WeightId, WeightSlot};

/// Why a model cannot be imported into a plan (and so runs on neither the
/// compiled CPU engine nor the CUDA engine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The op type (`LSTM`), or the graph part at fault.
    pub op: String,
    /// The node's name (or its first output's), if a node is at fault.
    pub node: String,
    /// What about it is not supported.
    pub reason: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.node.is_empty() {
            write!(f, "{}: {}", self.op, self.reason)
        } else {
            write!(f, "op {} (node '{}'): {}", self.op, self.node, self.reason)
        }
    }
}

/// A plan and the weights of the model it was imported from, in slot order.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The forward pass.
    pub plan: Plan,
    /// The model's own weights (its family's first member).
    pub weights: Vec<Weight>,
}

/// How an activation is seen: its plan value's floats, batch-first in
/// memory, as a tensor whose batch axis is at `batch`.
#[derive(Debug, Clone, PartialEq)]
struct View {
    /// The floats.
    value: ValueId,
    /// The non-batch dimensions, in order (their product is the value's width).
    dims: Vec<usize>,
    /// The batch's axis in the tensor (`0..=dims.len()`).
    batch: usize,
}

/// One axis of a tensor's shape as the importer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dim {
    /// The batch: known only at run time.
    Batch,
    /// A fixed size.
    Fixed(usize),
    /// `-1` in a shape being built for Reshape: whatever the rest leaves.
    Infer,
    /// `0` in a shape being built for Reshape: the input's size there.
    Same,
}

impl View {
    /// A batch-first view of `value`.
    fn first(value: ValueId, dims: Vec<usize>) -> View {
        View {
            value,
            dims,
            batch: 0,
        }
    }

    /// The tensor's shape.
    fn shape(&self) -> Vec<Dim> {
        let mut shape: Vec<Dim> = self.dims.iter().map(|&d| Dim::Fixed(d)).collect();
        shape.insert(self.batch, Dim::Batch);
        shape
    }

    /// The same floats seen with `shape`: one batch axis, the same element
    /// count, and as many elements before the batch as before (else the
    /// reshape would mix rows).
    fn reshaped(&self, shape: &[Dim]) -> Option<View> {
        let batch = shape.iter().position(|d| *d == Dim::Batch)?;
        let dims: Option<Vec<usize>> = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != batch)
            .map(|(_, d)| match d {
                Dim::Fixed(n) => Some(*n),
                _ => None,
            })
            .collect();
        let dims = dims?;
        let before = |dims: &[usize], batch: usize| dims[..batch].iter().product::<usize>();
        let same = dims.iter().product::<usize>() == self.dims.iter().product::<usize>()
            && before(&dims, batch) == before(&self.dims, self.batch);
        same.then_some(View {
            value: self.value,
            dims,
            batch,
        })
    }

    /// Row-major strides of the non-batch dimensions, in floats.
    fn strides(&self) -> Vec<isize> {
        let mut strides = vec![1isize; self.dims.len()];
        for i in (0..self.dims.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.dims[i + 1] as isize;
        }
        strides
    }

    /// The index among `dims` of tensor axis `axis` (not the batch's).
    fn stored(&self, axis: usize) -> usize {
        if axis > self.batch { axis - 1 } else { axis }
    }
}

/// A tensor name's meaning during import.
#[derive(Debug, Clone)]
enum Tensor {
    /// An activation.
    Dynamic(View),
    /// A constant: an initializer, a member weight or a Constant node.
    Constant(Weight),
    /// A shape computed from an activation's (Shape and the arithmetic on
    /// it): the batch, or a fixed size, per element.
    Shape(Vec<Dim>),
    /// A tensor of `shape` with every element `value` (ConstantOfShape or
    /// Expand of a scalar over a shape holding the batch).
    Filled {
        /// Its shape.
        shape: Vec<Dim>,
        /// Its value.
        value: f32,
    },
}

struct Importer<'a> {
    plan: Plan,
    names: HashMap<String, Tensor>,
    /// Weight name → slot, for weights already given a slot.
    slots: HashMap<String, WeightId>,
    weights: Vec<Weight>,
    /// How many nodes read each tensor name (graph outputs count as readers).
    readers: HashMap<&'a str, usize>,
    /// The tensor name each step wrote last (the only name it may fuse from).
    produced: Vec<String>,
    opset: i64,
}

/// Imports `model`, whose inputs are `inputs` (batch first, every other
/// dimension fixed). `weights` are the first member's weights for a graph
/// that takes them as inputs; a graph with its weights as initializers needs
/// none.
pub fn import(
    model: &OnnxModel,
    inputs: &[TensorSpec],
    weights: Option<&[Weight]>,
) -> Result<Imported, Unsupported> {
    let graph = model.graph_proto();
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for node in &graph.node {
        for input in node.input.iter().filter(|i| !i.is_empty()) {
            *readers.entry(input.as_str()).or_default() += 1;
        }
    }
    for output in &graph.output {
        *readers.entry(output.name()).or_default() += 1;
    }
    let mut importer = Importer {
        plan: Plan {
            values: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: Vec::new(),
            baked: Vec::new(),
            steps: Vec::new(),
        },
        names: HashMap::new(),
        slots: HashMap::new(),
        weights: Vec::new(),
        readers,
        produced: Vec::new(),
        opset: model.opset(),
    };
    for t in &graph.initializer {
        let weight = tickserve_onnx::tensor_weight(t).map_err(|reason| Unsupported {
            op: "initializer".into(),
            node: t.name().into(),
            reason,
        })?;
        importer
            .names
            .insert(weight.name.clone(), Tensor::Constant(weight));
    }
    for w in weights.unwrap_or_default() {
        importer
            .names
            .insert(w.name.clone(), Tensor::Constant(w.clone()));
    }
    for spec in inputs {
        if spec.datatype != DataType::Fp32 {
            return Err(Unsupported {
                op: "input".into(),
                node: spec.name.clone(),
                reason: format!("datatype {} (plans are FP32)", spec.datatype),
            });
        }
        let value = importer.value(spec.dims.clone());
        importer.plan.inputs.push((spec.name.clone(), value));
        importer.names.insert(
            spec.name.clone(),
            Tensor::Dynamic(View::first(value, spec.dims.clone())),
        );
    }
    for node in &graph.node {
        importer.node(node)?;
    }
    for output in &graph.output {
        let view = match importer.names.get(output.name()) {
            Some(Tensor::Dynamic(view)) => view.clone(),
            _ => {
                return Err(Unsupported {
                    op: "output".into(),
                    node: output.name().into(),
                    reason: "is not computed from the inputs".into(),
                });
            }
        };
        if view.batch != 0 {
            return Err(Unsupported {
                op: "output".into(),
                node: output.name().into(),
                reason: format!("its batch is axis {}, not the first", view.batch),
            });
        }
        let value = importer.seen_as(&view, output.name());
        importer
            .plan
            .outputs
            .push((output.name().to_string(), value));
    }
    importer.outputs_apart();
    Ok(Imported {
        plan: importer.plan,
        weights: importer.weights,
    })
}

/// Orders a member's `weights` into `plan`'s slots, as floats, checking
/// names, element types, dimensions and the constants the plan baked in.
pub fn arrange(plan: &Plan, weights: &[Weight]) -> Result<Vec<Vec<f32>>, String> {
    let by_name: HashMap<&str, &Weight> = weights.iter().map(|w| (w.name.as_str(), w)).collect();
    for (name, bytes) in &plan.baked {
        if let Some(w) = by_name.get(name.as_str())
            && &w.data != bytes
        {
            return Err(format!(
                "constant '{name}' differs from the family's (it shapes the graph)"
            ));
        }
    }
    plan.weights
        .iter()
        .map(|slot| {
            let w = by_name
                .get(slot.name.as_str())
                .ok_or_else(|| format!("weight '{}' is missing", slot.name))?;
            if w.datatype != DataType::Fp32 || w.dims != slot.dims {
                return Err(format!(
                    "weight '{}': expected FP32 {:?}, got {} {:?}",
                    slot.name, slot.dims, w.datatype, w.dims
                ));
            }
            if w.data.len() != slot.len * 4 {
                return Err(format!(
                    "weight '{}': expected {} bytes, got {}",
                    slot.name,
                    slot.len * 4,
                    w.data.len()
                ));
            }
            Ok(w.data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        })
        .collect()
}

fn attribute<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name() == name)
}

fn int_attribute(node: &NodeProto, name: &str, default: i64) -> i64 {
    attribute(node, name).map_or(default, |a| a.i())
}

fn float_attribute(node: &NodeProto, name: &str, default: f32) -> f32 {
    attribute(node, name).map_or(default, |a| a.f())
}

fn node_name(node: &NodeProto) -> String {
    if node.name().is_empty() {
        node.output
            .iter()
            .find(|o| !o.is_empty())
            .cloned()
            .unwrap_or_default()
    } else {
        node.name().to_string()
    }
}

/// The dimensions of a constant with leading ones dropped.
fn significant(dims: &[usize]) -> &[usize] {
    let first = dims.iter().position(|&d| d != 1).unwrap_or(dims.len());
    &dims[first..]
}

/// A constant's elements as integers (INT64 or INT32), if it is one.
fn integers(weight: &Weight) -> Option<Vec<i64>> {
    match weight.datatype {
        DataType::Int64 => Some(
            weight
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
        ),
        DataType::Int32 => Some(
            weight
                .data
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        ),
        _ => None,
    }
}

/// `axis` (negative counts from the end) as an index below `rank`.
fn axis_index(axis: i64, rank: usize) -> Option<usize> {
    let rank = rank as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    (0..rank).contains(&axis).then_some(axis as usize)
}

impl Importer<'_> {
    fn value(&mut self, dims: Vec<usize>) -> ValueId {
        let width = dims.iter().product();
        self.plan.values.push(Value { dims, width });
        self.plan.values.len() - 1
    }

    fn unsupported(&self, node: &NodeProto, reason: impl Into<String>) -> Unsupported {
        Unsupported {
            op: node.op_type().to_string(),
            node: node_name(node),
            reason: reason.into(),
        }
    }

    fn input<'t>(&'t self, node: &NodeProto, index: usize) -> Result<&'t Tensor, Unsupported> {
        let name = node
            .input
            .get(index)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| self.unsupported(node, format!("input {index} is missing")))?;
        self.names.get(name).ok_or_else(|| {
            self.unsupported(
                node,
                format!("input '{name}' is not produced by an earlier node"),
            )
        })
    }

    /// Whether input `index` is given (not absent, not the empty name).
    fn has_input(node: &NodeProto, index: usize) -> bool {
        node.input.get(index).is_some_and(|n| !n.is_empty())
    }

    /// Input `index` as an activation, seen as it is.
    fn view(&self, node: &NodeProto, index: usize) -> Result<View, Unsupported> {
        match self.input(node, index)? {
            Tensor::Dynamic(view) => Ok(view.clone()),
            _ => Err(self.unsupported(
                node,
                format!("input {index} is a constant where an activation is expected"),
            )),
        }
    }

    /// Input `index` as a batch-first activation.
    fn dynamic(&self, node: &NodeProto, index: usize) -> Result<View, Unsupported> {
        let view = self.view(node, index)?;
        if view.batch != 0 {
            return Err(self.unsupported(
                node,
                format!(
                    "input {index} has its batch at axis {} (the batch must be first here)",
                    view.batch
                ),
            ));
        }
        Ok(view)
    }

    fn constant(&self, node: &NodeProto, index: usize) -> Result<Weight, Unsupported> {
        match self.input(node, index)? {
            Tensor::Constant(w) => Ok(w.clone()),
            _ => Err(self.unsupported(
                node,
                format!("input {index} must be a weight, not computed from the inputs"),
            )),
        }
    }

    /// Input `index` as constant integers that shape the plan (axes, a
    /// shape, indices): a member whose own copy differs cannot join.
    fn baked_integers(&mut self, node: &NodeProto, index: usize) -> Result<Vec<i64>, Unsupported> {
        let weight = self.constant(node, index)?;
        let values = integers(&weight).ok_or_else(|| {
            self.unsupported(node, format!("input {index} must be INT64 or INT32"))
        })?;
        if !self.plan.baked.iter().any(|(name, _)| *name == weight.name) {
            self.plan.baked.push((weight.name, weight.data));
        }
        Ok(values)
    }

    /// The slot for an fp32 weight, made on first use.
    fn slot(&mut self, node: &NodeProto, weight: &Weight) -> Result<WeightId, Unsupported> {
        if let Some(&slot) = self.slots.get(&weight.name) {
            return Ok(slot);
        }
        if weight.datatype != DataType::Fp32 {
            return Err(self.unsupported(
                node,
                format!(
                    "weight '{}' is {} (FP32 expected)",
                    weight.name, weight.datatype
                ),
            ));
        }
        let len = weight
            .dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|n| n.checked_mul(4).is_some());
        let Some(len) = len else {
            return Err(self.unsupported(
                node,
                format!(
                    "weight '{}' {:?} is too large to address",
                    weight.name, weight.dims
                ),
            ));
        };
        if weight.data.len() != len * 4 {
            return Err(self.unsupported(
                node,
                format!("weight '{}' holds the wrong number of bytes", weight.name),
            ));
        }
        self.plan.weights.push(WeightSlot {
            name: weight.name.clone(),
            dims: weight.dims.clone(),
            len,
        });
        self.weights.push(weight.clone());
        let slot = self.plan.weights.len() - 1;
        self.slots.insert(weight.name.clone(), slot);
        Ok(slot)
    }

    fn output_name<'n>(&self, node: &'n NodeProto) -> Result<&'n str, Unsupported> {
        if node.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Err(self.unsupported(node, "only its first output can be used"));
        }
        node.output
            .first()
            .map(String::as_str)
            .ok_or_else(|| self.unsupported(node, "it has no output"))
    }

    /// Adds a step writing a new value of `dims`, seen with the batch at
    /// axis `batch`, named by the node's output.
    fn step_seen(
        &mut self,
        node: &NodeProto,
        op: Op,
        dims: Vec<usize>,
        batch: usize,
    ) -> Result<(), Unsupported> {
        let name = self.output_name(node)?.to_string();
        let output = self.value(dims.clone());
        self.plan.steps.push(Step {
            op,
            epilogue: Vec::new(),
            output,
            nodes: vec![node_name(node)],
        });
        self.produced.push(name.clone());
        self.names.insert(
            name,
            Tensor::Dynamic(View {
                value: output,
                dims,
                batch,
            }),
        );
        Ok(())
    }

    /// Names the node's output `view` (the same floats, seen anew).
    fn alias(&mut self, node: &NodeProto, view: View) -> Result<(), Unsupported> {
        let name = self.output_name(node)?.to_string();
        self.names.insert(name, Tensor::Dynamic(view));
        Ok(())
    }

    /// A value holding `view`'s floats with `view`'s dimensions, for a graph
    /// output (whose dimensions are its value's): its own, named anew where
    /// no input or other output sees it otherwise, else a copy.
    fn seen_as(&mut self, view: &View, name: &str) -> ValueId {
        if self.plan.values[view.value].dims == view.dims {
            return view.value;
        }
        let taken = self
            .plan
            .inputs
            .iter()
            .chain(&self.plan.outputs)
            .any(|(_, v)| *v == view.value);
        if !taken {
            // Dimensions are a value's name for its width: only a graph
            // output's are read, so renaming them moves nothing.
            self.plan.values[view.value].dims.clone_from(&view.dims);
            return view.value;
        }
        let output = self.value(view.dims.clone());
        self.plan.steps.push(Step {
            op: Op::Copy { input: view.value },
            epilogue: Vec::new(),
            output,
            nodes: vec![format!("copy to output '{name}'")],
        });
        self.produced.push(String::new());
        output
    }

    fn node(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        if !(node.domain().is_empty() || node.domain() == "ai.onnx") {
            return Err(
                self.unsupported(node, format!("domain '{}' is not supported", node.domain()))
            );
        }
        match node.op_type() {
            "Constant" => self.constant_node(node),
            "Identity" => {
                let tensor = self.input(node, 0)?.clone();
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, tensor);
                Ok(())
            }
            "Flatten" => {
                let view = self.dynamic(node, 0)?;
                if int_attribute(node, "axis", 1) != 1 {
                    return Err(self.unsupported(node, "only axis 1 keeps the batch first"));
                }
                let width = view.dims.iter().product();
                self.alias(node, View::first(view.value, vec![width]))
            }
            "Reshape" => self.reshape(node),
            "Gemm" => self.gemm(node),
            "MatMul" => self.matmul(node),
            "Add" | "Sub" | "Mul" | "Div" => self.binary(node),
            "Relu" | "LeakyRelu" | "Tanh" | "Sigmoid" => self.activation(node),
            "Softmax" => self.softmax(node),
            "LayerNormalization" => self.layer_norm(node),
            "BatchNormalization" => self.batch_norm(node),
            "Conv" => self.conv(node),
            "Transpose" => self.transpose(node),
            "Squeeze" | "Unsqueeze" => self.squeeze(node),
            "Slice" => self.slice(node),
            "Gather" => self.gather(node),
            "Concat" => self.concat(node),
            "Shape" => self.shape(node),
            "Cast" => self.cast(node),
            "ConstantOfShape" | "Expand" => self.filled(node),
            "LSTM" | "GRU" => self.recurrent(node),
            other => Err(self.unsupported(node, format!("{other} is not among the plan's ops"))),
        }
    }

    fn constant_node(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let value = attribute(node, "value")
            .and_then(|a| a.t.as_ref())
            .ok_or_else(|| self.unsupported(node, "only a tensor 'value' is supported"))?;
        let mut weight = tickserve_onnx::tensor_weight(value)
            .map_err(|reason| self.unsupported(node, reason))?;
        weight.name = self.output_name(node)?.to_string();
        self.names
            .insert(weight.name.clone(), Tensor::Constant(weight));
        Ok(())
    }

    /// Every graph output gets a value of its own, written by a step (an
    /// output that is an input, or the same value twice, gets a copy), so
    /// the engine can place the outputs side by side for one copy out.
    fn outputs_apart(&mut self) {
        let mut seen: Vec<ValueId> = Vec::new();
        for i in 0..self.plan.outputs.len() {
            let value = self.plan.outputs[i].1;
            let is_input = self.plan.inputs.iter().any(|(_, v)| *v == value);
            if is_input || seen.contains(&value) {
                let dims = self.plan.values[value].dims.clone();
                let output = self.value(dims);
                self.plan.steps.push(Step {
                    op: Op::Copy { input: value },
                    epilogue: Vec::new(),
                    output,
                    nodes: vec![format!("copy to output '{}'", self.plan.outputs[i].0)],
                });
                self.plan.outputs[i].1 = output;
            }
            seen.push(self.plan.outputs[i].1);
        }
    }
}
