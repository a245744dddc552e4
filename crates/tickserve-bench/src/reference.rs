//! The reference: ONNX Runtime run in the harness on the same ticks, one
//! row at a time, carrying each instance's state (or window) itself, as the
//! server should.

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, SOLE_MEMBER};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtModel, OrtOptions};

use crate::workload::{Memory, Workload};

/// One instance's reference model and what it remembers.
pub struct Reference {
    model: OrtModel,
    /// Graph input index of the client's tick, and each state pair's input
    /// and output indices.
    tick_input: usize,
    pairs: Vec<(usize, usize)>,
    states: Vec<Vec<u8>>,
    /// The last ticks, oldest first, for a window model.
    window: Option<(usize, Vec<f32>)>,
}

impl Reference {
    /// ONNX Runtime (one intra-op thread) on `workload`'s graph, batch 1.
    pub fn new(library: &Path, workload: &Workload) -> Result<Reference, String> {
        let engine = OrtEngine::new(
            library,
            OrtOptions {
                intra_op_threads: 1,
            },
        )?;
        let signature = workload.onnx.signature(&ModelConfig::default())?;
        let buckets = Buckets::new(&[1], None).map_err(|e| e.to_string())?;
        let model = engine
            .compile(&OrtCompileRequest {
                family: "reference",
                onnx: &workload.onnx,
                signature: &signature,
                buckets: &buckets,
                weights: None,
            })
            .map_err(|e| e.to_string())?;
        let full = model.signature().clone();
        let input = |name: &str| full.inputs.iter().position(|t| t.name == name);
        let output = |name: &str| full.outputs.iter().position(|t| t.name == name);
        let tick_input = input(&workload.input).ok_or("no tick input")?;
        let mut pairs = Vec::new();
        if let Memory::State(states) = &workload.memory {
            for (i, o) in states {
                pairs.push((
                    input(i).ok_or_else(|| format!("no input {i}"))?,
                    output(o).ok_or_else(|| format!("no output {o}"))?,
                ));
            }
        }
        let states = pairs
            .iter()
            .map(|&(i, _)| vec![0u8; full.inputs[i].row_bytes()])
            .collect();
        let window = match workload.memory {
            Memory::Window { length, .. } => Some((length, vec![0.0; length * workload.features])),
            _ => None,
        };
        Ok(Reference {
            model,
            tick_input,
            pairs,
            states,
            window,
        })
    }

    /// Runs one tick; returns the first output's first value, and keeps the
    /// state (or the window) for the next.
    pub fn step(&mut self, tick: &[f32]) -> Result<f32, String> {
        let bytes =
            |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        match &mut self.window {
            Some((_, window)) => {
                window.drain(..tick.len());
                window.extend_from_slice(tick);
                self.model
                    .input_mut(0, self.tick_input)
                    .copy_from_slice(&bytes(window));
            }
            None => self
                .model
                .input_mut(0, self.tick_input)
                .copy_from_slice(&bytes(tick)),
        }
        for (&(input, _), state) in self.pairs.iter().zip(&self.states) {
            self.model.input_mut(0, input).copy_from_slice(state);
        }
        self.model.run(0, SOLE_MEMBER).map_err(|e| e.to_string())?;
        for (&(_, output), state) in self.pairs.iter().zip(self.states.iter_mut()) {
            state.copy_from_slice(self.model.output(0, output));
        }
        let out = self.model.output(0, 0);
        Ok(f32::from_le_bytes([out[0], out[1], out[2], out[3]]))
    }
}
