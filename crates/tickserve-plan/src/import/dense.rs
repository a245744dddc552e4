//! The ops of dense (MLP-style) models: products, one-axis convolutions,
//! elementwise arithmetic and activations, softmax and the normalizations,
//! and Reshape.

use tickserve_core::{DataType, Weight};
use tickserve_onnx::proto::NodeProto;

use super::{Dim, Importer, Tensor, View, float_attribute, int_attribute, node_name, significant};
use crate::plan::{BinaryOp, Conv1d, Elementwise, Op};

impl Importer<'_> {
    /// Relu, LeakyRelu, Tanh or Sigmoid.
    pub(super) fn activation(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let e = match node.op_type() {
            "Relu" => Elementwise::Relu,
            "LeakyRelu" => Elementwise::LeakyRelu(float_attribute(node, "alpha", 0.01)),
            "Tanh" => Elementwise::Tanh,
            _ => Elementwise::Sigmoid,
        };
        self.elementwise(node, 0, e)
    }

    /// Applies `e` to activation `input` (node input `index`): fused into
    /// the step that made it when nothing else reads it, else a new step.
    pub(super) fn elementwise(
        &mut self,
        node: &NodeProto,
        index: usize,
        e: Elementwise,
    ) -> Result<(), super::Unsupported> {
        let view = self.view(node, index)?;
        let input_name = node.input[index].as_str();
        let output_name = self.output_name(node)?.to_string();
        let fusable = self
            .plan
            .steps
            .iter()
            .rposition(|s| s.output == view.value)
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
                self.names.insert(output_name, Tensor::Dynamic(view));
            }
            None => {
                let (dims, batch) = (view.dims.clone(), view.batch);
                self.step_seen(node, Op::Copy { input: view.value }, dims, batch)?;
                if let Some(step) = self.plan.steps.last_mut() {
                    step.epilogue.push(e);
                }
            }
        }
        Ok(())
    }

    /// Reshape: of an activation (a new view of the same floats; the batch
    /// stays one whole axis with as many elements before it), or of a shape
    /// (which stays the list it is).
    pub(super) fn reshape(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let allow_zero = int_attribute(node, "allowzero", 0) != 0;
        let target: Vec<Dim> = match self.input(node, 1)?.clone() {
            Tensor::Shape(shape) => shape,
            Tensor::Constant(shape) => {
                if shape.datatype != DataType::Int64 {
                    return Err(self.unsupported(node, "the shape must be INT64"));
                }
                let values = self.baked_integers(node, 1)?;
                let mut dims = Vec::with_capacity(values.len());
                for v in values {
                    dims.push(match v {
                        0 if !allow_zero => Dim::Same,
                        -1 => Dim::Infer,
                        n if n > 0 => Dim::Fixed(n as usize),
                        _ => {
                            return Err(
                                self.unsupported(node, format!("dimension {v} in the shape"))
                            );
                        }
                    });
                }
                dims
            }
            _ => return Err(self.unsupported(node, "the shape must be static")),
        };
        let view = match self.input(node, 0)?.clone() {
            Tensor::Dynamic(view) => view,
            Tensor::Shape(dims) => {
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, Tensor::Shape(dims));
                return Ok(());
            }
            _ => return Err(self.unsupported(node, "only activations and shapes are reshaped")),
        };
        let shape = resolved(&view, &target).map_err(|reason| self.unsupported(node, reason))?;
        let seen = view.reshaped(&shape).ok_or_else(|| {
            self.unsupported(
                node,
                format!("{:?} to {shape:?} would mix the batch's rows", view.shape()),
            )
        })?;
        self.alias(node, seen)
    }

    fn product(
        &mut self,
        node: &NodeProto,
        input: &View,
        weight: &Weight,
        transposed: bool,
    ) -> Result<usize, super::Unsupported> {
        if weight.dims.len() != 2 {
            return Err(self.unsupported(node, format!("the weight '{}' must be 2-D", weight.name)));
        }
        let (k, n) = if transposed {
            (weight.dims[1], weight.dims[0])
        } else {
            (weight.dims[0], weight.dims[1])
        };
        if input.batch == input.dims.len() || input.dims.last() != Some(&k) {
            return Err(self.unsupported(
                node,
                format!(
                    "activation {:?} does not end in the weight's inner dimension {k}",
                    input.shape()
                ),
            ));
        }
        let slot = self.slot(node, weight)?;
        let groups = input.dims.iter().product::<usize>() / k;
        let mut out = input.dims.clone();
        if let Some(last) = out.last_mut() {
            *last = n;
        }
        self.step_seen(
            node,
            Op::MatMul {
                input: input.value,
                weight: slot,
                transposed,
                groups,
                k,
                n,
            },
            out,
            input.batch,
        )?;
        Ok(n)
    }

    /// Conv over one axis: `[batch, channels, length]`, weights
    /// `[out, channels / group, kernel]`, an optional bias per output channel.
    pub(super) fn conv(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let view = self.dynamic(node, 0)?;
        let [channels, length] = view.dims[..] else {
            return Err(self.unsupported(
                node,
                format!(
                    "input {:?}: only a convolution over one axis ([batch, channels, length]) is supported",
                    view.shape()
                ),
            ));
        };
        let weight = self.constant(node, 1)?;
        let [out_channels, per_group, kernel] = weight.dims[..] else {
            return Err(self.unsupported(node, format!("weight {:?} is not 3-D", weight.dims)));
        };
        if out_channels == 0 || per_group == 0 || kernel == 0 {
            return Err(self.unsupported(
                node,
                format!("weight {:?} has an empty dimension", weight.dims),
            ));
        }
        let overflow = |what: &str| self.unsupported(node, format!("{what} is too large"));
        let ints = |name: &str| super::attribute(node, name).map(|a| a.ints.clone());
        let one = |name: &str| -> Result<usize, super::Unsupported> {
            match ints(name).as_deref() {
                None => Ok(1),
                Some([v]) if *v >= 1 => Ok(*v as usize),
                Some(v) => Err(self.unsupported(node, format!("{name} {v:?}"))),
            }
        };
        let (stride, dilation) = (one("strides")?, one("dilations")?);
        let groups = usize::try_from(int_attribute(node, "group", 1)).unwrap_or(0);
        if groups == 0
            || !channels.is_multiple_of(groups)
            || channels / groups != per_group
            || !out_channels.is_multiple_of(groups)
        {
            return Err(self.unsupported(
                node,
                format!(
                    "group {groups} does not fit {channels} channels and weight {:?}",
                    weight.dims
                ),
            ));
        }
        if let Some(k) = ints("kernel_shape")
            && k != [kernel as i64]
        {
            return Err(self.unsupported(node, format!("kernel_shape {k:?} is not the weight's")));
        }
        let span = dilation
            .checked_mul(kernel - 1)
            .and_then(|s| s.checked_add(1))
            .ok_or_else(|| overflow("the dilated kernel"))?;
        let auto_pad = super::attribute(node, "auto_pad")
            .map(|a| String::from_utf8_lossy(a.s()).into_owned())
            .unwrap_or_default();
        let (pad, padded) = match auto_pad.as_str() {
            "" | "NOTSET" => match ints("pads").as_deref() {
                None => (0, length),
                Some(&[b, e]) if b >= 0 && e >= 0 => {
                    let (b, e) = (
                        usize::try_from(b).map_err(|_| overflow("pads"))?,
                        usize::try_from(e).map_err(|_| overflow("pads"))?,
                    );
                    let padded = length
                        .checked_add(b)
                        .and_then(|l| l.checked_add(e))
                        .ok_or_else(|| overflow("the padded input"))?;
                    (b, padded)
                }
                Some(p) => return Err(self.unsupported(node, format!("pads {p:?}"))),
            },
            "VALID" => (0, length),
            "SAME_UPPER" | "SAME_LOWER" => {
                let out = length.div_ceil(stride);
                let total = out
                    .saturating_sub(1)
                    .checked_mul(stride)
                    .and_then(|t| t.checked_add(span))
                    .ok_or_else(|| overflow("the padding"))?
                    .saturating_sub(length);
                let before = if auto_pad == "SAME_UPPER" {
                    total / 2
                } else {
                    total.div_ceil(2)
                };
                (
                    before,
                    length
                        .checked_add(total)
                        .ok_or_else(|| overflow("the padded input"))?,
                )
            }
            other => return Err(self.unsupported(node, format!("auto_pad {other}"))),
        };
        if padded < span {
            return Err(self.unsupported(node, "the kernel is longer than the padded input"));
        }
        let out_length = (padded - span) / stride + 1;
        let slot = self.slot(node, &weight)?;
        let conv = Conv1d {
            input: view.value,
            weight: slot,
            channels,
            length,
            out_channels,
            kernel,
            stride,
            dilation,
            pad,
            groups,
            out_length,
        };
        self.step_seen(
            node,
            Op::Conv1d(Box::new(conv)),
            vec![out_channels, out_length],
            0,
        )?;
        if Self::has_input(node, 2) {
            let bias = self.constant(node, 2)?;
            if bias.dims.iter().product::<usize>() != out_channels {
                return Err(self.unsupported(
                    node,
                    format!("bias {:?} is not one per output channel", bias.dims),
                ));
            }
            let slot = self.slot(node, &bias)?;
            let at = self.plan.steps.len() - 1;
            // Channel `column / out_length`: a weight of one value per channel,
            // broadcast as BatchNorm's per-channel terms are.
            self.plan.steps[at].epilogue.push(Elementwise::ChannelBias {
                bias: slot,
                channels: out_channels,
                inner: out_length,
            });
        }
        Ok(())
    }

    pub(super) fn gemm(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let input = self.dynamic(node, 0)?;
        if input.dims.len() != 1 {
            return Err(self.unsupported(node, "A must be 2-D [batch, k]"));
        }
        if int_attribute(node, "transA", 0) != 0 {
            return Err(self.unsupported(node, "transA = 1 would move the batch"));
        }
        let weight = self.constant(node, 1)?;
        let transposed = int_attribute(node, "transB", 0) != 0;
        let alpha = float_attribute(node, "alpha", 1.0);
        let beta = float_attribute(node, "beta", 1.0);
        let n = self.product(node, &input, &weight, transposed)?;
        let name = self.output_name(node)?.to_string();
        let at = self.plan.steps.len() - 1;
        if alpha != 1.0 {
            self.plan.steps[at].epilogue.push(Elementwise::Scale(alpha));
        }
        if Self::has_input(node, 2) && beta != 0.0 {
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

    pub(super) fn matmul(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let input = self.view(node, 0)?;
        let weight = self.constant(node, 1)?;
        self.product(node, &input, &weight, false).map(|_| ())
    }

    pub(super) fn binary(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let op = match node.op_type() {
            "Add" => BinaryOp::Add,
            "Sub" => BinaryOp::Sub,
            "Mul" => BinaryOp::Mul,
            _ => BinaryOp::Div,
        };
        match (self.input(node, 0)?.clone(), self.input(node, 1)?.clone()) {
            (Tensor::Dynamic(a), Tensor::Dynamic(b)) => {
                if a.shape() != b.shape() {
                    return Err(self.unsupported(
                        node,
                        format!(
                            "activations {:?} and {:?} differ in shape (no broadcasting between activations)",
                            a.shape(),
                            b.shape()
                        ),
                    ));
                }
                let (a, b, dims, batch) = (a.value, b.value, a.dims, a.batch);
                self.step_seen(node, Op::Binary { a, b, op }, dims, batch)
            }
            (Tensor::Dynamic(_), Tensor::Constant(w)) => self.with_weight(node, 0, op, &w, false),
            (Tensor::Constant(w), Tensor::Dynamic(_)) => self.with_weight(node, 1, op, &w, true),
            (
                a @ (Tensor::Shape(_) | Tensor::Constant(_)),
                b @ (Tensor::Shape(_) | Tensor::Constant(_)),
            ) => {
                let dims = shape_arithmetic(op, &a, &b)
                    .map_err(|reason| self.unsupported(node, reason))?;
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, Tensor::Shape(dims));
                Ok(())
            }
            _ => Err(self.unsupported(
                node,
                "its operands are not an activation and a weight, or two activations",
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
    ) -> Result<(), super::Unsupported> {
        let view = self.view(node, index)?;
        // After the batch's axis, the stored dimensions are the tensor's.
        let after = &view.dims[view.batch..];
        let w = significant(&weight.dims);
        // A weight broadcasts along the row when its dimensions are a suffix
        // of the activation's after the batch (leading ones aside).
        if w.len() > after.len() || after[after.len() - w.len()..] != *w {
            return Err(self.unsupported(
                node,
                format!(
                    "weight '{}' {:?} does not broadcast along rows of {:?}",
                    weight.name,
                    weight.dims,
                    view.shape()
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

    pub(super) fn softmax(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let view = self.view(node, 0)?;
        let rank = view.dims.len() as i64 + 1;
        let default_axis = if self.opset >= 13 { -1 } else { 1 };
        let mut axis = int_attribute(node, "axis", default_axis);
        if axis < 0 {
            axis += rank;
        }
        let segment = if axis == rank - 1 && view.batch as i64 != axis {
            view.dims.last().copied().unwrap_or(1)
        } else if self.opset < 13 && axis == 1 && view.batch == 0 {
            // Before opset 13, Softmax flattens from `axis` on.
            view.dims.iter().product()
        } else {
            return Err(self.unsupported(
                node,
                format!("axis {axis} (only the last axis, not the batch, is supported)"),
            ));
        };
        let (input, dims, batch) = (view.value, view.dims, view.batch);
        self.step_seen(node, Op::Softmax { input, segment }, dims, batch)
    }

    pub(super) fn layer_norm(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        let view = self.view(node, 0)?;
        let rank = view.dims.len() as i64 + 1;
        let mut axis = int_attribute(node, "axis", -1);
        if axis < 0 {
            axis += rank;
        }
        if axis <= view.batch as i64 || axis >= rank {
            return Err(self.unsupported(
                node,
                format!("axis {axis} would normalise across the batch"),
            ));
        }
        let normalised = view.dims[axis as usize - 1..].to_vec();
        let segment: usize = normalised.iter().product();
        let scale = self.constant(node, 1)?;
        if significant(&scale.dims).iter().product::<usize>() != segment {
            return Err(self.unsupported(
                node,
                format!("scale {:?} does not match {normalised:?}", scale.dims),
            ));
        }
        let scale = self.slot(node, &scale)?;
        let bias = if Self::has_input(node, 2) {
            let bias = self.constant(node, 2)?;
            if significant(&bias.dims).iter().product::<usize>() != segment {
                return Err(self.unsupported(
                    node,
                    format!("bias {:?} does not match {normalised:?}", bias.dims),
                ));
            }
            Some(self.slot(node, &bias)?)
        } else {
            None
        };
        let epsilon = float_attribute(node, "epsilon", 1e-5);
        let (input, dims, batch) = (view.value, view.dims, view.batch);
        self.step_seen(
            node,
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            },
            dims,
            batch,
        )
    }

    pub(super) fn batch_norm(&mut self, node: &NodeProto) -> Result<(), super::Unsupported> {
        if int_attribute(node, "training_mode", 0) != 0 {
            return Err(self.unsupported(node, "training mode"));
        }
        let view = self.dynamic(node, 0)?;
        let Some(&channels) = view.dims.first() else {
            return Err(self.unsupported(node, "the input has no channel dimension"));
        };
        let inner = view.dims[1..].iter().product();
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
}

/// A Reshape's target with its `0`s and its `-1` resolved against `view`;
/// the `-1` is the batch where nothing else is.
fn resolved(view: &View, target: &[Dim]) -> Result<Vec<Dim>, String> {
    let shape = view.shape();
    let mut out = Vec::with_capacity(target.len());
    for (i, d) in target.iter().enumerate() {
        out.push(match d {
            Dim::Same => *shape
                .get(i)
                .ok_or_else(|| format!("shape {target:?} copies an axis the input lacks"))?,
            other => *other,
        });
    }
    let width: usize = view.dims.iter().product();
    let fixed: usize = out
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            _ => 1,
        })
        .product();
    let batches = out.iter().filter(|d| **d == Dim::Batch).count();
    let infers = out.iter().filter(|d| **d == Dim::Infer).count();
    let fill = match (batches, infers) {
        (1, 0) if fixed == width => return Ok(out),
        (1, 1) if fixed > 0 && width.is_multiple_of(fixed) => Dim::Fixed(width / fixed),
        (0, 1) if fixed == width => Dim::Batch,
        _ => {
            return Err(format!(
                "shape {target:?} does not keep the batch as one axis"
            ));
        }
    };
    for d in &mut out {
        if *d == Dim::Infer {
            *d = fill;
        }
    }
    Ok(out)
}

/// Arithmetic on shapes (a shape, or integer constants, on either side; one
/// element broadcasts): fixed sizes only, a result that is a size.
fn shape_arithmetic(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Vec<Dim>, String> {
    let sizes = |t: &Tensor| -> Result<Vec<i64>, String> {
        match t {
            Tensor::Shape(dims) => dims
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Ok(*n as i64),
                    _ => Err("arithmetic on the batch's size".to_string()),
                })
                .collect(),
            Tensor::Constant(w) => {
                super::integers(w).ok_or_else(|| "arithmetic on a float constant".to_string())
            }
            _ => Err("arithmetic on an activation and a shape".to_string()),
        }
    };
    let (a, b) = (sizes(a)?, sizes(b)?);
    let len = a.len().max(b.len());
    if !(a.len() == len || a.len() == 1) || !(b.len() == len || b.len() == 1) {
        return Err(format!("shapes of {} and {} elements", a.len(), b.len()));
    }
    (0..len)
        .map(|i| {
            let (x, y) = (a[i.min(a.len() - 1)], b[i.min(b.len() - 1)]);
            let v = match op {
                BinaryOp::Add => x.checked_add(y),
                BinaryOp::Sub => x.checked_sub(y),
                BinaryOp::Mul => x.checked_mul(y),
                BinaryOp::Div => x.checked_div(y),
            };
            match v {
                Some(v) if v > 0 => Ok(Dim::Fixed(v as usize)),
                _ => Err(format!("{x} {} {y} is not a size", op.symbol())),
            }
        })
        .collect()
}
