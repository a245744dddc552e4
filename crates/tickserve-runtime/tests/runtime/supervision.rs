//! Supervised executors, with faults injected by a test engine wrapped around
//! the real ONNX Runtime engine: a row whose first feature is [`PANIC`] makes
//! the engine panic, one whose first feature is [`LOSE_DEVICE`] makes it
//! report its device lost.
//!
//! A panic fails only the request that caused it (the other requests of its
//! batch run again alone and get their predictions), the executor goes on,
//! and the model stays ready. A lost device makes its family's models not
//! ready (they answer UNAVAILABLE, the index says why); reloading a model
//! founds a new family rather than joining the dead one.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use tickserve_core::config::ServerConfig;
use tickserve_core::{Buckets, CompileRequest, Engine, EngineError, Error, InferRequest};
use tickserve_engine_cuda::Gpus;
use tickserve_onnx::ModelGraph;
use tickserve_runtime::Engines;
use tickserve_runtime::ModelQueue;
use tickserve_runtime::testing::{Executor, FamilyLinks};
use tickserve_runtime::testing::{FamilyRows, Ticket};
use tickserve_runtime::testing::{Job, Submission};
use tickserve_runtime::testing::{Member, RetiredLog, Version};
use tickserve_runtime::{ModelStats, Runtime};

use crate::support;
use support::{HookedEngine, copy_sample_model, hooked_engine, library, request, root};

/// A first feature that makes the engine panic.
const PANIC: f32 = 7777.0;
/// A first feature that makes the engine report its device lost.
const LOSE_DEVICE: f32 = 6666.0;

/// ONNX Runtime, panicking on a [`PANIC`] row and losing its device on a
/// [`LOSE_DEVICE`] row.
fn faulty_engine() -> Arc<HookedEngine> {
    hooked_engine(Arc::new(|firsts: &[f32]| {
        if firsts.contains(&PANIC) {
            panic!("a poisoned row (injected)");
        }
        if firsts.contains(&LOSE_DEVICE) {
            return Err(EngineError::DeviceLost("injected".to_string()));
        }
        Ok(())
    }))
}

/// A runtime over a scratch copy of the sample models `models`, on the faulty engine.
fn runtime(
    models: &[&str],
    adjust: impl FnOnce(&mut ServerConfig),
) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for name in models {
        copy_sample_model(dir.path(), name, None);
    }
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    adjust(&mut config);
    let engine = faulty_engine();
    let engines = Engines::new(engine.clone(), engine, Gpus::Absent("test".into()));
    (Runtime::load_with(&config, engines).unwrap(), dir)
}

/// One request of a row per entry of `firsts`: that first feature, then a ramp.
fn rows(model: &str, width: usize, firsts: &[f32]) -> InferRequest {
    let values: Vec<f32> = firsts
        .iter()
        .flat_map(|&first| std::iter::once(first).chain((1..width).map(|i| i as f32 / 64.0)))
        .collect();
    request(
        model,
        "features",
        vec![firsts.len() as i64, width as i64],
        &values,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_run_fails_only_its_request_and_the_model_stays_ready() {
    let (runtime, _dir) = runtime(&["alpha_mlp"], |_| {});
    let alone = runtime.infer(rows("alpha_mlp", 50, &[0.5])).await.unwrap();
    // On the caller's thread (run at once) and on the executor thread (too
    // many rows to run at once), a panic is an INTERNAL answer, nothing more.
    for firsts in [vec![PANIC], vec![PANIC; 200]] {
        let error = runtime
            .infer(rows("alpha_mlp", 50, &firsts))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::Internal { message, .. } if message.contains("panicked")),
            "{error:?}"
        );
        let again = runtime.infer(rows("alpha_mlp", 50, &[0.5])).await.unwrap();
        assert_eq!(again.outputs, alone.outputs, "served as before");
    }
    let handle = runtime.model("alpha_mlp", None).unwrap();
    assert!(handle.is_ready());
    assert!(runtime.index().unwrap().iter().all(|e| e.state == "READY"));
    runtime.shutdown();
}

#[test]
fn the_other_requests_of_a_batch_with_a_panicking_row_get_their_predictions() {
    let (runtime, _dir) = runtime(&["alpha_mlp"], |_| {});
    let handle = runtime.model("alpha_mlp", None).unwrap();
    let signature = handle.signature.clone();
    // The same graph compiled by hand on the faulty engine, driven directly
    // with one batch of three requests, the middle one poisoned.
    let engine = faulty_engine();
    let onnx = std::fs::read(root().join("config/models/alpha_mlp/1/model.onnx")).unwrap();
    let onnx = tickserve_onnx::OnnxModel::parse(&onnx).unwrap();
    let graph = ModelGraph {
        signature: onnx.signature(&Default::default()).unwrap(),
        onnx,
    };
    let buckets = Buckets::new(&[1, 4], None).unwrap();
    let model = Engine::compile(
        engine.as_ref(),
        &CompileRequest {
            family: "test",
            graph: &graph,
            buckets: &buckets,
            weights: None,
            device: tickserve_core::Device::Cpu,
            check: false,
            resident: None,
        },
    )
    .unwrap();
    let links = FamilyLinks {
        family_key: "test".into(),
        retired: Arc::new(RetiredLog::default()),
        runs: Arc::new(AtomicU64::new(0)),
        health: Arc::default(),
    };
    let mut executor = Executor::new(model, links.clone(), 0);
    let queue = Arc::new(ModelQueue::new(
        "alpha_mlp",
        64,
        1 << 20,
        &Default::default(),
    ));
    let member = Arc::new(Member::new(
        0,
        Version {
            name: "alpha_mlp".into(),
            version: "1".into(),
            stats: Arc::new(ModelStats::new(2)),
            queue: Arc::clone(&queue),
        },
        buckets.sizes(),
        tickserve_core::Device::Cpu,
        Arc::clone(&links.retired),
    ));
    let family_rows = Arc::new(FamilyRows::default());
    let mut answers = Vec::new();
    let mut jobs = Vec::new();
    for first in [0.5, PANIC, 0.25] {
        let request = rows("alpha_mlp", 50, &[first]);
        let valid =
            tickserve_core::validate::validate(&request, &signature, &handle.settings.limits)
                .unwrap();
        let (reply, answer) = tokio::sync::oneshot::channel();
        jobs.push(Job {
            member: Arc::clone(&member),
            submission: Submission {
                request: valid,
                id: format!("{first}"),
                admitted: Instant::now(),
                deadline: None,
                level: 1,
                delay_at: None,
            },
            ticket: Ticket::admit(&queue, &family_rows, 1, 200, 1).unwrap(),
            reply,
        });
        answers.push(answer);
    }
    executor.answer_batch(&mut jobs);
    let results: Vec<_> = answers
        .into_iter()
        .map(|mut a| a.try_recv().expect("every caller is answered"))
        .collect();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(&results[1], Err(Error::Internal { .. })),
        "{:?}",
        results[1]
    );
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert!(links.health.failure().is_none(), "a panic is not fatal");
    drop(executor);
    runtime.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_device_makes_its_family_not_ready_until_a_reload() {
    let (runtime, _dir) = runtime(&["tick_000", "tick_001"], |_| {});
    let tick = |name: &str, first: f32| rows(name, 16, &[first]);
    runtime.infer(tick("tick_000", 0.5)).await.unwrap();
    let error = runtime
        .infer(tick("tick_000", LOSE_DEVICE))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Internal { .. }), "{error:?}");
    // Both members of the family stop: not ready, UNAVAILABLE with the reason.
    for name in ["tick_000", "tick_001"] {
        let handle = runtime.model(name, None).unwrap();
        assert!(!handle.is_ready(), "{name}");
        let error = runtime.infer(tick(name, 0.5)).await.unwrap_err();
        assert!(
            matches!(&error, Error::ModelNotReady { reason, .. } if reason.contains("device lost")),
            "{name}: {error:?}"
        );
    }
    let index = runtime.index().unwrap();
    assert!(
        index
            .iter()
            .all(|e| e.state == "UNAVAILABLE" && e.reason.contains("device lost")),
        "{index:?}"
    );
    // A reload founds a new family instead of joining the dead one.
    runtime.load_model("tick_000").unwrap();
    assert!(runtime.model("tick_000", None).unwrap().is_ready());
    runtime.infer(tick("tick_000", 0.5)).await.unwrap();
    assert!(!runtime.model("tick_001", None).unwrap().is_ready());
    runtime.load_model("tick_001").unwrap();
    runtime.infer(tick("tick_001", 0.5)).await.unwrap();
    runtime.shutdown();
}
