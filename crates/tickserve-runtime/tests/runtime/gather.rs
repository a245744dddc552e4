//! A front-end thread's round (`tickserve_runtime::gather::Round`): requests
//! of the round polled before it runs park at their family and then run together, in
//! one bucket run, on an idle executor, on this thread; with the family's
//! executor busy they go through its queue instead and are answered there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tickserve_core::{Error, InferResponse};
use tickserve_runtime::Runtime;
use tickserve_runtime::gather::Round;

use crate::support;
use support::gate::{HOLD, OpenOnDrop, gated_runtime_with, row, stop};

type Answer<'a> = Pin<Box<dyn Future<Output = Result<InferResponse, Error>> + Send + 'a>>;

/// The round's requests: one `alpha_mlp` row each, first features 1, 2, ...
fn round<'a>(runtime: &'a Runtime, gathering: &'a Round, requests: usize) -> Vec<Answer<'a>> {
    (1..=requests)
        .map(|i| Box::pin(runtime.infer_in(row(0, i as f32), gathering)) as Answer<'_>)
        .collect()
}

fn poll_once(answer: &mut Answer<'_>) -> Poll<Result<InferResponse, Error>> {
    answer
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn runs(runtime: &Runtime) -> u64 {
    let handle = runtime.model("alpha_mlp", None).unwrap();
    handle.stats.snapshot().execution_count
}

/// Each answer's first output, as floats.
fn values(answer: &InferResponse) -> Vec<f32> {
    answer.outputs[0]
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_requests_park_and_run_together_on_this_thread() {
    let (runtime, gate, _dir) = gated_runtime_with("", |_| {});
    gate.open();
    let mut alone = Vec::new();
    for i in 1..=5 {
        alone.push(runtime.infer(row(0, i as f32)).await.unwrap());
    }
    let before = runs(&runtime);
    let gathering = Round::new();
    let mut answers = round(&runtime, &gathering, 5);
    for (i, answer) in answers.iter_mut().enumerate() {
        assert!(poll_once(answer).is_pending(), "request {i} ran alone");
    }
    assert_eq!(gathering.run(), 5, "answered on this thread");
    for (i, answer) in answers.iter_mut().enumerate() {
        let Poll::Ready(Ok(answer)) = poll_once(answer) else {
            panic!("request {i} was not answered by the round's run");
        };
        for (g, w) in values(&answer).iter().zip(values(&alone[i])) {
            assert!(
                (g - w).abs() <= 1e-5,
                "request {i}: {g} in the round, {w} alone"
            );
        }
    }
    assert_eq!(runs(&runtime) - before, 1, "five rows, one run");
    drop(answers);
    stop(runtime);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_executor_busy_a_rounds_requests_go_through_the_queue() {
    let (runtime, gate, _dir) = gated_runtime_with("", |_| {});
    let _open = OpenOnDrop(Arc::clone(&gate));
    // A request runs at once on a worker thread and holds the executor.
    let held = tokio::spawn({
        let runtime = Arc::clone(&runtime);
        async move { runtime.infer(row(0, HOLD)).await }
    });
    gate.wait_for(1);
    let gathering = Round::new();
    let mut answers = round(&runtime, &gathering, 3);
    for answer in &mut answers {
        assert!(poll_once(answer).is_pending());
    }
    assert_eq!(gathering.run(), 0, "no idle executor: nothing runs here");
    for answer in &mut answers {
        assert!(
            poll_once(answer).is_pending(),
            "answered before the executor was free"
        );
    }
    gate.open();
    held.await.unwrap().unwrap();
    for answer in answers {
        let answer = answer.await.unwrap();
        assert_eq!(answer.outputs[0].shape, vec![1, 3]);
    }
    stop(runtime);
}

/// A round of exactly as many one-row requests as the family may run on a
/// caller's thread runs in one bucket run on this thread: a run takes rows
/// up to the cap, not one short of it. One more request is answered too, in
/// a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_at_the_inline_cap_runs_once_and_one_more_row_runs_twice() {
    let (runtime, gate, _dir) = gated_runtime_with("", |_| {});
    gate.open();
    let cap = runtime.model("alpha_mlp", None).unwrap().inline_rows();
    assert!(cap >= 2, "alpha_mlp runs {cap} rows on a caller's thread");
    for (requests, want_runs) in [(cap, 1), (cap + 1, 2)] {
        let before = runs(&runtime);
        let gathering = Round::new();
        let mut answers = round(&runtime, &gathering, requests);
        for answer in answers.iter_mut() {
            assert!(poll_once(answer).is_pending());
        }
        gathering.run();
        for (i, answer) in answers.iter_mut().enumerate() {
            if requests == cap {
                assert!(
                    matches!(poll_once(answer), Poll::Ready(Ok(_))),
                    "request {i} of a round at the cap ({cap}) was not answered by its run"
                );
            } else {
                let answered = tokio::time::timeout(std::time::Duration::from_secs(10), answer);
                assert!(
                    matches!(answered.await, Ok(Ok(_))),
                    "request {i} of {requests}"
                );
            }
        }
        assert_eq!(
            runs(&runtime) - before,
            want_runs,
            "{requests} one-row requests with a cap of {cap}"
        );
    }
    stop(runtime);
}

/// A round whose requests interleave two families (`alpha_mlp`, `tick_000`):
/// each family takes its own requests out of the round, in arrival order,
/// and every request is answered as it is alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_of_two_families_runs_each_familys_own_requests() {
    let dir = tempfile::tempdir().unwrap();
    support::copy_sample_model(dir.path(), "alpha_mlp", None);
    support::copy_sample_model(dir.path(), "tick_000", None);
    let mut config = tickserve_core::config::ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = support::library();
    let runtime = Runtime::load(&config).unwrap();
    let tick = |first: f32| {
        let values: Vec<f32> = std::iter::once(first)
            .chain((1..16).map(|i| i as f32 / 32.0))
            .collect();
        support::request("tick_000", "features", vec![1, 16], &values)
    };
    let requests: Vec<_> = (1..=6)
        .map(|i| {
            if i % 2 == 1 {
                row(0, i as f32)
            } else {
                tick(i as f32)
            }
        })
        .collect();
    let mut alone = Vec::new();
    for request in &requests {
        alone.push(runtime.infer(request.clone()).await.unwrap());
    }
    let gathering = Round::new();
    let mut answers: Vec<Answer<'_>> = requests
        .iter()
        .map(|request| Box::pin(runtime.infer_in(request.clone(), &gathering)) as Answer<'_>)
        .collect();
    for (i, answer) in answers.iter_mut().enumerate() {
        assert!(poll_once(answer).is_pending(), "request {i} ran alone");
    }
    assert_eq!(gathering.run(), 6, "answered on this thread");
    for (i, answer) in answers.iter_mut().enumerate() {
        let Poll::Ready(Ok(answer)) = poll_once(answer) else {
            panic!("request {i} was not answered by the round's runs");
        };
        assert_eq!(
            answer.outputs[0].name, alone[i].outputs[0].name,
            "request {i}"
        );
        for (g, w) in values(&answer).iter().zip(values(&alone[i])) {
            assert!(
                (g - w).abs() <= 1e-5,
                "request {i}: {g} in the round, {w} alone"
            );
        }
    }
    drop(answers);
    runtime.shutdown();
}
