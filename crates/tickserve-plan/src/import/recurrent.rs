//! ONNX LSTM and GRU, forward, with the attributes exporters write: the
//! default activations, `layout` 0 (`[steps, batch, features]`) or 1
//! (batch first), `linear_before_reset` (GRU), initial states as inputs, and
//! any of the outputs `Y`, `Y_h`, `Y_c`. Both layouts store the window the
//! same way (a row is its steps one after another), so neither costs a copy.
//! Refused by name: other directions, other activations, `clip`,
//! `input_forget`, peepholes and `sequence_lens`.

use tickserve_onnx::proto::NodeProto;

use super::{Dim, Importer, Tensor, Unsupported, View, attribute, int_attribute};
use crate::plan::{Cell, Op, Recurrent, Step};

/// ONNX's default activations per cell, as exporters may spell them out.
const LSTM_ACTIVATIONS: [&str; 3] = ["Sigmoid", "Tanh", "Tanh"];
const GRU_ACTIVATIONS: [&str; 2] = ["Sigmoid", "Tanh"];

impl Importer<'_> {
    pub(super) fn recurrent(&mut self, node: &NodeProto) -> Result<(), Unsupported> {
        let lstm = node.op_type() == "LSTM";
        let cell = if lstm {
            Cell::Lstm
        } else {
            Cell::Gru {
                linear_before_reset: int_attribute(node, "linear_before_reset", 0) != 0,
            }
        };
        self.refuse_variants(node, lstm)?;
        let layout = int_attribute(node, "layout", 0);
        if layout != 0 && layout != 1 {
            return Err(self.unsupported(node, format!("layout {layout}")));
        }
        let x = self.view(node, 0)?;
        let [first, second, Dim::Fixed(input_size)] = x.shape()[..] else {
            return Err(self.unsupported(node, format!("X {:?} is not 3-D", x.shape())));
        };
        let steps = match (layout, first, second) {
            (0, Dim::Fixed(steps), Dim::Batch) | (1, Dim::Batch, Dim::Fixed(steps)) => steps,
            _ => {
                return Err(self.unsupported(
                    node,
                    format!(
                        "X {:?} does not have the batch at axis {} (layout {layout})",
                        x.shape(),
                        1 - layout
                    ),
                ));
            }
        };
        let gates = cell.gates();
        let w = self.constant(node, 1)?;
        let r = self.constant(node, 2)?;
        let hidden = r.dims.last().copied().unwrap_or(0);
        let declared = int_attribute(node, "hidden_size", hidden as i64);
        if declared != hidden as i64 || hidden == 0 {
            return Err(self.unsupported(
                node,
                format!("hidden_size {declared} does not match R {:?}", r.dims),
            ));
        }
        let expect = |weight: &tickserve_core::Weight, dims: &[usize], what: &str| {
            if weight.dims == dims {
                Ok(())
            } else {
                Err(self.unsupported(
                    node,
                    format!(
                        "{what} '{}' is {:?}, not {dims:?}",
                        weight.name, weight.dims
                    ),
                ))
            }
        };
        // A file's hidden size times the gates must be a number, not a wrap
        // to 0 that empty weights would then match.
        let (rows, biases) = gates
            .checked_mul(hidden)
            .and_then(|rows| Some((rows, rows.checked_mul(2)?)))
            .ok_or_else(|| self.unsupported(node, format!("hidden_size {hidden} is too large")))?;
        expect(&w, &[1, rows, input_size], "W")?;
        expect(&r, &[1, rows, hidden], "R")?;
        let b = if Self::has_input(node, 3) {
            let b = self.constant(node, 3)?;
            expect(&b, &[1, biases], "B")?;
            Some(self.slot(node, &b)?)
        } else {
            None
        };
        let (w, r) = (self.slot(node, &w)?, self.slot(node, &r)?);
        // A state, in the layout's shape: [1, batch, hidden] or [batch, 1, hidden].
        let state_shape = if layout == 0 {
            vec![Dim::Fixed(1), Dim::Batch, Dim::Fixed(hidden)]
        } else {
            vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(hidden)]
        };
        let initial_h = self.initial_state(node, 5, &state_shape)?;
        let initial_c = if lstm {
            self.initial_state(node, 6, &state_shape)?
        } else {
            None
        };

        let used = |i: usize| node.output.get(i).is_some_and(|o| !o.is_empty());
        // Y: [steps, 1, batch, hidden] or [batch, steps, 1, hidden]; the
        // floats of a row are its steps' hidden states either way.
        let y_shape = if layout == 0 {
            vec![
                Dim::Fixed(steps),
                Dim::Fixed(1),
                Dim::Batch,
                Dim::Fixed(hidden),
            ]
        } else {
            vec![
                Dim::Batch,
                Dim::Fixed(steps),
                Dim::Fixed(1),
                Dim::Fixed(hidden),
            ]
        };
        let sequence = used(0).then(|| self.value(vec![steps, 1, hidden]));
        let last_c = (lstm && used(2)).then(|| self.value(vec![1, hidden]));
        let last_h = self.value(vec![1, hidden]);
        let layer = Recurrent {
            cell,
            input: x.value,
            initial_h,
            initial_c,
            w,
            r,
            b,
            steps,
            input_size,
            hidden,
            sequence,
            last_c,
        };
        self.plan.steps.push(Step {
            op: Op::Recurrent(Box::new(layer)),
            epilogue: Vec::new(),
            output: last_h,
            nodes: vec![super::node_name(node)],
        });
        // Nothing fuses into a recurrent step.
        self.produced.push(String::new());
        let seen = |value, shape: &[Dim]| {
            View {
                value,
                dims: Vec::new(),
                batch: 0,
            }
            .with_shape(shape)
        };
        let outputs = [
            (0, sequence.map(|v| seen(v, &y_shape))),
            (1, Some(seen(last_h, &state_shape))),
            (2, last_c.map(|v| seen(v, &state_shape))),
        ];
        for (i, view) in outputs {
            if let (true, Some(view)) = (used(i), view) {
                self.names
                    .insert(node.output[i].clone(), Tensor::Dynamic(view));
            }
        }
        Ok(())
    }

    /// Refuses, by name, what the plan's cells do not compute.
    fn refuse_variants(&self, node: &NodeProto, lstm: bool) -> Result<(), Unsupported> {
        if let Some(a) = attribute(node, "direction") {
            let direction = String::from_utf8_lossy(a.s());
            if direction != "forward" {
                return Err(self.unsupported(
                    node,
                    format!("direction '{direction}' (only forward is supported)"),
                ));
            }
        }
        if let Some(a) = attribute(node, "activations") {
            let names: Vec<String> = a
                .strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            let defaults: &[&str] = if lstm {
                &LSTM_ACTIVATIONS
            } else {
                &GRU_ACTIVATIONS
            };
            if names != defaults {
                return Err(self.unsupported(
                    node,
                    format!("activations {names:?} (only the defaults {defaults:?})"),
                ));
            }
        }
        for name in ["clip", "activation_alpha", "activation_beta"] {
            if attribute(node, name).is_some() {
                return Err(self.unsupported(node, format!("attribute '{name}'")));
            }
        }
        if int_attribute(node, "input_forget", 0) != 0 {
            return Err(self.unsupported(node, "input_forget = 1"));
        }
        if Self::has_input(node, 4) {
            return Err(self.unsupported(
                node,
                "sequence_lens (every window must be as long as the input)",
            ));
        }
        if lstm && Self::has_input(node, 7) {
            return Err(self.unsupported(node, "peepholes (input P)"));
        }
        Ok(())
    }

    /// An initial state (input `index`): an activation of `shape`, or
    /// zeros (absent, or filled with 0).
    fn initial_state(
        &self,
        node: &NodeProto,
        index: usize,
        shape: &[Dim],
    ) -> Result<Option<crate::plan::ValueId>, Unsupported> {
        if !Self::has_input(node, index) {
            return Ok(None);
        }
        match self.input(node, index)? {
            Tensor::Filled { value, .. } if *value == 0.0 => Ok(None),
            Tensor::Dynamic(view) if view.shape() == shape => Ok(Some(view.value)),
            Tensor::Dynamic(view) => Err(self.unsupported(
                node,
                format!("initial state {:?} is not {shape:?}", view.shape()),
            )),
            _ => Err(self.unsupported(
                node,
                format!("initial state (input {index}) is neither an activation nor zeros"),
            )),
        }
    }
}

impl View {
    /// `self.value`'s floats seen with `shape` (which holds the batch once).
    fn with_shape(self, shape: &[Dim]) -> View {
        let batch = shape.iter().position(|d| *d == Dim::Batch).unwrap_or(0);
        let dims = shape
            .iter()
            .filter_map(|d| match d {
                Dim::Fixed(n) => Some(*n),
                _ => None,
            })
            .collect();
        View {
            value: self.value,
            dims,
            batch,
        }
    }
}
