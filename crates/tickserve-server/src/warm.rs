//! Before the server reports ready, every async worker thread (the threads
//! a one-row request runs at once on) runs every model once: the first
//! request then finds the engine's per-thread state made and its code and
//! data in this thread's reach (docs/performance.md, "Sparse traffic").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tickserve_edge::Edge;

/// How long each warm-up task waits for the others to hold a worker of
/// their own before it runs anyway.
const GATHER: Duration = Duration::from_millis(100);

/// Runs [`tickserve_runtime::Runtime::warm_here`] once on each of the async runtime's worker
/// threads. Each task holds its worker until every task has one, so no two
/// share a worker (unless a worker stays busy past [`GATHER`]: then some
/// worker runs it twice and one not at all, which costs its first request
/// only what it cost before).
#[allow(clippy::disallowed_methods)] // warming waits at most a while of the machine's time
pub async fn workers(edge: &Arc<Edge>) {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let arrived = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (edge, arrived) = (Arc::clone(edge), Arc::clone(&arrived));
        tasks.spawn(async move {
            arrived.fetch_add(1, Ordering::AcqRel);
            let until = Instant::now() + GATHER;
            while arrived.load(Ordering::Acquire) < workers && Instant::now() < until {
                std::thread::yield_now();
            }
            edge.runtime.warm_here();
        });
    }
    while tasks.join_next().await.is_some() {}
}
