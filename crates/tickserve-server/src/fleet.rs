//! The server's part in a fleet (`[fleet]`): it joins before the models
//! load, answers what other replicas ask of it while it serves, and at a
//! drain hands every sequence over and leaves (docs/deploy.md, "Scaling
//! out"). The protocol is `tickserve_fleet`'s.

use std::sync::Arc;
use std::time::Instant;

use tickserve_edge::Edge;
use tickserve_fleet::Fleet;

/// Hands over each sequence another replica asks for, in the order asked,
/// until `stopped`. Each answer waits for the sequence's earlier requests,
/// so each runs on a task of its own.
pub async fn answer_asked(
    edge: Arc<Edge>,
    fleet: Arc<Fleet>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let Some(mut asked) = fleet.asked() else {
        return;
    };
    loop {
        let one = tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            one = asked.recv() => one,
        };
        let Some(one) = one else { return };
        let edge = Arc::clone(&edge);
        tokio::spawn(async move {
            if edge.runtime.hand_over_asked(&one.key, &one.version).await {
                tracing::debug!(model = one.key.model, "a sequence handed over on request");
            }
        });
    }
}

/// Hands every sequence over (the drain: nothing new is admitted, and each
/// sequence's earlier requests are answered first), then leaves the fleet.
#[allow(clippy::disallowed_methods)] // a hand-over's duration is the machine's time
pub async fn hand_over_all(edge: &Edge, fleet: &Fleet) {
    let started = Instant::now();
    let handed = edge.runtime.hand_over_all().await;
    fleet.leave().await;
    tracing::info!(
        sequences = handed,
        took_ms = started.elapsed().as_millis() as u64,
        "sequences handed over for the drain; left the fleet"
    );
}
