//! Configuration files: the server's `tickserve.toml` and each model's
//! optional `model.toml` in the repository.
//!
//! Both are TOML read with `deny_unknown_fields`, so a misspelt key is a
//! startup error, not a silent default. Durations are written as people write
//! them (`"250us"`, `"2ms"`). [`ServerConfig::validate`] runs once at startup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::buckets::DEFAULT_BUCKETS;
pub use crate::validate::NanPolicy;

mod fleet;
mod journal;
mod security;
mod versions;

pub use fleet::FleetConfig;
pub use journal::{Fsync, JournalConfig, WhenFull};
pub use versions::{
    Labels, ShadowConfig, VersionPolicy, check_labels, check_shadows, check_split, load_labels,
};

pub use security::{
    EndpointGroup, FrontEnd, KeySource, ModelControlMode, Restriction, Secret, SecurityConfig,
    TlsConfig,
};

/// The whole server configuration (`config/tickserve.toml`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listening addresses and request limits.
    pub server: ListenConfig,
    /// Engine settings.
    pub runtime: RuntimeConfig,
    /// Where the models are.
    pub repository: RepositoryConfig,
    /// Settings every model gets unless its `model.toml` says otherwise.
    pub model_defaults: ModelDefaults,
    /// Model control, keys per endpoint group, TLS.
    pub security: SecurityConfig,
    /// The shared-memory front end for clients on the same host.
    pub shm: ShmConfig,
    /// The latency mode: hot threads polling on cores of their own (off
    /// unless `cores` names some).
    pub latency: crate::latency::LatencyConfig,
    /// The prediction journal (off unless enabled).
    pub journal: JournalConfig,
    /// Risk controls that outlive a model's load: where halts are kept.
    pub risk: RiskConfig,
    /// The fleet this replica belongs to (etcd); unset: it works alone.
    pub fleet: Option<FleetConfig>,
    /// Where the server reads the time for what ages (idle sequences, the
    /// journal's files): the machine's clock; never read from the file (a
    /// test sets a clock it moves by hand, `tickserve_core::clock`).
    #[serde(skip)]
    pub clock: crate::clock::Clock,
    /// The fleet this process joined (`[fleet]`: the server connects it
    /// before the models load); never read from the file.
    #[serde(skip)]
    pub joined: Option<std::sync::Arc<dyn crate::fleet::SequenceFleet>>,
}

/// `[risk]`: who may halt and resume, and where the kill switch keeps its
/// halts (docs/risk.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RiskConfig {
    /// The file halted versions are kept in (`state/halts.json`, relative
    /// to the working directory, by default), rewritten at every halt and
    /// resume (written beside it, synced, renamed over it, its folder
    /// synced) and read at start, so a halt outlives a restart. An empty
    /// path: halts last as long as the process (or, with `[fleet]`, as
    /// long as the fleet's store keeps them).
    #[serde(deserialize_with = "optional_path")]
    pub halts_file: Option<PathBuf>,
    /// Whether halt and resume answer without a key: `"closed"` (the
    /// default: they answer only where a `[[security.restricted]]` entry
    /// gives the `risk` group a key) or `"open"` (anyone who reaches the
    /// port; a breaker's halt is still lifted only with the key).
    pub control: RiskControl,
}

impl Default for RiskConfig {
    fn default() -> Self {
        RiskConfig {
            halts_file: Some(PathBuf::from(DEFAULT_HALTS_FILE)),
            control: RiskControl::default(),
        }
    }
}

/// Where halts are kept unless `risk.halts_file` says otherwise.
pub const DEFAULT_HALTS_FILE: &str = "state/halts.json";

/// A path setting where `""` means none.
fn optional_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let path = PathBuf::deserialize(d)?;
    Ok((!path.as_os_str().is_empty()).then_some(path))
}

/// `[risk] control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RiskControl {
    /// Halt and resume need the `risk` group's key.
    #[default]
    Closed,
    /// Halt and resume answer without a key.
    Open,
}

/// The shared-memory front end (`[shm]`): co-located clients send requests
/// through iceoryx2 shared memory instead of a socket (docs/shm.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShmConfig {
    /// Serve it (off by default).
    pub enabled: bool,
    /// The iceoryx2 service name clients connect to.
    pub service: String,
    /// Threads taking requests from shared memory.
    pub threads: usize,
    /// How long a front-end thread keeps polling for the next request after
    /// one (burning its core) before it sleeps until a client wakes it; 0:
    /// sleep at once.
    #[serde(deserialize_with = "duration")]
    pub spin: Duration,
    /// CPUs the front-end threads are pinned to, one per thread in turn;
    /// empty: wherever the OS schedules them.
    pub cpus: Vec<usize>,
    /// The largest answer sent over shared memory, in bytes; a larger one is
    /// refused (INVALID_ARGUMENT, naming the model and the limit). The server
    /// maps clients × requests in flight × this many bytes of shared memory
    /// for its answers, of which only the pages written are memory.
    pub max_answer_bytes: usize,
    /// A round of several requests runs their rows together: each request
    /// of a model that runs on a front-end thread waits for the round's other
    /// requests to be read, then the model's rows run in one bucket run (up
    /// to the rows a caller's thread may run at once), on this thread. Off:
    /// each request runs alone as it is read.
    pub gather: bool,
}

/// The bounds of `shm.max_answer_bytes`.
pub const SHM_ANSWER_BYTES: std::ops::RangeInclusive<usize> = 4096..=16 * 1024 * 1024;

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            enabled: false,
            service: "tickserve".to_string(),
            threads: 1,
            spin: Duration::from_micros(50),
            cpus: Vec::new(),
            max_answer_bytes: 64 * 1024,
            gather: true,
        }
    }
}

/// The longest `shm.spin` and `runtime.spin`.
pub const MAX_SPIN: Duration = Duration::from_secs(1);

/// The most shared-memory front-end threads.
pub const MAX_SHM_THREADS: usize = 64;

/// Listening addresses and request limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// Address both front ends bind.
    pub host: String,
    /// HTTP port (0 picks a free port).
    pub http_port: u16,
    /// gRPC port (0 picks a free port).
    pub grpc_port: u16,
    /// Largest request body (HTTP) or message (gRPC) accepted, in bytes.
    pub max_request_bytes: usize,
    /// Inference requests in flight across the server (both protocols) beyond
    /// which a new one is answered RESOURCE_EXHAUSTED / 429 at once; 0: no limit.
    pub max_inflight: usize,
    /// Server readiness (`/v2/health/ready`, gRPC ServerReady) only while
    /// every model of the repository serves (Triton's strict readiness): an
    /// orchestrator sends no traffic to a server whose models failed to load.
    /// `false`: ready once the server accepts requests.
    pub strict_readiness: bool,
    /// Bytes of inference requests (bodies, messages) held at once across the
    /// server; a request that would go over is answered 429 at once.
    pub max_inflight_bytes: usize,
    /// Open connections, both front ends together; one more is closed at once.
    pub max_connections: usize,
    /// Open connections from one source address, both front ends together
    /// (more than `max_connections` is `max_connections`); one more from that
    /// address is closed at once, so that one address never holds them all. Behind a proxy or
    /// load balancer, whose address every connection comes from, raise it.
    pub max_connections_per_peer: usize,
    /// The longest a client may take to send a request's headers (HTTP/1),
    /// including the wait for the next request on a kept-alive connection:
    /// slow and idle clients are closed after it.
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// The longest a request body may take to arrive, whole, from its
    /// headers on (both front ends; however it is split): a body trickled
    /// slower fails its request. `ModelStreamInfer` streams are exempt: a
    /// stream lives as long as its client (HTTP/2 keep-alive finds a client
    /// that is gone).
    #[serde(deserialize_with = "duration")]
    pub body_read_timeout: Duration,
    /// The longest a connection may leave an answer unsent because its peer
    /// does not read (a full socket, an HTTP/2 window kept shut): the
    /// connection is then closed, and counted.
    #[serde(deserialize_with = "duration")]
    pub send_timeout: Duration,
    /// Bytes of request bodies one connection may hold at once (all its
    /// HTTP/2 streams together); a body that would go over is refused 429 /
    /// RESOURCE_EXHAUSTED. At least `max_request_bytes`.
    pub max_connection_bytes: usize,
    /// `grpc.health.v1.Health/Watch` streams open at once, server-wide; one
    /// more is refused RESOURCE_EXHAUSTED.
    pub max_health_watches: usize,
    /// Concurrent streams (requests) per HTTP/2 connection (gRPC and h2c).
    pub max_concurrent_streams: u32,
    /// HTTP/2 keep-alive: a ping after this long without traffic; a peer
    /// that does not answer within as long again is closed.
    #[serde(deserialize_with = "duration")]
    pub http2_keep_alive: Duration,
    /// A connection with no request open for this long is closed (HTTP/2:
    /// GOAWAY, and its client reconnects on its next call). An HTTP/1
    /// connection waiting for its next request is closed sooner, at
    /// `header_read_timeout`.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// How long a stop (SIGTERM) may take: the queues empty, a scaled-out
    /// replica hands its sequences over, the front ends answer what they
    /// admitted and close; past it, the server stops regardless.
    #[serde(deserialize_with = "duration")]
    pub drain_timeout: Duration,
    /// Every v2 answer (HTTP and gRPC) carries its queue and compute times
    /// (`tickserve-queue-us`, `tickserve-compute-us`); `false`: none does,
    /// which spares each gRPC answer their header compression.
    pub timing_headers: bool,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            host: "127.0.0.1".to_string(),
            http_port: 8000,
            grpc_port: 8001,
            max_request_bytes: 16 * 1024 * 1024,
            max_inflight: 0,
            strict_readiness: true,
            max_inflight_bytes: 1024 * 1024 * 1024,
            max_connections: 4096,
            max_connections_per_peer: 1024,
            header_read_timeout: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(10),
            max_connection_bytes: 64 * 1024 * 1024,
            max_health_watches: 64,
            max_concurrent_streams: 256,
            http2_keep_alive: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            drain_timeout: Duration::from_secs(10),
            timing_headers: true,
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Path of the ONNX Runtime shared library (`libonnxruntime.so.1.31.1`).
    /// The environment variable `TICKSERVE_ONNXRUNTIME_LIBRARY` overrides it.
    pub onnxruntime_library: PathBuf,
    /// ONNX Runtime intra-op threads per session. 1 is fastest for the small
    /// models tickserve serves (see docs/performance.md, "Thread settings").
    pub intra_op_threads: usize,
    /// Let the CUDA engine's fp32 products use TF32 tensor cores (faster,
    /// about 1e-3 relative error). Off: results match the CPU within 1e-5.
    pub cuda_tf32: bool,
    /// Run the CUDA engine's buckets without CUDA graphs: the same recorded
    /// products, kernels and copies issued on the stream run by run (more
    /// launch overhead; for a driver where graph capture fails).
    pub cuda_eager: bool,
    /// How a GPU runs the ticks of a sequence model (one whose state is
    /// `[[sequence.state]]` pairs), where its `gpu_mode` does not say:
    /// `"graphs"` (the default), `"resident"` or `"auto"`.
    pub gpu_mode: GpuMode,
    /// Blocks each slot of a resident kernel runs on (a thread-block
    /// cluster, each block a share of every step; 1 to
    /// [`MAX_RESIDENT_BLOCKS`]). 1 by default.
    pub resident_blocks: usize,
    /// Whether each block of a resident kernel holds its share of the
    /// tick's member's weights in shared memory (as much as the device
    /// gives a block), rather than reading them through L2 every tick.
    pub resident_weights_on_chip: bool,
    /// The longest bucket run that a request may make on its caller's thread
    /// (an async worker, serving other connections meanwhile) when it finds
    /// an executor idle; requests whose bucket ran longer at load go to the
    /// executor's own thread. 0 sends every request there.
    #[serde(deserialize_with = "duration")]
    pub inline_budget: Duration,
    /// Where to keep stateful models' sequences across a restart: written
    /// at shutdown (after the drain), read back (and renamed `*.restored`)
    /// at the next start. Unset (the default): sequences end with the process.
    pub sequence_snapshot: Option<PathBuf>,
    /// No longer read: sequences move between replicas through `[fleet]`
    /// (etcd). A file that sets it fails to start, saying so.
    pub handoff_directory: Option<PathBuf>,
    /// No longer read: `fleet.handoff_wait` took its place. A file that
    /// sets it fails to start, saying so.
    #[serde(deserialize_with = "optional_duration")]
    pub handoff_wait: Option<Duration>,
    /// How long an executor with nothing to do keeps polling its queue
    /// before it parks (a request that comes meanwhile skips the thread
    /// wake-up, tens of microseconds); each polling executor burns its core.
    /// 0 (the default): park at once.
    #[serde(deserialize_with = "duration")]
    pub spin: Duration,
    /// CPUs the executor threads are pinned to, one per thread in turn
    /// (models' executors in load order); empty (the default): wherever the
    /// OS schedules them.
    pub executor_cpus: Vec<usize>,
    /// The CPU priority of model compilation (and the load-time checks that
    /// run the new graph): `"normal"` (the default), or `"idle"`: each CPU
    /// family compiles on a thread of Linux's `SCHED_IDLE` class, which runs
    /// only when no other thread wants the CPU, so a model loaded while
    /// serving (poll, the load API) takes longer to compile and takes no
    /// CPU from the requests (docs/lifecycle.md).
    pub compile_priority: CompilePriority,
    /// Lock the process's memory (`mlockall`): no page of the server is ever
    /// swapped out or faulted in on the request path. Needs the memory-lock
    /// limit (`ulimit -l`, `LimitMEMLOCK=`) or CAP_IPC_LOCK; the start fails,
    /// naming the limit, without them. Off by default.
    pub mlockall: bool,
    /// Which engine runs models on the CPU: `"auto"` (the default: the
    /// compiled CPU engine where it imports the model and the model, run on
    /// it and on ONNX Runtime at load, answers the same; ONNX Runtime
    /// otherwise), `"onnxruntime"` or `"compiled"`. A model's `engine`
    /// overrides it.
    pub cpu_engine: CpuEngineChoice,
}

/// The most blocks a resident kernel's slot runs on (a portable
/// thread-block cluster).
pub const MAX_RESIDENT_BLOCKS: usize = 8;

/// How a GPU runs a sequence model's ticks (`runtime.gpu_mode`, a model's
/// `gpu_mode`; docs/cuda.md, "Resident mode").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMode {
    /// One CUDA graph launch per bucket run.
    #[default]
    Graphs,
    /// The family's resident kernel: launched once at load, each tick
    /// written to its mailbox. A family it cannot run fails to load, saying
    /// why.
    Resident,
    /// The resident kernel where it runs the family; the graphs otherwise
    /// (logged, with the reason, and shown by `tickserve check`).
    Auto,
}

/// Which engine runs a model on the CPU (`runtime.cpu_engine`, a model's
/// `engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuEngineChoice {
    /// The compiled engine where it imports the model and answers as ONNX
    /// Runtime does on the load-time check; ONNX Runtime otherwise (logged,
    /// with the reason, and shown by `tickserve check`).
    #[default]
    Auto,
    /// ONNX Runtime.
    Onnxruntime,
    /// The compiled engine: a model it cannot import, or that answers
    /// differently from ONNX Runtime at load, fails to load.
    Compiled,
}

impl CpuEngineChoice {
    /// Its name in the configuration (`auto`).
    pub fn name(self) -> &'static str {
        match self {
            CpuEngineChoice::Auto => "auto",
            CpuEngineChoice::Onnxruntime => "onnxruntime",
            CpuEngineChoice::Compiled => "compiled",
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            onnxruntime_library: PathBuf::from(".local/lib/libonnxruntime.so.1.31.1"),
            intra_op_threads: 1,
            cuda_tf32: false,
            cuda_eager: false,
            resident_blocks: 1,
            resident_weights_on_chip: false,
            gpu_mode: GpuMode::Graphs,
            inline_budget: Duration::from_micros(100),
            sequence_snapshot: None,
            handoff_directory: None,
            handoff_wait: None,
            spin: Duration::ZERO,
            executor_cpus: Vec::new(),
            compile_priority: CompilePriority::Normal,
            mlockall: false,
            cpu_engine: CpuEngineChoice::Auto,
        }
    }
}

/// The CPU priority of model compilation (`runtime.compile_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompilePriority {
    /// The threads' own priority.
    #[default]
    Normal,
    /// Linux's `SCHED_IDLE`: only CPU nothing else wants.
    Idle,
}

/// The largest `server.max_connections` (far above any file-descriptor limit).
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// What tickserve does with a model whose rows depend on each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixedRows {
    /// Serve it, one request per run (a client's rows never meet another's).
    #[default]
    Unbatched,
    /// Fail its load.
    Refuse,
}

/// Where the models are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepositoryConfig {
    /// The model repository: `PATH/NAME/VERSION/model.onnx` (Triton's
    /// layout), or one model as KServe hands it over: `PATH/model.onnx` or
    /// `PATH/VERSION/model.onnx`.
    pub path: PathBuf,
    /// The name the single model of a single-model repository is served under
    /// (KServe: the InferenceService's name, `--model-name {{.Name}}`).
    pub model_name: String,
    /// How often the repository is read for changes when
    /// `security.model_control_mode = "poll"` (Triton's
    /// `--repository-poll-secs`); a change applies once two reads in a row
    /// see it the same (docs/lifecycle.md).
    #[serde(deserialize_with = "duration")]
    pub poll_interval: Duration,
}

impl Default for RepositoryConfig {
    fn default() -> Self {
        RepositoryConfig {
            path: PathBuf::from("config/models"),
            model_name: "model".to_string(),
            poll_interval: Duration::from_secs(5),
        }
    }
}

/// Settings every model gets unless its `model.toml` overrides them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelDefaults {
    /// Batch sizes compiled for each model.
    pub buckets: Vec<usize>,
    /// The most rows one request may carry.
    pub max_request_rows: usize,
    /// The most rows waiting for one model's executor; a request that would
    /// go over is answered RESOURCE_EXHAUSTED / 429 at once.
    pub max_queue_rows: usize,
    /// The most bytes of input waiting for one model's executors (a queued
    /// request keeps its whole input alive); beyond it, 429 at once.
    pub max_queue_bytes: usize,
    /// How long a queued request may wait for others to join its batch
    /// (`"0us"`: not at all; an idle executor never waits).
    #[serde(deserialize_with = "duration")]
    pub max_queue_delay: Duration,
    /// While a model's executor is idle, it runs the model's smallest bucket
    /// this often, so that the engine and the thread stay warm for a sparse
    /// request (`"0s"`, the default: never; docs/performance.md).
    #[serde(deserialize_with = "duration")]
    pub keep_warm: Duration,
    /// Executors (threads, each with its own compiled sessions) per model.
    pub executors: usize,
    /// Models of one family (same graph, different weights) share one compiled
    /// graph per bucket, each run binding its model's weights (docs/families.md).
    /// `false` compiles every model on its own, weights as constants.
    pub share_weights: bool,
    /// Where models run, one replica per entry (see [`ModelConfig::devices`]).
    pub devices: Vec<Placement>,
    /// Whether a model's predictions are journaled when `[journal]` is on
    /// (a model's `journal` key says otherwise for it).
    pub journal: bool,
}

impl Default for ModelDefaults {
    fn default() -> Self {
        ModelDefaults {
            buckets: DEFAULT_BUCKETS.to_vec(),
            max_request_rows: 1024,
            max_queue_rows: 4096,
            max_queue_bytes: 64 * 1024 * 1024,
            max_queue_delay: Duration::ZERO,
            keep_warm: Duration::ZERO,
            executors: 1,
            share_weights: true,
            devices: vec![Placement::Auto],
            journal: true,
        }
    }
}

/// Where a model runs: one entry of a `devices` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The CPU, through ONNX Runtime.
    Cpu,
    /// A replica on every GPU, or the CPU where there is none.
    Auto,
    /// GPU `N` (`gpu:N`), through the CUDA engine; a startup error where
    /// there is no such GPU.
    Gpu(usize),
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Cpu => f.write_str("cpu"),
            Placement::Auto => f.write_str("auto"),
            Placement::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Placement::Cpu),
            "auto" => Ok(Placement::Auto),
            _ => s
                .strip_prefix("gpu:")
                .and_then(|n| n.parse().ok())
                .map(Placement::Gpu)
                .ok_or_else(|| {
                    format!("unknown device '{s}': expected \"cpu\", \"auto\" or \"gpu:N\"")
                }),
        }
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Fixed dimensions for one tensor, overriding what the ONNX file says.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorOverride {
    /// The dimensions after the batch dimension.
    pub dims: Vec<usize>,
}

/// A model's `model.toml`: every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Batch sizes to compile (default: the server's `model_defaults.buckets`).
    pub buckets: Option<Vec<usize>>,
    /// Cap on the bucket sizes.
    pub max_batch_size: Option<usize>,
    /// The most rows one request may carry; larger requests run as several
    /// bucket runs up to this limit.
    pub max_request_rows: Option<usize>,
    /// The most rows waiting for this model's executor.
    pub max_queue_rows: Option<usize>,
    /// The most bytes of input waiting (default: `model_defaults.max_queue_bytes`).
    pub max_queue_bytes: Option<usize>,
    /// How long a queued request may wait for others to join its batch.
    #[serde(default, deserialize_with = "optional_duration")]
    pub max_queue_delay: Option<Duration>,
    /// How often an idle executor runs the smallest bucket to stay warm
    /// (default: `model_defaults.keep_warm`; `"0s"`: never). Models of one
    /// family share executors: the family keeps its founding model's.
    #[serde(default, deserialize_with = "optional_duration")]
    pub keep_warm: Option<Duration>,
    /// Executors for this model.
    pub executors: Option<usize>,
    /// Whether this model shares its family's compiled graph (default: the
    /// server's `model_defaults.share_weights`).
    pub share_weights: Option<bool>,
    /// Which engine runs the model on the CPU (default: the server's
    /// `runtime.cpu_engine`): `"auto"`, `"onnxruntime"` or `"compiled"`.
    pub engine: Option<CpuEngineChoice>,
    /// How a GPU runs its ticks, for a sequence model (default: the
    /// server's `runtime.gpu_mode`): `"graphs"`, `"resident"` or `"auto"`.
    pub gpu_mode: Option<GpuMode>,
    /// What to do when the model's rows depend on each other (checked at
    /// load: a few random rows run alone and inside a full bucket of others
    /// must agree): `"unbatched"` (the default) serves it without ever
    /// running two requests together, `"refuse"` fails its load.
    pub mixed_rows: Option<MixedRows>,
    /// Where the model runs, one replica per entry: `["gpu:0", "gpu:1"]`,
    /// `["auto"]`, `["cpu"]`; an entry twice is two replicas on that device.
    /// Default: the server's `model_defaults.devices`.
    pub devices: Option<Vec<Placement>>,
    /// NaN/infinity policy (default: `reject`, `allow` for tree ensembles).
    pub nan_policy: Option<NanPolicy>,
    /// Deadline for requests that bring none.
    #[serde(default, deserialize_with = "optional_duration")]
    pub timeout: Option<Duration>,
    /// Values for the ONNX file's named dynamic dimensions (`seq = 30`).
    pub dimensions: BTreeMap<String, usize>,
    /// Per-input dimension overrides.
    pub inputs: BTreeMap<String, TensorOverride>,
    /// Per-output dimension overrides.
    pub outputs: BTreeMap<String, TensorOverride>,
    /// Monte Carlo input noise: the most samples, per-feature sigmas, inputs
    /// never perturbed.
    pub monte_carlo: crate::monte_carlo::MonteCarloConfig,
    /// Priority levels and their queue policies (Triton's names).
    pub priority: crate::priority::PriorityConfig,
    /// Stateful sequences: state pairs, idle policy, table bound.
    pub sequence: crate::sequence::SequenceConfig,
    /// Whether its predictions are journaled when the server's `[journal]`
    /// is on (default: `model_defaults.journal`).
    pub journal: Option<bool>,
    /// Which version directories serve (default: the highest one).
    pub version_policy: VersionPolicy,
    /// Names for versions (`stable = 3`), reachable wherever a version is;
    /// a `labels.toml` beside `model.toml` adds to and overrides them.
    pub labels: Labels,
    /// How requests that name no version are shared among versions: a
    /// label or a version number, and its weight (`stable = 95`,
    /// `canary = 5`). A request of a sequence goes where its sequence is.
    /// Empty (the default): the highest ready version answers them all.
    pub split: BTreeMap<String, u32>,
    /// Shadow versions: each gets a copy of (a fraction of) another's
    /// requests, and its answers are compared with the primary's.
    pub shadow: Vec<ShadowConfig>,
    /// Output guards (`[[guard]]`): bounds every answer's output must keep,
    /// else the answer is withheld ([`crate::guard`]).
    pub guard: Vec<crate::guard::GuardConfig>,
    /// The circuit breaker: guard trips that halt the version, and who
    /// answers then ([`crate::breaker`]).
    pub breaker: Option<crate::breaker::BreakerConfig>,
}

impl ModelConfig {
    /// Reads `model.toml` of the model directory `dir` (through
    /// [`crate::files::read`]: a regular file inside it, at most
    /// [`crate::files::MAX_CONFIG_BYTES`]), or the defaults when there is
    /// none. Errors name the file as `shown` (`alpha/model.toml`), with the
    /// line and column, never the file's lines.
    pub fn load(dir: &Path, shown: &str) -> Result<ModelConfig, String> {
        let Some(text) =
            crate::files::read_text(dir, "model.toml", shown, crate::files::MAX_CONFIG_BYTES)?
        else {
            return Ok(ModelConfig::default());
        };
        let config = toml::from_str::<ModelConfig>(&text)
            .map_err(|e| crate::files::toml_error(shown, &text, &e))?;
        check_labels(&config.labels)
            .and_then(|()| check_split(&config.split))
            .and_then(|()| check_shadows(&config.shadow))
            .and_then(|()| config.breaker.as_ref().map_or(Ok(()), |b| b.check()))
            .map_err(|e| format!("{shown}: {e}"))?;
        Ok(config)
    }
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    crate::durations::deserialize(d)
}

impl ServerConfig {
    /// Reads a server configuration file.
    pub fn load(path: &Path) -> Result<ServerConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// This configuration with the latency mode's placement applied: the
    /// shared-memory front-end threads and the executors pinned to
    /// `latency.cores`, each polling for ever ([`crate::latency::FOREVER`])
    /// instead of sleeping; as it is when the mode is off. Call after
    /// [`ServerConfig::validate`].
    pub fn with_latency_placement(&self) -> ServerConfig {
        let mut placed = self.clone();
        if !self.latency.enabled() {
            return placed;
        }
        let threads = if self.shm.enabled {
            self.shm.threads
        } else {
            0
        };
        let placement = self.latency.place(threads);
        if !placement.shm.is_empty() {
            placed.shm.cpus = placement.shm;
            placed.shm.spin = crate::latency::FOREVER;
        }
        if !placement.executors.is_empty() {
            placed.runtime.executor_cpus = placement.executors;
            placed.runtime.spin = crate::latency::FOREVER;
        }
        placed
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), String> {
        self.security.validate()?;
        self.journal.validate()?;
        let shm = &self.shm;
        if !(1..=MAX_SHM_THREADS).contains(&shm.threads) {
            return Err(format!(
                "shm.threads is {}; it must be 1 to {MAX_SHM_THREADS}",
                shm.threads
            ));
        }
        if shm.service.is_empty() || shm.service.len() > 200 {
            return Err("shm.service must be a name of 1 to 200 bytes".to_string());
        }
        if !SHM_ANSWER_BYTES.contains(&shm.max_answer_bytes) {
            return Err(format!(
                "shm.max_answer_bytes is {}; it must be {} to {}",
                shm.max_answer_bytes,
                SHM_ANSWER_BYTES.start(),
                SHM_ANSWER_BYTES.end()
            ));
        }
        crate::durations::check("shm.spin", shm.spin, MAX_SPIN)?;
        crate::durations::check("runtime.spin", self.runtime.spin, MAX_SPIN)?;
        self.latency.validate(crate::latency::Threads {
            shm: if shm.enabled { shm.threads } else { 0 },
            shm_cpus: &shm.cpus,
            executor_cpus: &self.runtime.executor_cpus,
        })?;
        if self.runtime.handoff_directory.is_some() || self.runtime.handoff_wait.is_some() {
            return Err(
                "runtime.handoff_directory and runtime.handoff_wait are gone: replicas \
                 hand sequences over through the fleet's etcd, set in [fleet] (endpoints, \
                 prefix, lease, handoff_wait; docs/deploy.md, \"Scaling out\")"
                    .to_string(),
            );
        }
        if let Some(fleet) = &self.fleet {
            fleet.validate()?;
            if self.runtime.sequence_snapshot.is_some() {
                return Err(
                    "runtime.sequence_snapshot does not go with [fleet]: a replica's \
                     sequences are handed over through the fleet's store at a drain"
                        .to_string(),
                );
            }
        }
        let poll = self.repository.poll_interval;
        if poll < Duration::from_millis(10) || poll > Duration::from_secs(3600) {
            return Err(format!(
                "repository.poll_interval is {poll:?}; it must be 10ms to 1h"
            ));
        }
        let d = &self.model_defaults;
        crate::Buckets::new(&d.buckets, None)
            .map_err(|e| format!("model_defaults.buckets: {e}"))?;
        if d.max_request_rows == 0 {
            return Err("model_defaults.max_request_rows must be positive".into());
        }
        if d.executors == 0 {
            return Err("model_defaults.executors must be positive".into());
        }
        if d.devices.is_empty() {
            return Err("model_defaults.devices must name at least one device".into());
        }
        if d.max_queue_rows < d.max_request_rows {
            return Err("model_defaults.max_queue_rows must be at least max_request_rows".into());
        }
        if !(1..=MAX_RESIDENT_BLOCKS).contains(&self.runtime.resident_blocks) {
            return Err(format!(
                "runtime.resident_blocks is {}; it must be 1 to {MAX_RESIDENT_BLOCKS}",
                self.runtime.resident_blocks
            ));
        }
        if self.runtime.intra_op_threads == 0 {
            return Err("runtime.intra_op_threads must be positive".into());
        }
        if self.server.max_request_bytes < 1024 {
            return Err("server.max_request_bytes must be at least 1024".into());
        }
        use crate::durations::{MAX_INLINE_BUDGET, MAX_QUEUE_DELAY, MAX_TIMEOUT, check};
        let listen = &self.server;
        if d.max_queue_bytes == 0 || listen.max_inflight_bytes < listen.max_request_bytes {
            return Err(
                "model_defaults.max_queue_bytes must be positive, and server.max_inflight_bytes \
                 at least server.max_request_bytes"
                    .into(),
            );
        }
        if listen.max_connections > MAX_CONNECTIONS {
            return Err(format!(
                "server.max_connections is {}; the most it may be is {MAX_CONNECTIONS}",
                listen.max_connections
            ));
        }
        if listen.max_connection_bytes < listen.max_request_bytes {
            return Err(format!(
                "server.max_connection_bytes ({}) must be at least server.max_request_bytes ({})",
                listen.max_connection_bytes, listen.max_request_bytes
            ));
        }
        if listen.max_connections_per_peer == 0 {
            return Err("server.max_connections_per_peer must be positive".into());
        }
        if listen.max_connections == 0 || listen.max_concurrent_streams == 0 {
            return Err(
                "server.max_connections and server.max_concurrent_streams must be positive".into(),
            );
        }
        for (key, value) in [
            ("server.header_read_timeout", listen.header_read_timeout),
            ("server.body_read_timeout", listen.body_read_timeout),
            ("server.send_timeout", listen.send_timeout),
            ("server.http2_keep_alive", listen.http2_keep_alive),
            ("server.idle_timeout", listen.idle_timeout),
            ("server.drain_timeout", listen.drain_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("{key} must be positive"));
            }
            check(key, value, MAX_TIMEOUT)?;
        }
        check(
            "model_defaults.max_queue_delay",
            d.max_queue_delay,
            MAX_QUEUE_DELAY,
        )?;
        crate::durations::check_keep_warm("model_defaults.keep_warm", d.keep_warm)?;
        check(
            "runtime.inline_budget",
            self.runtime.inline_budget,
            MAX_INLINE_BUDGET,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A duration in a model's `[sequence]` and in the server's `[journal]`
    /// is refused alike, with one message: one reader.
    #[test]
    fn every_duration_key_refuses_alike() {
        let refused = crate::durations::parse("ten seconds").unwrap_err();
        let sequence =
            toml::from_str::<ModelConfig>("[sequence]\nmax_sequence_idle = \"ten seconds\"");
        let journal =
            toml::from_str::<ServerConfig>("[journal]\nrotate_interval = \"ten seconds\"");
        for error in [
            sequence.map(|_| ()).unwrap_err().to_string(),
            journal.map(|_| ()).unwrap_err().to_string(),
        ] {
            assert!(error.contains(&refused), "{error}");
        }
    }

    #[test]
    fn model_toml_parses_every_key() {
        let c: ModelConfig = toml::from_str(
            r#"
            buckets = [1, 2, 4]
            max_batch_size = 4
            max_request_rows = 8
            max_queue_rows = 16
            max_queue_delay = "100us"
            mixed_rows = "refuse"
            executors = 2
            devices = ["gpu:1", "gpu:1", "cpu"]
            nan_policy = "allow"
            timeout = "250us"
            [dimensions]
            seq = 30
            [inputs.window]
            dims = [30, 8]
            "#,
        )
        .unwrap();
        assert_eq!(c.timeout, Some(Duration::from_micros(250)));
        assert_eq!(c.max_queue_delay, Some(Duration::from_micros(100)));
        assert_eq!(c.mixed_rows, Some(MixedRows::Refuse));
        assert_eq!(c.executors, Some(2));
        assert_eq!(c.dimensions["seq"], 30);
        assert_eq!(c.inputs["window"].dims, vec![30, 8]);
        assert_eq!(c.nan_policy, Some(NanPolicy::Allow));
        assert_eq!(
            c.devices,
            Some(vec![Placement::Gpu(1), Placement::Gpu(1), Placement::Cpu])
        );
    }

    #[test]
    fn the_drain_and_the_hand_over_are_bounded() {
        let read = |text: &str| {
            let config: ServerConfig = toml::from_str(text).unwrap();
            config.validate()
        };
        let config: ServerConfig = toml::from_str("[server]\ndrain_timeout = \"3s\"\n").unwrap();
        assert_eq!(config.server.drain_timeout, Duration::from_secs(3));
        // The shared hand-over directory is gone: a file that still sets it
        // is refused, naming what replaced it.
        for old in [
            "[runtime]\nhandoff_directory = \"/shared/handoff\"\n",
            "[runtime]\nhandoff_wait = \"250ms\"\n",
        ] {
            let error = read(old).unwrap_err();
            assert!(error.contains("[fleet]"), "{error}");
        }
        let fleet = "[fleet]\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"desk-a\"\nlease = \"3s\"\n";
        read(fleet).unwrap();
        let config: ServerConfig = toml::from_str(fleet).unwrap();
        let parsed = config.fleet.unwrap();
        assert_eq!(parsed.lease, Duration::from_secs(3));
        assert_eq!(parsed.handoff_wait, Duration::from_secs(5));
        for (bad, named) in [
            ("[fleet]\n", "fleet.endpoints"),
            (
                "[fleet]\nendpoints = [\"127.0.0.1:2379\"]\n",
                "fleet.endpoints",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\nlease = \"100ms\"\n",
                "fleet.lease",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\nprefix = \"a b\"\n",
                "fleet.prefix",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\nhandoff_wait = \"2m\"\n",
                "fleet.handoff_wait",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\nuser = \"u\"\n",
                "fleet.password_file",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\n[runtime]\nsequence_snapshot = \"s\"\n",
                "sequence_snapshot",
            ),
        ] {
            let error = read(bad).unwrap_err();
            assert!(error.contains(named), "{bad}: {error}");
        }
        let error = read("[server]\ndrain_timeout = \"0s\"\n").unwrap_err();
        assert!(error.contains("server.drain_timeout"), "{error}");
        assert_eq!(
            ServerConfig::default().server.drain_timeout,
            Duration::from_secs(10)
        );
    }

    #[test]
    fn a_device_that_is_not_cpu_auto_or_gpu_n_is_refused_naming_it() {
        let error = toml::from_str::<ModelConfig>("devices = [\"tpu:0\"]").unwrap_err();
        assert!(error.to_string().contains("tpu:0"), "{error}");
        assert!(toml::from_str::<ModelConfig>("devices = [\"gpu:x\"]").is_err());
        assert_eq!("gpu:3".parse::<Placement>(), Ok(Placement::Gpu(3)));
        assert_eq!(Placement::Gpu(3).to_string(), "gpu:3");
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(toml::from_str::<ModelConfig>("bucket = [1]").is_err());
        assert!(toml::from_str::<ServerConfig>("[server]\nport = 1").is_err());
    }

    #[test]
    fn absurd_durations_in_the_server_config_are_refused_naming_key_and_limit() {
        let config: ServerConfig =
            toml::from_str("[model_defaults]\nmax_queue_delay = \"100000000000s\"").unwrap();
        let error = config.validate().unwrap_err();
        assert!(
            error.starts_with("model_defaults.max_queue_delay is") && error.ends_with("1s"),
            "{error}"
        );
        let config: ServerConfig = toml::from_str("[runtime]\ninline_budget = \"2s\"").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.starts_with("runtime.inline_budget is 2s"), "{error}");
        let config: ServerConfig =
            toml::from_str("[server]\nmax_connections = 18446744073709551615").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.contains("server.max_connections"), "{error}");
        for (text, key) in [
            ("[runtime]\nspin = \"5s\"", "runtime.spin is 5s"),
            ("[shm]\nspin = \"2s\"", "shm.spin is 2s"),
            ("[shm]\nthreads = 0", "shm.threads is 0"),
            (
                "[runtime]\nresident_blocks = 9",
                "runtime.resident_blocks is 9; it must be 1 to 8",
            ),
            (
                "[runtime]\nresident_blocks = 0",
                "runtime.resident_blocks is 0",
            ),
            ("[shm]\nservice = \"\"", "shm.service"),
            (
                "[shm]\nmax_answer_bytes = 4095",
                "shm.max_answer_bytes is 4095",
            ),
            (
                "[shm]\nmax_answer_bytes = 16777217",
                "shm.max_answer_bytes is 16777217",
            ),
        ] {
            let config: ServerConfig = toml::from_str(text).unwrap();
            let error = config.validate().unwrap_err();
            assert!(error.starts_with(key), "{text}: {error}");
        }
    }

    /// `[latency] cores` pins the front end and the executors and makes
    /// them poll for ever; off, nothing moves; a placement of its own beside
    /// it is refused by name.
    #[test]
    fn the_latency_mode_places_and_spins_the_hot_threads() {
        let text =
            "[shm]\nenabled = true\nthreads = 2\n[latency]\ncores = [3, 4, 5]\nwarm = \"1ms\"";
        let config: ServerConfig = toml::from_str(text).unwrap();
        config.validate().unwrap();
        let placed = config.with_latency_placement();
        assert_eq!(placed.shm.cpus, [3, 4]);
        assert_eq!(placed.runtime.executor_cpus, [5]);
        assert_eq!(placed.shm.spin, crate::latency::FOREVER);
        assert_eq!(placed.runtime.spin, crate::latency::FOREVER);
        // Without [shm], every core goes to the executors.
        let config: ServerConfig = toml::from_str("[latency]\ncores = [3]").unwrap();
        let placed = config.with_latency_placement();
        assert!(placed.shm.cpus.is_empty());
        assert_eq!(placed.shm.spin, ShmConfig::default().spin);
        assert_eq!(placed.runtime.executor_cpus, [3]);
        // Off: the configuration as it was.
        let config: ServerConfig = toml::from_str("[shm]\nenabled = true").unwrap();
        let placed = config.with_latency_placement();
        assert_eq!(placed.shm.spin, config.shm.spin);
        assert_eq!(placed.runtime.spin, Duration::ZERO);
        assert!(placed.runtime.executor_cpus.is_empty());
        let config: ServerConfig =
            toml::from_str("[shm]\ncpus = [1]\n[latency]\ncores = [3]").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.contains("remove shm.cpus"), "{error}");
        assert!(toml::from_str::<ServerConfig>("[latency]\ncore = [3]").is_err());
    }

    /// Halts are kept by default, durably, in `state/halts.json`; `""` keeps
    /// them in memory only.
    #[test]
    fn halts_are_kept_in_a_file_by_default() {
        let default = ServerConfig::default();
        assert_eq!(
            default.risk.halts_file.as_deref(),
            Some(Path::new(DEFAULT_HALTS_FILE))
        );
        let parsed: ServerConfig = toml::from_str("[risk]\ncontrol = \"open\"\n").unwrap();
        assert_eq!(parsed.risk.halts_file, default.risk.halts_file);
        let none: ServerConfig = toml::from_str("[risk]\nhalts_file = \"\"\n").unwrap();
        assert_eq!(none.risk.halts_file, None);
        let shipped = ServerConfig::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/tickserve.toml"),
        )
        .unwrap();
        assert_eq!(shipped.risk.halts_file, default.risk.halts_file);
    }

    /// Every configuration file shipped in the repository parses and validates.
    #[test]
    fn shipped_configs_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        let server = ServerConfig::load(&root.join("tickserve.toml")).unwrap();
        server.validate().unwrap();
        let deploy = root.join("../deploy/kubernetes");
        for pod in ["base", "overlays/scaleout"] {
            let file = deploy.join(pod).join("tickserve.toml");
            let config = ServerConfig::load(&file).unwrap();
            config
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
        for entry in std::fs::read_dir(root.join("models")).unwrap() {
            ModelConfig::load(&entry.unwrap().path(), "model.toml").unwrap();
        }
    }
}
