//! The forest fuzzing entry point (`tickserve_engine_cpu::fuzzing::forest`) on
//! stable: the committed corpus (`fuzz/corpus/forest/`, every finding once added
//! there) and a few thousand seeded byte strings, each a forest and rows the
//! compiled walk must answer as the plain walk does. The fuzzing itself is
//! `cargo +nightly fuzz run forest` (docs/testing.md).

use std::path::Path;

use tickserve_engine_cpu::fuzzing;

#[test]
fn the_forest_corpus_and_seeded_forests_answer_as_the_plain_walk() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/forest");
    let mut count = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| fuzzing::forest(&data));
        assert!(outcome.is_ok(), "{} failed", path.display());
        count += 1;
    }
    assert!(count > 0, "no corpus in {}", dir.display());
    // Seeded bytes (a 64-bit LCG): shapes the corpus may not hold.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for case in 0..3000 {
        let len = 16 + case % 400;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 56) as u8
            })
            .collect();
        let outcome = std::panic::catch_unwind(|| fuzzing::forest(&data));
        assert!(outcome.is_ok(), "seeded case {case} failed: {data:?}");
    }
}
