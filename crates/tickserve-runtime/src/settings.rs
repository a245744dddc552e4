//! A model's effective settings: its `model.toml` over the server's
//! `model_defaults`, plus what the ONNX file implies (tree ensembles allow NaN).
//! (Where its replicas run is [`crate::engines::Engines::replicas`].)

use std::sync::Arc;
use std::time::Duration;

use tickserve_core::breaker::BreakerConfig;
use tickserve_core::config::{
    CpuEngineChoice, GpuMode, MixedRows, ModelConfig, ModelDefaults, NanPolicy,
};
use tickserve_core::durations::{self, MAX_QUEUE_DELAY, MAX_TIMEOUT};
use tickserve_core::guard::Guards;
use tickserve_core::monte_carlo::MonteCarloSettings;
use tickserve_core::priority::Priorities;
use tickserve_core::sequence::{SequenceSpec, StateConfig};
use tickserve_core::validate::Limits;
use tickserve_core::{Buckets, DataType, TensorSpec};

/// Settings of one model, fixed at load.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// Batch sizes compiled.
    pub buckets: Buckets,
    /// Request limits checked at the edge.
    pub limits: Limits,
    /// The most rows waiting for the executor.
    pub max_queue_rows: usize,
    /// The most bytes of input waiting for the executor.
    pub max_queue_bytes: usize,
    /// How long a queued request may wait for company.
    pub max_queue_delay: Duration,
    /// How often an idle executor runs the smallest bucket (`keep_warm`);
    /// `None`: never.
    pub keep_warm: Option<Duration>,
    /// Executor threads, each with its own compiled sessions.
    pub executors: usize,
    /// Deadline for requests that bring none.
    pub default_timeout: Option<Duration>,
    /// What to do if its rows turn out to depend on each other.
    pub mixed_rows: MixedRows,
    /// Monte Carlo input noise: the most samples, which inputs are perturbed.
    pub monte_carlo: MonteCarloSettings,
    /// Priority levels and their queue policies.
    pub priorities: Priorities,
    /// For a stateful model: its state pairs, the signature clients see, its
    /// idle policy and table bound.
    pub sequence: Option<Arc<SequenceSpec>>,
    /// Whether its predictions are journaled when the server's journal is
    /// on (`journal` in `model.toml`, else `model_defaults.journal`).
    pub journal: bool,
    /// Its output guards, checked on every answer before it goes
    /// ([`ModelSettings::with_guards`]: they need the graph's outputs).
    pub guards: Guards,
    /// Its circuit breaker, if it has one.
    pub breaker: Option<BreakerConfig>,
    /// Which engine runs it on the CPU, where `model.toml` says
    /// (`engine`); `None`: the server's `runtime.cpu_engine`. A family's
    /// engine is its first member's.
    pub engine: Option<CpuEngineChoice>,
    /// How a GPU runs its ticks, where `model.toml` says (`gpu_mode`);
    /// `None`: the server's `runtime.gpu_mode`. A family's is its first
    /// member's.
    pub gpu_mode: Option<GpuMode>,
    /// Its `[[sequence.state]]` pairs as written (a resident kernel keeps
    /// them on its device).
    pub state_pairs: Vec<StateConfig>,
}

impl ModelSettings {
    /// Merges `config` over `defaults` for a model whose graph has
    /// `inputs`; `tree_ensemble` picks the NaN default. A stateful model's
    /// [`ModelSettings::sequence`] is resolved once its outputs are known
    /// (after compiling: [`SequenceSpec::resolve`]).
    pub fn resolve(
        config: &ModelConfig,
        defaults: &ModelDefaults,
        inputs: &[TensorSpec],
        tree_ensemble: bool,
    ) -> Result<ModelSettings, String> {
        // What clients send: a stateful model's state inputs are the server's,
        // and a window input comes one tick at a time (its dimensions after the
        // window's length).
        let inputs: Vec<TensorSpec> = inputs
            .iter()
            .filter(|t| !config.sequence.state.iter().any(|s| s.input == t.name))
            .map(|t| {
                let mut sent = t.clone();
                if config.sequence.window.iter().any(|w| w.input == t.name) && !sent.dims.is_empty()
                {
                    sent.dims.remove(0);
                }
                sent
            })
            .collect();
        let inputs = inputs.as_slice();
        let sizes = config.buckets.as_deref().unwrap_or(&defaults.buckets);
        let buckets =
            Buckets::new(sizes, config.max_batch_size).map_err(|e| format!("buckets: {e}"))?;
        let max_request_rows = config.max_request_rows.unwrap_or(defaults.max_request_rows);
        let max_queue_rows = config.max_queue_rows.unwrap_or(defaults.max_queue_rows);
        let executors = config.executors.unwrap_or(defaults.executors);
        if executors == 0 {
            return Err("executors must be positive".to_string());
        }
        if max_request_rows == 0 {
            return Err("max_request_rows must be positive".to_string());
        }
        if max_queue_rows < max_request_rows {
            return Err(format!(
                "max_queue_rows ({max_queue_rows}) must be at least max_request_rows ({max_request_rows})"
            ));
        }
        let max_queue_delay = config.max_queue_delay.unwrap_or(defaults.max_queue_delay);
        durations::check("max_queue_delay", max_queue_delay, MAX_QUEUE_DELAY)?;
        let keep_warm = config.keep_warm.unwrap_or(defaults.keep_warm);
        durations::check_keep_warm("keep_warm", keep_warm)?;
        if let Some(timeout) = config.timeout {
            durations::check("timeout", timeout, MAX_TIMEOUT)?;
        }
        let default_nan = if tree_ensemble {
            NanPolicy::Allow
        } else {
            NanPolicy::Reject
        };
        let priorities =
            Priorities::resolve(&config.priority).map_err(|e| format!("priority.{e}"))?;
        if priorities.reserved_executors >= executors {
            return Err(format!(
                "priority.reserved_executors ({}) must be below executors ({executors}): \
                 lower levels need at least one",
                priorities.reserved_executors
            ));
        }
        Ok(ModelSettings {
            buckets,
            limits: Limits {
                max_request_rows,
                nan_policy: config.nan_policy.unwrap_or(default_nan),
            },
            max_queue_rows,
            max_queue_bytes: config.max_queue_bytes.unwrap_or(defaults.max_queue_bytes),
            max_queue_delay,
            keep_warm: (!keep_warm.is_zero()).then_some(keep_warm),
            executors,
            default_timeout: config.timeout,
            mixed_rows: config.mixed_rows.unwrap_or_default(),
            monte_carlo: MonteCarloSettings::resolve(&config.monte_carlo, inputs, max_queue_rows)?,
            priorities,
            sequence: None,
            journal: config.journal.unwrap_or(defaults.journal),
            guards: Guards::default(),
            breaker: config.breaker.clone(),
            engine: config.engine,
            gpu_mode: config.gpu_mode,
            state_pairs: config.sequence.state.clone(),
        })
    }

    /// These settings with `config`'s guards resolved against the graph's
    /// `outputs` (name and datatype).
    pub fn with_guards(
        mut self,
        config: &ModelConfig,
        outputs: &[(&str, DataType)],
    ) -> Result<ModelSettings, String> {
        self.guards = Guards::resolve(&config.guard, outputs)?;
        let sequence = &config.sequence;
        if self.guards.step_outputs().next().is_some()
            && sequence.state.is_empty()
            && sequence.window.is_empty()
        {
            return Err(
                "a guard's max_step needs a sequence model ([[sequence.state]] or \
                 [[sequence.window]]): it bounds a sequence's move from its last answer"
                    .to_string(),
            );
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tickserve_core::DataType;

    #[test]
    fn a_window_inputs_monte_carlo_sigmas_are_per_element_of_a_tick() {
        let window = [TensorSpec {
            name: "window".into(),
            datatype: DataType::Fp32,
            dims: vec![30, 8],
        }];
        let config = |sigmas: usize| -> ModelConfig {
            let sigma = vec!["0.1"; sigmas].join(", ");
            toml::from_str(&format!(
                "[monte_carlo]\nenabled = true\n[monte_carlo.sigma]\nwindow = [{sigma}]\n\n\
                 [[sequence.window]]\ninput = \"window\"\n"
            ))
            .unwrap()
        };
        let defaults = ModelDefaults::default();
        assert!(ModelSettings::resolve(&config(8), &defaults, &window, false).is_ok());
        let error = ModelSettings::resolve(&config(240), &defaults, &window, false).unwrap_err();
        assert!(error.contains('8'), "{error}");
    }
}
