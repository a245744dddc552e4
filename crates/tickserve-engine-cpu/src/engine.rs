//! The engine and a model compiled by it: the family's plan, one
//! [`Bucket`] of buffers per batch size, each member's [`Packed`] weights.
//! A run is the plan's steps over the bucket's buffers with the member's
//! weights; a weight swap is picking another member's. Nothing is allocated
//! per run.

use std::collections::HashMap;

use tickserve_core::{
    Buckets, CompileRequest, CompiledModel, Device, Engine, EngineError, MemberId, SOLE_MEMBER,
    Signature, Weight, metrics as names,
};
use tickserve_onnx::ModelGraph;
use tickserve_plan::forest::{Yield, import_forest};
use tickserve_plan::plan::Plan;
use tickserve_plan::{Imported, arrange, import};

use crate::forest::CompiledForest;
use crate::kernels::Isa;
use crate::packed::Packed;
use crate::run::{Bucket, Prepared};

#[cfg(not(target_endian = "little"))]
compile_error!("the compiled CPU engine hands out its f32 buffers as little-endian bytes");

/// Compiles plans for this CPU.
#[derive(Debug, Clone, Copy)]
pub struct CpuEngine {
    isa: Isa,
}

impl Default for CpuEngine {
    fn default() -> CpuEngine {
        CpuEngine::new()
    }
}

impl CpuEngine {
    /// The engine, with the best kernels this CPU runs.
    pub fn new() -> CpuEngine {
        CpuEngine { isa: Isa::detect() }
    }

    /// The engine with the kernels of `isa` (the portable ones run
    /// anywhere; tests compare the two).
    pub fn with_isa(isa: Isa) -> CpuEngine {
        CpuEngine { isa }
    }

    /// The kernels it runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Compiles `imported` (its plan, its first member's weights) for
    /// every bucket of `buckets`, completing `graph`'s signature. `given`
    /// are the weights the family's graph takes as inputs (none: the model
    /// holds every value); the plan's other slots hold the graph's own
    /// constants (`Constant` nodes), the same for every member.
    pub fn compile_plan(
        &self,
        imported: &Imported,
        given: Option<&[Weight]>,
        signature: &tickserve_onnx::PartialSignature,
        buckets: &Buckets,
    ) -> Result<CpuModel, EngineError> {
        let plan = &imported.plan;
        for ((name, _), (expected, _, _)) in plan.outputs.iter().zip(&signature.outputs) {
            if name != expected {
                return Err(EngineError::InvalidModel(format!(
                    "the plan's output '{name}' is not the signature's '{expected}'"
                )));
            }
        }
        if plan.inputs.len() != signature.inputs.len()
            || plan.outputs.len() != signature.outputs.len()
        {
            return Err(EngineError::InvalidModel(format!(
                "the plan has {} inputs and {} outputs; the signature {} and {}",
                plan.inputs.len(),
                plan.outputs.len(),
                signature.inputs.len(),
                signature.outputs.len()
            )));
        }
        let outputs = plan
            .outputs
            .iter()
            .map(|(_, v)| plan.values[*v].dims.clone())
            .collect();
        let mut model = CpuModel {
            signature: signature.complete(outputs),
            buckets: buckets.clone(),
            program: Program::Plan {
                constants: imported
                    .weights
                    .iter()
                    .filter(|w| !given.is_some_and(|g| g.iter().any(|g| g.name == w.name)))
                    .cloned()
                    .collect(),
                prepared: plan.steps.iter().map(|s| Prepared::new(plan, s)).collect(),
                sized: buckets
                    .sizes()
                    .iter()
                    .map(|&rows| Bucket::new(plan, rows))
                    .collect(),
                plan: plan.clone(),
                members: HashMap::new(),
            },
            isa: self.isa,
        };
        model.add_member(SOLE_MEMBER, &imported.weights)?;
        model.warm_up()?;
        Ok(model)
    }

    /// Compiles `forest` for every bucket of `buckets`; `constants` are the
    /// weights its family took out of the graph (its members must give the
    /// same).
    pub fn compile_forest(
        &self,
        forest: tickserve_plan::forest::Forest,
        constants: &[Weight],
        signature: &tickserve_onnx::PartialSignature,
        buckets: &Buckets,
    ) -> Result<CpuModel, EngineError> {
        let forest = CompiledForest::new(forest).map_err(EngineError::Unsupported)?;
        let (features, targets) = (forest.features(), forest.targets());
        let dims = forest
            .forest()
            .outputs
            .iter()
            .map(|(_, y)| match y {
                Yield::Scores => vec![targets],
                Yield::Label => Vec::new(),
            })
            .collect();
        let mut model = CpuModel {
            signature: signature.complete(dims),
            buckets: buckets.clone(),
            program: Program::Forest {
                inputs: buckets
                    .sizes()
                    .iter()
                    .map(|&r| vec![0.0; r * features])
                    .collect(),
                outputs: buckets
                    .sizes()
                    .iter()
                    .map(|&r| vec![0.0; r * targets])
                    .collect(),
                labels: buckets.sizes().iter().map(|&r| vec![0; r]).collect(),
                scores: vec![0.0; targets],
                given: vec![false; targets],
                members: std::collections::HashSet::from([SOLE_MEMBER]),
                constants: constants.to_vec(),
                forest: Box::new(forest),
            },
            isa: self.isa,
        };
        model.warm_up()?;
        Ok(model)
    }
}

/// What `graph` compiles to here, or why the engine cannot run it: a plan
/// (with its first member's weights), or a forest.
enum Compiled {
    Plan(Imported),
    Forest(tickserve_plan::forest::Forest),
}

fn compiled(graph: &ModelGraph, weights: Option<&[Weight]>) -> Result<Compiled, EngineError> {
    if graph.onnx.is_tree_ensemble() {
        // A forest's trees are attributes of its node: what a family takes
        // out of its graph as weights are the constants after it (a
        // LightGBM classifier's `Mul` by 1), which every member must share.
        return import_forest(&graph.onnx, &graph.signature, weights.unwrap_or(&[]))
            .map(Compiled::Forest)
            .map_err(|unsupported| EngineError::Unsupported(unsupported.to_string()));
    }
    imported(graph, weights).map(Compiled::Plan)
}

/// The plan of `graph`, or why the engine cannot run it.
fn imported(graph: &ModelGraph, weights: Option<&[Weight]>) -> Result<Imported, EngineError> {
    import(&graph.onnx, &graph.signature.inputs, weights)
        .map_err(|unsupported| EngineError::Unsupported(unsupported.to_string()))
}

impl Engine<ModelGraph> for CpuEngine {
    fn platform(&self) -> &'static str {
        "tickserve_cpu"
    }

    fn backend(&self) -> &'static str {
        "tickserve_cpu"
    }

    /// Imports the graph (as a forest, for a tree ensemble):
    /// [`EngineError::Unsupported`] names the first node the importer cannot
    /// take.
    fn check(&self, graph: &ModelGraph, weights: Option<&[Weight]>) -> Result<(), EngineError> {
        compiled(graph, weights).map(|_| ())
    }

    fn compile(
        &self,
        request: &CompileRequest<'_, ModelGraph>,
    ) -> Result<Box<dyn CompiledModel>, EngineError> {
        if request.device != Device::Cpu {
            return Err(EngineError::Unsupported(format!(
                "the compiled CPU engine runs on the CPU, not on {}",
                request.device
            )));
        }
        let signature = &request.graph.signature;
        let model = match compiled(request.graph, request.weights)? {
            Compiled::Plan(imported) => {
                self.compile_plan(&imported, request.weights, signature, request.buckets)?
            }
            Compiled::Forest(forest) => self.compile_forest(
                forest,
                request.weights.unwrap_or(&[]),
                signature,
                request.buckets,
            )?,
        };
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

/// A family's plan, or a forest, compiled for every bucket, owned by one
/// executor thread.
#[derive(Debug)]
pub struct CpuModel {
    signature: Signature,
    buckets: Buckets,
    program: Program,
    isa: Isa,
}

/// What a model runs.
#[derive(Debug)]
enum Program {
    /// A plan: its buffers per bucket, each member's packed weights.
    Plan {
        plan: Plan,
        /// The graph's own values, for slots a member does not give.
        constants: Vec<Weight>,
        prepared: Vec<Prepared>,
        sized: Vec<Bucket>,
        members: HashMap<MemberId, Packed>,
    },
    /// A forest: its input, scores and labels per bucket, a row's scratch,
    /// its members (models of the same trees: a forest has no weights to
    /// swap).
    Forest {
        forest: Box<CompiledForest>,
        members: std::collections::HashSet<MemberId>,
        /// The weights the family took out of the graph, as compiled.
        constants: Vec<Weight>,
        inputs: Vec<Vec<f32>>,
        outputs: Vec<Vec<f32>>,
        labels: Vec<Vec<i64>>,
        scores: Vec<f32>,
        given: Vec<bool>,
    },
}

impl CpuModel {
    /// Runs every bucket once: their memory touched before the first
    /// request.
    fn warm_up(&mut self) -> Result<(), EngineError> {
        for bucket in 0..self.buckets.sizes().len() {
            self.run(bucket, SOLE_MEMBER)?;
        }
        Ok(())
    }

    /// Runs bucket `bucket` with `member`'s weights over its first `rows`
    /// rows (at most the bucket's).
    fn run_first(
        &mut self,
        bucket: usize,
        rows: usize,
        member: MemberId,
    ) -> Result<(), EngineError> {
        let rows = self
            .buckets
            .sizes()
            .get(bucket)
            .copied()
            .ok_or_else(|| EngineError::Internal(format!("no bucket {bucket}")))?
            .min(rows);
        match &mut self.program {
            Program::Plan {
                plan,
                prepared,
                sized,
                members,
                ..
            } => {
                let weights = members.get(&member).ok_or_else(|| {
                    EngineError::Internal(format!("member {member} is not loaded"))
                })?;
                sized[bucket].run(plan, prepared, weights, self.isa, rows);
            }
            Program::Forest {
                forest,
                inputs,
                outputs,
                labels,
                scores,
                given,
                members,
                ..
            } => {
                if !members.contains(&member) {
                    return Err(EngineError::Internal(format!(
                        "member {member} is not loaded"
                    )));
                }
                forest.run(
                    &inputs[bucket],
                    rows,
                    &mut outputs[bucket],
                    &mut labels[bucket],
                    scores,
                    given,
                );
            }
        }
        Ok(())
    }
}

/// `floats` as the bytes they are stored in.
fn bytes(floats: &[f32]) -> &[u8] {
    // SAFETY: an f32 slice is `4 · len` initialised bytes, u8 has no
    // alignment, and the borrow keeps the floats alive and unchanged.
    unsafe {
        std::slice::from_raw_parts(floats.as_ptr().cast::<u8>(), std::mem::size_of_val(floats))
    }
}

/// `labels` as the bytes they are stored in.
fn labels_bytes(labels: &[i64]) -> &[u8] {
    // SAFETY: as `bytes`: an i64 slice is `8 · len` initialised bytes.
    unsafe {
        std::slice::from_raw_parts(labels.as_ptr().cast::<u8>(), std::mem::size_of_val(labels))
    }
}

/// `floats` as bytes to write.
fn bytes_mut(floats: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `bytes`; every bit pattern is a valid f32, so any bytes
    // written leave valid floats.
    unsafe {
        std::slice::from_raw_parts_mut(
            floats.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(floats),
        )
    }
}

impl CompiledModel for CpuModel {
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
        match &mut self.program {
            Program::Plan { plan, sized, .. } => {
                let value = plan.inputs[input].1;
                bytes_mut(&mut sized[bucket].values[value])
            }
            Program::Forest { inputs, .. } => bytes_mut(&mut inputs[bucket]),
        }
    }

    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        self.run_first(bucket, usize::MAX, member)
    }

    /// A forest walks the batch's rows only, and a plan runs them only.
    fn run_rows(
        &mut self,
        bucket: usize,
        rows: usize,
        members: &[MemberId],
    ) -> Result<(), EngineError> {
        match members {
            [first, rest @ ..] if rest.iter().all(|m| m == first) => {
                self.run_first(bucket, rows, *first)
            }
            _ => self.run_members(bucket, members),
        }
    }

    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        match &self.program {
            Program::Plan { plan, sized, .. } => {
                let value = plan.outputs[output].1;
                bytes(&sized[bucket].values[value])
            }
            Program::Forest {
                forest,
                outputs,
                labels,
                ..
            } => match forest.forest().outputs.get(output) {
                Some((_, Yield::Label)) => labels_bytes(&labels[bucket]),
                _ => bytes(&outputs[bucket]),
            },
        }
    }

    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        match &mut self.program {
            Program::Plan {
                plan,
                members,
                constants,
                ..
            } => {
                let mut all = weights.to_vec();
                all.extend(
                    constants
                        .iter()
                        .filter(|c| !weights.iter().any(|w| w.name == c.name))
                        .cloned(),
                );
                let slots = arrange(plan, &all).map_err(EngineError::InvalidModel)?;
                members.insert(member, Packed::new(plan, slots));
                Ok(())
            }
            // Another model of the same trees (its family key says so) and
            // the same constants after them.
            Program::Forest {
                members, constants, ..
            } if weights == constants.as_slice() => {
                members.insert(member);
                Ok(())
            }
            Program::Forest { .. } => Err(EngineError::InvalidModel(
                "a tree ensemble's trees are constants: a member must give the same weights as \
                 the model it joins (the constants after its trees)"
                    .to_string(),
            )),
        }
    }

    fn remove_member(&mut self, member: MemberId) {
        match &mut self.program {
            Program::Plan { members, .. } => {
                members.remove(&member);
            }
            Program::Forest { members, .. } => {
                members.remove(&member);
            }
        }
    }
}
