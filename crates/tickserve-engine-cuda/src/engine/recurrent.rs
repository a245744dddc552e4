//! A recurrent layer recorded on the stream (and so into the bucket's
//! graph): the initial states copied (or zeroed) into place, the window's
//! input projection as one product, then per step of the window the
//! recurrent product and the gate kernel ([`crate::kernels::gate_name`]),
//! with a GRU that resets before its product a reset kernel and a second
//! product between. Every step's launches are recorded, so a window of `T`
//! steps is `1 + T · (2 or 4)` graph nodes besides the state copies.
//!
//! The hidden state lives in the step's output value (read and written in
//! place); the LSTM's cell state in its `Y_c` value or a scratch area.

use std::ffi::c_void;

use cudarc::driver::result;
use tickserve_core::EngineError;

use super::product::{Operands, Product};
use super::{BucketGraph, CudaModel, aligned};
use crate::device::driver;
use crate::kernels::{gate_name, reset_name};
use crate::plan::{Cell, Recurrent, ValueId};

/// A recurrent step's scratch in a bucket's arena (offsets).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scratch {
    /// `xw = x · Wᵀ`: every step's input projection, `rows × steps × gates·hidden`.
    xw: usize,
    /// `hr = h · Rᵀ`: one step's recurrent projection, `rows × gates·hidden`.
    hr: usize,
    /// The GRU's second product `(r ⊙ h) · Rᵀ`, when it resets first.
    hr2: Option<usize>,
    /// The LSTM's cell state when `Y_c` is not read, or the GRU's `r ⊙ h`.
    c: Option<usize>,
    /// The products' operands: the window's projection, the recurrent
    /// one, the GRU's second (when it resets first).
    pub(super) operands: [Option<Operands>; 3],
}

/// Whether `layer` is a GRU that resets `h` before its recurrent product.
fn resets_first(layer: &Recurrent) -> bool {
    matches!(
        layer.cell,
        Cell::Gru {
            linear_before_reset: false
        }
    )
}

impl Scratch {
    /// Places `layer`'s scratch for `rows` rows from arena offset `at` on.
    pub(super) fn place(layer: &Recurrent, rows: usize, at: &mut usize) -> Scratch {
        let gh = layer.cell.gates() * layer.hidden;
        let mut take = |floats: usize| {
            let offset = *at;
            *at += aligned(rows * floats * 4);
            offset
        };
        let xw = take(layer.steps * gh);
        let hr = take(gh);
        let hr2 = resets_first(layer).then(|| take(gh));
        let needs_c = match layer.cell {
            Cell::Lstm => layer.last_c.is_none(),
            Cell::Gru { .. } => resets_first(layer),
        };
        let c = needs_c.then(|| take(layer.hidden));
        let operands = [
            Some(Operands::place(rows, at)),
            Some(Operands::place(rows, at)),
            hr2.is_some().then(|| Operands::place(rows, at)),
        ];
        Scratch {
            xw,
            hr,
            hr2,
            c,
            operands,
        }
    }

    /// Where the cell state (or the GRU's `r ⊙ h`) lives; 0 if nowhere.
    fn cell(&self, layer: &Recurrent, base: u64, address: &impl Fn(ValueId) -> u64) -> u64 {
        match (layer.last_c, self.c) {
            (Some(v), _) => address(v),
            (None, Some(offset)) => base + offset as u64,
            (None, None) => 0,
        }
    }

    /// The products' operand blocks, each at its offset, to be written into
    /// the arena: `x → xw`, `h → hr`, `r ⊙ h → hr2`, for `rows` rows.
    pub(super) fn operands(
        &self,
        layer: &Recurrent,
        rows: usize,
        base: u64,
        address: &impl Fn(ValueId) -> u64,
        h: ValueId,
    ) -> Vec<(usize, Vec<u64>)> {
        let gh = layer.cell.gates() * layer.hidden;
        let (hidden, projected) = (layer.hidden * 4, gh * 4);
        let ends = [
            (
                address(layer.input),
                layer.steps * layer.input_size * 4,
                base + self.xw as u64,
                layer.steps * projected,
            ),
            (address(h), hidden, base + self.hr as u64, projected),
            (
                self.cell(layer, base, address),
                hidden,
                self.hr2.map_or(0, |o| base + o as u64),
                projected,
            ),
        ];
        self.operands
            .iter()
            .zip(ends)
            .filter_map(|(block, (input, input_row, output, output_row))| {
                block.map(|b| {
                    (
                        b.at,
                        Operands::pointers(input, input_row, output, output_row, rows),
                    )
                })
            })
            .collect()
    }
}

impl CudaModel {
    /// Records recurrent step `index` (output value `h`) of `bucket`, with
    /// one member's weights or each row's member's (`mixed`).
    pub(super) fn record_recurrent(
        &self,
        bucket: &BucketGraph,
        mixed: bool,
        index: usize,
        h: ValueId,
        layer: &Recurrent,
    ) -> Result<(), EngineError> {
        let (layout, base, rows) = (&bucket.layout, bucket.arena.ptr, bucket.rows);
        let stream = self.stream.0;
        let address = |v: ValueId| base + layout.values[v] as u64;
        let scratch = layout.recurrent.get(&index).ok_or_else(|| {
            EngineError::Internal(format!("step {index} has no recurrent scratch"))
        })?;
        let gh = layer.cell.gates() * layer.hidden;
        let state_bytes = rows * layer.hidden * 4;
        let h_at = address(h);
        let c_at = scratch.cell(layer, base, &address);
        let start = |to: u64, from: Option<ValueId>| -> Result<(), EngineError> {
            // SAFETY: both areas lie in the arena, `state_bytes` long.
            unsafe {
                match from {
                    Some(v) => result::memcpy_dtod_async(to, address(v), state_bytes, stream),
                    None => result::memset_d8_async(to, 0, state_bytes, stream),
                }
            }
            .map_err(driver("the initial state"))
        };
        start(h_at, layer.initial_h)?;
        if layer.cell == Cell::Lstm {
            start(c_at, layer.initial_c)?;
        }
        let [Some(projection), Some(recurrence), second] = scratch.operands else {
            return Err(EngineError::Internal(format!(
                "step {index} has no operands for its products"
            )));
        };
        let product = |operands, slot, per_row, k| Product {
            slot,
            operands,
            transposed: true,
            per_row,
            k,
            n: gh,
        };
        let projection = product(projection, layer.w, layer.steps, layer.input_size);
        self.record_product(bucket, mixed, &projection)?;
        let recurrence = product(recurrence, layer.r, 1, layer.hidden);
        let function = |name: &str| {
            self.kernels
                .iter()
                .find(|(k, _)| k.name == name)
                .ok_or_else(|| EngineError::Internal(format!("no kernel {name}")))
        };
        let gate = function(&gate_name(index))?;
        let reset = if resets_first(layer) {
            Some(function(&reset_name(index))?)
        } else {
            None
        };
        let y = layer.sequence.map_or(0, address);
        let hr2 = scratch.hr2.map_or(0, |o| base + o as u64);
        for t in 0..layer.steps {
            self.record_product(bucket, mixed, &recurrence)?;
            let mut args = Arguments {
                h: h_at,
                c: c_at,
                y,
                xw: base + scratch.xw as u64,
                hr: base + scratch.hr as u64,
                hr2,
                table: bucket.table(mixed),
                rows: rows as i32,
                t: t as i32,
                mixed: i32::from(mixed),
            };
            if let Some((kernel, function)) = reset {
                args.launch(*function, kernel.dims(rows, layer.hidden), stream)?;
                let second = second.ok_or_else(|| {
                    EngineError::Internal(format!("step {index} has no second product"))
                })?;
                self.record_product(bucket, mixed, &product(second, layer.r, 1, layer.hidden))?;
            }
            let (kernel, function) = gate;
            args.launch(*function, kernel.dims(rows, layer.hidden), stream)?;
        }
        Ok(())
    }
}

/// A recurrent kernel's parameters, in the order of `RECURRENT(name)`.
struct Arguments {
    h: u64,
    c: u64,
    y: u64,
    xw: u64,
    hr: u64,
    hr2: u64,
    table: u64,
    rows: i32,
    t: i32,
    mixed: i32,
}

impl Arguments {
    fn launch(
        &mut self,
        function: cudarc::driver::sys::CUfunction,
        (grid, block): (u32, u32),
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), EngineError> {
        let mut params: [*mut c_void; 10] = [
            (&raw mut self.h).cast(),
            (&raw mut self.c).cast(),
            (&raw mut self.y).cast(),
            (&raw mut self.xw).cast(),
            (&raw mut self.hr).cast(),
            (&raw mut self.hr2).cast(),
            (&raw mut self.table).cast(),
            (&raw mut self.rows).cast(),
            (&raw mut self.t).cast(),
            (&raw mut self.mixed).cast(),
        ];
        // SAFETY: the parameters match `RECURRENT(name)`: six device
        // pointers into the arena (or null where unused), the table, three ints.
        unsafe {
            result::launch_kernel(
                function,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(driver("recurrent kernel launch"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout;
    use super::*;
    use crate::plan::{Op, Plan, Step, Value, WeightSlot};

    /// x [6, 4] → GRU (resets first) of 5 units from h0 → y [6, 1, 5], h.
    fn gru_plan() -> Plan {
        let value = |dims: Vec<usize>| Value {
            width: dims.iter().product(),
            dims,
        };
        let slot = |name: &str, dims: Vec<usize>| WeightSlot {
            name: name.into(),
            len: dims.iter().product(),
            dims,
        };
        Plan {
            values: vec![
                value(vec![6, 4]),
                value(vec![5]),
                value(vec![6, 1, 5]),
                value(vec![1, 5]),
            ],
            inputs: vec![("x".into(), 0), ("h0".into(), 1)],
            outputs: vec![("y".into(), 2), ("h".into(), 3)],
            weights: vec![
                slot("w", vec![1, 15, 4]),
                slot("r", vec![1, 15, 5]),
                slot("b", vec![1, 30]),
            ],
            baked: Vec::new(),
            steps: vec![Step {
                op: Op::Recurrent(Box::new(Recurrent {
                    cell: Cell::Gru {
                        linear_before_reset: false,
                    },
                    input: 0,
                    initial_h: Some(1),
                    initial_c: None,
                    w: 0,
                    r: 1,
                    b: Some(2),
                    steps: 6,
                    input_size: 4,
                    hidden: 5,
                    sequence: Some(2),
                    last_c: None,
                })),
                epilogue: Vec::new(),
                output: 3,
                nodes: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_recurrent_step_gets_its_scratch_apart_and_its_products_their_pointers() {
        let plan = gru_plan();
        let rows = 64;
        let l = layout(&plan, rows);
        let s = l.recurrent[&0];
        let (Some(hr2), Some(c)) = (s.hr2, s.c) else {
            panic!("a GRU that resets first needs r ⊙ h and a second product: {s:?}");
        };
        let regions: Vec<(usize, usize)> = (0..4)
            .map(|v| (l.values[v], rows * plan.values[v].width * 4))
            .chain([
                (s.xw, rows * 6 * 15 * 4),
                (s.hr, rows * 15 * 4),
                (hr2, rows * 15 * 4),
                (c, rows * 5 * 4),
            ])
            .chain(
                s.operands
                    .iter()
                    .flatten()
                    .map(|b| (b.at, Operands::bytes(rows))),
            )
            .collect();
        super::super::tests::assert_apart(regions, l.total);
        let Op::Recurrent(layer) = &plan.steps[0].op else {
            unreachable!()
        };
        let base = 1 << 20;
        let address = |v: ValueId| base + l.values[v] as u64;
        let blocks = s.operands(layer, rows, base, &address, 3);
        let starts: Vec<(usize, [u64; 2])> =
            blocks.iter().map(|(at, p)| (*at, [p[0], p[1]])).collect();
        let at = |i: usize| s.operands[i].unwrap().at;
        assert_eq!(
            starts,
            [
                (at(0), [address(0), base + s.xw as u64]),
                (at(1), [address(3), base + s.hr as u64]),
                (at(2), [base + c as u64, base + hr2 as u64]),
            ]
        );
        // Row 1's window and projection, one row on.
        let (_, window) = &blocks[0];
        assert_eq!(window[2 + 1], address(0) + 6 * 4 * 4);
        assert_eq!(window[2 + rows + 1], base + s.xw as u64 + 6 * 15 * 4);
    }

    #[test]
    fn an_lstm_keeps_its_cell_state_in_y_c_when_it_is_read() {
        let mut plan = gru_plan();
        let Op::Recurrent(layer) = &mut plan.steps[0].op else {
            unreachable!()
        };
        layer.cell = Cell::Lstm;
        layer.last_c = Some(1);
        let mut at = 0;
        let scratch = Scratch::place(layer, 8, &mut at);
        assert!(scratch.c.is_none() && scratch.hr2.is_none(), "{scratch:?}");
        layer.last_c = None;
        let scratch = Scratch::place(layer, 8, &mut at);
        assert!(scratch.c.is_some(), "{scratch:?}");
    }
}
