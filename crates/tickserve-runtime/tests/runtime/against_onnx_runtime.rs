//! The fuzz target `against_onnx_runtime` on stable: its committed corpus
//! (`fuzz/corpus/against_onnx_runtime`) and 100 seeded byte strings, each a
//! random tree ensemble or dense network put through the load-time check on
//! the compiled CPU engine against ONNX Runtime
//! (`engine_check::fuzz_against_onnx_runtime`: a difference panics).

use tickserve_engine_ort::{OrtEngine, OrtOptions};
use tickserve_runtime::engine_check::fuzz_against_onnx_runtime;
use tickserve_testing::{onnxruntime_library, root};

#[test]
fn the_corpus_and_seeded_models_answer_as_onnx_runtime_does() {
    let ort = OrtEngine::new(
        &onnxruntime_library(),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh");
    let corpus = root().join("fuzz/corpus/against_onnx_runtime");
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&corpus)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(inputs.len() >= 50, "the corpus: {} inputs", inputs.len());
    // Seeded strings of 64 to 2,048 bytes (xorshift).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..100 {
        let len = 64 + (next() % 1985) as usize;
        inputs.push((0..len).map(|_| next() as u8).collect());
    }
    for input in &inputs {
        fuzz_against_onnx_runtime(&ort, input);
    }
}
