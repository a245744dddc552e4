//! Whether an answer is the first on its connection: its timing headers
//! may teach HTTP/2's header compression their names, which later answers
//! then refer to (the server's `timing`). One per connection, in each of
//! its requests' extensions.

use std::sync::atomic::{AtomicBool, Ordering};

/// A connection's first answer, not yet given.
#[derive(Debug, Default)]
pub struct FirstAnswer {
    answered: AtomicBool,
}

impl FirstAnswer {
    /// True for the first request on the connection that asks, false after.
    pub fn take(&self) -> bool {
        // Read first: after the first answer no request writes the line.
        !self.answered.load(Ordering::Relaxed) && !self.answered.swap(true, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::FirstAnswer;

    #[test]
    fn a_connection_answers_first_once() {
        let first = FirstAnswer::default();
        assert!(first.take());
        assert!(!first.take());
        assert!(!first.take());
    }
}
