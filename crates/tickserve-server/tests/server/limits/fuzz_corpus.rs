//! Replays the committed fuzzing corpus (`fuzz/corpus/<target>/`) through the
//! fuzzing entry points on stable: every input, and every finding once it is
//! added there, must run without a panic. The fuzzing itself is
//! `cargo +nightly fuzz run <target>` (docs/testing.md).

use std::path::Path;

use tickserve_server::fuzzing;

fn replay(target: &str, entry: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut count = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| entry(&data));
        assert!(outcome.is_ok(), "{target}: {} panicked", path.display());
        count += 1;
    }
    count
}

#[test]
fn the_fuzzing_corpus_runs_without_a_panic() {
    for (target, entry) in [
        ("http_json", fuzzing::http_json as fn(&[u8])),
        ("http_binary", fuzzing::http_binary),
        ("grpc_request", fuzzing::grpc_request),
        ("grpc_answer", fuzzing::grpc_answer),
        ("config", fuzzing::config),
        ("shm_request", fuzzing::shm_request),
        ("tf_json", fuzzing::tf_json),
        ("tf_tensor", fuzzing::tf_tensor),
        ("sequence_snapshot", fuzzing::sequence_snapshot),
        ("model_file", fuzzing::model_file),
    ] {
        let count = replay(target, entry);
        assert!(count > 0, "{target}: no corpus");
        println!("{target}: {count} inputs");
    }
}
