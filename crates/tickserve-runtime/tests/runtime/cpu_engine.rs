//! Which engine runs a model on the CPU: with `auto` (the default) the
//! compiled CPU engine takes what it imports and answers as ONNX Runtime
//! does at load; a model it cannot import runs on ONNX Runtime, the reason
//! kept for `tickserve check`; `compiled` fails that model's load instead;
//! a compiled engine whose answers differ (here one that adds 1e-3 to every
//! first output float) is kept off, naming the output and the element.

use std::sync::Arc;

use tickserve_core::config::{CpuEngineChoice, ServerConfig};
use tickserve_core::{CompileRequest, CompiledModel, Engine, EngineError, MemberId, Signature};
use tickserve_engine_cpu::CpuEngine;
use tickserve_engine_cuda::Gpus;
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_onnx::ModelGraph;
use tickserve_runtime::{Engines, Runtime, VersionState};

use crate::support::{copy_sample_model, library, request};

/// `repository/erf/1/model.onnx`: `y = Erf(x)`, an op the plan importer lacks.
fn erf_model(repository: &std::path::Path) {
    let dir = repository.join("erf").join("1");
    std::fs::create_dir_all(&dir).unwrap();
    let script = "import onnx, sys\n\
         from onnx import helper as h, TensorProto as T\n\
         g = h.make_graph([h.make_node('Erf', ['x'], ['y'], name='the_erf')], 'g',\n\
             [h.make_tensor_value_info('x', T.FLOAT, ['N', 4])],\n\
             [h.make_tensor_value_info('y', T.FLOAT, ['N', 4])])\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)])\n\
         m.ir_version = 8\n\
         onnx.save(m, sys.argv[1])\n";
    let status = std::process::Command::new(tickserve_testing::python())
        .args(["-c", script])
        .arg(dir.join("model.onnx"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "writing erf failed (run scripts/setup.sh)"
    );
}

fn config(repository: &std::path::Path, engine: CpuEngineChoice) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = library();
    config.runtime.cpu_engine = engine;
    config
}

fn backend(runtime: &Runtime, model: &str) -> &'static str {
    runtime.model(model, None).unwrap().placements[0].backend
}

#[tokio::test]
async fn auto_compiles_what_it_imports_and_leaves_the_rest_on_onnx_runtime_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    copy_sample_model(dir.path(), "seq_lstm", None);
    erf_model(dir.path());
    let runtime = Runtime::load(&config(dir.path(), CpuEngineChoice::Auto)).unwrap();
    assert!(runtime.all_ready());
    assert_eq!(backend(&runtime, "alpha_mlp"), "tickserve_cpu");
    assert_eq!(backend(&runtime, "seq_lstm"), "tickserve_cpu");
    assert_eq!(backend(&runtime, "erf"), "onnxruntime");
    let note = runtime
        .model("erf", None)
        .unwrap()
        .engine_note
        .clone()
        .unwrap();
    assert!(
        note.contains("cannot import it") && note.contains("Erf"),
        "{note}"
    );
    assert!(
        runtime
            .model("alpha_mlp", None)
            .unwrap()
            .engine_note
            .is_none()
    );
    runtime
        .infer(request("alpha_mlp", "features", vec![1, 50], &[0.5; 50]))
        .await
        .unwrap();
    runtime
        .infer(request("erf", "x", vec![1, 4], &[0.5; 4]))
        .await
        .unwrap();
    runtime.shutdown();

    // A model's own `engine` overrides the server's.
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("engine = \"onnxruntime\"\n"));
    let runtime = Runtime::load(&config(dir.path(), CpuEngineChoice::Auto)).unwrap();
    assert_eq!(backend(&runtime, "alpha_mlp"), "onnxruntime");
    runtime.shutdown();
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("engine = \"auto\"\n"));
    let runtime = Runtime::load(&config(dir.path(), CpuEngineChoice::Onnxruntime)).unwrap();
    assert_eq!(backend(&runtime, "alpha_mlp"), "tickserve_cpu");
    runtime.shutdown();
}

#[tokio::test]
async fn compiled_fails_the_load_of_a_model_it_cannot_take_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    erf_model(dir.path());
    let runtime = Runtime::load(&config(dir.path(), CpuEngineChoice::Compiled)).unwrap();
    assert_eq!(backend(&runtime, "alpha_mlp"), "tickserve_cpu");
    let models = runtime.models();
    let Some(VersionState::Failed(reason)) = models["erf"].versions.values().next() else {
        panic!("erf loaded: {:?}", models["erf"].versions);
    };
    assert!(
        reason.contains("engine = \"compiled\"") && reason.contains("Erf"),
        "{reason}"
    );
    runtime.shutdown();
}

/// The compiled CPU engine with every run's first output float moved by 1e-3.
#[derive(Debug)]
struct Skewed(CpuEngine);

struct SkewedModel {
    inner: Box<dyn CompiledModel>,
    outputs: Vec<Vec<Vec<u8>>>,
}

impl Engine<ModelGraph> for Skewed {
    fn platform(&self) -> &'static str {
        "skewed"
    }
    fn backend(&self) -> &'static str {
        "skewed"
    }
    fn check(
        &self,
        graph: &ModelGraph,
        weights: Option<&[tickserve_core::Weight]>,
    ) -> Result<(), EngineError> {
        self.0.check(graph, weights)
    }
    fn compile(
        &self,
        request: &CompileRequest<'_, ModelGraph>,
    ) -> Result<Box<dyn CompiledModel>, EngineError> {
        let inner = self.0.compile(request)?;
        let outputs = (0..inner.buckets().sizes().len())
            .map(|b| {
                (0..inner.signature().outputs.len())
                    .map(|o| inner.output(b, o).to_vec())
                    .collect()
            })
            .collect();
        Ok(Box::new(SkewedModel { inner, outputs }))
    }
}

impl CompiledModel for SkewedModel {
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn buckets(&self) -> &tickserve_core::Buckets {
        self.inner.buckets()
    }
    fn device(&self) -> &str {
        "cpu"
    }
    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8] {
        self.inner.input_mut(bucket, input)
    }
    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        self.inner.run(bucket, member)?;
        for (o, out) in self.outputs[bucket].iter_mut().enumerate() {
            out.copy_from_slice(self.inner.output(bucket, o));
            let first = f32::from_le_bytes([out[0], out[1], out[2], out[3]]) + 1e-3;
            out[..4].copy_from_slice(&first.to_le_bytes());
        }
        Ok(())
    }
    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        &self.outputs[bucket][output]
    }
    fn add_member(
        &mut self,
        member: MemberId,
        weights: &[tickserve_core::Weight],
    ) -> Result<(), EngineError> {
        self.inner.add_member(member, weights)
    }
    fn remove_member(&mut self, member: MemberId) {
        self.inner.remove_member(member);
    }
}

#[tokio::test]
async fn a_compiled_engine_that_answers_differently_is_kept_off_naming_the_element() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    let ort = Arc::new(
        OrtEngine::new(
            &library(),
            OrtOptions {
                intra_op_threads: 1,
            },
        )
        .unwrap(),
    );
    let engines = Engines::new(ort.clone(), ort, Gpus::Absent("test".into()))
        .with_compiled(Arc::new(Skewed(CpuEngine::new())));
    let runtime = Runtime::load_with(&config(dir.path(), CpuEngineChoice::Auto), engines).unwrap();
    assert_eq!(backend(&runtime, "alpha_mlp"), "onnxruntime");
    let note = runtime
        .model("alpha_mlp", None)
        .unwrap()
        .engine_note
        .clone()
        .unwrap();
    assert!(
        note.contains("answers differently from ONNX Runtime")
            && note.contains("output 'probabilities'")
            && note.contains("element 0"),
        "{note}"
    );
    runtime.shutdown();
}
