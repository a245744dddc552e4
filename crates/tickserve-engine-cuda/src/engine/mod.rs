//! The CUDA engine proper: a family's plan compiled for every bucket on one
//! GPU, each bucket one captured CUDA graph.
//!
//! Per bucket, at load: one device arena holds the staging area (the member
//! pointer table, then the inputs), the outputs side by side, every
//! intermediate value and the pointer arrays of the products; pinned host
//! buffers mirror the staging area and the outputs. The graph is: one copy
//! in (staging), the products (cuBLAS, pointer-array form, so the weight
//! pointer is read from the table at run time) and the kernels, one copy out
//! (outputs). A run writes the member's row of weight pointers into the
//! pinned table, launches the graph and waits: swapping members is that
//! pointer write. Nothing is allocated or compiled per run.

mod recurrent;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas::sys as blas_sys;
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
        let model = CudaEngine::compile(
            self,
            &CudaCompileRequest {
                family: request.family,
                imported: &imported,
                signature: &graph.signature,
                buckets: request.buckets,
                ordinal,
                first_member: SOLE_MEMBER,
            },
        )?;
        Ok(Box::new(model))
    }
}

/// One member's weights on the device and its row of pointers to them.
struct MemberWeights {
    _memory: DeviceMemory,
    pointers: Vec<u64>,
}

/// One bucket: its buffers and its captured graph (none when eager).
struct BucketGraph {
    /// Its batch rows.
    rows: usize,
    /// Where each value lives in the arena.
    layout: Layout,
    /// Pinned mirror of the staging area: pointer table, then the inputs.
    staging: PinnedMemory,
    /// Pinned mirror of the outputs.
    outputs: PinnedMemory,
    /// (offset, bytes) of each input in `staging`.
    inputs_at: Vec<(usize, usize)>,
    /// (offset, bytes) of each output in `outputs`.
    outputs_at: Vec<(usize, usize)>,
    /// The captured graph; `None` runs the sequence on the stream each time.
    exec: Option<GraphExec>,
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

/// Writes `member`'s row of weight pointers (from `members`, on `device`)
/// into the head of `staging`, the pointer table.
fn write_table(
    members: &HashMap<MemberId, MemberWeights>,
    device: &str,
    staging: &mut PinnedMemory,
    member: MemberId,
) -> Result<(), EngineError> {
    let pointers = &members
        .get(&member)
        .ok_or_else(|| {
            EngineError::Internal(format!("member {member} has no weights on {device}"))
        })?
        .pointers;
    for (entry, pointer) in staging.as_mut_slice().chunks_exact_mut(8).zip(pointers) {
        entry.copy_from_slice(&pointer.to_le_bytes());
    }
    Ok(())
}

/// Where each value lives in a bucket's arena.
struct Layout {
    /// Staging bytes (table + inputs), copied in per run.
    staging: usize,
    /// Output region: offset in the arena and bytes, copied out per run.
    outputs: (usize, usize),
    /// Offset of each value in the arena.
    values: Vec<usize>,
    /// Offset of each product's pointer pair (input, output) in the arena.
    pointer_pairs: HashMap<usize, usize>,
    /// Each recurrent step's scratch.
    recurrent: HashMap<usize, recurrent::Scratch>,
    /// Total arena bytes.
    total: usize,
}

fn layout(plan: &Plan, rows: usize) -> Layout {
    let bytes = |v: ValueId| rows * plan.values[v].width * 4;
    let mut values = vec![usize::MAX; plan.values.len()];
    let table = aligned(plan.weights.len().max(1) * 8);
    let mut at = table;
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
    let mut pointer_pairs = HashMap::new();
    let mut recurrent = HashMap::new();
    for (index, step) in plan.steps.iter().enumerate() {
        match &step.op {
            Op::MatMul { .. } => {
                pointer_pairs.insert(index, at);
                at += ALIGN;
            }
            Op::Recurrent(layer) => {
                recurrent.insert(index, recurrent::Scratch::place(layer, rows, &mut at));
            }
            _ => {}
        }
    }
    Layout {
        staging,
        outputs,
        values,
        pointer_pairs,
        recurrent,
        total: at,
    }
}

impl CudaModel {
    /// Allocates bucket `rows`' buffers, runs its sequence once uncaptured
    /// with `member`'s weights (cuBLAS and the kernels initialise here, not
    /// inside a capture) and, unless `eager`, captures it as a graph.
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
        for (&step, &offset) in &layout.pointer_pairs {
            if let Op::MatMul { input, .. } = plan.steps[step].op {
                arena.write(offset, &[address(input), address(plan.steps[step].output)])?;
            }
        }
        for (&step, scratch) in &layout.recurrent {
            if let Op::Recurrent(layer) = &plan.steps[step].op {
                let pointers =
                    scratch.pointer_pairs(layer, base, &address, plan.steps[step].output);
                arena.write(scratch.pairs, &pointers)?;
            }
        }
        let mut staging = PinnedMemory::zeroed(layout.staging, true)?;
        let outputs = PinnedMemory::zeroed(layout.outputs.1, false)?;
        write_table(&self.members, &self.device, &mut staging, member)?;
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
            start: Event::new()?,
            end: Event::new()?,
            arena,
        };
        self.record(&bucket)
            .map_err(|e| within(e, "the uncaptured run"))?;
        self.stream
            .synchronize()
            .map_err(|e| within(e, "the uncaptured run"))?;
        if !eager {
            bucket.exec = Some(self.capture(&bucket)?);
        }
        Ok(bucket)
    }

    /// Captures `bucket`'s recorded sequence as a graph.
    fn capture(&self, bucket: &BucketGraph) -> Result<GraphExec, EngineError> {
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
        let captured = self.record(bucket);
        // End the capture even when recording failed, so the stream is usable.
        let exec = GraphExec::end_capture(stream);
        captured?;
        exec
    }

    /// Records `bucket`'s forward pass on the stream (capturing, or not:
    /// then it runs).
    fn record(&self, bucket: &BucketGraph) -> Result<(), EngineError> {
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
        // SAFETY: copies between live pinned buffers and the live arena, in range.
        unsafe { result::memcpy_htod_async(base, staging.as_slice(), stream) }
            .map_err(driver("copy in"))?;
        let mut kernels = self.kernels.iter().peekable();
        for (index, step) in plan.steps.iter().enumerate() {
            if let Op::Recurrent(layer) = &step.op {
                while kernels.next_if(|(k, _)| k.step == index).is_some() {}
                self.record_recurrent(bucket, index, step.output, layer)?;
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
                let pairs = base + layout.pointer_pairs[&index] as u64;
                let table_entry = base + (weight * 8) as u64;
                self.product(table_entry, pairs, transposed, rows * groups, k, n)?;
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
                let mut table = base;
                let mut rows_arg = rows as i32;
                let mut params: [*mut c_void; 5] = [
                    (&raw mut out).cast(),
                    (&raw mut a).cast(),
                    (&raw mut b).cast(),
                    (&raw mut table).cast(),
                    (&raw mut rows_arg).cast(),
                ];
                let (grid, block) = kernel.dims(rows, plan.values[step.output].width);
                // SAFETY: the kernel's parameters are (float*, const float*,
                // const float*, const u64*, int), all pointing into the arena.
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

    /// Records `out[m, n] = in[m, k] · W`, with `W`'s address read from the
    /// table at run time: cuBLAS's pointer-array product, batch of one.
    /// Row-major `out = in · W` is column-major `outᵀ = Wᵀ · inᵀ`.
    fn product(
        &self,
        table_entry: u64,
        pairs: u64,
        transposed: bool,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let (op_w, ld_w) = if transposed {
            (blas_sys::cublasOperation_t::CUBLAS_OP_T, k)
        } else {
            (blas_sys::cublasOperation_t::CUBLAS_OP_N, n)
        };
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: the three pointer arrays are device addresses inside the
        // arena holding [weight] (the table entry), [input] and [output];
        // alpha and beta are read during the call.
        unsafe {
            blas_sys::cublasSgemmBatched(
                self.blas.handle,
                op_w,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha,
                table_entry as *const *const f32,
                ld_w as i32,
                pairs as *const *const f32,
                k as i32,
                &beta,
                (pairs + 8) as *const *mut f32,
                n as i32,
                1,
            )
        }
        .result()
        .map_err(|e| EngineError::Internal(format!("cuBLAS product: {e:?}")))
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
        write_table(&self.members, &self.device, &mut b.staging, member)?;
        let b = &self.buckets_graphs[bucket];
        b.start.record(&self.stream)?;
        match &b.exec {
            Some(exec) => exec.launch(&self.stream)?,
            None => self.record(b)?,
        }
        b.end.record(&self.stream)?;
        b.end.synchronize()?;
        let ms = b.start.elapsed_ms(&b.end)?;
        self.last_device_time = Some(Duration::from_secs_f64(f64::from(ms) / 1e3));
        Ok(())
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
        // Table first, then the input: the staging area is one copy in.
        assert_eq!(l.values[0], ALIGN);
        assert_eq!(l.staging, ALIGN + aligned(rows * 5 * 4));
        // Outputs right after, in order: one copy out.
        assert_eq!(l.outputs.0, l.staging);
        assert_eq!(l.values[1], l.outputs.0);
        assert_eq!(l.values[2], l.values[1] + aligned(rows * 3 * 4));
        assert_eq!(l.outputs.1, 2 * aligned(rows * 3 * 4));
        // Every region aligned and disjoint, all inside the arena.
        let regions: Vec<(usize, usize)> = (0..3)
            .map(|v| (l.values[v], rows * plan.values[v].width * 4))
            .chain(l.pointer_pairs.values().map(|&p| (p, 16)))
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
