//! The interface between the runtime and engines, both sides of it.
//!
//! An [`Engine`] compiles a graph once per signature bucket when a model loads
//! ([`Engine::compile`]) and hands the result to the executor thread that owns
//! it as a [`CompiledModel`]. Engines answer with an [`EngineError`] the
//! runtime can act on (an op the engine lacks sends a replica to another
//! engine; a lost device is not the client's fault), never a bare string. The
//! graph type is the engines' choice (`G`: tickserve's engines compile ONNX),
//! so this crate knows no graph format and no engine library. Each bucket
//! has preallocated input and output buffers. A run is: the executor writes
//! rows into a bucket's input buffers and zero-pads the rest, calls
//! [`CompiledModel::run`] naming the member whose weights to use, and reads rows
//! out of the bucket's output buffers. Nothing is allocated or compiled per run.
//!
//! A compiled model serves one or more **members**: models of one family (equal
//! graph structure, different weight values). A model compiled with its weights
//! as constants has exactly one member, [`SOLE_MEMBER`]. A family compiled with
//! its weights as inputs takes members with [`CompiledModel::add_member`]: the
//! engine copies the member's weights once into its own memory, and a run binds
//! them without a copy.

use crate::{Buckets, DataType, Signature};

/// Where a compiled model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// GPU `N` (its CUDA ordinal).
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

/// Why an engine could not compile or run a model: what the runtime acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The graph uses something this engine does not implement (an op, an
    /// attribute, a shape); another engine may take it.
    #[error("{0}")]
    Unsupported(String),
    /// The graph or the weights are wrong for what is asked of them (a
    /// malformed graph, weights that do not fit the family's graph).
    #[error("{0}")]
    InvalidModel(String),
    /// The device ran out of memory.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The device failed or is gone; nothing more runs on it until it is reset.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// Anything else inside the engine or its library.
    #[error("{0}")]
    Internal(String),
}

/// What an engine compiles: a family's graph, for every bucket, on one device.
#[derive(Debug)]
pub struct CompileRequest<'a, G: ?Sized> {
    /// The family key, for the compilations metric and messages.
    pub family: &'a str,
    /// The graph: weights as constants, or as inputs when `weights` is given.
    pub graph: &'a G,
    /// The batch sizes to compile.
    pub buckets: &'a Buckets,
    /// For a graph that takes its weights as inputs: the first member's
    /// weights, added as [`SOLE_MEMBER`] and used for the warm-up runs.
    pub weights: Option<&'a [Weight]>,
    /// Where it runs.
    pub device: Device,
    /// A compilation for a check (the runtime's load-time comparison of two
    /// engines), not for serving: not counted in
    /// `tickserve_graph_compilations_total`.
    pub check: bool,
    /// For a sequence model on a GPU whose `gpu_mode` is `resident` or
    /// `auto`: run its ticks on a resident kernel (engines without one
    /// ignore it).
    pub resident: Option<ResidentRequest<'a>>,
}

/// A sequence model asked to run resident on its GPU.
#[derive(Debug, Clone, Copy)]
pub struct ResidentRequest<'a> {
    /// `gpu_mode = "resident"`: a family the resident kernel cannot run
    /// fails to compile, saying why; otherwise (`auto`) it runs on the
    /// engine's usual path, logged with the reason.
    pub required: bool,
    /// Its state pairs (`[[sequence.state]]`).
    pub state: &'a [crate::sequence::StateConfig],
}

/// The compile side of an engine: one per engine library, shared by every
/// executor thread that compiles on it.
pub trait Engine<G: ?Sized>: Send + Sync + std::fmt::Debug {
    /// Triton's `platform` for models this engine runs (`onnxruntime_onnx`).
    fn platform(&self) -> &'static str;

    /// Triton's `backend` for models this engine runs (`onnxruntime`).
    fn backend(&self) -> &'static str;

    /// Whether this engine can compile `graph` with these weights, without
    /// compiling it: [`EngineError::Unsupported`] names what it lacks.
    fn check(&self, graph: &G, weights: Option<&[Weight]>) -> Result<(), EngineError> {
        let _ = (graph, weights);
        Ok(())
    }

    /// Compiles `request.graph` once per bucket on `request.device`, adds
    /// the first member and warms every bucket up. Called on the executor
    /// thread that will own the result.
    fn compile(
        &self,
        request: &CompileRequest<'_, G>,
    ) -> Result<Box<dyn CompiledModel>, EngineError>;
}

/// Identifies a member of a compiled family, unique within that family.
pub type MemberId = u32;

/// The member of a model compiled with its weights as constants.
pub const SOLE_MEMBER: MemberId = 0;

/// One weight tensor of a model, as the ONNX file stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Weight {
    /// The weight's name in the graph.
    pub name: String,
    /// Its element type.
    pub datatype: DataType,
    /// Its dimensions.
    pub dims: Vec<usize>,
    /// Its values, little-endian.
    pub data: Vec<u8>,
}

/// A model compiled for every bucket on one device, owned by one executor thread.
pub trait CompiledModel: Send {
    /// The model's signature (outputs resolved by the warm-up runs).
    fn signature(&self) -> &Signature;

    /// The batch sizes compiled, ascending.
    fn buckets(&self) -> &Buckets;

    /// The device label used in logs and metrics (`cpu`).
    fn device(&self) -> &str;

    /// Input `input` of bucket `bucket`: `bucket size × row bytes`, little-endian.
    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8];

    /// Runs bucket `bucket` with `member`'s weights on what its input buffers hold.
    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError>;
    /// Runs bucket `bucket` with each row's own member's weights: row `r`
    /// with `members[r]`'s, the rows past `members` (padding) with
    /// `members[0]`'s. Where every row is one member's, this is
    /// [`CompiledModel::run`]; rows of several members need an engine that
    /// [`CompiledModel::mixes_members`] (else [`EngineError::Unsupported`]).
    fn run_members(&mut self, bucket: usize, members: &[MemberId]) -> Result<(), EngineError> {
        match members {
            [first, rest @ ..] if rest.iter().all(|m| m == first) => self.run(bucket, *first),
            [] => Err(EngineError::Internal("a run of no rows".to_string())),
            _ => Err(EngineError::Unsupported(format!(
                "{} runs one member's weights per run",
                self.device()
            ))),
        }
    }
    /// [`CompiledModel::run_members`] on a bucket whose first `rows` rows
    /// are a batch's and the rest padding, whose outputs nobody reads: an
    /// engine that runs rows one by one may leave the padding unrun. The
    /// default runs the whole bucket.
    fn run_rows(
        &mut self,
        bucket: usize,
        rows: usize,
        members: &[MemberId],
    ) -> Result<(), EngineError> {
        let _ = rows;
        self.run_members(bucket, members)
    }
    /// Whether one run may hold rows of several members
    /// ([`CompiledModel::run_members`]).
    fn mixes_members(&self) -> bool {
        false
    }

    /// Output `output` of bucket `bucket` after a run: `bucket size × row bytes`.
    fn output(&self, bucket: usize, output: usize) -> &[u8];

    /// Makes `weights` (every weight of the graph, by name) resident as
    /// `member`'s, ready to bind in every bucket. Compiles nothing. Fails for a
    /// model compiled with its weights as constants, or weights that do not
    /// match the graph.
    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError>;

    /// Frees `member`'s weights; later runs naming it fail.
    fn remove_member(&mut self, member: MemberId);

    /// The device's own time for the last run (CUDA events), where the
    /// engine measures it.
    fn device_time(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether any thread may run it (the caller's own, when its executor
    /// is idle). A GPU model runs only on its executor threads.
    fn runs_on_any_thread(&self) -> bool {
        true
    }
}
