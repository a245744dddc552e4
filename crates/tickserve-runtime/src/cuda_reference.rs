//! `tickserve check --cuda-reference`: every model of a repository imported
//! with the CUDA engine's importer, its plan evaluated on the CPU
//! (`tickserve_engine_cuda::reference`) and compared with ONNX Runtime on
//! the same seeded random inputs. Runs on any machine, GPU or not: it is how
//! the importer is proven where there is no GPU.
//!
//! Each model is tried at 1 row, 3 rows and its largest bucket; a stateful
//! model over several ticks, each side carrying its own state from tick to
//! tick (so an error that accumulates shows). The graph imported is the one
//! the loader would give the CUDA engine (its weights as inputs when the
//! model shares them); ONNX Runtime runs the file as it is.

use std::collections::HashMap;

use tickserve_core::config::{ModelConfig, ServerConfig};
use tickserve_core::{Buckets, CompiledModel, SOLE_MEMBER};
use tickserve_engine_cuda::{arrange, import, reference};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine};
use tickserve_onnx::OnnxModel;

use crate::engine_check::difference;
use crate::repository::{ModelDir, scan};
use crate::settings::ModelSettings;

/// Ticks a stateful model is run for, its state carried between them.
const STATEFUL_TICKS: usize = 8;

/// What the comparison found for one model.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every output within `tolerance` (the largest relative difference).
    Ok {
        /// The largest `|plan − onnxruntime| / max(|onnxruntime|, 1)`.
        max_rel: f64,
    },
    /// The importer refuses the model (it would run on ONNX Runtime).
    Unsupported(String),
    /// Some output differs by more than the tolerance.
    Mismatch {
        /// The largest relative difference.
        max_rel: f64,
        /// Where it was: rows, tick, output and element.
        at: String,
    },
    /// The model could not be read or run on ONNX Runtime at all.
    Error(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Ok { max_rel } => write!(f, "cuda-reference ok max_rel={max_rel:.3e}"),
            Verdict::Unsupported(reason) => write!(f, "cuda-reference unsupported: {reason}"),
            Verdict::Mismatch { max_rel, .. } => {
                write!(f, "cuda-reference mismatch max_rel={max_rel:.3e}")
            }
            Verdict::Error(reason) => write!(f, "cuda-reference error: {reason}"),
        }
    }
}

/// Compares every model of `config`'s repository (its highest version) with
/// ONNX Runtime, within `tolerance`; in the repository's order.
pub fn check_repository(
    config: &ServerConfig,
    tolerance: f64,
) -> Result<Vec<(String, Verdict)>, String> {
    let ort = crate::engines::onnxruntime(config)?;
    Ok(scan(&config.repository)?
        .into_iter()
        .map(|dir| {
            let verdict =
                check_model(config, &ort, &dir, tolerance).unwrap_or_else(|outcome| outcome);
            (dir.name, verdict)
        })
        .collect())
}

fn check_model(
    config: &ServerConfig,
    ort: &OrtEngine,
    dir: &ModelDir,
    tolerance: f64,
) -> Result<Verdict, Verdict> {
    let model_config = dir.config.clone().map_err(Verdict::Error)?;
    let (version, path) = dir
        .versions
        .last()
        .ok_or_else(|| Verdict::Error("no version holds a model.onnx".to_string()))?;
    let relative = path
        .strip_prefix(&dir.dir)
        .ok()
        .and_then(|p| p.to_str())
        .unwrap_or("model.onnx");
    let shown = format!("{}/{relative}", dir.name);
    let bytes = tickserve_core::files::read(
        &dir.dir,
        relative,
        &shown,
        tickserve_core::files::MAX_ONNX_BYTES,
    )
    .map_err(|e| Verdict::Error(e.to_string()))?
    .ok_or_else(|| Verdict::Error(format!("{shown}: gone before it was read")))?;
    let onnx = OnnxModel::parse(&bytes).map_err(Verdict::Error)?;
    let signature = onnx.signature(&model_config).map_err(Verdict::Error)?;
    let settings = ModelSettings::resolve(
        &model_config,
        &config.model_defaults,
        &signature.inputs,
        onnx.is_tree_ensemble(),
    )
    .map_err(Verdict::Error)?;
    // The graph the loader gives the CUDA engine.
    let share = model_config
        .share_weights
        .unwrap_or(config.model_defaults.share_weights);
    let shared = if share {
        onnx.with_weights_as_inputs().ok()
    } else {
        None
    };
    let imported = match &shared {
        Some((graph, weights)) => import(graph, &signature.inputs, Some(weights)),
        None => import(&onnx, &signature.inputs, None),
    }
    .map_err(|e| Verdict::Unsupported(e.to_string()))?;
    let weights = arrange(&imported.plan, &imported.weights).map_err(Verdict::Error)?;

    let largest = settings.buckets.sizes().last().copied().unwrap_or(1);
    let mut sizes = vec![1, 3, largest];
    sizes.sort_unstable();
    sizes.dedup();
    let buckets = Buckets::new(&sizes, None).map_err(Verdict::Error)?;
    let family = format!("{}/{version} cuda-reference", dir.name);
    let mut compiled = ort
        .compile(&OrtCompileRequest {
            family: &family,
            onnx: &onnx,
            signature: &signature,
            buckets: &buckets,
            weights: None,
        })
        .map_err(|e| Verdict::Error(format!("ONNX Runtime: {e}")))?;

    let pairs = state_pairs(&model_config, &signature.inputs, &imported.plan);
    let ticks = if pairs.is_empty() { 1 } else { STATEFUL_TICKS };
    let mut worst = Verdict::Ok { max_rel: 0.0 };
    for (bucket, &rows) in sizes.iter().enumerate() {
        let mut compare = Comparison {
            plan: &imported.plan,
            weights: &weights,
            model: &mut compiled,
            bucket,
            rows,
            pairs: &pairs,
        };
        let verdict = compare.run(ticks, tolerance, rows as u64)?;
        worst = worse(worst, verdict);
    }
    Ok(worst)
}

/// The verdict that says more: a mismatch over an ok, the larger difference.
fn worse(a: Verdict, b: Verdict) -> Verdict {
    match (&a, &b) {
        (Verdict::Mismatch { .. }, Verdict::Ok { .. }) => a,
        (Verdict::Ok { .. }, Verdict::Mismatch { .. }) => b,
        (Verdict::Ok { max_rel: x }, Verdict::Ok { max_rel: y })
        | (Verdict::Mismatch { max_rel: x, .. }, Verdict::Mismatch { max_rel: y, .. }) => {
            if y > x {
                b
            } else {
                a
            }
        }
        _ => a,
    }
}

/// A state pair by position: input index and output index (in the plan's
/// and the file's order, which agree by name).
#[derive(Debug, Clone, Copy)]
struct Pair {
    input: usize,
    output: usize,
}

fn state_pairs(
    config: &ModelConfig,
    inputs: &[tickserve_core::TensorSpec],
    plan: &tickserve_engine_cuda::plan::Plan,
) -> Vec<Pair> {
    config
        .sequence
        .state
        .iter()
        .filter_map(|s| {
            Some(Pair {
                input: inputs.iter().position(|i| i.name == s.input)?,
                output: plan
                    .outputs
                    .iter()
                    .position(|(name, _)| *name == s.output)?,
            })
        })
        .collect()
}

/// One bucket's comparison.
struct Comparison<'a> {
    plan: &'a tickserve_engine_cuda::plan::Plan,
    weights: &'a [Vec<f32>],
    model: &'a mut tickserve_engine_ort::OrtModel,
    bucket: usize,
    rows: usize,
    pairs: &'a [Pair],
}

impl Comparison<'_> {
    /// Runs `ticks` ticks on both sides, each carrying its own state (the
    /// first tick's state is random, like every other input).
    fn run(&mut self, ticks: usize, tolerance: f64, seed: u64) -> Result<Verdict, Verdict> {
        let inputs = &self.model.signature().inputs.clone();
        let outputs: Vec<String> = self
            .model
            .signature()
            .outputs
            .iter()
            .map(|o| o.name.clone())
            .collect();
        let width = |i: usize| inputs[i].dims.iter().product::<usize>() * self.rows;
        let mut ours_state: HashMap<usize, Vec<f32>> = HashMap::new();
        let mut theirs_state: HashMap<usize, Vec<f32>> = HashMap::new();
        let mut worst = Verdict::Ok { max_rel: 0.0 };
        for tick in 0..ticks {
            let fresh: Vec<Vec<f32>> = (0..inputs.len())
                .map(|i| reference::random_rows(seed * 1000 + (tick * 31 + i) as u64, width(i)))
                .collect();
            let side = |state: &HashMap<usize, Vec<f32>>| -> Vec<Vec<f32>> {
                (0..inputs.len())
                    .map(|i| state.get(&i).cloned().unwrap_or_else(|| fresh[i].clone()))
                    .collect()
            };
            let (ours_in, theirs_in) = (side(&ours_state), side(&theirs_state));
            for (i, data) in theirs_in.iter().enumerate() {
                let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                self.model.input_mut(self.bucket, i).copy_from_slice(&bytes);
            }
            self.model
                .run(self.bucket, SOLE_MEMBER)
                .map_err(|e| Verdict::Error(format!("ONNX Runtime: {e}")))?;
            let slices: Vec<&[f32]> = ours_in.iter().map(Vec::as_slice).collect();
            let ours = reference::run(self.plan, self.weights, &slices, self.rows);
            for (o, (name, _)) in self.plan.outputs.iter().enumerate() {
                let index = outputs.iter().position(|n| n == name).ok_or_else(|| {
                    Verdict::Error(format!("output '{name}' is not ONNX Runtime's"))
                })?;
                let theirs: Vec<f32> = self
                    .model
                    .output(self.bucket, index)
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let (max_rel, element) = difference(&ours[o], &theirs).ok_or_else(|| {
                    Verdict::Error(format!(
                        "output '{name}': {} floats from the plan, {} from ONNX Runtime",
                        ours[o].len(),
                        theirs.len()
                    ))
                })?;
                let verdict = if max_rel <= tolerance {
                    Verdict::Ok { max_rel }
                } else {
                    Verdict::Mismatch {
                        max_rel,
                        at: format!(
                            "{} rows, tick {tick}, output '{name}', element {element}",
                            self.rows
                        ),
                    }
                };
                worst = worse(worst, verdict);
                for pair in self.pairs.iter().filter(|p| p.output == o) {
                    ours_state.insert(pair.input, ours[o].clone());
                    theirs_state.insert(pair.input, theirs.clone());
                }
            }
        }
        Ok(worst)
    }
}
