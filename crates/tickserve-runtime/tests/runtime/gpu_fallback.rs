//! A GPU the model cannot compile on (here the real CUDA engine, told of a
//! `gpu:0` on a machine whose CUDA libraries do not load): a model that
//! `auto` placed there runs on the CPU instead and answers;
//! a model whose configuration names `gpu:0` fails its load, saying which GPU
//! and why, and the server still starts.

use std::sync::Arc;

use tickserve_core::config::{Placement, ServerConfig};
use tickserve_engine_cuda::{CudaEngine, CudaOptions, GpuInfo, Gpus};
use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_runtime::{Engines, Runtime};

use crate::support;
use support::{copy_sample_model, library, request};

/// The sample `alpha_mlp` placed on `devices`, on engines that believe in a
/// `gpu:0` this machine cannot use.
fn runtime(devices: Vec<Placement>, repository: &std::path::Path) -> Runtime {
    let mut config = ServerConfig::default();
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = library();
    config.model_defaults.devices = devices;
    let ort = OrtEngine::new(
        &library(),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .unwrap();
    let gpus = Gpus::Present(vec![GpuInfo {
        ordinal: 0,
        name: "a GPU whose libraries do not load".into(),
        memory: 1 << 30,
        capability: (9, 0),
        multiprocessors: 132,
    }]);
    let engines = Engines::new(
        Arc::new(ort),
        Arc::new(CudaEngine::new(CudaOptions::default())),
        gpus,
    );
    Runtime::load_with(&config, engines).unwrap()
}

#[tokio::test]
async fn auto_gives_way_to_the_cpu_when_the_gpu_fails_to_compile_and_a_named_gpu_fails_the_load() {
    if !Gpus::probe().devices().is_empty() {
        // On a GPU machine the engine compiles: nothing fails to fall back from.
        eprintln!("this machine's GPU compiles models; the fallback is tested where it cannot");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);

    let auto = runtime(vec![Placement::Auto], dir.path());
    assert!(auto.all_ready());
    assert_eq!(auto.model("alpha_mlp", None).unwrap().device, "cpu");
    let answer = auto
        .infer(request("alpha_mlp", "features", vec![1, 50], &[0.5; 50]))
        .await
        .unwrap();
    assert_eq!(answer.outputs[0].shape, vec![1, 3]);
    auto.shutdown();

    let named = runtime(vec![Placement::Gpu(0)], dir.path());
    assert!(!named.all_ready());
    let index = named.index().unwrap();
    let entry = index.iter().find(|e| e.name == "alpha_mlp").unwrap();
    assert_eq!(entry.state, "UNAVAILABLE");
    assert!(
        entry.reason.contains("gpu:0") && entry.reason.contains("CUDA"),
        "the reason names the GPU and what failed: {}",
        entry.reason
    );
    named.shutdown();
}
