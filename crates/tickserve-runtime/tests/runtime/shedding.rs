//! Shedding answers at once: while the only executor is held at the gate
//! (so nothing served can finish), a request the queue has no room for is
//! refused with QUEUE_FULL, without waiting for the held run. (The server's
//! `tests/shedding.rs` floods real servers; this is the deterministic check
//! that the refusal never waits.)

use std::time::{Duration, Instant};

use tickserve_core::Error;

use crate::support;
use support::gate::{HOLD, gated_runtime, row, stop};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_while_the_executor_is_still_held() {
    // One executor, one-row runs, room for one queued row.
    let (runtime, gate, _dir) =
        gated_runtime("executors = 1\nbuckets = [1]\nmax_request_rows = 1\nmax_queue_rows = 1\n");
    let running = tokio::spawn({
        let runtime = std::sync::Arc::clone(&runtime);
        async move { runtime.infer(row(0, HOLD)).await }
    });
    gate.wait_for(1);
    let queued = tokio::spawn({
        let runtime = std::sync::Arc::clone(&runtime);
        async move { runtime.infer(row(0, 0.5)).await }
    });
    let handle = runtime.model("alpha_mlp", None).unwrap();
    let started = Instant::now();
    while handle.queue.rows() < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the second request never queued"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The queue is full and the executor held: the refusal cannot have
    // waited for any run to finish, since none can until the gate opens.
    let refused = tokio::time::timeout(Duration::from_secs(10), runtime.infer(row(0, 0.5)))
        .await
        .expect("a request the queue has no room for waited instead of being refused");
    assert!(
        matches!(refused, Err(Error::QueueFull { .. })),
        "{refused:?}"
    );
    assert_eq!(gate.held(), 1, "refused while the run is still held");
    gate.open();
    running.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    stop(runtime);
}
