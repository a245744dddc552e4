//! Sequences handed between replicas (`runtime.handoff_directory`): while
//! the server serves, what other replicas ask of it is handed over every
//! [`ASKED_POLL`]; at a drain, every sequence is (see
//! `tickserve_runtime::Runtime::hand_over_all` and docs/deploy.md).

#![allow(clippy::disallowed_methods)] // a hand-over's duration is the machine's time

use std::sync::Arc;
use std::time::{Duration, Instant};

use tickserve_edge::Edge;

/// How often the server looks for sequences other replicas ask for: a
/// claim waits about this long for a live keeper.
pub const ASKED_POLL: Duration = Duration::from_millis(10);

/// Hands over what other replicas ask for, until `stopped`.
pub async fn answer_asked(edge: Arc<Edge>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(ASKED_POLL) => {}
        }
        let handed = edge.runtime.hand_over_wanted().await;
        if handed > 0 {
            tracing::info!(sequences = handed, "sequences handed over on request");
        }
    }
}

/// Hands every sequence over (the drain: nothing new is admitted, and each
/// sequence's earlier requests are answered first).
pub async fn hand_over_all(edge: &Edge) {
    let Some(replica) = edge.runtime.handoff_replica().map(str::to_string) else {
        return;
    };
    let started = Instant::now();
    let handed = edge.runtime.hand_over_all().await;
    tracing::info!(
        sequences = handed,
        replica,
        took_ms = started.elapsed().as_millis() as u64,
        "sequences handed over for the drain"
    );
}
