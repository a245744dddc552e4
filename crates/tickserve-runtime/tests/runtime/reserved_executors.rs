//! Executors reserved for level 1 (`priority.reserved_executors`): lower
//! levels never run on them, so a level-1 request finds one free while lower
//! levels hold every other executor. Runs are held open at a gate
//! (`support::gate`).

use std::sync::Arc;
use std::time::Duration;

use tickserve_runtime::{Runtime, VersionState};

use crate::support;
use support::gate::{HOLD, gated_runtime as runtime, row, stop};

/// Two executors and two levels; one-row buckets, so that each request is a
/// run of its own (two held requests can never share one run).
/// Two level-2 requests whose runs hold at the gate, sent at once.
fn two_held_level_two_requests(
    runtime: &Arc<Runtime>,
) -> Vec<tokio::task::JoinHandle<Result<tickserve_core::InferResponse, tickserve_core::Error>>> {
    (0..2)
        .map(|_| {
            let runtime = Arc::clone(runtime);
            tokio::spawn(async move { runtime.infer(row(2, HOLD)).await })
        })
        .collect()
}

/// Waits for `held` and checks each was answered.
async fn answered(
    held: Vec<
        tokio::task::JoinHandle<Result<tickserve_core::InferResponse, tickserve_core::Error>>,
    >,
) {
    for task in held {
        task.await.unwrap().unwrap();
    }
}

const TWO_LEVELS: &str = r#"
executors = 2
buckets = [1]
[priority]
priority_levels = 2
default_priority_level = 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_levels_never_take_the_reserved_executor_and_level_one_finds_it_free() {
    let (runtime, gate, _dir) = runtime(&format!("{TWO_LEVELS}reserved_executors = 1\n"));
    // Two level-2 requests whose runs hold: one executor is not theirs, so
    // only one runs, and the other waits for it.
    let held = two_held_level_two_requests(&runtime);
    gate.wait_for(1);
    // A fixed wait: the test shows that something does NOT happen (the
    // second level-2 run never takes the reserved executor), which no
    // event can signal; the executors run on their own OS threads, so a
    // paused clock would not stand for their time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gate.held(), 1, "a level-2 run took the reserved executor");
    // Level 1 is answered while level 2 holds the shared executor.
    let level_one = tokio::time::timeout(Duration::from_secs(10), runtime.infer(row(1, 0.5)))
        .await
        .expect("level 1 waited behind level 2's held run")
        .unwrap();
    assert_eq!(level_one.outputs.len(), 1);
    gate.open();
    answered(held).await;
    stop(runtime);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_reservation_lower_levels_take_every_executor() {
    let (runtime, gate, _dir) = runtime(TWO_LEVELS);
    let held = two_held_level_two_requests(&runtime);
    gate.wait_for(2);
    gate.open();
    answered(held).await;
    stop(runtime);
}

#[test]
fn a_reservation_must_leave_lower_levels_an_executor_and_needs_levels() {
    for (model_toml, expected) in [
        (
            format!("{TWO_LEVELS}reserved_executors = 2\n"),
            "priority.reserved_executors (2) must be below executors (2)",
        ),
        (
            "executors = 2\n[priority]\nreserved_executors = 1\n".to_string(),
            "need priority_levels",
        ),
    ] {
        let (runtime, _gate, _dir) = runtime(&model_toml);
        let models = runtime.models();
        let Some((_, VersionState::Failed(reason))) = models["alpha_mlp"].default_version() else {
            panic!("alpha_mlp loaded with {model_toml}")
        };
        assert!(reason.contains(expected), "{reason}");
        stop(runtime);
    }
}
