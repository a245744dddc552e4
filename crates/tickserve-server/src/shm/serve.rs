//! A front-end thread's loop: requests taken in rounds, each answered (a
//! lookup, an inference), the spin while requests come, the sleep on the
//! wake-up event while none do, and the warm runs of the latency mode.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use tickserve_core::Error;
use tickserve_edge::observe::Protocol;
use tickserve_runtime::gather::Round;
use tickserve_shm_protocol as wire;

use super::answer::respond_error;
use super::infer::{Infer, Unfinished, finish_round, infer};
use super::inputs::copy_inputs;
use super::lookup::lookup;
use super::rounds::Rounds;
use super::{ActiveRequest, Context_, MAX_CLIENTS, MAX_REQUESTS_PER_CLIENT, STALE_HANDLE, TICK};

/// A front-end thread's loop: takes every request waiting, then spins
/// (running the last model again now and then, with `latency.warm`) while
/// requests came within `shm.spin`, else sleeps on the wake-up event.
#[allow(clippy::disallowed_methods)] // the spin and the idle clean-up are the machine's time
pub(super) fn serve(context: &Context_, stop: &AtomicBool) {
    // Futures polled here may set timers (a sequence's turn, say).
    let _entered = context.runtime.enter();
    let mut last_request = Instant::now();
    let mut last_cleanup = Instant::now();
    let mut taking = Taking::new();
    // When this thread last ran anything (a request or a warm run).
    let mut last_run = Instant::now();
    let warm_runs = metrics::counter!(tickserve_core::metrics::SHM_WARM_RUNS,
        "thread" => std::thread::current().name().unwrap_or("shm").to_string());
    while !stop.load(Ordering::Acquire) {
        let served = taking.take_waiting(context);
        let now = Instant::now();
        if served {
            last_request = now;
            last_run = now;
            continue;
        }
        if now.duration_since(last_cleanup) >= TICK {
            last_cleanup = now;
            context.node.try_cleanup_dead_nodes();
        }
        if now.duration_since(last_request) < context.spin {
            if let (Some(interval), Some(model)) = (context.warm, taking.last_model)
                && now.duration_since(last_run) >= interval
            {
                warm(context, model);
                warm_runs.increment(1);
                last_run = Instant::now();
            }
            std::hint::spin_loop();
            continue;
        }
        // Sleep until a client says it sent something (or the tick passes).
        let _ = context.listener.timed_wait(|_| {}, TICK);
    }
}

/// What a front-end thread keeps from one request to the next: its rounds,
/// the round it gathers, and the model it last ran.
struct Taking {
    rounds: Rounds<ActiveRequest>,
    /// A round's requests whose answers wait for its gathered runs.
    unfinished: Vec<Unfinished>,
    /// The round being gathered, from its first request to its last.
    round: Option<Round>,
    /// The handle of the last model this thread ran (`latency.warm`).
    last_model: Option<u64>,
}

impl Taking {
    fn new() -> Taking {
        let most = MAX_CLIENTS * MAX_REQUESTS_PER_CLIENT;
        Taking {
            rounds: Rounds::new(most),
            unfinished: Vec::with_capacity(most),
            round: None,
            last_model: None,
        }
    }

    /// Takes and answers every request waiting now, round by round;
    /// whether there was one.
    fn take_waiting(&mut self, context: &Context_) -> bool {
        let mut served = false;
        loop {
            if self.rounds.left() == 0 {
                crate::faults::shm_round();
            }
            match self.rounds.next(|| context.server.receive()) {
                Ok(Some(active)) => {
                    served = true;
                    self.take(context, active);
                }
                Ok(None) => return served,
                Err(e) => {
                    tracing::warn!(error = ?e, "shared-memory receive failed");
                    return served;
                }
            }
        }
    }

    /// Answers one request. The first of a round of several opens a round
    /// its requests gather in; the last runs it.
    fn take(&mut self, context: &Context_, active: ActiveRequest) {
        if context.gather && self.round.is_none() && self.rounds.left() > 0 {
            self.round = Some(Round::new());
        }
        let gathering = self.round.as_ref().map(|r| (r, &mut self.unfinished));
        if let Some(model) = handle(context, active, gathering) {
            self.last_model = Some(model);
        }
        if self.rounds.left() == 0
            && let Some(round) = self.round.take()
        {
            finish_round(context, &round, &mut self.unfinished);
        }
    }
}

/// Answers one request: a lookup here; an inference here when it can
/// finish without waiting, else on the async runtime (in a gathering round,
/// `round` keeps it until the round's runs: [`finish_round`]). The handle
/// of the model an inference asked for, when it named a known one.
#[allow(clippy::disallowed_methods)] // a request's latency is the machine's time
fn handle(
    context: &Context_,
    active: ActiveRequest,
    round: Option<(&Round, &mut Vec<Unfinished>)>,
) -> Option<u64> {
    crate::faults::shm_request();
    let started = Instant::now();
    let bytes = active.payload();
    let request_id = wire::request_id_of(bytes);
    let limit = context.edge.max_request_bytes;
    if bytes.len() > limit {
        let error = Error::PayloadTooLarge {
            got: bytes.len(),
            limit,
        };
        let error = context.edge.refuse(Protocol::Shm, "", started, error);
        respond_error(active, request_id, &error);
        return None;
    }
    // The client may still write its sample: what is checked and parsed is
    // a copy (the inputs are slices of it, not copied again).
    let owned = Bytes::copy_from_slice(bytes);
    let request = match wire::parse_request(&owned) {
        Ok(request) => request,
        Err(e) => {
            let error = Error::request("", e.to_string());
            let error = context.edge.refuse(Protocol::Shm, "", started, error);
            respond_error(active, request_id, &error);
            return None;
        }
    };
    match request {
        wire::Request::Lookup { name, version, .. } => {
            let (name, version) = (name.to_string(), version.to_string());
            lookup(context, active, request_id, name, version);
            None
        }
        wire::Request::Infer {
            request_id,
            handle,
            timeout_us,
            parameters,
            inputs,
        } => {
            let Some((name, version)) = context.resolve(handle) else {
                let error = Error::ModelNotFound {
                    model: format!("handle {handle:#018x}"),
                    version: None,
                    known: format!(
                        "{STALE_HANDLE}: a handle comes from a lookup to this server process"
                    ),
                };
                let error = context.edge.refuse(Protocol::Shm, "", started, error);
                respond_error(active, request_id, &error);
                return None;
            };
            let request = Infer {
                request_id,
                inputs: copy_inputs(&name, &parameters, &inputs, &owned),
                name,
                version,
                timeout_us,
                size: owned.len(),
                started,
            };
            infer(context, active, request, round);
            Some(handle)
        }
    }
}

/// Runs the model behind `handle` once on this thread (`latency.warm`): the
/// smallest bucket of each idle executor, nothing counted; a model gone
/// since is skipped.
fn warm(context: &Context_, handle: u64) {
    let Some((name, version)) = context.resolve(handle) else {
        return;
    };
    let version = (!version.is_empty()).then_some(version.as_str());
    if let Ok(model) = context.edge.runtime.model(&name, version) {
        model.warm_here();
    }
}
