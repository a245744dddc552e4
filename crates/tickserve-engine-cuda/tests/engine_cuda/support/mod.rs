//! What the engine's tests share: the repository root, reading a model, and
//! the fixture repository, and a family's members made from one model.

#![allow(clippy::unwrap_used, dead_code)]

pub mod members;

use std::path::{Path, PathBuf};

use tickserve_onnx::OnnxModel;

pub use tickserve_testing::root;

/// Parses the ONNX file at `path`.
pub fn read(path: &Path) -> OnnxModel {
    OnnxModel::parse(&std::fs::read(path).unwrap()).unwrap()
}

/// The Python that writes the fixtures: `TICKSERVE_PYTHON`, else the
/// project's `.venv` (scripts/setup.sh), else `python3` (the GPU machine's,
/// which has onnx and numpy).
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("TICKSERVE_PYTHON") {
        return python.into();
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// `scripts/dev/make_models.py --fixtures` into a temporary directory; fails the
/// test, saying which Python it ran, where that Python lacks onnx or numpy
/// (run scripts/setup.sh, or set `TICKSERVE_PYTHON`).
pub fn fixtures() -> tempfile::TempDir {
    made("--fixtures")
}

/// The per-tick benchmark's models (`make_models.py --bench`: `bench_lstm`
/// and the rest) in a temporary repository.
pub fn bench_models() -> tempfile::TempDir {
    made("--bench")
}

/// The one-tick recurrent models (`make_models.py --steps`: `gru_step`,
/// `gru_step_reset0`) in a temporary repository.
pub fn step_models() -> tempfile::TempDir {
    made("--steps")
}

/// What `make_models.py FLAG DIR` writes, in a temporary directory.
fn made(flag: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let python = python();
    let output = std::process::Command::new(&python)
        .arg(root().join("scripts/dev/make_models.py"))
        .arg(flag)
        .arg(dir.path())
        .output();
    match output {
        Ok(out) if out.status.success() => dir,
        Ok(out) => panic!(
            "{} scripts/dev/make_models.py {flag} failed (run scripts/setup.sh, or set \
             TICKSERVE_PYTHON to a Python with onnx and numpy): {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "{} cannot run (run scripts/setup.sh, or set TICKSERVE_PYTHON): {e}",
            python.display()
        ),
    }
}

/// Little-endian bytes as floats.
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// ONNX Runtime (`.local/lib`, one thread), as the tests compare with.
pub fn onnx_runtime() -> tickserve_engine_ort::OrtEngine {
    tickserve_engine_ort::OrtEngine::new(
        &root().join(".local/lib/libonnxruntime.so.1.31.1"),
        tickserve_engine_ort::OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh")
}

/// `model`'s outputs from ONNX Runtime on `inputs` (one per input, `rows`
/// rows each).
pub fn onnx_runtime_outputs(
    engine: &tickserve_engine_ort::OrtEngine,
    model: &OnnxModel,
    signature: &tickserve_onnx::PartialSignature,
    inputs: &[Vec<f32>],
    rows: usize,
) -> Vec<Vec<f32>> {
    use tickserve_core::CompiledModel;
    let mut ort = engine
        .compile(&tickserve_engine_ort::OrtCompileRequest {
            family: "test",
            onnx: model,
            signature,
            buckets: &tickserve_core::Buckets::new(&[rows], None).unwrap(),
            weights: None,
        })
        .unwrap();
    for (i, data) in inputs.iter().enumerate() {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        ort.input_mut(0, i).copy_from_slice(&bytes);
    }
    ort.run(0, tickserve_core::SOLE_MEMBER).unwrap();
    (0..ort.signature().outputs.len())
        .map(|o| floats(ort.output(0, o)))
        .collect()
}

/// `source` built by the host's C++ compiler (C++20, -O1) into a shared
/// library and loaded, with the directory that holds it: the emulated
/// kernels' host build. Fails the test with the compiler's message and the
/// source.
pub fn host_library(source: &str) -> (libloading::Library, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (cpp, so) = (dir.path().join("module.cpp"), dir.path().join("module.so"));
    std::fs::write(&cpp, source).unwrap();
    let built = std::process::Command::new("c++")
        .args([
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-w",
            "-o",
        ])
        .arg(&so)
        .arg(&cpp)
        .output()
        .expect("a C++ compiler (c++) runs");
    assert!(
        built.status.success(),
        "{}\n{source}",
        String::from_utf8_lossy(&built.stderr)
    );
    // SAFETY: a library this test just built; its initialisers do nothing.
    let library = unsafe { libloading::Library::new(&so) }.unwrap();
    (library, dir)
}
