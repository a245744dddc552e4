//! The decider on whether a run's answer goes: the model's output guards.
//! An answer that breaks one is withheld (counted, logged, and kept beside
//! its error for the journal) and the trip counts toward the model's
//! breaker, which halts the version past its limit.

use std::sync::Arc;

use tickserve_core::error::Withheld;
use tickserve_core::{Error, InferResponse};
use tickserve_runtime::{HeldState, ModelHandle};

use crate::breaker::Breakers;

/// A run's outcome with `handle`'s output guards applied: an answer that
/// breaks one becomes [`Error::GuardTripped`], and the answer it withheld
/// comes back beside it; the trip counts toward the model's breaker, if it
/// has one. `monte_carlo`: the outputs are a Monte Carlo run's summaries.
/// A sequence's tick (`held`) is checked against its previous outputs; one
/// that trips leaves its state as it was (the exit keeps the new state only
/// with an answer).
pub(super) fn of(
    breakers: &Breakers,
    handle: &Arc<ModelHandle>,
    result: Result<InferResponse, Error>,
    monte_carlo: bool,
    held: Option<&HeldState>,
) -> (Result<InferResponse, Error>, Option<InferResponse>) {
    let guards = &handle.settings.guards;
    let trip = match &result {
        Ok(response) if !guards.is_empty() => guards.check(response, monte_carlo, |output| {
            held.and_then(|h| h.previous(output))
        }),
        _ => None,
    };
    let Some(trip) = trip else {
        return (result, None);
    };
    metrics::counter!(tickserve_core::metrics::GUARD_TRIPS,
        "model" => handle.name.clone(), "version" => handle.version.clone(),
        "output" => trip.output.clone(), "guard" => trip.guard)
    .increment(1);
    let error = Error::GuardTripped(Box::new(Withheld {
        model: handle.name.clone(),
        version: handle.version.clone(),
        output: trip.output,
        tensor: trip.tensor,
        bound: trip.bound,
        position: trip.position,
        value: trip.value.to_string(),
    }));
    tracing::warn!(model = %handle.name, version = %handle.version, "{error}");
    if handle.settings.breaker.is_some() {
        breakers.tripped(handle);
    }
    (Err(error), result.ok())
}
