//! Circuit breakers (`[breaker]` in `model.toml`): a version's guard trips,
//! counted within its window; at its count the version is halted through
//! [`Halts`], as the kill switch halts it, until an operator resumes it.
//! Touched only when a guard trips, by requests to models that have a
//! breaker.

#![allow(clippy::disallowed_methods)] // a breaker counts trips within a window of the machine's time

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tickserve_runtime::ModelHandle;

use super::halts::Halts;

/// The trips each version's breaker has counted, and the halts it sets.
#[derive(Debug)]
pub struct Breakers {
    halts: Arc<Halts>,
    trips: Mutex<HashMap<(String, String), VecDeque<Instant>>>,
}

impl Breakers {
    /// Breakers that halt through `halts`.
    pub fn new(halts: Arc<Halts>) -> Breakers {
        Breakers {
            halts,
            trips: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a guard trip of `handle`'s version; at its breaker's `trips`
    /// within its `window`, halts the version.
    pub fn tripped(&self, handle: &Arc<ModelHandle>) {
        let Some(breaker) = &handle.settings.breaker else {
            return;
        };
        let now = Instant::now();
        let count = {
            let mut table = self.trips.lock().unwrap_or_else(|p| p.into_inner());
            let times = table
                .entry((handle.name.clone(), handle.version.clone()))
                .or_default();
            times.push_back(now);
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) > breaker.window)
                || times.len() > breaker.trips as usize
            {
                times.pop_front();
            }
            let count = times.len();
            if count >= breaker.trips as usize {
                times.clear();
            }
            count
        };
        if count >= breaker.trips as usize {
            let reason = format!(
                "{count} guard trips within {}",
                humantime::format_duration(breaker.window)
            );
            self.halts.halt_by_breaker(handle, &reason);
        }
    }
}
