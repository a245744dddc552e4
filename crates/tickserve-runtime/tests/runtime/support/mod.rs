//! Helpers the runtime's integration tests share: where the repository and
//! its sample models are, a request with one FP32 input, ONNX Runtime with a
//! test's hook before each run, and runs held at a gate ([`gate`]).

#![allow(dead_code)]

pub mod gate;

use std::path::Path;
use std::sync::Arc;

use tickserve_core::{
    Buckets, CompileRequest, CompiledModel, DataType, Engine, EngineError, InferRequest,
    InputTensor, MemberId, ModelRequest, Signature, Weight,
};
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_onnx::ModelGraph;

pub use tickserve_testing::{alone, root};

/// A request to `model` with one FP32 input `input` of `shape` holding `values`.
pub fn request(model: &str, input: &str, shape: Vec<i64>, values: &[f32]) -> InferRequest {
    InferRequest {
        model: model.to_string(),
        version: None,
        request: ModelRequest {
            id: "t".into(),
            inputs: vec![InputTensor {
                name: input.to_string(),
                datatype: DataType::Fp32,
                shape,
                data: values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        },
    }
}

/// The ONNX Runtime library scripts/setup.sh installs.
pub use tickserve_testing::onnxruntime_library as library;

/// Copies sample model `name` (version 1) into `repository`, with
/// `model_toml` as its `model.toml` when given.
pub fn copy_sample_model(repository: &Path, name: &str, model_toml: Option<&str>) {
    tickserve_testing::sample_version(repository, name, name, 1);
    if let Some(text) = model_toml {
        std::fs::write(repository.join(name).join("model.toml"), text).unwrap();
    }
}

/// What a test does before each run: it sees the first feature of each row
/// of the bucket's first input (the batch's rows, without the padding),
/// and may panic, fail the run or hold it.
pub type BeforeRun = Arc<dyn Fn(&[f32]) -> Result<(), EngineError> + Send + Sync>;

/// ONNX Runtime (one intra-op thread), calling a test's hook before each run.
pub struct HookedEngine {
    inner: OrtEngine,
    before_run: BeforeRun,
}

impl std::fmt::Debug for HookedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedEngine").finish_non_exhaustive()
    }
}

/// ONNX Runtime with `before_run` before each run.
pub fn hooked_engine(before_run: BeforeRun) -> Arc<HookedEngine> {
    let inner = OrtEngine::new(
        &library(),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("the engine starts (run scripts/setup.sh first)");
    Arc::new(HookedEngine { inner, before_run })
}

impl Engine<ModelGraph> for HookedEngine {
    fn platform(&self) -> &'static str {
        self.inner.platform()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn compile(
        &self,
        request: &CompileRequest<'_, ModelGraph>,
    ) -> Result<Box<dyn CompiledModel>, EngineError> {
        Ok(Box::new(Hooked {
            inner: Engine::compile(&self.inner, request)?,
            before_run: Arc::clone(&self.before_run),
        }))
    }
}

struct Hooked {
    inner: Box<dyn CompiledModel>,
    before_run: BeforeRun,
}

impl CompiledModel for Hooked {
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn buckets(&self) -> &Buckets {
        self.inner.buckets()
    }
    fn device(&self) -> &str {
        self.inner.device()
    }
    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8] {
        self.inner.input_mut(bucket, input)
    }
    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        let rows = self.inner.buckets().sizes()[bucket];
        self.run_rows(bucket, rows, &[member])
    }
    /// The hook sees the batch's rows, not the padding.
    fn run_rows(
        &mut self,
        bucket: usize,
        rows: usize,
        members: &[MemberId],
    ) -> Result<(), EngineError> {
        let row_bytes = self.inner.signature().inputs[0].row_bytes();
        let firsts: Vec<f32> = self
            .inner
            .input_mut(bucket, 0)
            .chunks_exact(row_bytes)
            .take(rows)
            .map(|row| f32::from_le_bytes([row[0], row[1], row[2], row[3]]))
            .collect();
        (self.before_run)(&firsts)?;
        self.inner.run_rows(bucket, rows, members)
    }
    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        self.inner.output(bucket, output)
    }
    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        self.inner.add_member(member, weights)
    }
    fn remove_member(&mut self, member: MemberId) {
        self.inner.remove_member(member);
    }
}
