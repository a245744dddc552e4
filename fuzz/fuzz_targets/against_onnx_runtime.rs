//! Fuzzes the compiled CPU engine against ONNX Runtime
//! (`tickserve_runtime::engine_check::fuzz_against_onnx_runtime`): a random tree ensemble
//! or dense network (`tickserve_engine_cpu::fuzzing::models`) built from the bytes, put
//! through the load-time check the server runs before it lets the compiled engine take a
//! model (both engines compile it for one row and for three, run the same rows, every
//! output within 1e-5, labels equal). A difference, a failed run, or a dense network the
//! compiled engine refuses is a crash; a forest either engine refuses (PROBIT, the class
//! layouts ONNX Runtime leaves undefined) is not.
//!
//! Needs ONNX Runtime: `scripts/setup.sh` installs it into .local/lib.
#![no_main]

use std::sync::OnceLock;

use tickserve_engine_ort::{OrtEngine, OrtOptions};

static ONNX_RUNTIME: OnceLock<OrtEngine> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let ort = ONNX_RUNTIME.get_or_init(|| {
        OrtEngine::new(
            &tickserve_testing::onnxruntime_library(),
            OrtOptions {
                intra_op_threads: 1,
            },
        )
        .expect("ONNX Runtime in .local/lib (scripts/setup.sh)")
    });
    tickserve_runtime::engine_check::fuzz_against_onnx_runtime(ort, data);
});
