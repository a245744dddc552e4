//! The edge's side of shadow versions: which of a request's shadows get a
//! copy (each draws its fraction), and the copy sent to them once the
//! primary has answered, on a task of its own (see the runtime's `shadow`
//! module for how a shadow runs and is compared). A request of any front
//! end is mirrored; sequence ticks and Monte Carlo requests are not. With
//! the journal on, a shadow's answer is journaled as the shadow's record
//! (protocol `shadow`, the primary request's id).

use std::sync::Arc;

use tickserve_core::InferResponse;
use tickserve_core::validate::ValidRequest;
use tickserve_runtime::{ModelHandle, Prepared, ShadowPlan};

use super::journal::Pending;

/// A request's copy for the shadows that want it.
pub(crate) struct Mirror {
    plans: Arc<Vec<ShadowPlan>>,
    /// Which of `plans` want it (bit `i` for plan `i`; at most 64 kept).
    chosen: u64,
    request: ValidRequest,
    /// The journal records of the copies, for the chosen plans in order
    /// (`None` where the journal does not take the shadow).
    records: Vec<Option<Pending>>,
}

impl Mirror {
    /// The copy of `prepared` (answered by `handle`) for the `plans` that
    /// draw it; `None` when none does or the request is not mirrored.
    pub(crate) fn of(
        plans: Arc<Vec<ShadowPlan>>,
        handle: &ModelHandle,
        prepared: &Prepared,
        journal: Option<&Pending>,
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
        let records = match journal {
            None => Vec::new(),
            Some(pending) => plans
                .iter()
                .enumerate()
                .take(64)
                .filter(|(i, _)| chosen & (1 << i) != 0)
                .map(|(_, plan)| pending.for_shadow(&plan.shadow))
                .collect(),
        };
        Some(Mirror {
            plans,
            chosen,
            request,
            records,
        })
    }

    /// Sends the copy to its shadows, after `primary` (the answer, already
    /// computed) is handed back to its front end; never waited for.
    pub(crate) fn send(self, primary: &InferResponse) {
        let primary = primary.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            let Mirror {
                plans,
                chosen,
                request,
                records,
            } = self;
            let mut records = records.into_iter();
            for (i, plan) in plans.iter().enumerate().take(64) {
                if chosen & (1 << i) == 0 {
                    continue;
                }
                let outcome = plan.run(request.clone(), &primary).await;
                match (records.next().flatten(), outcome) {
                    (Some(record), Some(Ok(answer))) => {
                        // Not waited for: no answer waits on a shadow's record.
                        drop(record.answered(&Ok(answer), None));
                    }
                    (Some(record), Some(Err(error))) => record.refused(&error),
                    _ => {}
                }
            }
        });
    }
}
