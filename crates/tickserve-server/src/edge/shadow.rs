//! The edge's side of shadow versions: which of a request's shadows get a
//! copy (each draws its fraction), and the copy sent to them once the
//! primary has answered, on a task of its own (see the runtime's `shadow`
//! module for how a shadow runs and is compared). A request of any front
//! end is mirrored; sequence ticks and Monte Carlo requests are not.

use std::sync::Arc;

use tickserve_core::InferResponse;
use tickserve_core::validate::ValidRequest;
use tickserve_runtime::{ModelHandle, Prepared, ShadowPlan};

/// A request's copy for the shadows that want it.
pub struct Mirror {
    plans: Arc<Vec<ShadowPlan>>,
    /// Which of `plans` want it (bit `i` for plan `i`; at most 64 kept).
    chosen: u64,
    request: ValidRequest,
}

impl Mirror {
    /// The copy of `prepared` (answered by `handle`) for the `plans` that
    /// draw it; `None` when none does or the request is not mirrored.
    pub fn of(
        plans: Arc<Vec<ShadowPlan>>,
        handle: &ModelHandle,
        prepared: &Prepared,
    ) -> Option<Mirror> {
        let mut chosen = 0u64;
        for (i, plan) in plans.iter().enumerate().take(64) {
            // The plans are the looked-up version's; a split sequence may
            // have moved the request to another (it is not mirrored then).
            if plan.wants() && handle.version != plan.shadow.version {
                chosen |= 1 << i;
            }
        }
        if chosen == 0 {
            return None;
        }
        let request = prepared.mirror()?;
        Some(Mirror {
            plans,
            chosen,
            request,
        })
    }

    /// Sends the copy to its shadows, after `primary` (the answer, already
    /// computed) is handed back to its front end; never waited for.
    pub fn send(self, primary: &InferResponse) {
        let primary = primary.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            for (i, plan) in self.plans.iter().enumerate().take(64) {
                if self.chosen & (1 << i) != 0 {
                    plan.run(self.request.clone(), &primary).await;
                }
            }
        });
    }
}
