//! The engines, and the choice of one for each replica: the only code in the
//! runtime that names ONNX Runtime or CUDA.
//!
//! [`Engines::start`] loads ONNX Runtime (a missing library stops the start
//! with a message saying where it looked) and probes the GPUs once, with one
//! log line. [`Engines::replicas`] turns a model's placement (`auto`, `cpu`,
//! `gpu:N`) into one device per replica. [`Engines::choose`] picks the engine
//! for a replica: the CUDA engine on a GPU when it takes every op of the
//! graph; on the CPU, the compiled CPU engine where the model's preference
//! (`runtime.cpu_engine`, its `engine`) allows it, it imports the graph and
//! the graph answers on it as on ONNX Runtime ([`crate::engine_check`]),
//! otherwise ONNX Runtime; each with a log line naming what kept it off the
//! GPU or off the compiled engine. Everything above this module sees only
//! the core's [`Engine`] and [`CompiledModel`] traits.
//!
//! [`CompiledModel`]: tickserve_core::CompiledModel

use std::sync::Arc;

use tickserve_core::config::{CpuEngineChoice, GpuMode, Placement, ServerConfig};
use tickserve_core::sequence::StateConfig;
use tickserve_core::{Device, Engine, Weight};
use tickserve_engine_cpu::CpuEngine;
use tickserve_engine_cuda::{CudaEngine, CudaOptions, Gpus};
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_onnx::ModelGraph;

/// The CPU instruction-set extensions ONNX Runtime's kernels choose among:
/// a prediction computed with one set may differ in its last bits from one
/// computed with another.
const ISA_FLAGS: &[&str] = &[
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
];

/// An engine as the runtime holds it: compiles ONNX graphs.
pub type SharedEngine = Arc<dyn Engine<ModelGraph>>;

/// The engines this process runs models on, and the GPUs it found.
#[derive(Debug, Clone)]
pub struct Engines {
    cpu: SharedEngine,
    /// The compiled CPU engine, where this process may choose it.
    compiled: Option<SharedEngine>,
    /// Its kernels (`avx2+fma`, `portable`), for the machine description.
    compiled_isa: &'static str,
    gpu: SharedEngine,
    gpus: Arc<Gpus>,
    /// ONNX Runtime's build, where this process loaded it.
    onnxruntime: Option<String>,
}

/// One replica's place: its device, and whether `auto` chose it (a GPU that
/// `auto` chose gives way to the CPU when the model fails to compile there;
/// a GPU the configuration names does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The device.
    pub device: Device,
    /// Chosen by `auto`.
    pub auto: bool,
}

/// Where a replica compiles: its device and the engine for it.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The device it runs on (the CPU when its GPU's engine lacks an op).
    pub device: Device,
    /// The engine that compiles it.
    pub engine: SharedEngine,
    /// Why a CPU replica whose preference allowed the compiled engine runs
    /// on ONNX Runtime instead.
    pub note: Option<String>,
}

/// ONNX Runtime, loaded from `TICKSERVE_ONNXRUNTIME_LIBRARY`, else
/// `runtime.onnxruntime_library`.
pub(crate) fn onnxruntime(config: &ServerConfig) -> Result<OrtEngine, String> {
    let library = std::env::var_os("TICKSERVE_ONNXRUNTIME_LIBRARY")
        .map(Into::into)
        .unwrap_or_else(|| config.runtime.onnxruntime_library.clone());
    OrtEngine::new(
        &library,
        OrtOptions {
            intra_op_threads: config.runtime.intra_op_threads,
        },
    )
}

impl Engines {
    /// Loads ONNX Runtime (from `TICKSERVE_ONNXRUNTIME_LIBRARY`, else
    /// `runtime.onnxruntime_library`), probes the GPUs and logs what it found.
    pub fn start(config: &ServerConfig) -> Result<Engines, String> {
        let ort = onnxruntime(config)?;
        let gpus = Gpus::probe();
        tracing::info!("devices: {}", gpus.describe());
        let compiled = CpuEngine::new();
        Ok(Engines {
            onnxruntime: Some(ort.build_info()),
            cpu: Arc::new(ort),
            compiled: Some(Arc::new(compiled)),
            compiled_isa: compiled.isa().name(),
            gpu: Arc::new(CudaEngine::new(CudaOptions {
                tf32: config.runtime.cuda_tf32,
                eager: config.runtime.cuda_eager,
                resident_blocks: config.runtime.resident_blocks,
                resident_weights_on_chip: config.runtime.resident_weights_on_chip,
            })),
            gpus: Arc::new(gpus),
        })
    }

    /// Engines of the caller's choosing: `cpu` for CPU replicas (never the
    /// compiled engine), `gpu` for replicas on `gpus`.
    pub fn new(cpu: SharedEngine, gpu: SharedEngine, gpus: Gpus) -> Engines {
        Engines {
            cpu,
            compiled: None,
            compiled_isa: "none",
            gpu,
            gpus: Arc::new(gpus),
            onnxruntime: None,
        }
    }

    /// These engines with `compiled` as the compiled CPU engine (the choice
    /// [`Engines::cpu_choice`] makes for CPU replicas whose preference
    /// allows it; [`Engines::new`] has none).
    pub fn with_compiled(mut self, compiled: SharedEngine) -> Engines {
        self.compiled = Some(compiled);
        self
    }

    /// What predictions here are computed on, as `name → value`: the server's
    /// version, ONNX Runtime's build and its thread setting, the CPU and the
    /// instruction-set extensions it has that ONNX Runtime's kernels choose
    /// among, the GPUs, the OS kernel. The journal keeps it with every file,
    /// and `journal replay` compares it with the machine it runs on.
    pub fn machine(&self, intra_op_threads: usize) -> std::collections::BTreeMap<String, String> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let flags = field("flags");
        let present: Vec<&str> = ISA_FLAGS
            .iter()
            .copied()
            .filter(|f| flags.split_whitespace().any(|have| have == *f))
            .collect();
        let os = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        [
            ("server", env!("CARGO_PKG_VERSION").to_string()),
            (
                "onnxruntime",
                self.onnxruntime
                    .clone()
                    .unwrap_or_else(|| "not loaded".into()),
            ),
            ("onnxruntime_intra_op_threads", intra_op_threads.to_string()),
            ("compiled_cpu_kernels", self.compiled_isa.to_string()),
            ("arch", std::env::consts::ARCH.to_string()),
            ("cpu", field("model name")),
            ("cpu_isa", present.join(" ")),
            ("gpus", self.gpus.describe()),
            (
                "cuda_driver",
                Gpus::driver_version().unwrap_or_else(|| "none".into()),
            ),
            ("cuda_libraries", Gpus::library_versions()),
            ("os", format!("Linux {}", os.trim())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The devices of a model placed on `placements` (its `devices`, or the
    /// server's), one per replica; see [`replicas`].
    pub fn replicas(&self, placements: &[Placement]) -> Result<Vec<Placed>, String> {
        replicas(placements, &self.gpus)
    }

    /// The engine for a replica of `model` placed on `device`: the CUDA
    /// engine on a GPU when it can compile `graph`; otherwise the CPU, on the
    /// engine `preference` and the load-time check pick
    /// ([`Engines::cpu_choice`]). Logged where the choice was not the first.
    pub fn choose(
        &self,
        model: &str,
        device: Device,
        graph: &ModelGraph,
        weights: Option<&[Weight]>,
        preference: CpuEngineChoice,
    ) -> Result<Choice, String> {
        if device == Device::Cpu {
            return self.cpu_choice(model, graph, weights, preference);
        }
        match self.gpu.check(graph, weights) {
            Ok(()) => Ok(Choice {
                device,
                engine: Arc::clone(&self.gpu),
                note: None,
            }),
            Err(reason) => {
                tracing::warn!(
                    model,
                    %device,
                    "runs on the CPU instead: the CUDA engine lacks {reason}"
                );
                self.cpu_choice(model, graph, weights, preference)
            }
        }
    }

    /// What `tickserve check` says of a family whose `gpu_mode` is `mode`
    /// and whose replica runs on `device`: whether its ticks run (or, off
    /// a GPU, would run) on the CUDA engine's resident kernel, and if not
    /// why. `None` for `graphs`. Needs no GPU.
    pub fn resident_note(
        &self,
        mode: GpuMode,
        device: Device,
        graph: &ModelGraph,
        weights: Option<&[Weight]>,
        state: &[StateConfig],
    ) -> Option<String> {
        if mode == GpuMode::Graphs {
            return None;
        }
        let verdict = tickserve_engine_cuda::import(&graph.onnx, &graph.signature.inputs, weights)
            .map_err(|unsupported| format!("the CUDA engine lacks {unsupported}"))
            .and_then(|imported| CudaEngine::resident_layout(&imported, state));
        let required = mode == GpuMode::Resident;
        Some(match (device, verdict) {
            (Device::Gpu(n), Ok(layout)) => format!(
                "runs resident on gpu:{n} (a tick: {} floats through its mailbox, {} of state kept \
                 on the device)",
                layout.mailbox_floats, layout.state_floats
            ),
            (Device::Gpu(n), Err(reason)) => {
                format!("runs on CUDA graphs on gpu:{n}, not resident: {reason}")
            }
            (Device::Cpu, Ok(_)) => "on a GPU its ticks would run resident".to_string(),
            (Device::Cpu, Err(reason)) if required => format!(
                "on a GPU it would fail to load (gpu_mode = \"resident\"): the resident kernel \
                 cannot run it: {reason}"
            ),
            (Device::Cpu, Err(reason)) => {
                format!("on a GPU its ticks would run on CUDA graphs, not resident: {reason}")
            }
        })
    }

    /// ONNX Runtime on the CPU.
    pub fn onnxruntime_choice(&self) -> Choice {
        Choice {
            device: Device::Cpu,
            engine: Arc::clone(&self.cpu),
            note: None,
        }
    }

    /// The CPU engine for `model`: ONNX Runtime when `preference` says so;
    /// otherwise the compiled engine when it imports `graph` and answers as
    /// ONNX Runtime does on the load-time check. Where it does not, `auto`
    /// gives ONNX Runtime (logged, the reason kept in the choice) and
    /// `compiled` an error naming the reason.
    pub fn cpu_choice(
        &self,
        model: &str,
        graph: &ModelGraph,
        weights: Option<&[Weight]>,
        preference: CpuEngineChoice,
    ) -> Result<Choice, String> {
        let on = |engine: &SharedEngine, note| Choice {
            device: Device::Cpu,
            engine: Arc::clone(engine),
            note,
        };
        let compiled = match (&self.compiled, preference) {
            (_, CpuEngineChoice::Onnxruntime) | (None, _) => return Ok(on(&self.cpu, None)),
            (Some(compiled), _) => compiled,
        };
        let checked = compiled
            .check(graph, weights)
            .map_err(|e| format!("cannot import it: {e}"))
            .and_then(|()| {
                crate::engine_check::same_answers(
                    model,
                    compiled.as_ref(),
                    self.cpu.as_ref(),
                    graph,
                    weights,
                )
            });
        match checked {
            Ok(max_rel) => {
                tracing::debug!(model, max_rel, "runs on the compiled CPU engine");
                Ok(on(compiled, None))
            }
            Err(reason) if preference == CpuEngineChoice::Auto => {
                tracing::info!(
                    model,
                    "runs on ONNX Runtime: the compiled CPU engine {reason}"
                );
                Ok(on(&self.cpu, Some(reason)))
            }
            Err(reason) => Err(format!(
                "engine = \"compiled\", but the compiled CPU engine {reason}"
            )),
        }
    }
}

/// The replicas of a model placed on `placements` on a machine with `gpus`:
/// `auto` is a replica on every GPU, or the CPU where there is none; an entry
/// twice is two replicas; a GPU that is not there is an error saying why.
pub fn replicas(placements: &[Placement], gpus: &Gpus) -> Result<Vec<Placed>, String> {
    if placements.is_empty() {
        return Err("devices must name at least one device".to_string());
    }
    let named = |device| Placed {
        device,
        auto: false,
    };
    let mut devices = Vec::new();
    for placement in placements {
        match placement {
            Placement::Cpu => devices.push(named(Device::Cpu)),
            Placement::Auto if gpus.devices().is_empty() => devices.push(Placed {
                device: Device::Cpu,
                auto: true,
            }),
            Placement::Auto => devices.extend(gpus.devices().iter().map(|g| Placed {
                device: Device::Gpu(g.ordinal),
                auto: true,
            })),
            Placement::Gpu(n) => match gpus {
                Gpus::Present(found) if found.iter().any(|g| g.ordinal == *n) => {
                    devices.push(named(Device::Gpu(*n)));
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

/// Fuzzing's entry to the model reader and the CUDA importer
/// (`tickserve_server::fuzzing::model_file`): `bytes` read as a model file,
/// given its signature, and imported into a plan; a plan that imports holds
/// no more weight bytes than the file did. Must return, never panic. Not an
/// API.
#[doc(hidden)]
pub fn fuzz_import(bytes: &[u8]) {
    let Ok(model) = tickserve_onnx::OnnxModel::parse(bytes) else {
        return;
    };
    let Ok(signature) = model.signature(&tickserve_core::config::ModelConfig::default()) else {
        return;
    };
    if let Ok(imported) = tickserve_engine_cuda::import(&model, &signature.inputs, None) {
        let held = imported
            .plan
            .weights
            .iter()
            .map(|w| w.len.saturating_mul(4))
            .fold(0usize, usize::saturating_add);
        assert!(
            held <= bytes.len(),
            "a plan of {held} weight bytes from a file of {}",
            bytes.len()
        );
    }
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
                    capability: (9, 0),
                    multiprocessors: 132,
                })
                .collect(),
        )
    }

    fn devices(placements: &[Placement], gpus: &Gpus) -> Result<Vec<(Device, bool)>, String> {
        replicas(placements, gpus).map(|r| r.iter().map(|p| (p.device, p.auto)).collect())
    }

    #[test]
    fn auto_is_every_gpu_or_the_cpu() {
        let none = Gpus::Absent("no CUDA driver".into());
        assert_eq!(
            devices(&[Placement::Auto], &none),
            Ok(vec![(Device::Cpu, true)])
        );
        assert_eq!(
            devices(&[Placement::Auto], &two_gpus()),
            Ok(vec![(Device::Gpu(0), true), (Device::Gpu(1), true)])
        );
    }

    #[test]
    fn an_entry_twice_is_two_replicas_on_that_device() {
        let placements = [Placement::Gpu(1), Placement::Gpu(1), Placement::Cpu];
        assert_eq!(
            devices(&placements, &two_gpus()),
            Ok(vec![
                (Device::Gpu(1), false),
                (Device::Gpu(1), false),
                (Device::Cpu, false)
            ])
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
