//! The ONNX Runtime engine: one session per model (or family) and signature
//! bucket, each compiled with fully static shapes when the model loads, warmed
//! up, and run through an IoBinding on preallocated input and output tensors.
//!
//! [`OrtEngine::new`] loads the ONNX Runtime shared library (a missing or wrong
//! library is an error, not a panic). [`OrtEngine::compile`] turns an
//! [`OnnxModel`] into an [`OrtModel`], which the executor thread that called it
//! owns and drives through [`CompiledModel`]; the runtime reaches both through
//! the core's [`Engine`] trait. ONNX Runtime's errors become
//! [`EngineError`]s here: a graph it cannot compile is an invalid model, a
//! failed allocation is out of memory. ONNX Runtime's `run` takes
//! `&mut self`, so a model's sessions belong to one executor at a time.
//!
//! A family's graph takes its weights as inputs (see
//! [`OnnxModel::with_weights_as_inputs`]): each member's weights are copied once
//! into tensors ONNX Runtime owns, and each member has one IoBinding per bucket
//! holding its weights and the bucket's shared input and output tensors. A
//! weight swap is picking the member's binding: no copy, no rebinding (measured
//! in `benches/weights.rs`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use ort::AsPointer;
use ort::environment::Environment;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{IoBinding, Session};
use ort::value::{DynTensor, TensorElementType};
use tickserve_core::{
    Buckets, CompileRequest, CompiledModel, DataType, Device, Engine, EngineError, MemberId,
    SOLE_MEMBER, Signature, Weight, metrics as names,
};
use tickserve_onnx::{ModelGraph, OnnxModel, PartialSignature};

/// Runs of each bucket before a model reports ready.
const WARMUP_RUNS: usize = 3;

/// Settings for every session the engine builds.
#[derive(Debug, Clone, Copy)]
pub struct OrtOptions {
    /// Intra-op threads per session.
    pub intra_op_threads: usize,
}

/// The loaded ONNX Runtime library and its environment; shared by every executor.
#[derive(Debug, Clone)]
pub struct OrtEngine {
    environment: Environment,
    options: OrtOptions,
}

/// What a compilation needs to know about the model beyond its ONNX file.
#[derive(Debug, Clone, Copy)]
pub struct OrtCompileRequest<'a> {
    /// The family key, for the compilations metric and messages.
    pub family: &'a str,
    /// The graph to compile: with its weights as constants, or (`weights`
    /// given) with its weights as inputs.
    pub onnx: &'a OnnxModel,
    /// The signature resolved from the file and `model.toml`.
    pub signature: &'a PartialSignature,
    /// The batch sizes to compile.
    pub buckets: &'a Buckets,
    /// For a graph that takes its weights as inputs: the first member's
    /// weights, added as [`SOLE_MEMBER`] and used for the warm-up runs.
    pub weights: Option<&'a [Weight]>,
}
/// The file name of the ONNX Runtime library this process loaded.
static LOADED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

impl OrtEngine {
    /// The loaded ONNX Runtime: its library's file name (which carries the
    /// version: `libonnxruntime.so.1.31.1`) and its build as the library
    /// reports it (git commit, build type).
    pub fn build_info(&self) -> String {
        let library = LOADED.get().map_or("?", String::as_str);
        format!("{library} ({})", ort::info().trim())
    }

    /// Loads ONNX Runtime from `library` and creates its environment, once per
    /// process: ONNX Runtime allows one environment per process, so later calls
    /// (a second server in a test, a benchmark with other options) share the
    /// first one's library and environment and keep only their own options.
    pub fn new(library: &Path, options: OrtOptions) -> Result<OrtEngine, String> {
        static ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);
        let mut shared = ENVIRONMENT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(environment) = shared.as_ref() {
            return Ok(OrtEngine {
                environment: environment.clone(),
                options,
            });
        }
        if !library.exists() {
            return Err(format!(
                "the ONNX Runtime library {} does not exist; run scripts/setup.sh, or set \
                 runtime.onnxruntime_library / TICKSERVE_ONNXRUNTIME_LIBRARY",
                library.display()
            ));
        }
        let builder = ort::init_from(library).map_err(|e| {
            format!(
                "could not load the ONNX Runtime library {}: {e}",
                library.display()
            )
        })?;
        let environment = builder
            .with_name("tickserve")
            .with_telemetry(false)
            .build()
            .map_err(|e| format!("could not create the ONNX Runtime environment: {e}"))?;
        *shared = Some(environment.clone());
        let _ = LOADED.set(library.file_name().map_or_else(
            || library.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ));
        Ok(OrtEngine {
            environment,
            options,
        })
    }

    /// The process's ONNX Runtime environment, for building sessions by hand
    /// (benchmarks of alternative session layouts).
    pub fn environment(&self) -> &Environment {
        &self.environment
    }

    /// Compiles `request.onnx` once per bucket with a static batch dimension,
    /// binds preallocated tensors (and the first member's weights, for a graph
    /// that takes them as inputs), and warms every bucket up.
    #[allow(clippy::disallowed_methods)] // a compilation's duration is the machine's time
    pub fn compile(&self, request: &OrtCompileRequest<'_>) -> Result<OrtModel, EngineError> {
        let mut sessions = Vec::with_capacity(request.buckets.sizes().len());
        let mut output_dims: Option<Vec<Vec<usize>>> = None;
        let weights = match request.weights {
            Some(weights) => {
                Some(weight_tensors(weights).map_err(|e| classify("cannot hold the weights", &e))?)
            }
            None => None,
        };
        for &size in request.buckets.sizes() {
            let started = Instant::now();
            let bytes = request.onnx.with_static_batch(size, request.signature);
            let session = self.session(&bytes).map_err(|e| {
                EngineError::InvalidModel(format!(
                    "ONNX Runtime could not compile bucket {size}: {e}"
                ))
            })?;
            let bucket = BucketSession::new(session, size, request.signature, weights.as_deref())
                .map_err(|e| EngineError::InvalidModel(format!("bucket {size}: {e}")))?;
            match &output_dims {
                None => output_dims = Some(bucket.output_dims.clone()),
                Some(dims) if *dims != bucket.output_dims => {
                    return Err(EngineError::InvalidModel(format!(
                        "bucket {size} gives output dimensions {:?}, other buckets {dims:?}; \
                         the outputs' non-batch dimensions must not depend on the batch",
                        bucket.output_dims
                    )));
                }
                Some(_) => {}
            }
            tracing::debug!(family = request.family, bucket = size, elapsed = ?started.elapsed(), "compiled");
            sessions.push(bucket);
        }
        let signature = request.signature.complete(output_dims.unwrap_or_default());
        let weight_specs = request
            .weights
            .unwrap_or_default()
            .iter()
            .map(|w| WeightSpec {
                name: w.name.clone(),
                datatype: w.datatype,
                dims: w.dims.clone(),
            })
            .collect();
        let mut model = OrtModel {
            signature,
            buckets: request.buckets.clone(),
            sessions,
            takes_weights: request.weights.is_some(),
            weight_specs,
            members: HashMap::new(),
        };
        let first = model.bindings(weights.as_deref().unwrap_or_default())?;
        model.members.insert(SOLE_MEMBER, first);
        for bucket in 0..model.sessions.len() {
            for _ in 0..WARMUP_RUNS {
                model.run(bucket, SOLE_MEMBER)?;
            }
        }
        Ok(model)
    }

    fn session(&self, bytes: &[u8]) -> ort::Result<Session> {
        Session::builder(&self.environment)?
            .with_optimization_level(GraphOptimizationLevel::All)?
            .with_intra_threads(self.options.intra_op_threads)?
            .with_inter_threads(1)?
            .with_parallel_execution(false)?
            .with_intra_op_spinning(false)?
            .commit_from_memory(bytes)
    }
}

impl Engine<ModelGraph> for OrtEngine {
    fn platform(&self) -> &'static str {
        "onnxruntime_onnx"
    }

    fn backend(&self) -> &'static str {
        "onnxruntime"
    }

    fn compile(
        &self,
        request: &CompileRequest<'_, ModelGraph>,
    ) -> Result<Box<dyn CompiledModel>, EngineError> {
        if request.device != Device::Cpu {
            return Err(EngineError::Unsupported(format!(
                "ONNX Runtime runs on the CPU here, not on {}",
                request.device
            )));
        }
        let model = OrtEngine::compile(
            self,
            &OrtCompileRequest {
                family: request.family,
                onnx: &request.graph.onnx,
                signature: &request.graph.signature,
                buckets: request.buckets,
                weights: request.weights,
            },
        )?;
        if !request.check {
            for size in request.buckets.sizes() {
                metrics::counter!(names::GRAPH_COMPILATIONS,
                    "family" => request.family.to_string(), "bucket" => size.to_string(), "device" => "cpu")
                .increment(1);
            }
        }
        Ok(Box::new(model))
    }
}

/// An ONNX Runtime error as an [`EngineError`]: a failed allocation is out
/// of memory, anything else internal; `what` says what was being done.
fn classify(what: &str, error: &ort::Error) -> EngineError {
    let message = format!("{what}: {error}");
    let lower = message.to_ascii_lowercase();
    if lower.contains("failed to allocate") || lower.contains("bad_alloc") {
        EngineError::OutOfMemory(message)
    } else {
        EngineError::Internal(message)
    }
}

/// One bucket: a static-shape session and its preallocated input and output
/// tensors, which every member's binding of this bucket shares.
struct BucketSession {
    session: Session,
    /// Input tensors, in signature order; written before each run.
    inputs: Vec<DynTensor>,
    /// Output tensors, in signature order; filled by each run.
    outputs: Vec<DynTensor>,
    output_dims: Vec<Vec<usize>>,
}

impl BucketSession {
    /// Allocates the bucket's tensors; a first run (with `weights` bound, for a
    /// graph that takes them as inputs) tells the output shapes, since the file
    /// may leave non-batch output dimensions symbolic.
    fn new(
        session: Session,
        size: usize,
        signature: &PartialSignature,
        weights: Option<&[(String, DynTensor)]>,
    ) -> ort::Result<Self> {
        let mut probe = session.create_binding()?;
        let mut inputs = Vec::with_capacity(signature.inputs.len());
        for spec in &signature.inputs {
            let shape: Vec<i64> = std::iter::once(size as i64)
                .chain(spec.dims.iter().map(|&d| d as i64))
                .collect();
            let tensor = DynTensor::new(session.allocator(), element_type(spec.datatype), shape)?;
            probe.bind_input(spec.name.as_str(), &tensor)?;
            inputs.push(tensor);
        }
        for (name, tensor) in weights.unwrap_or_default() {
            probe.bind_input(name.as_str(), tensor)?;
        }
        let cpu = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )?;
        for (name, _, _) in &signature.outputs {
            probe.bind_output_to_device(name.as_str(), &cpu)?;
        }
        let mut output_shapes = Vec::with_capacity(signature.outputs.len());
        let mut session = session;
        {
            let outputs = session.run_binding(&probe)?;
            for (name, _, _) in &signature.outputs {
                let value = &outputs[name.as_str()];
                let dims: Vec<i64> = match value.dtype() {
                    ort::value::ValueType::Tensor { shape, .. } => shape.iter().copied().collect(),
                    other => {
                        return Err(ort::Error::new(format!(
                            "output '{name}' is {other}, not a tensor"
                        )));
                    }
                };
                output_shapes.push(dims);
            }
        }
        drop(probe);
        let mut outputs = Vec::with_capacity(signature.outputs.len());
        let mut output_dims = Vec::with_capacity(signature.outputs.len());
        for ((name, datatype, declared), shape) in signature.outputs.iter().zip(output_shapes) {
            if shape.first() != Some(&(size as i64)) || shape.iter().any(|&d| d < 0) {
                return Err(ort::Error::new(format!(
                    "output '{name}' has shape {shape:?}; expected the batch ({size}) first"
                )));
            }
            let dims: Vec<usize> = shape[1..].iter().map(|&d| d as usize).collect();
            if declared.len() != dims.len()
                || declared
                    .iter()
                    .zip(&dims)
                    .any(|(d, got)| d.is_some_and(|d| d != *got))
            {
                return Err(ort::Error::new(format!(
                    "output '{name}' has dimensions {dims:?} after the batch; the model declares {declared:?}"
                )));
            }
            outputs.push(DynTensor::new(
                session.allocator(),
                element_type(*datatype),
                shape,
            )?);
            output_dims.push(dims);
        }
        Ok(BucketSession {
            session,
            inputs,
            outputs,
            output_dims,
        })
    }

    /// A binding of this bucket's tensors and one member's weights.
    fn bind(
        &mut self,
        signature: &Signature,
        weights: &[(String, DynTensor)],
    ) -> ort::Result<IoBinding> {
        let mut binding = self.session.create_binding()?;
        for (spec, tensor) in signature.inputs.iter().zip(&self.inputs) {
            binding.bind_input(spec.name.as_str(), tensor)?;
        }
        for (name, tensor) in weights {
            binding.bind_input(name.as_str(), tensor)?;
        }
        for (spec, tensor) in signature.outputs.iter().zip(&mut self.outputs) {
            binding.bind_output(spec.name.as_str(), tensor)?;
        }
        Ok(binding)
    }
}

/// What the graph expects of one weight input.
#[derive(Debug, Clone)]
struct WeightSpec {
    name: String,
    datatype: DataType,
    dims: Vec<usize>,
}

/// Copies `weights` into tensors ONNX Runtime owns, once.
fn weight_tensors(weights: &[Weight]) -> ort::Result<Vec<(String, DynTensor)>> {
    let allocator = Allocator::default();
    weights
        .iter()
        .map(|w| {
            let shape = w
                .dims
                .iter()
                .map(|&d| i64::try_from(d))
                .collect::<Result<Vec<i64>, _>>();
            let len = w
                .dims
                .iter()
                .try_fold(w.datatype.size(), |n, &d| n.checked_mul(d));
            let (Ok(shape), Some(len)) = (shape, len) else {
                return Err(ort::Error::new(format!(
                    "weight '{}': its shape {:?} is too large",
                    w.name, w.dims
                )));
            };
            let mut tensor = DynTensor::new(&allocator, element_type(w.datatype), shape)?;
            if len != w.data.len() {
                return Err(ort::Error::new(format!(
                    "weight '{}' holds {} bytes; its shape {:?} of {} needs {len}",
                    w.name,
                    w.data.len(),
                    w.dims,
                    w.datatype
                )));
            }
            // An empty weight (a dimension of 0) has no bytes, and ONNX Runtime
            // gives it no buffer (a null pointer): nothing to copy.
            if len > 0 {
                let ptr = tensor.data_ptr_mut().cast::<u8>();
                // SAFETY: a CPU tensor of exactly `len` (> 0) bytes, just
                // allocated and not yet shared.
                unsafe { std::slice::from_raw_parts_mut(ptr, len) }.copy_from_slice(&w.data);
            }
            Ok((w.name.clone(), tensor))
        })
        .collect()
}

/// A model compiled for every bucket on the CPU, with its members' bindings.
pub struct OrtModel {
    signature: Signature,
    buckets: Buckets,
    sessions: Vec<BucketSession>,
    /// Compiled with its weights as inputs (members may join), even when it
    /// has none: a graph whose values are all `Constant` nodes (the family
    /// key hashes them) is shared by the models of the same graph.
    takes_weights: bool,
    /// The weights the graph takes as inputs; empty when they are constants.
    weight_specs: Vec<WeightSpec>,
    /// Each member's bindings, one per bucket; each holds the member's weight
    /// tensors (ONNX Runtime keeps a bound input alive) and the bucket's shared
    /// input and output tensors. A swap is picking another binding.
    members: HashMap<MemberId, Vec<IoBinding>>,
}

impl OrtModel {
    /// One binding per bucket of the buckets' tensors and `weights`.
    fn bindings(&mut self, weights: &[(String, DynTensor)]) -> Result<Vec<IoBinding>, EngineError> {
        let signature = &self.signature;
        self.sessions
            .iter_mut()
            .map(|bucket| {
                bucket
                    .bind(signature, weights)
                    .map_err(|e| classify("cannot bind", &e))
            })
            .collect()
    }

    /// Checks that `weights` are exactly the ones the graph takes, in any order.
    fn check_weights(&self, weights: &[Weight]) -> Result<(), EngineError> {
        let invalid = EngineError::InvalidModel;
        if weights.len() != self.weight_specs.len() {
            return Err(invalid(format!(
                "the family's graph takes {} weights; this model has {}",
                self.weight_specs.len(),
                weights.len()
            )));
        }
        for w in weights {
            let spec = self
                .weight_specs
                .iter()
                .find(|s| s.name == w.name)
                .ok_or_else(|| invalid(format!("the family's graph has no weight '{}'", w.name)))?;
            if spec.datatype != w.datatype || spec.dims != w.dims {
                return Err(invalid(format!(
                    "weight '{}' is {} {:?}; the family's graph takes {} {:?}",
                    w.name, w.datatype, w.dims, spec.datatype, spec.dims
                )));
            }
        }
        Ok(())
    }
}

impl CompiledModel for OrtModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    fn device(&self) -> &str {
        "cpu"
    }

    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8] {
        let len = self.buckets.sizes()[bucket] * self.signature.inputs[input].row_bytes();
        let tensor = &mut self.sessions[bucket].inputs[input];
        let ptr = tensor.data_ptr_mut().cast::<u8>();
        // SAFETY: the tensor was allocated on the CPU by ONNX Runtime with the shape
        // [bucket size, dims...] of this input's datatype, which is exactly `len`
        // bytes; `&mut self` makes this the only reference to it while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        let binding = self
            .members
            .get(&member)
            .and_then(|b| b.get(bucket))
            .ok_or_else(|| EngineError::Internal(format!("member {member} is not loaded")))?;
        run_bound(&mut self.sessions[bucket].session, binding).map_err(|e| classify("run", &e))
    }

    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        let len = self.buckets.sizes()[bucket] * self.signature.outputs[output].row_bytes();
        let ptr = self.sessions[bucket].outputs[output]
            .data_ptr()
            .cast::<u8>();
        // SAFETY: the tensor was allocated on the CPU with shape [bucket size, dims...]
        // of this output's datatype (checked at compile), `len` bytes; `&self` keeps
        // `run` (which writes it) from running while the slice lives.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        if !self.takes_weights {
            return Err(EngineError::InvalidModel(
                "this model was compiled with its weights as constants".to_string(),
            ));
        }
        self.check_weights(weights)?;
        let tensors = weight_tensors(weights).map_err(|e| classify("cannot hold weights", &e))?;
        let bindings = self.bindings(&tensors)?;
        self.members.insert(member, bindings);
        Ok(())
    }

    fn remove_member(&mut self, member: MemberId) {
        self.members.remove(&member);
    }
}

/// Runs `session` on `binding`'s tensors. The outputs land in the tensors
/// bound at compile, so nothing is asked back: `Session::run_binding` would
/// fetch every bound output anew (an allocation, a handle per output, a list)
/// only for the caller to drop them.
fn run_bound(session: &mut Session, binding: &IoBinding) -> Result<(), ort::Error> {
    // SAFETY: both pointers come from live safe wrappers that outlive the
    // call; `&mut Session` keeps anyone else from running the session
    // meanwhile (`RunWithBinding` is not thread safe: `run_binding` takes
    // `&mut Session` too); a null `OrtRunOptions` means the defaults.
    unsafe {
        ort::Error::result_from_status((ort::api().RunWithBinding)(
            session.ptr_mut(),
            std::ptr::null(),
            binding.ptr(),
        ))
    }
}

fn element_type(datatype: DataType) -> TensorElementType {
    match datatype {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
    }
}
