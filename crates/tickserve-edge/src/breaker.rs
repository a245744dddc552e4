//! Circuit breakers (`[breaker]` in `model.toml`): a version's guard trips,
//! counted within its window; at its count the version is halted through
//! [`Halts`], as the kill switch halts it, until an operator resumes it.
//! Touched only when a guard trips, by requests to models that have a
//! breaker. The window is read on the server's [`Clock`] (a test moves it by
//! hand), and the counting is a plain function on explicit instants.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tickserve_core::Clock;
use tickserve_runtime::ModelHandle;

use super::halts::Halts;

/// The trips each version's breaker has counted, and the halts it sets.
#[derive(Debug)]
pub struct Breakers {
    halts: Arc<Halts>,
    trips: Mutex<HashMap<(String, String), VecDeque<Instant>>>,
    clock: Clock,
}

/// Counts a trip at `now` among `times` (the trips still in the window):
/// trips older than `window` leave it; returns the count with this one, and
/// forgets them all when the count reaches `trips` (the breaker opens).
fn count_trip(
    times: &mut VecDeque<Instant>,
    now: Instant,
    trips: usize,
    window: Duration,
) -> usize {
    times.push_back(now);
    while times
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) > window)
        || times.len() > trips
    {
        times.pop_front();
    }
    let count = times.len();
    if count >= trips {
        times.clear();
    }
    count
}

impl Breakers {
    /// Breakers that halt through `halts`, reading the window on `clock`.
    pub fn new(halts: Arc<Halts>, clock: Clock) -> Breakers {
        Breakers {
            halts,
            trips: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// Counts a guard trip of `handle`'s version; at its breaker's `trips`
    /// within its `window`, halts the version.
    pub fn tripped(&self, handle: &Arc<ModelHandle>) {
        let Some(breaker) = &handle.settings.breaker else {
            return;
        };
        let now = self.clock.now();
        let trips = usize::try_from(breaker.trips).unwrap_or(usize::MAX);
        let count = {
            let mut table = self.trips.lock().unwrap_or_else(|p| p.into_inner());
            let times = table
                .entry((handle.name.clone(), handle.version.clone()))
                .or_default();
            count_trip(times, now, trips, breaker.window)
        };
        if count >= trips {
            let reason = format!(
                "{count} guard trips within {}",
                humantime::format_duration(breaker.window)
            );
            self.halts.halt_by_breaker(handle, &reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_within_the_window_open_the_breaker_and_older_ones_leave_it() {
        let clock = Clock::by_hand();
        let window = Duration::from_secs(10);
        let mut times = VecDeque::new();
        // Three trips within 10 s open a breaker of 3.
        assert_eq!(count_trip(&mut times, clock.now(), 3, window), 1);
        clock.advance(Duration::from_secs(4));
        assert_eq!(count_trip(&mut times, clock.now(), 3, window), 2);
        clock.advance(Duration::from_secs(4));
        assert_eq!(count_trip(&mut times, clock.now(), 3, window), 3);
        assert!(times.is_empty(), "an open breaker starts counting afresh");
        // Trips further apart than the window never add up.
        for _ in 0..5 {
            clock.advance(Duration::from_secs(6));
            let count = count_trip(&mut times, clock.now(), 3, window);
            assert!(count <= 2, "{count}");
        }
        // Exactly the window apart still counts; a moment past it does not.
        let mut times = VecDeque::new();
        count_trip(&mut times, clock.now(), 2, window);
        clock.advance(window);
        assert_eq!(count_trip(&mut times, clock.now(), 2, window), 2);
        count_trip(&mut times, clock.now(), 2, window);
        clock.advance(window + Duration::from_millis(1));
        assert_eq!(count_trip(&mut times, clock.now(), 2, window), 1);
    }
}
