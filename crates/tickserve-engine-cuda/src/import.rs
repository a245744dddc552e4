//! ONNX → [`Plan`]: the ops of MLP-style trading models.
//!
//! Supported: Gemm, MatMul (activation × weight), Add, Sub, Mul, Div (an
//! activation with a broadcast weight, or two activations of one shape), Relu,
//! LeakyRelu, Tanh, Sigmoid, Softmax (over the last axis), Identity, Flatten
//! (axis 1), Reshape (to a constant shape that keeps the batch first),
//! BatchNormalization and LayerNormalization (inference), and Constant. Every
//! activation is fp32 with the batch first. Anything else is an
//! [`Unsupported`] naming the node and the op: the model then runs on ONNX
//! Runtime, and the server says so.
//!
//! Elementwise nodes are fused into the step that made their input when that
//! step's result has no other reader, so `Gemm → Relu` is one product and one
//! epilogue kernel.

use std::collections::HashMap;

use tickserve_core::{DataType, TensorSpec, Weight};
use tickserve_onnx::OnnxModel;
use tickserve_onnx::proto::{AttributeProto, NodeProto};

use crate::plan::{BinaryOp, Elementwise, Op, Plan, Step, Value, ValueId, WeightId, WeightSlot};

/// Why a model cannot run on the CUDA engine.
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

/// A tensor name's meaning during import.
#[derive(Debug, Clone)]
enum Tensor {
    /// An activation.
    Dynamic(ValueId),
    /// A constant: an initializer, a member weight or a Constant node.
    Constant(Weight),
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
                reason: format!("datatype {} (the CUDA engine serves FP32)", spec.datatype),
            });
        }
        let value = importer.value(spec.dims.clone());
        importer.plan.inputs.push((spec.name.clone(), value));
        importer
            .names
            .insert(spec.name.clone(), Tensor::Dynamic(value));
    }
    for node in &graph.node {
        importer.node(node)?;
    }
    for output in &graph.output {
        let value = match importer.names.get(output.name()) {
            Some(Tensor::Dynamic(v)) => *v,
            _ => {
                return Err(Unsupported {
                    op: "output".into(),
                    node: output.name().into(),
                    reason: "is not computed from the inputs".into(),
                });
            }
        };
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
        node.output.first().cloned().unwrap_or_default()
    } else {
        node.name().to_string()
    }
}

/// The dimensions of a constant with leading ones dropped.
fn significant(dims: &[usize]) -> &[usize] {
    let first = dims.iter().position(|&d| d != 1).unwrap_or(dims.len());
    &dims[first..]
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

    fn dynamic(&self, node: &NodeProto, index: usize) -> Result<ValueId, Unsupported> {
        match self.input(node, index)? {
            Tensor::Dynamic(v) => Ok(*v),
            Tensor::Constant(_) => Err(self.unsupported(
                node,
                format!("input {index} is a constant where an activation is expected"),
            )),
        }
    }

    fn constant(&self, node: &NodeProto, index: usize) -> Result<Weight, Unsupported> {
        match self.input(node, index)? {
            Tensor::Constant(w) => Ok(w.clone()),
            Tensor::Dynamic(_) => Err(self.unsupported(
                node,
                format!("input {index} must be a weight, not computed from the inputs"),
            )),
        }
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
        let len = weight.dims.iter().product::<usize>();
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

    /// Adds a step writing a new value of `dims` named by the node's output.
    fn step(&mut self, node: &NodeProto, op: Op, dims: Vec<usize>) -> Result<(), Unsupported> {
        let name = self.output_name(node)?.to_string();
        let output = self.value(dims);
        self.plan.steps.push(Step {
            op,
            epilogue: Vec::new(),
            output,
            nodes: vec![node_name(node)],
        });
        self.produced.push(name.clone());
        self.names.insert(name, Tensor::Dynamic(output));
        Ok(())
    }

    /// Applies `e` to activation `input` (node input `index`): fused into
    /// the step that made it when nothing else reads it, else a new step.
    fn elementwise(
        &mut self,
        node: &NodeProto,
        index: usize,
        e: Elementwise,
    ) -> Result<(), Unsupported> {
        let input = self.dynamic(node, index)?;
        let input_name = node.input[index].as_str();
        let output_name = self.output_name(node)?.to_string();
        let fusable = self
            .plan
            .steps
            .iter()
            .rposition(|s| s.output == input)
            .filter(|&at| {
                self.produced[at] == input_name
                    && self.readers.get(input_name).copied().unwrap_or(0) == 1
            });
        match fusable {
            Some(at) => {
                let step = &mut self.plan.steps[at];
                step.epilogue.push(e);
                step.nodes.push(node_name(node));
                self.produced[at] = output_name.clone();
                self.names.insert(output_name, Tensor::Dynamic(input));
            }
            None => {
                let dims = self.plan.values[input].dims.clone();
                self.step(node, Op::Copy { input }, dims)?;
                if let Some(step) = self.plan.steps.last_mut() {
                    step.epilogue.push(e);
                }
            }
        }
        Ok(())
    }

    /// Gives `name` the same value as `value` (Identity, Flatten, Reshape).
    fn alias(
        &mut self,
        node: &NodeProto,
        value: ValueId,
        dims: Vec<usize>,
    ) -> Result<(), Unsupported> {
        let name = self.output_name(node)?.to_string();
        let target = if dims == self.plan.values[value].dims {
            value
        } else {
            // Same floats, other dimensions: a new value sharing nothing, so
            // later shape checks read the right dims; a copy step fills it.
            let width: usize = dims.iter().product();
            if width != self.plan.values[value].width {
                return Err(self.unsupported(node, "the element count per row changes"));
            }
            self.step(node, Op::Copy { input: value }, dims)?;
            return Ok(());
        };
        self.names.insert(name, Tensor::Dynamic(target));
        Ok(())
    }

    fn node(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        if !(node.domain().is_empty() || node.domain() == "ai.onnx") {
            return Err(
                self.unsupported(node, format!("domain '{}' is not supported", node.domain()))
            );
        }
        match node.op_type() {
            "Constant" => {
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
            "Identity" => {
                let input = self.dynamic(node, 0)?;
                let dims = self.plan.values[input].dims.clone();
                self.alias(node, input, dims)
            }
            "Flatten" => {
                let input = self.dynamic(node, 0)?;
                if int_attribute(node, "axis", 1) != 1 {
                    return Err(self.unsupported(node, "only axis 1 keeps the batch first"));
                }
                let width = self.plan.values[input].width;
                self.alias(node, input, vec![width])
            }
            "Reshape" => self.reshape(node),
            "Gemm" => self.gemm(node),
            "MatMul" => self.matmul(node),
            "Add" | "Sub" | "Mul" | "Div" => self.binary(node),
            "Relu" => self.elementwise(node, 0, Elementwise::Relu),
            "LeakyRelu" => {
                let alpha = float_attribute(node, "alpha", 0.01);
                self.elementwise(node, 0, Elementwise::LeakyRelu(alpha))
            }
            "Tanh" => self.elementwise(node, 0, Elementwise::Tanh),
            "Sigmoid" => self.elementwise(node, 0, Elementwise::Sigmoid),
            "Softmax" => self.softmax(node),
            "LayerNormalization" => self.layer_norm(node),
            "BatchNormalization" => self.batch_norm(node),
            other => {
                Err(self.unsupported(node, format!("{other} is not among the CUDA engine's ops")))
            }
        }
    }

    fn reshape(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let input = self.dynamic(node, 0)?;
        let shape = self.constant(node, 1)?;
        if shape.datatype != DataType::Int64 {
            return Err(self.unsupported(node, "the shape must be INT64"));
        }
        let target: Vec<i64> = shape
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        let width = self.plan.values[input].width;
        let old = self.plan.values[input].dims.clone();
        let allow_zero = int_attribute(node, "allowzero", 0) != 0;
        // The batch must stay first: shape[0] is 0 (copy) or -1 with the rest fixed.
        let mut dims = Vec::with_capacity(target.len().saturating_sub(1));
        match target.first() {
            Some(0) if !allow_zero => {}
            Some(-1) if !target[1..].contains(&-1) => {}
            _ => {
                return Err(self.unsupported(
                    node,
                    format!(
                        "shape {target:?} does not keep the batch as the first dimension (0 or -1)"
                    ),
                ));
            }
        }
        let mut unknown = None;
        for (i, &d) in target.iter().enumerate().skip(1) {
            match d {
                0 if !allow_zero => dims.push(old.get(i - 1).copied().ok_or_else(|| {
                    self.unsupported(
                        node,
                        format!("shape {target:?} copies a dimension the input lacks"),
                    )
                })?),
                -1 => {
                    unknown = Some(dims.len());
                    dims.push(1);
                }
                d if d > 0 => dims.push(d as usize),
                _ => return Err(self.unsupported(node, format!("shape {target:?} is not static"))),
            }
        }
        let known: usize = dims.iter().product();
        if let Some(at) = unknown {
            if known == 0 || !width.is_multiple_of(known) {
                return Err(
                    self.unsupported(node, format!("shape {target:?} does not divide the row"))
                );
            }
            dims[at] = width / known;
        }
        self.plan
            .baked
            .push((shape.name.clone(), shape.data.clone()));
        self.alias(node, input, dims)
    }

    fn product(
        &mut self,
        node: &NodeProto,
        input: ValueId,
        weight: &Weight,
        transposed: bool,
    ) -> Result<(usize, Vec<usize>), Unsupported> {
        if weight.dims.len() != 2 {
            return Err(self.unsupported(node, format!("the weight '{}' must be 2-D", weight.name)));
        }
        let (k, n) = if transposed {
            (weight.dims[1], weight.dims[0])
        } else {
            (weight.dims[0], weight.dims[1])
        };
        let dims = self.plan.values[input].dims.clone();
        if dims.last() != Some(&k) {
            return Err(self.unsupported(
                node,
                format!("activation {dims:?} does not end in the weight's inner dimension {k}"),
            ));
        }
        let slot = self.slot(node, weight)?;
        let groups = self.plan.values[input].width / k;
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = n;
        }
        self.step(
            node,
            Op::MatMul {
                input,
                weight: slot,
                transposed,
                groups,
                k,
                n,
            },
            out.clone(),
        )?;
        Ok((n, out))
    }

    fn gemm(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let input = self.dynamic(node, 0)?;
        if self.plan.values[input].dims.len() != 1 {
            return Err(self.unsupported(node, "A must be 2-D [batch, k]"));
        }
        if int_attribute(node, "transA", 0) != 0 {
            return Err(self.unsupported(node, "transA = 1 would move the batch"));
        }
        let weight = self.constant(node, 1)?;
        let transposed = int_attribute(node, "transB", 0) != 0;
        let alpha = float_attribute(node, "alpha", 1.0);
        let beta = float_attribute(node, "beta", 1.0);
        let (n, _) = self.product(node, input, &weight, transposed)?;
        let name = self.output_name(node)?.to_string();
        let at = self.plan.steps.len() - 1;
        if alpha != 1.0 {
            self.plan.steps[at].epilogue.push(Elementwise::Scale(alpha));
        }
        if node.input.get(2).is_some_and(|c| !c.is_empty()) && beta != 0.0 {
            let bias = self.constant(node, 2)?;
            let period = significant(&bias.dims).iter().product::<usize>();
            if significant(&bias.dims).len() > 1 || !(period == 1 || period == n) {
                return Err(self.unsupported(
                    node,
                    format!(
                        "C {:?} does not broadcast along the rows of [batch, {n}]",
                        bias.dims
                    ),
                ));
            }
            let slot = self.slot(node, &bias)?;
            self.plan.steps[at].epilogue.push(Elementwise::Weight {
                op: BinaryOp::Add,
                weight: slot,
                period,
                reversed: false,
                coef: beta,
            });
        }
        self.produced[at] = name;
        Ok(())
    }

    fn matmul(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let input = self.dynamic(node, 0)?;
        let weight = self.constant(node, 1)?;
        self.product(node, input, &weight, false).map(|_| ())
    }

    fn binary(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let op = match node.op_type() {
            "Add" => BinaryOp::Add,
            "Sub" => BinaryOp::Sub,
            "Mul" => BinaryOp::Mul,
            _ => BinaryOp::Div,
        };
        match (self.input(node, 0)?.clone(), self.input(node, 1)?.clone()) {
            (Tensor::Dynamic(a), Tensor::Dynamic(b)) => {
                if self.plan.values[a].dims != self.plan.values[b].dims {
                    return Err(self.unsupported(
                        node,
                        format!(
                            "activations {:?} and {:?} differ in shape (no broadcasting between activations)",
                            self.plan.values[a].dims, self.plan.values[b].dims
                        ),
                    ));
                }
                let dims = self.plan.values[a].dims.clone();
                self.step(node, Op::Binary { a, b, op }, dims)
            }
            (Tensor::Dynamic(_), Tensor::Constant(w)) => self.with_weight(node, 0, op, &w, false),
            (Tensor::Constant(w), Tensor::Dynamic(_)) => self.with_weight(node, 1, op, &w, true),
            (Tensor::Constant(_), Tensor::Constant(_)) => Err(self.unsupported(
                node,
                "both operands are constants (fold them before export)",
            )),
        }
    }

    fn with_weight(
        &mut self,
        node: &NodeProto,
        index: usize,
        op: BinaryOp,
        weight: &Weight,
        reversed: bool,
    ) -> Result<(), Unsupported> {
        let input = self.dynamic(node, index)?;
        let dims = &self.plan.values[input].dims;
        let w = significant(&weight.dims);
        // A weight broadcasts along the row when its dimensions are a suffix
        // of the activation's (leading ones aside) and not longer than a row.
        if w.len() > dims.len() || dims[dims.len() - w.len()..] != *w {
            return Err(self.unsupported(
                node,
                format!(
                    "weight '{}' {:?} does not broadcast along rows of {dims:?}",
                    weight.name, weight.dims
                ),
            ));
        }
        let period = w.iter().product();
        let slot = self.slot(node, weight)?;
        self.elementwise(
            node,
            index,
            Elementwise::Weight {
                op,
                weight: slot,
                period,
                reversed,
                coef: 1.0,
            },
        )
    }

    fn softmax(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let input = self.dynamic(node, 0)?;
        let dims = self.plan.values[input].dims.clone();
        let rank = dims.len() as i64 + 1;
        let default_axis = if self.opset >= 13 { -1 } else { 1 };
        let mut axis = int_attribute(node, "axis", default_axis);
        if axis < 0 {
            axis += rank;
        }
        let segment = if axis == rank - 1 {
            dims.last().copied().unwrap_or(1)
        } else if self.opset < 13 && axis == 1 {
            // Before opset 13, Softmax flattens from `axis` on.
            self.plan.values[input].width
        } else {
            return Err(self.unsupported(
                node,
                format!("axis {axis} (only the last axis is supported)"),
            ));
        };
        self.step(node, Op::Softmax { input, segment }, dims)
    }

    fn layer_norm(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let input = self.dynamic(node, 0)?;
        let dims = self.plan.values[input].dims.clone();
        let rank = dims.len() as i64 + 1;
        let mut axis = int_attribute(node, "axis", -1);
        if axis < 0 {
            axis += rank;
        }
        if axis < 1 || axis >= rank {
            return Err(self.unsupported(
                node,
                format!("axis {axis} would normalise across the batch"),
            ));
        }
        let normalised = &dims[axis as usize - 1..];
        let segment: usize = normalised.iter().product();
        let scale = self.constant(node, 1)?;
        if significant(&scale.dims).iter().product::<usize>() != segment {
            return Err(self.unsupported(
                node,
                format!("scale {:?} does not match {normalised:?}", scale.dims),
            ));
        }
        let scale = self.slot(node, &scale)?;
        let bias = match node.input.get(2).filter(|b| !b.is_empty()) {
            Some(_) => {
                let bias = self.constant(node, 2)?;
                if significant(&bias.dims).iter().product::<usize>() != segment {
                    return Err(self.unsupported(
                        node,
                        format!("bias {:?} does not match {normalised:?}", bias.dims),
                    ));
                }
                Some(self.slot(node, &bias)?)
            }
            None => None,
        };
        let epsilon = float_attribute(node, "epsilon", 1e-5);
        self.step(
            node,
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            },
            dims,
        )
    }

    fn batch_norm(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        if int_attribute(node, "training_mode", 0) != 0 {
            return Err(self.unsupported(node, "training mode"));
        }
        let input = self.dynamic(node, 0)?;
        let dims = self.plan.values[input].dims.clone();
        let Some(&channels) = dims.first() else {
            return Err(self.unsupported(node, "the input has no channel dimension"));
        };
        let inner = dims[1..].iter().product();
        let mut slots = [0; 4];
        for (i, slot) in slots.iter_mut().enumerate() {
            let w = self.constant(node, i + 1)?;
            if w.dims.iter().product::<usize>() != channels {
                return Err(self.unsupported(
                    node,
                    format!(
                        "'{}' {:?} is not one value per channel ({channels})",
                        w.name, w.dims
                    ),
                ));
            }
            *slot = self.slot(node, &w)?;
        }
        let [scale, bias, mean, var] = slots;
        let epsilon = float_attribute(node, "epsilon", 1e-5);
        self.elementwise(
            node,
            0,
            Elementwise::BatchNorm {
                scale,
                bias,
                mean,
                var,
                epsilon,
                channels,
                inner,
            },
        )
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
