//! Ops that move, pick or join an activation's floats (Transpose, Squeeze,
//! Unsqueeze, Slice, Gather, Concat), and the static shape arithmetic
//! exporters write around recurrent layers (Shape, Cast, ConstantOfShape,
//! Expand), folded here so nothing of it runs.
//!
//! Moving only the batch axis, or adding and removing axes of one, changes
//! the [`View`], not the floats; anything else is one [`Op::Rearrange`] or
//! [`Op::Concat`] step.

use tickserve_core::{DataType, Weight};
use tickserve_onnx::proto::NodeProto;

use super::{
    Dim, Importer, Tensor, Unsupported, View, attribute, axis_index, int_attribute, integers,
};
use crate::plan::Op;

/// `shape` without `axes`, each of which must be a fixed 1.
fn squeezed(shape: &[Dim], axes: &[usize]) -> Result<Vec<Dim>, String> {
    for &a in axes {
        if shape[a] != Dim::Fixed(1) {
            return Err(format!("axis {a} is {:?}, not 1", shape[a]));
        }
    }
    Ok(shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, d)| *d)
        .collect())
}

/// `shape` with ones at `axes` (indices of the result).
fn unsqueezed(shape: &[Dim], axes: &[usize]) -> Vec<Dim> {
    let mut rest = shape.iter();
    (0..shape.len() + axes.len())
        .map(|i| {
            if axes.contains(&i) {
                Dim::Fixed(1)
            } else {
                rest.next().copied().unwrap_or(Dim::Fixed(1))
            }
        })
        .collect()
}

/// ONNX's Slice bounds on an axis of size `size`: first index and count.
fn slice_bounds(start: i64, end: i64, step: i64, size: usize) -> (usize, usize) {
    let size = size as i64;
    let clamp = |x: i64, low: i64, high: i64| x.max(low).min(high);
    let wrap = |x: i64| if x < 0 { x.saturating_add(size) } else { x };
    let (start, end) = if step > 0 {
        (clamp(wrap(start), 0, size), clamp(wrap(end), 0, size))
    } else {
        (
            clamp(wrap(start), 0, size - 1),
            clamp(wrap(end), -1, size - 1),
        )
    };
    let span = end - start;
    let count = if (step > 0 && span > 0) || (step < 0 && span < 0) {
        (span + step - step.signum()) / step
    } else {
        0
    };
    (start.max(0) as usize, count.max(0) as usize)
}

/// A picking of a view's floats: the result's dimensions, and per
/// dimension the input stride, plus the first element.
struct Picked {
    dims: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    batch: usize,
}

impl Picked {
    /// Every float of `view` where it is.
    fn all(view: &View) -> Picked {
        Picked {
            dims: view.dims.clone(),
            strides: view.strides(),
            offset: 0,
            batch: view.batch,
        }
    }

    /// Whether this reads the input as it lies.
    fn is_identity(&self, view: &View) -> bool {
        self.offset == 0 && self.dims == view.dims && self.strides == view.strides()
    }
}

impl Importer<'_> {
    /// Names the node's output `picked` from `view`: the same floats when it
    /// reads them as they lie, else a [`Op::Rearrange`] step.
    fn picked(&mut self, node: &NodeProto, view: &View, p: Picked) -> Result<(), Unsupported> {
        if p.is_identity(view) {
            return self.alias(
                node,
                View {
                    value: view.value,
                    dims: p.dims,
                    batch: p.batch,
                },
            );
        }
        let dims = p.dims.clone();
        self.step_seen(
            node,
            Op::Rearrange {
                input: view.value,
                dims: p.dims,
                strides: p.strides,
                offset: p.offset,
            },
            dims,
            p.batch,
        )
    }

    /// Axes from input `index` (newer opsets) or the `axes` attribute.
    fn axes(&mut self, node: &NodeProto, index: usize) -> Result<Option<Vec<i64>>, Unsupported> {
        if Self::has_input(node, index) {
            return self.baked_integers(node, index).map(Some);
        }
        Ok(attribute(node, "axes").map(|a| a.ints.clone()))
    }

    pub(super) fn transpose(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let tensor = self.input(node, 0)?.clone();
        let Tensor::Dynamic(view) = tensor else {
            return Err(self.unsupported(node, "only activations are transposed"));
        };
        let rank = view.dims.len() + 1;
        let perm: Vec<usize> = match attribute(node, "perm") {
            Some(a) => a
                .ints
                .iter()
                .map(|&p| axis_index(p, rank))
                .collect::<Option<_>>()
                .ok_or_else(|| self.unsupported(node, format!("perm {:?}", a.ints)))?,
            None => (0..rank).rev().collect(),
        };
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        if sorted != (0..rank).collect::<Vec<_>>() {
            return Err(self.unsupported(node, format!("perm {perm:?} is not a permutation")));
        }
        let strides = view.strides();
        let mut p = Picked {
            dims: Vec::new(),
            strides: Vec::new(),
            offset: 0,
            batch: 0,
        };
        for (i, &axis) in perm.iter().enumerate() {
            if axis == view.batch {
                p.batch = i;
            } else {
                let stored = view.stored(axis);
                p.dims.push(view.dims[stored]);
                p.strides.push(strides[stored]);
            }
        }
        self.picked(node, &view, p)
    }

    /// Squeeze and Unsqueeze, of activations and of shapes.
    pub(super) fn squeeze(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let unsqueeze = node.op_type() == "Unsqueeze";
        let axes = self.axes(node, 1)?;
        let tensor = self.input(node, 0)?.clone();
        let shape = match &tensor {
            Tensor::Dynamic(view) => view.shape(),
            Tensor::Filled { shape, .. } => shape.clone(),
            Tensor::Shape(_) | Tensor::Constant(_) => {
                // A shape is a list: adding or removing an axis of one
                // around it leaves the list.
                let name = self.output_name(node)?.to_string();
                let tensor = match tensor {
                    Tensor::Constant(mut w) => {
                        let len = w.dims.iter().product::<usize>();
                        w.dims = vec![len];
                        w.name.clone_from(&name);
                        Tensor::Constant(w)
                    }
                    other => other,
                };
                self.names.insert(name, tensor);
                return Ok(());
            }
        };
        let Some(axes) = axes else {
            return Err(self.unsupported(
                node,
                "no axes: which axes go would depend on the batch's size",
            ));
        };
        let rank = if unsqueeze {
            shape.len() + axes.len()
        } else {
            shape.len()
        };
        let axes: Vec<usize> = axes
            .iter()
            .map(|&a| axis_index(a, rank))
            .collect::<Option<_>>()
            .ok_or_else(|| self.unsupported(node, format!("axes {axes:?} for rank {rank}")))?;
        let shape = if unsqueeze {
            unsqueezed(&shape, &axes)
        } else {
            squeezed(&shape, &axes).map_err(|reason| self.unsupported(node, reason))?
        };
        match tensor {
            Tensor::Dynamic(view) => {
                let seen = view
                    .reshaped(&shape)
                    .ok_or_else(|| self.unsupported(node, "the batch axis cannot go"))?;
                self.alias(node, seen)
            }
            Tensor::Filled { value, .. } => {
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, Tensor::Filled { shape, value });
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn slice(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let read =
            |this: &mut Self, index: usize, attr: &str| -> Result<Option<Vec<i64>>, Unsupported> {
                if this.opset >= 10 {
                    if Self::has_input(node, index) {
                        this.baked_integers(node, index).map(Some)
                    } else {
                        Ok(None)
                    }
                } else {
                    Ok(attribute(node, attr).map(|a| a.ints.clone()))
                }
            };
        let starts =
            read(self, 1, "starts")?.ok_or_else(|| self.unsupported(node, "starts are missing"))?;
        let ends =
            read(self, 2, "ends")?.ok_or_else(|| self.unsupported(node, "ends are missing"))?;
        let axes = read(self, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = read(self, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(self.unsupported(node, "starts, ends, axes and steps differ in length"));
        }
        let tensor = self.input(node, 0)?.clone();
        match tensor {
            Tensor::Shape(dims) => {
                if axes.iter().any(|&a| axis_index(a, 1) != Some(0)) || steps != [1] {
                    return Err(self.unsupported(node, "a shape is sliced along its one axis"));
                }
                let (first, count) = slice_bounds(starts[0], ends[0], 1, dims.len());
                let name = self.output_name(node)?.to_string();
                self.names
                    .insert(name, Tensor::Shape(dims[first..first + count].to_vec()));
                Ok(())
            }
            Tensor::Dynamic(view) => {
                let mut p = Picked::all(&view);
                let rank = view.dims.len() + 1;
                for i in 0..starts.len() {
                    let axis = axis_index(axes[i], rank)
                        .ok_or_else(|| self.unsupported(node, format!("axis {}", axes[i])))?;
                    if steps[i] == 0 {
                        return Err(self.unsupported(node, "a step of 0"));
                    }
                    if axis == view.batch {
                        if starts[i] == 0 && ends[i] >= i64::from(i32::MAX) && steps[i] == 1 {
                            continue;
                        }
                        return Err(self.unsupported(node, "it slices the batch"));
                    }
                    let stored = view.stored(axis);
                    let (first, count) =
                        slice_bounds(starts[i], ends[i], steps[i], view.dims[stored]);
                    p.offset += first * view.strides()[stored] as usize;
                    p.dims[stored] = count;
                    p.strides[stored] *= steps[i] as isize;
                }
                if p.dims.contains(&0) {
                    return Err(self.unsupported(node, "the slice is empty"));
                }
                self.picked(node, &view, p)
            }
            Tensor::Filled { shape, value } => {
                let mut shape = shape.clone();
                for i in 0..starts.len() {
                    let axis = axis_index(axes[i], shape.len())
                        .ok_or_else(|| self.unsupported(node, format!("axis {}", axes[i])))?;
                    let Dim::Fixed(size) = shape[axis] else {
                        return Err(self.unsupported(node, "it slices the batch"));
                    };
                    if steps[i] == 0 {
                        return Err(self.unsupported(node, "a step of 0"));
                    }
                    shape[axis] = Dim::Fixed(slice_bounds(starts[i], ends[i], steps[i], size).1);
                }
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, Tensor::Filled { shape, value });
                Ok(())
            }
            _ => Err(self.unsupported(node, "only activations and shapes are sliced")),
        }
    }

    pub(super) fn gather(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let indices_weight = self.constant(node, 1)?;
        let scalar = indices_weight.dims.is_empty();
        let indices = self.baked_integers(node, 1)?;
        let tensor = self.input(node, 0)?.clone();
        match tensor {
            Tensor::Shape(dims) => {
                let picked: Option<Vec<Dim>> = indices
                    .iter()
                    .map(|&i| axis_index(i, dims.len()).map(|i| dims[i]))
                    .collect();
                let picked =
                    picked.ok_or_else(|| self.unsupported(node, format!("indices {indices:?}")))?;
                let name = self.output_name(node)?.to_string();
                self.names.insert(name, Tensor::Shape(picked));
                Ok(())
            }
            Tensor::Dynamic(view) => {
                let rank = view.dims.len() + 1;
                let axis = axis_index(int_attribute(node, "axis", 0), rank)
                    .filter(|&a| a != view.batch)
                    .ok_or_else(|| {
                        self.unsupported(node, "the axis is the batch's, or out of range")
                    })?;
                let stored = view.stored(axis);
                let size = view.dims[stored];
                let at: Option<Vec<usize>> = indices.iter().map(|&i| axis_index(i, size)).collect();
                let at = at.ok_or_else(|| {
                    self.unsupported(node, format!("indices {indices:?} outside 0..{size}"))
                })?;
                let step = match at.as_slice() {
                    [] => return Err(self.unsupported(node, "no indices")),
                    [_] => 0,
                    [a, b, ..] => *b as isize - *a as isize,
                };
                if at.windows(2).any(|w| w[1] as isize - w[0] as isize != step) {
                    return Err(self
                        .unsupported(node, format!("indices {indices:?} are not evenly spaced")));
                }
                if !scalar && indices_weight.dims.len() != 1 {
                    return Err(self.unsupported(node, "indices of more than one axis"));
                }
                let mut p = Picked::all(&view);
                let stride = p.strides[stored];
                p.offset = at[0] * stride as usize;
                if scalar {
                    p.dims.remove(stored);
                    p.strides.remove(stored);
                    if axis < view.batch {
                        p.batch -= 1;
                    }
                } else {
                    p.dims[stored] = at.len();
                    p.strides[stored] = stride * step;
                }
                self.picked(node, &view, p)
            }
            _ => Err(self.unsupported(node, "only activations and shapes are gathered from")),
        }
    }

    pub(super) fn concat(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let tensors: Vec<Tensor> = (0..node.input.len())
            .map(|i| self.input(node, i).cloned())
            .collect::<Result<_, _>>()?;
        if tensors.iter().all(|t| matches!(t, Tensor::Dynamic(_))) {
            return self.concat_activations(node, &tensors);
        }
        // A shape being built: lists of dimensions and constant integers.
        let mut dims = Vec::new();
        for t in &tensors {
            match t {
                Tensor::Shape(d) => dims.extend_from_slice(d),
                Tensor::Constant(w) => {
                    let values = integers(w).ok_or_else(|| {
                        self.unsupported(node, "it joins activations and constants")
                    })?;
                    for v in values {
                        dims.push(match v {
                            n if n > 0 => Dim::Fixed(n as usize),
                            -1 => Dim::Infer,
                            0 => Dim::Same,
                            _ => return Err(self.unsupported(node, format!("dimension {v}"))),
                        });
                    }
                }
                _ => return Err(self.unsupported(node, "it joins activations and constants")),
            }
        }
        let name = self.output_name(node)?.to_string();
        self.names.insert(name, Tensor::Shape(dims));
        Ok(())
    }

    fn concat_activations(
        &mut self,
        node: &NodeProto,
        tensors: &[Tensor],
    ) -> Result<(), Unsupported> {
        let views: Vec<&View> = tensors
            .iter()
            .filter_map(|t| match t {
                Tensor::Dynamic(v) => Some(v),
                _ => None,
            })
            .collect();
        let first = views[0];
        let rank = first.dims.len() + 1;
        let axis = axis_index(int_attribute(node, "axis", 0), rank)
            .filter(|&a| a != first.batch)
            .ok_or_else(|| self.unsupported(node, "the axis is the batch's, or out of range"))?;
        let stored = first.stored(axis);
        let mut dims = first.dims.clone();
        dims[stored] = 0;
        let mut chunks = Vec::with_capacity(views.len());
        for v in &views {
            let same = v.batch == first.batch
                && v.dims.len() == first.dims.len()
                && v.dims
                    .iter()
                    .zip(&first.dims)
                    .enumerate()
                    .all(|(i, (a, b))| i == stored || a == b);
            if !same {
                return Err(self.unsupported(
                    node,
                    format!(
                        "{:?} and {:?} do not join on axis {axis}",
                        first.shape(),
                        v.shape()
                    ),
                ));
            }
            dims[stored] += v.dims[stored];
            chunks.push(v.dims[stored..].iter().product());
        }
        let outer = first.dims[..stored].iter().product();
        let inputs = views.iter().map(|v| v.value).collect();
        self.step_seen(
            node,
            Op::Concat {
                inputs,
                outer,
                chunks,
            },
            dims,
            first.batch,
        )
    }

    pub(super) fn shape(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let shape = match self.input(node, 0)?.clone() {
            Tensor::Dynamic(view) => view.shape(),
            Tensor::Filled { shape, .. } => shape,
            Tensor::Constant(w) => w.dims.iter().map(|&d| Dim::Fixed(d)).collect(),
            Tensor::Shape(d) => vec![Dim::Fixed(d.len())],
        };
        let rank = shape.len() as i64;
        let wrap = |x: i64| if x < 0 { (x + rank).max(0) } else { x.min(rank) } as usize;
        let start = wrap(int_attribute(node, "start", 0));
        let end = wrap(int_attribute(node, "end", rank));
        let name = self.output_name(node)?.to_string();
        let picked = shape
            .get(start..end.max(start))
            .unwrap_or_default()
            .to_vec();
        self.names.insert(name, Tensor::Shape(picked));
        Ok(())
    }

    /// Cast: of a shape (a no-op), or of a float activation to FP32.
    pub(super) fn cast(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let to = int_attribute(node, "to", 0);
        let tensor = self.input(node, 0)?.clone();
        let keep = match &tensor {
            Tensor::Shape(_) => true,
            Tensor::Dynamic(_) | Tensor::Filled { .. } => to == 1,
            Tensor::Constant(w) => integers(w).is_some() && (to == 6 || to == 7),
        };
        if !keep {
            return Err(self.unsupported(node, format!("a cast to element type {to}")));
        }
        let name = self.output_name(node)?.to_string();
        let tensor = match tensor {
            Tensor::Constant(mut w) => {
                w.name.clone_from(&name);
                Tensor::Constant(w)
            }
            other => other,
        };
        self.names.insert(name, tensor);
        Ok(())
    }

    /// ConstantOfShape, or Expand of a constant of one value: a tensor of
    /// one value whose shape may hold the batch (an initial state of zeros).
    pub(super) fn filled(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let (value, shape_index) = if node.op_type() == "ConstantOfShape" {
            let value = match attribute(node, "value").and_then(|a| a.t.as_ref()) {
                Some(t) => tickserve_onnx::tensor_weight(t)
                    .map_err(|reason| self.unsupported(node, reason))?,
                None => Weight {
                    name: String::new(),
                    datatype: DataType::Fp32,
                    dims: vec![1],
                    data: 0f32.to_le_bytes().to_vec(),
                },
            };
            (value, 0)
        } else {
            (self.constant(node, 0)?, 1)
        };
        let floats: Vec<f32> = match value.datatype {
            DataType::Fp32 => value
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => return Err(self.unsupported(node, "only FP32 values fill a tensor")),
        };
        let Some(&first) = floats.first() else {
            return Err(self.unsupported(node, "an empty value"));
        };
        if floats.iter().any(|&f| f.to_bits() != first.to_bits()) {
            return Err(self.unsupported(node, "the value is not one number"));
        }
        let shape = match self.input(node, shape_index)?.clone() {
            Tensor::Shape(dims) => dims,
            Tensor::Constant(w) => integers(&w)
                .ok_or_else(|| self.unsupported(node, "the shape must be integers"))?
                .into_iter()
                .map(|d| usize::try_from(d).map(Dim::Fixed))
                .collect::<Result<_, _>>()
                .map_err(|_| self.unsupported(node, "a negative dimension"))?,
            _ => return Err(self.unsupported(node, "the shape must be static")),
        };
        if shape.iter().any(|d| matches!(d, Dim::Infer | Dim::Same)) {
            return Err(self.unsupported(node, "the shape is not static"));
        }
        let name = self.output_name(node)?.to_string();
        self.names.insert(
            name,
            Tensor::Filled {
                shape,
                value: first,
            },
        );
        Ok(())
    }
}
