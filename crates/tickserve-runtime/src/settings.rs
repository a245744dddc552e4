//! A model's effective settings: its `model.toml` over the server's
//! `model_defaults`, plus what the ONNX file implies (tree ensembles allow NaN),
//! and where its replicas run.

use std::time::Duration;

use tickserve_core::Buckets;
use tickserve_core::config::{ModelConfig, ModelDefaults, NanPolicy, Placement};
use tickserve_core::validate::Limits;
use tickserve_engine_cuda::Gpus;

/// Settings of one model, fixed at load.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// Batch sizes compiled.
    pub buckets: Buckets,
    /// Request limits checked at the edge.
    pub limits: Limits,
    /// The most rows waiting for the executor.
    pub max_queue_rows: usize,
    /// How long a queued request may wait for company.
    pub max_queue_delay: Duration,
    /// Executor threads, each with its own compiled sessions.
    pub executors: usize,
    /// Deadline for requests that bring none.
    pub default_timeout: Option<Duration>,
}

impl ModelSettings {
    /// Merges `config` over `defaults`; `tree_ensemble` picks the NaN default.
    pub fn resolve(
        config: &ModelConfig,
        defaults: &ModelDefaults,
        tree_ensemble: bool,
    ) -> Result<ModelSettings, String> {
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
        let default_nan = if tree_ensemble {
            NanPolicy::Allow
        } else {
            NanPolicy::Reject
        };
        Ok(ModelSettings {
            buckets,
            limits: Limits {
                max_request_rows,
                nan_policy: config.nan_policy.unwrap_or(default_nan),
            },
            max_queue_rows,
            max_queue_delay: config.max_queue_delay.unwrap_or(defaults.max_queue_delay),
            executors,
            default_timeout: config.timeout,
        })
    }
}

/// Where one replica of a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU, through ONNX Runtime.
    Cpu,
    /// GPU `N`, through the CUDA engine.
    Gpu(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// The replicas of a model placed on `placements` (its `devices`, or the
/// server's), on a machine with `gpus`: `auto` is a replica on every GPU, or
/// the CPU where there is none; a GPU that is not there is an error saying why.
pub fn replicas(placements: &[Placement], gpus: &Gpus) -> Result<Vec<Device>, String> {
    if placements.is_empty() {
        return Err("devices must name at least one device".to_string());
    }
    let mut devices = Vec::new();
    for placement in placements {
        match placement {
            Placement::Cpu => devices.push(Device::Cpu),
            Placement::Auto if gpus.devices().is_empty() => devices.push(Device::Cpu),
            Placement::Auto => {
                devices.extend(gpus.devices().iter().map(|g| Device::Gpu(g.ordinal)))
            }
            Placement::Gpu(n) => match gpus {
                Gpus::Present(found) if found.iter().any(|g| g.ordinal == *n) => {
                    devices.push(Device::Gpu(*n));
                }
                Gpus::Present(found) => {
                    return Err(format!(
                        "device gpu:{n} is not available: this machine has {} GPU(s), gpu:0 to gpu:{}",
                        found.len(),
                        found.len().saturating_sub(1)
                    ));
                }
                Gpus::Absent(reason) => {
                    return Err(format!("device gpu:{n} is not available: {reason}"));
                }
            },
        }
    }
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tickserve_engine_cuda::GpuInfo;

    fn two_gpus() -> Gpus {
        Gpus::Present(
            (0..2)
                .map(|ordinal| GpuInfo {
                    ordinal,
                    name: "test".into(),
                    memory: 1 << 30,
                })
                .collect(),
        )
    }

    #[test]
    fn auto_is_every_gpu_or_the_cpu() {
        let none = Gpus::Absent("no CUDA driver".into());
        assert_eq!(replicas(&[Placement::Auto], &none), Ok(vec![Device::Cpu]));
        assert_eq!(
            replicas(&[Placement::Auto], &two_gpus()),
            Ok(vec![Device::Gpu(0), Device::Gpu(1)])
        );
    }

    #[test]
    fn an_entry_twice_is_two_replicas_on_that_device() {
        let placements = [Placement::Gpu(1), Placement::Gpu(1), Placement::Cpu];
        assert_eq!(
            replicas(&placements, &two_gpus()),
            Ok(vec![Device::Gpu(1), Device::Gpu(1), Device::Cpu])
        );
    }

    #[test]
    fn a_gpu_that_is_not_there_is_an_error_saying_why() {
        let none = Gpus::Absent("no CUDA driver (libcuda.so cannot be loaded)".into());
        let error = replicas(&[Placement::Gpu(0)], &none).unwrap_err();
        assert!(
            error.contains("gpu:0") && error.contains("libcuda"),
            "{error}"
        );
        let error = replicas(&[Placement::Gpu(2)], &two_gpus()).unwrap_err();
        assert!(
            error.contains("gpu:2") && error.contains("2 GPU(s)"),
            "{error}"
        );
    }
}
