//! The CUDA engine proper: a family's plan compiled for every bucket on one
//! GPU, each bucket one captured CUDA graph.
//!
//! Per bucket, at load: one device arena holds the staging area (the
//! pointer tables, then the inputs), the outputs side by side, every
//! intermediate value and the pointer arrays of the products; pinned host
//! buffers mirror the staging area and the outputs. The graph is: one copy
//! in (staging), the products (cuBLAS, pointer-array form, so the weight
//! pointer is read from the table at run time) and the kernels, one copy out
//! (outputs). A run writes the member's row of weight pointers into the
//! pinned table, launches the graph and waits: swapping members is that
//! pointer write. Nothing is allocated or compiled per run.
//!
//! Buckets of two rows or more hold a second graph over the same buffers,
//! for rows of different members in one launch
//! ([`CompiledModel::run_members`]): its table holds one pointer per row and
//! weight slot, every product is one product per row (one cuBLAS call) and
//! every kernel reads each row's weights through its row's pointers.

mod product;
mod recurrent;
mod resident;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, result, sys};
use tickserve_core::{
    Buckets, CompileRequest, CompiledModel, Device, Engine, EngineError, MemberId, SOLE_MEMBER,
    Signature, Weight, metrics as names,
};
use tickserve_onnx::{ModelGraph, PartialSignature};

use crate::device::{Blas, DeviceMemory, Event, GraphExec, Module, PinnedMemory, Stream, driver};
use crate::import::{Imported, arrange};
use crate::kernels::{self, Kernel};
use crate::plan::{Op, Plan, ValueId};
use product::{Operands, Product};
pub use resident::{RESIDENT_MEMBERS, ResidentModel};

/// The longest a resident tick may take before its family fails over to
/// its graphs (docs/cuda.md, "Resident mode").
pub const RESIDENT_TICK_BOUND: Duration = Duration::from_millis(100);

/// Device buffers are laid out on this boundary.
const ALIGN: usize = 256;

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Engine settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaOptions {
    /// Let cuBLAS use TF32 tensor cores for fp32 products (faster, about
    /// 1e-3 relative error); off by default.
    pub tf32: bool,
    /// Run each bucket's recorded sequence directly on the stream, run by
    /// run, instead of as a captured CUDA graph: the same products, kernels
    /// and copies, with more launch overhead. For a driver where capture
    /// fails; off by default.
    pub eager: bool,
    /// Blocks each slot of a resident kernel runs on
    /// ([`ResidentOptions::split`]; 0 or 1: one).
    pub resident_blocks: usize,
    /// Whether a resident kernel's blocks hold their share of the weights
    /// in shared memory, as much as the device gives a block
    /// ([`ResidentOptions::on_chip`]).
    pub resident_weights_on_chip: bool,
}

/// Compiles families for GPUs.
#[derive(Debug, Clone, Default)]
pub struct CudaEngine {
    options: CudaOptions,
}

/// What to compile, and where.
#[derive(Debug)]
pub struct CudaCompileRequest<'a> {
    /// The family key, for metrics and messages.
    pub family: &'a str,
    /// The imported plan and the first member's weights.
    pub imported: &'a Imported,
    /// The signature from the file and `model.toml`.
    pub signature: &'a PartialSignature,
    /// The batch sizes to compile.
    pub buckets: &'a Buckets,
    /// The GPU (`gpu:N`).
    pub ordinal: usize,
    /// The first member's id.
    pub first_member: MemberId,
}

impl CudaEngine {
    /// An engine with `options`.
    pub fn new(options: CudaOptions) -> CudaEngine {
        CudaEngine { options }
    }

    /// Compiles `request`'s plan for every bucket on its GPU, adds the first
    /// member and runs every bucket once.
    pub fn compile(&self, request: &CudaCompileRequest<'_>) -> Result<CudaModel, EngineError> {
        let plan = &request.imported.plan;
        kernels::lowerable(plan).map_err(EngineError::Unsupported)?;
        let device = format!("gpu:{}", request.ordinal);
        // SAFETY: only tries to dlopen the driver; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(EngineError::Unsupported(format!(
                "{device}: no CUDA driver (libcuda.so cannot be loaded)"
            )));
        }
        if let Some(missing) = crate::probe::missing_libraries() {
            return Err(EngineError::Unsupported(format!("{device}: {missing}")));
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(request.ordinal))
            .map_err(|_| {
                EngineError::DeviceLost(format!("{device}: the CUDA driver could not be loaded"))
            })?
            .map_err(driver(&device))?;
        ctx.bind_to_thread()
            .map_err(driver("binding the context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let (source, kernel_list) = kernels::module_source(plan);
        let compiled = kernels::compile(&source, &format!("sm_{major}{minor}"))?;
        let (module, loaded) = Module::load(&compiled)?;
        tracing::debug!(family = request.family, %device, "kernels loaded as {loaded}");
        let functions = kernel_list
            .iter()
            .map(|k| module.function(&k.name))
            .collect::<Result<Vec<_>, _>>()?;
        let stream = Stream::new()?;
        let blas = Blas::new(&stream, self.options.tf32, request.ordinal)?;

        let outputs: Vec<Vec<usize>> = plan
            .outputs
            .iter()
            .map(|(_, v)| plan.values[*v].dims.clone())
            .collect();
        for ((name, _), (expected, _, _)) in plan.outputs.iter().zip(&request.signature.outputs) {
            if name != expected {
                return Err(EngineError::InvalidModel(format!(
                    "the plan's output '{name}' is not the signature's '{expected}'"
                )));
            }
        }
        let signature = request.signature.complete(outputs);
        let mut model = CudaModel {
            buckets_graphs: Vec::new(),
            members: HashMap::new(),
            last_device_time: None,
            signature,
            buckets: request.buckets.clone(),
            device,
            plan: plan.clone(),
            kernels: kernel_list.into_iter().zip(functions).collect(),
            blas,
            stream,
            _module: module,
            ctx,
        };
        // The first member's weights come first: the uncaptured warm-up run
        // of each bucket reads them through the table.
        model.add_weights(
            request.first_member,
            &request.imported.weights,
            request.ordinal,
        )?;
        for &size in request.buckets.sizes() {
            let bucket = model
                .bucket(
                    size,
                    request.ordinal,
                    request.first_member,
                    self.options.eager,
                )
                .map_err(|e| within(e, &format!("bucket {size}")))?;
            model.buckets_graphs.push(bucket);
            metrics::counter!(names::GRAPH_COMPILATIONS,
                "family" => request.family.to_string(), "bucket" => size.to_string(),
                "device" => model.device.clone())
            .increment(1);
        }
        for bucket in 0..model.buckets_graphs.len() {
            model.run(bucket, request.first_member).map_err(|e| {
                let size = request.buckets.sizes()[bucket];
                within(e, &format!("warm-up of bucket {size}"))
            })?;
        }
        Ok(model)
    }
}

/// `e` with `context` before its message, of the same kind.
fn within(e: EngineError, context: &str) -> EngineError {
    match e {
        EngineError::Internal(m) => EngineError::Internal(format!("{context}: {m}")),
        EngineError::OutOfMemory(m) => EngineError::OutOfMemory(format!("{context}: {m}")),
        EngineError::DeviceLost(m) => EngineError::DeviceLost(format!("{context}: {m}")),
        other => other,
    }
}

impl Engine<ModelGraph> for CudaEngine {
    fn platform(&self) -> &'static str {
        "tickserve_cuda"
    }

    fn backend(&self) -> &'static str {
        "tickserve_cuda"
    }

    /// Imports the graph: [`EngineError::Unsupported`] names the first op
    /// (or attribute) the engine lacks.
    fn check(&self, graph: &ModelGraph, weights: Option<&[Weight]>) -> Result<(), EngineError> {
        let imported = crate::import(&graph.onnx, &graph.signature.inputs, weights)
            .map_err(|unsupported| EngineError::Unsupported(unsupported.to_string()))?;
        kernels::lowerable(&imported.plan).map_err(EngineError::Unsupported)
    }

    fn compile(
        &self,
        request: &CompileRequest<'_, ModelGraph>,
    ) -> Result<Box<dyn CompiledModel>, EngineError> {
        let Device::Gpu(ordinal) = request.device else {
            return Err(EngineError::Unsupported(
                "the CUDA engine runs on GPUs only".to_string(),
            ));
        };
        let graph = request.graph;
        let imported = crate::import(&graph.onnx, &graph.signature.inputs, request.weights)
            .map_err(|unsupported| EngineError::Unsupported(unsupported.to_string()))?;
        let cuda_request = CudaCompileRequest {
            family: request.family,
            imported: &imported,
            signature: &graph.signature,
            buckets: request.buckets,
            ordinal,
            first_member: SOLE_MEMBER,
        };
        let Some(asked) = request.resident.filter(|_| !request.check) else {
            return Ok(Box::new(CudaEngine::compile(self, &cuda_request)?));
        };
        let options = ResidentOptions {
            split: self.options.resident_blocks.max(1),
            on_chip: if self.options.resident_weights_on_chip {
                usize::MAX
            } else {
                0
            },
            ..ResidentOptions::default()
        };
        match self.compile_resident_with(&cuda_request, asked.state, &options)? {
            Ok(resident) => {
                tracing::info!(
                    family = request.family,
                    device = resident.device(),
                    "runs resident"
                );
                Ok(Box::new(resident))
            }
            Err((why, _)) if asked.required => Err(EngineError::Unsupported(format!(
                "gpu_mode = \"resident\", but the resident kernel cannot run it: {why}"
            ))),
            Err((why, model)) => {
                tracing::warn!(
                    family = request.family,
                    device = model.device(),
                    "runs on its CUDA graphs, not resident: {why}"
                );
                Ok(model)
            }
        }
    }
}

impl CudaEngine {
    /// Compiles `request` ([`CudaEngine::compile`]) and starts its resident
    /// kernel beside the graphs ([`ResidentModel`]), its state paired as
    /// `state` says. `Err` where the graphs do not compile; `Ok(Err)` where
    /// they do and the kernel cannot run the family: why, and the graphs,
    /// to run on them instead.
    #[allow(clippy::type_complexity)] // the graphs come back with the reason
    pub fn compile_resident(
        &self,
        request: &CudaCompileRequest<'_>,
        state: &[tickserve_core::sequence::StateConfig],
    ) -> Result<Result<ResidentModel, (EngineError, Box<CudaModel>)>, EngineError> {
        self.compile_resident_with(request, state, &ResidentOptions::default())
    }

    /// [`CudaEngine::compile_resident`] with `options`' table, bound and
    /// blocks a slot.
    #[allow(clippy::type_complexity)] // the graphs come back with the reason
    pub fn compile_resident_with(
        &self,
        request: &CudaCompileRequest<'_>,
        state: &[tickserve_core::sequence::StateConfig],
        options: &ResidentOptions,
    ) -> Result<Result<ResidentModel, (EngineError, Box<CudaModel>)>, EngineError> {
        let model = self.compile(request)?;
        // No more shared memory than the device gives a block.
        let most = model
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(driver("the device's shared memory a block"))?;
        let options = ResidentOptions {
            on_chip: options.on_chip.min(usize::try_from(most).unwrap_or(0)),
            ..options.clone()
        };
        Ok(match resident_layout(request.imported, state, &options) {
            Ok(layout) => ResidentModel::start(
                request.family,
                model,
                layout,
                (request.first_member, &request.imported.weights),
                (options.members, options.bound),
            ),
            Err(reason) => Err((EngineError::Unsupported(reason), Box::new(model))),
        })
    }

    /// The resident kernel for `imported`'s plan with `state`'s pairs, or
    /// why the kernel cannot run it. Needs no GPU: `tickserve check` says
    /// it on any machine.
    pub fn resident_layout(
        imported: &Imported,
        state: &[tickserve_core::sequence::StateConfig],
    ) -> Result<kernels::Resident, String> {
        resident_layout(imported, state, &ResidentOptions::default())
    }
}

/// The resident kernel for `imported`'s plan with `state`'s pairs, each
/// slot on `options.split` blocks holding up to `options.on_chip` bytes of
/// weights, or why the kernel cannot run it.
fn resident_layout(
    imported: &Imported,
    state: &[tickserve_core::sequence::StateConfig],
    options: &ResidentOptions,
) -> Result<kernels::Resident, String> {
    let pairs: Vec<(&str, &str)> = state
        .iter()
        .map(|s| (s.input.as_str(), s.output.as_str()))
        .collect();
    kernels::resident_split(&imported.plan, &pairs, options.split, options.on_chip)
}

/// How a family runs resident.
#[derive(Debug, Clone)]
pub struct ResidentOptions {
    /// Rows of the kernel's weight table: the most members on the kernel
    /// (the others run on the graphs). [`RESIDENT_MEMBERS`] by default.
    pub members: usize,
    /// The longest a tick may take before the family fails over to its
    /// graphs. [`RESIDENT_TICK_BOUND`] by default.
    pub bound: Duration,
    /// Blocks a slot runs on (a thread-block cluster; 1 to
    /// [`kernels::MAX_SPLIT`]). 1 by default.
    pub split: usize,
    /// Bytes of shared memory each block may have in all, its share of the
    /// tick's member's weights held in what its own arrays leave (at most
    /// the device's limit a block; what does not fit is read through L2).
    /// 0 by default: every weight through L2.
    pub on_chip: usize,
}

impl Default for ResidentOptions {
    fn default() -> ResidentOptions {
        ResidentOptions {
            members: RESIDENT_MEMBERS,
            bound: RESIDENT_TICK_BOUND,
            split: 1,
            on_chip: 0,
        }
    }
}

/// One member's weights on the device and its row of pointers to them.
struct MemberWeights {
    _memory: DeviceMemory,
    pointers: Vec<u64>,
}

/// One bucket: its buffers and its captured graphs (none when eager).
struct BucketGraph {
    /// Its batch rows.
    rows: usize,
    /// Where each value lives in the arena.
    layout: Layout,
    /// Pinned mirror of the staging area: the tables, then the inputs.
    staging: PinnedMemory,
    /// Pinned mirror of the outputs.
    outputs: PinnedMemory,
    /// (offset, bytes) of each input in `staging`.
    inputs_at: Vec<(usize, usize)>,
    /// (offset, bytes) of each output in `outputs`.
    outputs_at: Vec<(usize, usize)>,
    /// The captured graph; `None` runs the sequence on the stream each time.
    exec: Option<GraphExec>,
    /// The captured graph for rows of mixed members (buckets of two rows or
    /// more, unless eager).
    mixed: Option<GraphExec>,
    start: Event,
    end: Event,
    /// Freed after the graph (declared last).
    arena: DeviceMemory,
}

/// A family compiled on one GPU, owned by one executor thread.
pub struct CudaModel {
    // Field order is drop order: graphs and buffers before the handles, the
    // context last.
    buckets_graphs: Vec<BucketGraph>,
    members: HashMap<MemberId, MemberWeights>,
    last_device_time: Option<Duration>,
    signature: Signature,
    buckets: Buckets,
    device: String,
    plan: Plan,
    kernels: Vec<(Kernel, sys::CUfunction)>,
    blas: Blas,
    stream: Stream,
    _module: Module,
    ctx: Arc<CudaContext>,
}

// SAFETY: the raw CUDA handles inside are used by one thread at a time (the
// executor's mutex), and every entry point makes the context current on the
// calling thread first.
unsafe impl Send for CudaModel {}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("device", &self.device)
            .field("buckets", &self.buckets)
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        // The fields free themselves in the context.
        let _ = self.ctx.bind_to_thread();
    }
}

/// `member`'s row of weight pointers (from `members`, on `device`).
fn pointers_of<'a>(
    members: &'a HashMap<MemberId, MemberWeights>,
    device: &str,
    member: MemberId,
) -> Result<&'a [u64], EngineError> {
    members
        .get(&member)
        .map(|m| m.pointers.as_slice())
        .ok_or_else(|| EngineError::Internal(format!("member {member} has no weights on {device}")))
}

/// Writes `member`'s row of weight pointers into `staging`'s one-member
/// table (at `table`).
fn write_table(
    members: &HashMap<MemberId, MemberWeights>,
    device: &str,
    staging: &mut PinnedMemory,
    table: usize,
    member: MemberId,
) -> Result<(), EngineError> {
    let pointers = pointers_of(members, device, member)?;
    let entries = staging.as_mut_slice()[table..].chunks_exact_mut(8);
    for (entry, pointer) in entries.zip(pointers) {
        entry.copy_from_slice(&pointer.to_le_bytes());
    }
    Ok(())
}

/// Writes the mixed-members table at the head of `staging`: for each weight
/// slot, each of `rows` rows' member's pointer (`row_members[r]`; rows past
/// its end, the padding, take its first member's).
fn write_rows_table(
    members: &HashMap<MemberId, MemberWeights>,
    device: &str,
    staging: &mut PinnedMemory,
    rows: usize,
    row_members: &[MemberId],
) -> Result<(), EngineError> {
    let first = *row_members
        .first()
        .ok_or_else(|| EngineError::Internal("a mixed run of no rows".to_string()))?;
    let table = staging.as_mut_slice();
    for r in 0..rows {
        let member = row_members.get(r).copied().unwrap_or(first);
        let pointers = pointers_of(members, device, member)?;
        for (slot, pointer) in pointers.iter().enumerate() {
            let at = (slot * rows + r) * 8;
            table[at..at + 8].copy_from_slice(&pointer.to_le_bytes());
        }
    }
    Ok(())
}

/// Where each value lives in a bucket's arena.
struct Layout {
    /// The one-member table's offset: the mixed-members table (one pointer
    /// per slot and row, slot-major) fills the bytes before it.
    table: usize,
    /// Staging bytes (tables + inputs), copied in per run (from `table` on,
    /// for one member).
    staging: usize,
    /// Output region: offset in the arena and bytes, copied out per run.
    outputs: (usize, usize),
    /// Offset of each value in the arena.
    values: Vec<usize>,
    /// Each product step's operand pointers.
    products: HashMap<usize, Operands>,
    /// Each recurrent step's scratch.
    recurrent: HashMap<usize, recurrent::Scratch>,
    /// Total arena bytes.
    total: usize,
}

fn layout(plan: &Plan, rows: usize) -> Layout {
    let bytes = |v: ValueId| rows * plan.values[v].width * 4;
    let mut values = vec![usize::MAX; plan.values.len()];
    let slots = plan.weights.len().max(1);
    let table = aligned(slots * rows * 8);
    let mut at = table + aligned(slots * 8);
    for (_, v) in &plan.inputs {
        values[*v] = at;
        at += aligned(bytes(*v));
    }
    let staging = at;
    let outputs_start = at;
    for (_, v) in &plan.outputs {
        values[*v] = at;
        at += aligned(bytes(*v));
    }
    let outputs = (outputs_start, at - outputs_start);
    for (v, offset) in values.iter_mut().enumerate() {
        if *offset == usize::MAX {
            *offset = at;
            at += aligned(rows * plan.values[v].width * 4);
        }
    }
    let mut products = HashMap::new();
    let mut recurrent = HashMap::new();
    for (index, step) in plan.steps.iter().enumerate() {
        match &step.op {
            Op::MatMul { .. } => {
                products.insert(index, Operands::place(rows, &mut at));
            }
            Op::Recurrent(layer) => {
                recurrent.insert(index, recurrent::Scratch::place(layer, rows, &mut at));
            }
            _ => {}
        }
    }
    Layout {
        table,
        staging,
        outputs,
        values,
        products,
        recurrent,
        total: at,
    }
}

impl CudaModel {
    /// Allocates bucket `rows`' buffers, runs its sequence once uncaptured
    /// with `member`'s weights (cuBLAS and the kernels initialise here, not
    /// inside a capture) and, unless `eager`, captures it as a graph; with
    /// two rows or more, the same for rows of mixed members (every row
    /// `member`'s in the warm-up run).
    fn bucket(
        &mut self,
        rows: usize,
        ordinal: usize,
        member: MemberId,
        eager: bool,
    ) -> Result<BucketGraph, EngineError> {
        let plan = &self.plan;
        let layout = layout(plan, rows);
        let arena = DeviceMemory::zeroed(layout.total, ordinal)?;
        let base = arena.ptr;
        let address = |v: ValueId| base + layout.values[v] as u64;
        let row_bytes = |v: ValueId| plan.values[v].width * 4;
        for (&step, operands) in &layout.products {
            if let Op::MatMul { input, .. } = plan.steps[step].op {
                let output = plan.steps[step].output;
                let pointers = Operands::pointers(
                    address(input),
                    row_bytes(input),
                    address(output),
                    row_bytes(output),
                    rows,
                );
                arena.write(operands.at, &pointers)?;
            }
        }
        for (&step, scratch) in &layout.recurrent {
            if let Op::Recurrent(layer) = &plan.steps[step].op {
                for (at, pointers) in
                    scratch.operands(layer, rows, base, &address, plan.steps[step].output)
                {
                    arena.write(at, &pointers)?;
                }
            }
        }
        let mut staging = PinnedMemory::zeroed(layout.staging, true)?;
        let outputs = PinnedMemory::zeroed(layout.outputs.1, false)?;
        write_table(
            &self.members,
            &self.device,
            &mut staging,
            layout.table,
            member,
        )?;
        write_rows_table(&self.members, &self.device, &mut staging, rows, &[member])?;
        let inputs_at = plan
            .inputs
            .iter()
            .map(|(_, v)| (layout.values[*v], rows * plan.values[*v].width * 4))
            .collect();
        let outputs_at = plan
            .outputs
            .iter()
            .map(|(_, v)| {
                (
                    layout.values[*v] - layout.outputs.0,
                    rows * plan.values[*v].width * 4,
                )
            })
            .collect();

        let mut bucket = BucketGraph {
            rows,
            layout,
            staging,
            outputs,
            inputs_at,
            outputs_at,
            exec: None,
            mixed: None,
            start: Event::new()?,
            end: Event::new()?,
            arena,
        };
        for mixed in [false, true] {
            if mixed && rows < 2 {
                break;
            }
            let what = if mixed {
                "the uncaptured run of mixed members"
            } else {
                "the uncaptured run"
            };
            self.record(&bucket, mixed).map_err(|e| within(e, what))?;
            self.stream.synchronize().map_err(|e| within(e, what))?;
            if !eager {
                let exec = Some(self.capture(&bucket, mixed)?);
                if mixed {
                    bucket.mixed = exec;
                } else {
                    bucket.exec = exec;
                }
            }
        }
        Ok(bucket)
    }

    /// Captures `bucket`'s recorded sequence (for mixed members or not) as
    /// a graph.
    fn capture(&self, bucket: &BucketGraph, mixed: bool) -> Result<GraphExec, EngineError> {
        let stream = &self.stream;
        // SAFETY: the stream is alive and idle; everything captured refers to
        // the arena and the pinned buffers, which live as long as the graph.
        unsafe {
            result::stream::begin_capture(
                stream.0,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(driver("beginning the graph capture"))?;
        let captured = self.record(bucket, mixed);
        // End the capture even when recording failed, so the stream is usable.
        let exec = GraphExec::end_capture(stream);
        captured?;
        exec
    }

    /// Records `bucket`'s forward pass on the stream (capturing, or not:
    /// then it runs), with one member's weights or each row's member's
    /// (`mixed`).
    fn record(&self, bucket: &BucketGraph, mixed: bool) -> Result<(), EngineError> {
        let (layout, base, staging, outputs, rows) = (
            &bucket.layout,
            bucket.arena.ptr,
            &bucket.staging,
            &bucket.outputs,
            bucket.rows,
        );
        let plan = &self.plan;
        let stream = self.stream.0;
        let address = |v: ValueId| base + layout.values[v] as u64;
        // The staging area from the table this run reads on.
        let from = if mixed { 0 } else { layout.table };
        // SAFETY: copies between live pinned buffers and the live arena, in range.
        unsafe {
            result::memcpy_htod_async(base + from as u64, &staging.as_slice()[from..], stream)
        }
        .map_err(driver("copy in"))?;
        let mut kernels = self.kernels.iter().peekable();
        for (index, step) in plan.steps.iter().enumerate() {
            if let Op::Recurrent(layer) = &step.op {
                while kernels.next_if(|(k, _)| k.step == index).is_some() {}
                self.record_recurrent(bucket, mixed, index, step.output, layer)?;
                continue;
            }
            if let Op::MatMul {
                weight,
                transposed,
                groups,
                k,
                n,
                ..
            } = step.op
            {
                let operands = *layout.products.get(&index).ok_or_else(|| {
                    EngineError::Internal(format!("step {index} has no operands"))
                })?;
                let product = Product {
                    slot: weight,
                    operands,
                    transposed,
                    per_row: groups,
                    k,
                    n,
                };
                self.record_product(bucket, mixed, &product)?;
            }
            if let Some((kernel, function)) = kernels.next_if(|(k, _)| k.step == index) {
                let (a, b) = match step.op {
                    Op::MatMul { .. } => (address(step.output), 0),
                    Op::Copy { input }
                    | Op::Softmax { input, .. }
                    | Op::LayerNorm { input, .. } => (address(input), 0),
                    Op::Binary { a, b, .. } => (address(a), address(b)),
                    Op::Rearrange { input, .. } => (address(input), 0),
                    Op::Conv1d(ref conv) => (address(conv.input), 0),
                    Op::Concat { ref inputs, .. } => (
                        inputs.first().copied().map_or(0, address),
                        inputs.get(1).copied().map_or(0, address),
                    ),
                    // Recorded above.
                    Op::Recurrent(_) => continue,
                };
                let mut out = address(step.output);
                let mut a = a;
                let mut b = b;
                let mut table = bucket.table(mixed);
                let mut rows_arg = rows as i32;
                let mut mixed_arg = i32::from(mixed);
                let mut params: [*mut c_void; 6] = [
                    (&raw mut out).cast(),
                    (&raw mut a).cast(),
                    (&raw mut b).cast(),
                    (&raw mut table).cast(),
                    (&raw mut rows_arg).cast(),
                    (&raw mut mixed_arg).cast(),
                ];
                let (grid, block) = kernel.dims(rows, plan.values[step.output].width);
                // SAFETY: the kernel's parameters are (float*, const float*,
                // const float*, const u64*, int, int), all pointing into the arena.
                unsafe {
                    result::launch_kernel(
                        *function,
                        (grid, 1, 1),
                        (block, 1, 1),
                        0,
                        stream,
                        &mut params,
                    )
                }
                .map_err(driver("kernel launch"))?;
            }
        }
        let (start, bytes) = layout.outputs;
        // SAFETY: the output region lies inside the arena, and `outputs` is as long.
        let out_slice = unsafe {
            std::slice::from_raw_parts_mut(outputs.as_slice().as_ptr().cast_mut(), bytes.max(1))
        };
        unsafe { result::memcpy_dtoh_async(out_slice, base + start as u64, stream) }
            .map_err(driver("copy out"))?;
        Ok(())
    }

    fn add_weights(
        &mut self,
        member: MemberId,
        weights: &[Weight],
        ordinal: usize,
    ) -> Result<(), EngineError> {
        let slots = arrange(&self.plan, weights).map_err(EngineError::InvalidModel)?;
        let mut offsets = Vec::with_capacity(slots.len());
        let mut total = 0;
        for slot in &slots {
            offsets.push(total);
            total += aligned(slot.len() * 4);
        }
        let memory = DeviceMemory::zeroed(total, ordinal)?;
        for (slot, &offset) in slots.iter().zip(&offsets) {
            memory.write(offset, slot)?;
        }
        let pointers = offsets.iter().map(|&o| memory.ptr + o as u64).collect();
        self.members.insert(
            member,
            MemberWeights {
                _memory: memory,
                pointers,
            },
        );
        Ok(())
    }

    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Takes `member`'s weights out of the model without freeing them (a
    /// free would wait for the device to go idle).
    fn take_member(&mut self, member: MemberId) -> Option<MemberWeights> {
        self.members.remove(&member)
    }

    /// Input `input` of bucket `bucket` as the executor wrote it.
    fn input(&self, bucket: usize, input: usize) -> &[u8] {
        let b = &self.buckets_graphs[bucket];
        let (offset, bytes) = b.inputs_at[input];
        &b.staging.as_slice()[offset..offset + bytes]
    }

    /// Launches bucket `bucket`'s graph (for mixed members or not; its
    /// sequence directly when eager) on the table already written, waits,
    /// and keeps the device's time.
    fn launch(&mut self, bucket: usize, mixed: bool) -> Result<(), EngineError> {
        let b = &self.buckets_graphs[bucket];
        b.start.record(&self.stream)?;
        match if mixed { &b.mixed } else { &b.exec } {
            Some(exec) => exec.launch(&self.stream)?,
            None => self.record(b, mixed)?,
        }
        b.end.record(&self.stream)?;
        b.end.synchronize()?;
        let ms = b.start.elapsed_ms(&b.end)?;
        self.last_device_time = Some(Duration::from_secs_f64(f64::from(ms) / 1e3));
        Ok(())
    }
}

impl BucketGraph {
    /// The device address of the table a run reads: the mixed-members one,
    /// or the one-member one.
    fn table(&self, mixed: bool) -> u64 {
        if mixed {
            self.arena.ptr
        } else {
            self.arena.ptr + self.layout.table as u64
        }
    }
}

impl CompiledModel for CudaModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    fn device(&self) -> &str {
        &self.device
    }

    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8] {
        let b = &mut self.buckets_graphs[bucket];
        let (offset, bytes) = b.inputs_at[input];
        &mut b.staging.as_mut_slice()[offset..offset + bytes]
    }

    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let b = &mut self.buckets_graphs[bucket];
        write_table(
            &self.members,
            &self.device,
            &mut b.staging,
            b.layout.table,
            member,
        )?;
        self.launch(bucket, false)
    }

    fn run_members(&mut self, bucket: usize, members: &[MemberId]) -> Result<(), EngineError> {
        let Some(&first) = members.first() else {
            return Err(EngineError::Internal("a run of no rows".to_string()));
        };
        let rows = self.buckets_graphs[bucket].rows;
        if members.iter().all(|&m| m == first) || rows < 2 {
            return self.run(bucket, first);
        }
        if members.len() > rows {
            return Err(EngineError::Internal(format!(
                "{} rows' members for a bucket of {rows}",
                members.len()
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let b = &mut self.buckets_graphs[bucket];
        write_rows_table(&self.members, &self.device, &mut b.staging, rows, members)?;
        self.launch(bucket, true)
    }

    fn mixes_members(&self) -> bool {
        true
    }

    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        let b = &self.buckets_graphs[bucket];
        let (offset, bytes) = b.outputs_at[output];
        &b.outputs.as_slice()[offset..offset + bytes]
    }

    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        let ordinal = self.ordinal();
        self.add_weights(member, weights, ordinal)
    }

    fn remove_member(&mut self, member: MemberId) {
        // The graphs hold no member's weights (they read the table), so any
        // member may go.
        if self.ctx.bind_to_thread().is_ok() {
            self.members.remove(&member);
        }
    }

    fn device_time(&self) -> Option<Duration> {
        self.last_device_time
    }

    fn runs_on_any_thread(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Elementwise, Step, Value, WeightSlot};

    /// x → product → softmax, two outputs (the product and the softmax).
    fn two_output_plan() -> Plan {
        let value = |width| Value {
            dims: vec![width],
            width,
        };
        Plan {
            values: vec![value(5), value(3), value(3)],
            inputs: vec![("x".into(), 0)],
            outputs: vec![("logits".into(), 1), ("p".into(), 2)],
            weights: vec![WeightSlot {
                name: "w".into(),
                dims: vec![5, 3],
                len: 15,
            }],
            baked: Vec::new(),
            steps: vec![
                Step {
                    op: Op::MatMul {
                        input: 0,
                        weight: 0,
                        transposed: false,
                        groups: 1,
                        k: 5,
                        n: 3,
                    },
                    epilogue: vec![Elementwise::Relu],
                    output: 1,
                    nodes: Vec::new(),
                },
                Step {
                    op: Op::Softmax {
                        input: 1,
                        segment: 3,
                    },
                    epilogue: Vec::new(),
                    output: 2,
                    nodes: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn the_arena_holds_table_inputs_then_outputs_side_by_side_all_apart() {
        let plan = two_output_plan();
        let rows = 64;
        let l = layout(&plan, rows);
        // Tables first (one pointer per row, then one per slot), then the
        // input: the staging area is one copy in.
        assert_eq!(l.table, aligned(rows * 8));
        assert_eq!(l.values[0], l.table + ALIGN);
        assert_eq!(l.staging, l.values[0] + aligned(rows * 5 * 4));
        // Outputs right after, in order: one copy out.
        assert_eq!(l.outputs.0, l.staging);
        assert_eq!(l.values[1], l.outputs.0);
        assert_eq!(l.values[2], l.values[1] + aligned(rows * 3 * 4));
        assert_eq!(l.outputs.1, 2 * aligned(rows * 3 * 4));
        // Every region aligned and disjoint, all inside the arena.
        let regions: Vec<(usize, usize)> = (0..3)
            .map(|v| (l.values[v], rows * plan.values[v].width * 4))
            .chain([(0, rows * 8), (l.table, 8)])
            .chain(l.products.values().map(|p| (p.at, Operands::bytes(rows))))
            .collect();
        assert_apart(regions, l.total);
    }

    /// `regions` (offset, bytes) are aligned, disjoint and inside `total`.
    pub(in crate::engine) fn assert_apart(mut regions: Vec<(usize, usize)>, total: usize) {
        regions.sort_unstable();
        for pair in regions.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{regions:?}");
        }
        assert!(
            regions
                .iter()
                .all(|(at, len)| at % ALIGN == 0 && at + len <= total),
            "{regions:?} in {total}"
        );
    }
}
