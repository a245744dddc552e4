//! Where the server reads the time for what ages: a sequence's idleness and
//! the table's sweeps, a journal file's age, the journal's once-a-second
//! probe and drop count. [`Clock::system`] is the machine's monotonic clock
//! (what a server reads); a test builds [`Clock::by_hand`] and moves it with
//! [`Clock::advance`], so an expiry is tested without waiting for it.
//!
//! What measures real time on purpose (latency histograms, a request's
//! deadline, a poll's timeout, a benchmark) reads `std::time::Instant`
//! itself, in the files that say so (`clippy.toml` bans `Instant::now` and
//! `Instant::elapsed` elsewhere).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic clock: the machine's, or one a test moves by hand. Cloning
/// shares it: every clone of a clock by hand moves together.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    hand: Option<Arc<Hand>>,
}

/// A clock by hand: where it started, and how far it has been moved since.
#[derive(Debug)]
struct Hand {
    start: Instant,
    moved_nanos: AtomicU64,
}

impl Clock {
    /// The machine's monotonic clock.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock standing at the machine's now that moves only by
    /// [`Clock::advance`].
    #[allow(clippy::disallowed_methods)] // its starting point is the machine's now
    pub fn by_hand() -> Clock {
        Clock {
            hand: Some(Arc::new(Hand {
                start: Instant::now(),
                moved_nanos: AtomicU64::new(0),
            })),
        }
    }

    /// Now, on this clock.
    #[allow(clippy::disallowed_methods)] // the one reading of the machine's clock
    pub fn now(&self) -> Instant {
        match &self.hand {
            None => Instant::now(),
            Some(hand) => {
                hand.start + Duration::from_nanos(hand.moved_nanos.load(Ordering::Acquire))
            }
        }
    }

    /// The time since `earlier` on this clock (zero for a later instant).
    pub fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// Moves a clock by hand forward by `by` (saturating at about 584
    /// years). On the machine's clock it is an error: a test that moves
    /// time must have built its clock by hand.
    pub fn advance(&self, by: Duration) {
        let hand = self
            .hand
            .as_ref()
            .expect("Clock::advance on the machine's clock: build the clock with Clock::by_hand");
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = hand
            .moved_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Whether this clock moves only by hand.
    pub fn is_by_hand(&self) -> bool {
        self.hand.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_by_hand_moves_only_when_moved_and_its_clones_with_it() {
        let clock = Clock::by_hand();
        let clone = clock.clone();
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.now(), start, "a clock by hand moved by itself");
        clock.advance(Duration::from_secs(90));
        assert_eq!(clone.since(start), Duration::from_secs(90));
        clone.advance(Duration::MAX);
        assert!(clock.since(start) > Duration::from_secs(500 * 365 * 86_400));
        assert_eq!(
            clock.since(clock.now() + Duration::from_secs(1)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_machines_clock_moves_by_itself() {
        let clock = Clock::system();
        assert!(!clock.is_by_hand());
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.since(start) >= Duration::from_millis(2));
    }

    #[test]
    #[should_panic(expected = "Clock::by_hand")]
    fn moving_the_machines_clock_is_refused() {
        Clock::system().advance(Duration::from_secs(1));
    }
}
