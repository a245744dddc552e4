//! What the front ends tell clients about a model version, built once from
//! its handle and encoded by each protocol: Triton's model configuration and
//! its statistics.
//!
//! The views say true things: the platform and backend of the engine each
//! replica runs on, one instance group per replica (`KIND_GPU` with its GPU
//! for replicas on a GPU) whose count is the replica's executors, the buckets
//! as `preferred_batch_size`, the configured `max_queue_delay`, and
//! `max_request_rows` as `max_batch_size`. HTTP serializes the views as they
//! are (Triton's JSON names); gRPC copies them field by field into its
//! messages (`grpc::model_config`, `grpc::model_statistics`).

use std::collections::BTreeMap;

use serde::Serialize;
use tickserve_core::priority::{Priorities, QueuePolicy, TimeoutAction};
use tickserve_core::sequence::Warmup;
use tickserve_core::{DataType, Device, TensorSpec};
use tickserve_runtime::Stat;
use tickserve_runtime::{Loaded, ModelHandle};

/// Triton's model configuration of one model version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfigView {
    /// The model's name.
    pub name: String,
    /// The first replica's engine, as Triton names platforms (`onnxruntime_onnx`).
    pub platform: &'static str,
    /// The first replica's engine, as Triton names backends (`onnxruntime`).
    pub backend: &'static str,
    /// The most rows one request may carry (`max_request_rows`).
    pub max_batch_size: usize,
    /// The inputs, batch dimension left out.
    pub input: Vec<TensorView>,
    /// The outputs, batch dimension left out.
    pub output: Vec<TensorView>,
    /// One group per replica.
    pub instance_group: Vec<InstanceGroupView>,
    /// The batcher's settings (a stateless model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatchingView>,
    /// The sequence batcher's settings and the state kept per sequence (a
    /// stateful model); Triton reports one or the other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_batching: Option<SequenceBatchingView>,
    /// `family`: the family key.
    pub parameters: BTreeMap<&'static str, ParameterView>,
}

/// One input or output of the model configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorView {
    /// Its name.
    pub name: String,
    /// Its datatype as the configuration spells it (`TYPE_FP32`).
    pub data_type: String,
    /// Its dimensions after the batch.
    pub dims: Vec<usize>,
    /// Its datatype.
    #[serde(skip)]
    pub datatype: DataType,
}

/// Where a group of model instances runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum InstanceKind {
    /// On the CPU.
    #[serde(rename = "KIND_CPU")]
    Cpu,
    /// On the GPUs listed.
    #[serde(rename = "KIND_GPU")]
    Gpu,
}

/// One replica, as Triton's `instance_group` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceGroupView {
    /// The group's name: the model's, then `_1`, `_2` for later replicas.
    pub name: String,
    /// CPU or GPU.
    pub kind: InstanceKind,
    /// Executors of this replica (each with its own compiled graph).
    pub count: usize,
    /// The GPU, for a GPU replica.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<usize>,
}

/// The batcher's settings, as Triton's `dynamic_batching` describes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DynamicBatchingView {
    /// The buckets: the batch sizes compiled.
    pub preferred_batch_size: Vec<usize>,
    /// The configured `max_queue_delay`, in microseconds.
    pub max_queue_delay_microseconds: u64,
    /// Priority levels (0: none), as Triton reports them.
    #[serde(skip_serializing_if = "is_zero")]
    pub priority_levels: u64,
    /// The level of a request without a valid `priority`.
    #[serde(skip_serializing_if = "is_zero")]
    pub default_priority_level: u64,
    /// The policy of levels without their own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_queue_policy: Option<QueuePolicyView>,
    /// Each level's policy, by level.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub priority_queue_policy: BTreeMap<u64, QueuePolicyView>,
}

/// A stateful model's scheduling, as Triton's `sequence_batching` describes
/// it: the "oldest" strategy (requests of different sequences batch
/// together, one per sequence, oldest first) and the implicit state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SequenceBatchingView {
    /// `max_sequence_idle` in microseconds; 0: never (Triton reads 0 as its
    /// 1-second default; tickserve does not).
    pub max_sequence_idle_microseconds: u64,
    /// Inputs carrying control values: none (the server resets a sequence's
    /// state itself at its start).
    pub control_input: Vec<()>,
    /// The strategy.
    pub oldest: OldestView,
    /// The state pairs.
    pub state: Vec<StateView>,
}

/// Triton's `StrategyOldest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OldestView {
    /// `max_sequences`: the most sequences kept at once.
    pub max_candidate_sequences: usize,
    /// The buckets.
    pub preferred_batch_size: Vec<usize>,
    /// The configured `max_queue_delay`, in microseconds.
    pub max_queue_delay_microseconds: u64,
}

/// One state pair, as Triton's `sequence_batching.state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateView {
    /// The state input.
    pub input_name: String,
    /// The output that becomes its next value.
    pub output_name: String,
    /// Its datatype (`TYPE_FP32`).
    pub data_type: String,
    /// Its dimensions after the batch.
    pub dims: Vec<usize>,
    /// How it starts.
    pub initial_state: Vec<InitialStateView>,
    /// Its datatype.
    #[serde(skip)]
    pub datatype: DataType,
}

/// How a state starts, as Triton's `InitialState`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InitialStateView {
    /// The state's name.
    pub name: String,
    /// Its datatype.
    pub data_type: String,
    /// Its dimensions after the batch.
    pub dims: Vec<usize>,
    /// Zeros.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_data: Option<bool>,
    /// Or a file in the model's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_file: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A priority level's queue policy, as Triton's `ModelQueuePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueuePolicyView {
    /// `REJECT` or `DELAY`.
    pub timeout_action: &'static str,
    /// The level's timeout; 0 for none.
    pub default_timeout_microseconds: u64,
    /// Always true: tickserve honours a request's own timeout.
    pub allow_timeout_override: bool,
    /// The most requests of the level waiting; 0 for no bound of its own.
    pub max_queue_size: u64,
}

impl From<QueuePolicy> for QueuePolicyView {
    fn from(p: QueuePolicy) -> Self {
        QueuePolicyView {
            timeout_action: match p.timeout_action {
                TimeoutAction::Reject => "REJECT",
                TimeoutAction::Delay => "DELAY",
            },
            default_timeout_microseconds: p.timeout.map_or(0, tickserve_core::durations::micros),
            allow_timeout_override: true,
            max_queue_size: p.max_queue_size as u64,
        }
    }
}

/// A configuration parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParameterView {
    /// Its value.
    pub string_value: String,
}

impl ModelConfigView {
    /// The configuration of model `name`'s version `loaded`.
    pub fn of(name: &str, loaded: &Loaded) -> ModelConfigView {
        let first = loaded.placements.first();
        let instance_group = loaded
            .placements
            .iter()
            .enumerate()
            .map(|(index, replica)| InstanceGroupView {
                name: if index == 0 {
                    name.to_string()
                } else {
                    format!("{name}_{index}")
                },
                kind: match replica.device {
                    Device::Cpu => InstanceKind::Cpu,
                    Device::Gpu(_) => InstanceKind::Gpu,
                },
                count: loaded.settings.executors,
                gpus: match replica.device {
                    Device::Cpu => Vec::new(),
                    Device::Gpu(ordinal) => vec![ordinal],
                },
            })
            .collect();
        ModelConfigView {
            name: name.to_string(),
            platform: first.map_or("onnxruntime_onnx", |r| r.platform),
            backend: first.map_or("onnxruntime", |r| r.backend),
            max_batch_size: loaded.settings.limits.max_request_rows,
            input: tensors(&loaded.signature.inputs),
            output: tensors(&loaded.signature.outputs),
            instance_group,
            dynamic_batching: loaded
                .settings
                .sequence
                .is_none()
                .then(|| DynamicBatchingView {
                    preferred_batch_size: loaded.settings.buckets.sizes().to_vec(),
                    max_queue_delay_microseconds: tickserve_core::durations::micros(
                        loaded.settings.max_queue_delay,
                    ),
                    ..priority_view(&loaded.settings.priorities)
                }),
            sequence_batching: sequence_view(loaded),
            parameters: monte_carlo_parameters(loaded)
                .into_iter()
                .chain([("family", loaded.family_key.clone())])
                .chain(reserved_executors_parameter(&loaded.settings.priorities))
                .chain(window_parameters(loaded))
                .map(|(key, string_value)| (key, ParameterView { string_value }))
                .collect(),
        }
    }
}

/// `sequence_batching` for a stateful model.
fn sequence_view(loaded: &Loaded) -> Option<SequenceBatchingView> {
    let spec = loaded.settings.sequence.as_ref()?;
    let data_type = |t: &TensorSpec| format!("TYPE_{}", t.datatype.as_str());
    Some(SequenceBatchingView {
        max_sequence_idle_microseconds: spec.max_idle.map_or(0, tickserve_core::durations::micros),
        control_input: Vec::new(),
        oldest: OldestView {
            max_candidate_sequences: spec.max_sequences,
            preferred_batch_size: loaded.settings.buckets.sizes().to_vec(),
            max_queue_delay_microseconds: tickserve_core::durations::micros(
                loaded.settings.max_queue_delay,
            ),
        },
        state: spec
            .states
            .iter()
            .map(|s| StateView {
                input_name: s.input.name.clone(),
                output_name: s.output.clone(),
                data_type: data_type(&s.input),
                dims: s.input.dims.clone(),
                initial_state: vec![InitialStateView {
                    name: format!("{}_initial", s.input.name),
                    data_type: data_type(&s.input),
                    dims: s.input.dims.clone(),
                    zero_data: s.initial_file.is_none().then_some(true),
                    data_file: s.initial_file.clone(),
                }],
                datatype: s.input.datatype,
            })
            .collect(),
    })
}

/// The priority fields of `dynamic_batching`: empty for a model without levels.
fn priority_view(p: &Priorities) -> DynamicBatchingView {
    let mut view = DynamicBatchingView {
        preferred_batch_size: Vec::new(),
        max_queue_delay_microseconds: 0,
        priority_levels: 0,
        default_priority_level: 0,
        default_queue_policy: None,
        priority_queue_policy: BTreeMap::new(),
    };
    if p.configured {
        view.priority_levels = p.policies.len() as u64;
        view.default_priority_level = u64::from(p.default_level);
        view.default_queue_policy = Some(p.policy(p.default_level).into());
        view.priority_queue_policy = p
            .policies
            .iter()
            .enumerate()
            .map(|(i, policy)| (i as u64 + 1, (*policy).into()))
            .collect();
    }
    view
}

/// `priority_reserved_executors` (tickserve's own; Triton has no such field)
/// when some of the model's executors run level 1 only.
fn reserved_executors_parameter(p: &Priorities) -> Option<(&'static str, String)> {
    (p.reserved_executors > 0).then(|| {
        (
            "priority_reserved_executors",
            p.reserved_executors.to_string(),
        )
    })
}

/// What a Monte Carlo request to this model may ask and gets back, for the
/// model configuration (`parameters`): its sample limit, the inputs it
/// perturbs, and how answers are named.
/// A windowed sequence model's windows: `sequence_windows` lists each
/// window input with its length (`window:30`: clients send one tick under
/// `window`, the server keeps 30), `sequence_window_warmup` says what a tick
/// gets before the windows are full (`pad` or `wait`).
fn window_parameters(loaded: &Loaded) -> Vec<(&'static str, String)> {
    let Some(spec) = loaded.settings.sequence.as_ref() else {
        return Vec::new();
    };
    if spec.windows.is_empty() {
        return Vec::new();
    }
    let windows: Vec<String> = spec
        .windows
        .iter()
        .map(|w| format!("{}:{}", w.input.name, w.length))
        .collect();
    let warmup = match spec.warmup {
        Warmup::Pad => "pad",
        Warmup::Wait => "wait",
    };
    vec![
        ("sequence_windows", windows.join(",")),
        ("sequence_window_warmup", warmup.to_string()),
    ]
}

fn monte_carlo_parameters(loaded: &Loaded) -> Vec<(&'static str, String)> {
    let settings = &loaded.settings.monte_carlo;
    let perturbed: Vec<&str> = loaded
        .signature
        .inputs
        .iter()
        .zip(&settings.perturbed)
        .filter(|(_, p)| p.is_some())
        .map(|(t, _)| t.name.as_str())
        .collect();
    if !settings.enabled || perturbed.is_empty() {
        return Vec::new();
    }
    vec![
        ("monte_carlo_max_samples", settings.max_samples.to_string()),
        ("monte_carlo_inputs", perturbed.join(",")),
        (
            "monte_carlo_outputs",
            "OUTPUT_mean and OUTPUT_std (mc_output=moments, the default), OUTPUT_qP per quantile \
             P in percent (mc_output=quantiles), OUTPUT_samples [rows, samples, ...] \
             (mc_output=samples)"
                .to_string(),
        ),
    ]
}

fn tensors(specs: &[TensorSpec]) -> Vec<TensorView> {
    specs
        .iter()
        .map(|t| TensorView {
            name: t.name.clone(),
            data_type: format!("TYPE_{}", t.datatype.as_str()),
            dims: t.dims.clone(),
            datatype: t.datatype,
        })
        .collect()
}

/// A count and a total time, as Triton's statistics report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DurationView {
    /// How many.
    pub count: u64,
    /// Total nanoseconds.
    pub ns: u64,
}

impl From<Stat> for DurationView {
    fn from(stat: Stat) -> Self {
        DurationView {
            count: stat.count,
            ns: stat.ns,
        }
    }
}

/// Triton's statistics of one model version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatisticsView {
    /// The model's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Milliseconds since the epoch of the last answered request.
    pub last_inference: u64,
    /// Rows answered.
    pub inference_count: u64,
    /// Engine runs.
    pub execution_count: u64,
    /// Per request: outcome, queue and compute times.
    pub inference_stats: InferenceStatsView,
    /// Engine runs per bucket.
    pub batch_stats: Vec<BatchStatsView>,
}

/// Per-request durations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InferenceStatsView {
    /// Answered with a prediction.
    pub success: DurationView,
    /// Failed after admission.
    pub fail: DurationView,
    /// Waiting in the queue.
    pub queue: DurationView,
    /// Copying rows in.
    pub compute_input: DurationView,
    /// Engine time.
    pub compute_infer: DurationView,
    /// Copying rows out.
    pub compute_output: DurationView,
}

/// Engine runs of one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchStatsView {
    /// The bucket's size.
    pub batch_size: usize,
    /// Its runs and their engine time.
    pub compute_infer: DurationView,
}

impl StatisticsView {
    /// The statistics of `handle`'s version now.
    pub fn of(handle: &ModelHandle) -> StatisticsView {
        let s = handle.stats.snapshot();
        StatisticsView {
            name: handle.name.clone(),
            version: handle.version.clone(),
            last_inference: s.last_inference_ms,
            inference_count: s.inference_count,
            execution_count: s.execution_count,
            inference_stats: InferenceStatsView {
                success: s.success.into(),
                fail: s.fail.into(),
                queue: s.queue.into(),
                compute_input: s.compute_input.into(),
                compute_infer: s.compute_infer.into(),
                compute_output: s.compute_output.into(),
            },
            batch_stats: handle
                .settings
                .buckets
                .sizes()
                .iter()
                .zip(&s.batches)
                .map(|(&batch_size, &stat)| BatchStatsView {
                    batch_size,
                    compute_infer: stat.into(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use tickserve_core::config::NanPolicy;
    use tickserve_core::validate::Limits;
    use tickserve_core::{Buckets, Signature};
    use tickserve_runtime::ModelQueue;
    use tickserve_runtime::{ModelSettings, ModelStats, ReplicaInfo};

    use super::*;

    /// A version placed on `devices`, with its engines' names.
    fn loaded(placements: Vec<ReplicaInfo>) -> Loaded {
        Loaded {
            signature: Signature {
                inputs: vec![TensorSpec {
                    name: "x".into(),
                    datatype: DataType::Fp32,
                    dims: vec![8],
                }],
                outputs: vec![TensorSpec {
                    name: "y".into(),
                    datatype: DataType::Fp32,
                    dims: vec![1],
                }],
            },
            settings: ModelSettings {
                buckets: Buckets::new(&[1, 8, 32], None).unwrap(),
                limits: Limits {
                    max_request_rows: 96,
                    nan_policy: NanPolicy::Reject,
                },
                max_queue_rows: 1024,
                max_queue_bytes: 1 << 20,
                max_queue_delay: Duration::from_micros(40),
                keep_warm: None,
                executors: 3,
                default_timeout: None,
                mixed_rows: Default::default(),
                monte_carlo: tickserve_core::monte_carlo::MonteCarloSettings {
                    enabled: true,
                    max_samples: 1024,
                    perturbed: vec![Some(Vec::new())],
                },
                priorities: Default::default(),
                sequence: None,
                journal: true,
                guards: Default::default(),
                breaker: None,
                engine: None,
                gpu_mode: None,
                state_pairs: Vec::new(),
            },
            family_key: "f00d".into(),
            shares_graph: true,
            device: String::new(),
            placements,
            engine_note: None,
            gpu_note: None,
            load_time: Duration::ZERO,
            stats: Arc::new(ModelStats::new(3)),
            queue: Arc::new(ModelQueue::new("m", 1024, 1 << 20, &Default::default())),
            digest: String::new(),
        }
    }

    const CUDA: (&str, &str) = ("tickserve_cuda", "tickserve_cuda");

    #[test]
    fn a_gpu_replica_is_kind_gpu_with_its_gpu_on_its_engine() {
        let on = |device| ReplicaInfo {
            device,
            platform: CUDA.0,
            backend: CUDA.1,
        };
        let view = ModelConfigView::of("m", &loaded(vec![on(Device::Gpu(0)), on(Device::Gpu(1))]));
        assert_eq!((view.platform, view.backend), CUDA);
        assert_eq!(
            view.instance_group,
            vec![
                InstanceGroupView {
                    name: "m".into(),
                    kind: InstanceKind::Gpu,
                    count: 3,
                    gpus: vec![0],
                },
                InstanceGroupView {
                    name: "m_1".into(),
                    kind: InstanceKind::Gpu,
                    count: 3,
                    gpus: vec![1],
                },
            ]
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["instance_group"][1]["kind"], "KIND_GPU");
        assert_eq!(json["instance_group"][1]["gpus"], serde_json::json!([1]));
    }

    #[test]
    fn the_batcher_settings_are_the_configured_ones() {
        let cpu = ReplicaInfo {
            device: Device::Cpu,
            platform: "onnxruntime_onnx",
            backend: "onnxruntime",
        };
        let view = ModelConfigView::of("m", &loaded(vec![cpu]));
        assert_eq!(
            view.dynamic_batching,
            Some(DynamicBatchingView {
                preferred_batch_size: vec![1, 8, 32],
                max_queue_delay_microseconds: 40,
                priority_levels: 0,
                default_priority_level: 0,
                default_queue_policy: None,
                priority_queue_policy: BTreeMap::new(),
            })
        );
        assert_eq!(view.sequence_batching, None);
        assert_eq!(view.max_batch_size, 96);
        assert_eq!(view.instance_group[0].kind, InstanceKind::Cpu);
        assert!(view.instance_group[0].gpus.is_empty());
        let json = serde_json::to_value(&view).unwrap();
        assert!(json["instance_group"][0].get("gpus").is_none());
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
    }
}
