//! Executors reserved for level 1 (`priority.reserved_executors`): lower
//! levels never run on them, so a level-1 request finds one free while lower
//! levels hold every other executor. Runs are held open by a test engine
//! wrapped around the real ONNX Runtime engine: a row whose first feature is
//! [`HOLD`] waits at a gate until the test opens it.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tickserve_core::InferRequest;
use tickserve_core::config::ServerConfig;
use tickserve_engine_cuda::Gpus;
use tickserve_runtime::Engines;
use tickserve_runtime::{Runtime, VersionState};

mod common;
use common::{copy_sample_model, hooked_engine, library, request};

/// A first feature that holds its run at the gate.
const HOLD: f32 = 5555.0;

/// Where held runs wait, and how many are waiting.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    held: AtomicUsize,
}

impl Gate {
    fn pass(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits (at most 10 s) until `count` runs are held.
    fn wait_for(&self, count: usize) {
        let started = Instant::now();
        while self.held() < count && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(self.held(), count, "runs held at the gate");
    }
}

/// `alpha_mlp` with `model_toml`, on the gated engine; every request goes
/// through an executor thread (nothing runs on the caller's).
fn runtime(model_toml: &str) -> (Arc<Runtime>, Arc<Gate>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some(model_toml));
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    config.runtime.inline_budget = Duration::ZERO;
    let gate = Arc::new(Gate::default());
    let engine = hooked_engine({
        let gate = Arc::clone(&gate);
        Arc::new(move |firsts: &[f32]| {
            if firsts.first() == Some(&HOLD) {
                gate.pass();
            }
            Ok(())
        })
    });
    let engines = Engines::new(engine.clone(), engine, Gpus::Absent("test".into()));
    (
        Arc::new(Runtime::load_with(&config, engines).unwrap()),
        gate,
        dir,
    )
}

/// Shuts `runtime` down once the test's tasks have let go of it.
fn stop(runtime: Arc<Runtime>) {
    Arc::try_unwrap(runtime)
        .ok()
        .expect("the tasks are done")
        .shutdown();
}

/// A one-row `alpha_mlp` request at `priority` whose first feature is `first`.
fn row(priority: u64, first: f32) -> InferRequest {
    let values: Vec<f32> = std::iter::once(first)
        .chain((1..50).map(|i| i as f32 / 64.0))
        .collect();
    let mut request = request("alpha_mlp", "features", vec![1, 50], &values);
    request.priority = priority;
    request
}

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
