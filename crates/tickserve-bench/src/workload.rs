//! What one instance sends: a model read from its repository directory (its
//! inputs, its state pairs or window from `model.toml`), and a deterministic
//! stream of ticks per instance.

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_onnx::OnnxModel;

/// How a model keeps what came before.
#[derive(Debug, Clone, PartialEq)]
pub enum Memory {
    /// Nothing: every tick stands alone.
    None,
    /// State pairs (graph input, graph output): the server keeps them.
    State(Vec<(String, String)>),
    /// A window of the last `length` ticks under `input`.
    Window {
        /// The window's graph input.
        input: String,
        /// Ticks it holds.
        length: usize,
    },
}

/// A model as the harness drives it.
#[derive(Debug)]
pub struct Workload {
    /// The model's name (its directory's).
    pub name: String,
    /// The graph.
    pub onnx: OnnxModel,
    /// The input a client sends each tick.
    pub input: String,
    /// Floats in one tick.
    pub features: usize,
    /// What the model remembers.
    pub memory: Memory,
}

impl Workload {
    /// Reads `repository/name` (version 1 and its `model.toml`).
    pub fn read(repository: &Path, name: &str) -> Result<Workload, String> {
        let dir = repository.join(name);
        let config = ModelConfig::load(&dir, &format!("{name}/model.toml"))?;
        let bytes = std::fs::read(dir.join("1/model.onnx"))
            .map_err(|e| format!("{}: {e}", dir.join("1/model.onnx").display()))?;
        let onnx = OnnxModel::parse(&bytes)?;
        let signature = onnx.signature(&ModelConfig::default())?;
        let states: Vec<(String, String)> = config
            .sequence
            .state
            .iter()
            .map(|s| (s.input.clone(), s.output.clone()))
            .collect();
        let client = signature
            .inputs
            .iter()
            .find(|t| !states.iter().any(|(input, _)| *input == t.name))
            .ok_or("the model takes no input a client sends")?;
        let (memory, features) = match config.sequence.window.first() {
            Some(window) => {
                let dims = &client.dims;
                let length = dims
                    .first()
                    .copied()
                    .ok_or("a window input needs [N, F...]")?;
                let features = dims[1..].iter().product();
                (
                    Memory::Window {
                        input: window.input.clone(),
                        length,
                    },
                    features,
                )
            }
            None if states.is_empty() => (Memory::None, client.dims.iter().product()),
            None => (Memory::State(states), client.dims.iter().product()),
        };
        Ok(Workload {
            name: name.to_string(),
            input: client.name.clone(),
            features,
            memory,
            onnx,
        })
    }

    /// Tick `t` of instance `instance`: `features` floats in [-1, 1), the
    /// same on every run.
    pub fn tick(&self, instance: usize, t: usize) -> Vec<f32> {
        let mut seed = (instance as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(t as u64)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9)
            | 1;
        (0..self.features)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }
}
