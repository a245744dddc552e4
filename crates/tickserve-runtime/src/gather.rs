//! The batching policy, as a plain struct: which queued requests run together.
//!
//! Latency first: a request that finds its executor idle runs at once, alone
//! (the caller's thread runs it; see `Runtime::infer`). Requests that arrive
//! while the executor is busy wait in its queue; when the executor is free it
//! takes them in arrival order, as many as fit together in the largest bucket,
//! and runs them as one batch. A request too large for one bucket runs alone,
//! split across bucket runs. The executor thread drives a [`Gatherer`]; it is
//! kept apart from channels and threads so that the policy is tested alone.

/// Something with a row count (a queued request).
pub trait Rows {
    /// Rows it carries.
    fn rows(&self) -> usize;
}

/// Forms batches from a queue, carrying over a request that did not fit.
#[derive(Debug)]
pub struct Gatherer<J> {
    largest: usize,
    /// A request taken from the queue that did not fit the last batch; it
    /// opens the next one, so arrival order is kept.
    carry: Option<J>,
}

impl<J: Rows> Gatherer<J> {
    /// A gatherer for a model whose largest bucket holds `largest` rows.
    pub fn new(largest: usize) -> Self {
        Gatherer {
            largest,
            carry: None,
        }
    }

    /// True when a request is carried over to the next batch.
    pub fn carrying(&self) -> bool {
        self.carry.is_some()
    }

    /// Fills `batch` (which must be empty) with the next batch: the carried
    /// request or else the next one from `wait` (which may block), then
    /// whatever `ready` gives at once while the rows fit in the largest
    /// bucket. Returns false, with `batch` empty, when `wait` says the queue
    /// is closed and nothing is carried.
    pub fn next_batch(
        &mut self,
        wait: impl FnOnce() -> Option<J>,
        mut ready: impl FnMut() -> Option<J>,
        batch: &mut Vec<J>,
    ) -> bool {
        debug_assert!(batch.is_empty());
        let Some(first) = self.carry.take().or_else(wait) else {
            return false;
        };
        let mut rows = first.rows();
        batch.push(first);
        while rows < self.largest {
            let Some(next) = ready() else { break };
            if rows + next.rows() > self.largest {
                self.carry = Some(next);
                break;
            }
            rows += next.rows();
            batch.push(next);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    impl Rows for usize {
        fn rows(&self) -> usize {
            *self
        }
    }

    /// Runs the gatherer over `arrivals` (all queued at once) and returns the batches.
    fn batches(largest: usize, arrivals: &[usize]) -> Vec<Vec<usize>> {
        let mut queue: VecDeque<usize> = arrivals.iter().copied().collect();
        let mut g = Gatherer::new(largest);
        let mut out = Vec::new();
        loop {
            let mut batch = Vec::new();
            let q = std::cell::RefCell::new(&mut queue);
            if !g.next_batch(
                || q.borrow_mut().pop_front(),
                || q.borrow_mut().pop_front(),
                &mut batch,
            ) {
                return out;
            }
            out.push(batch);
        }
    }

    #[test]
    fn a_lone_request_runs_alone() {
        assert_eq!(batches(64, &[1]), vec![vec![1]]);
    }

    #[test]
    fn queued_requests_run_together_up_to_the_largest_bucket() {
        assert_eq!(batches(64, &[1; 5]), vec![vec![1; 5]]);
        assert_eq!(batches(8, &[3, 3, 3, 1]), vec![vec![3, 3], vec![3, 1]]);
        // A full bucket closes the batch.
        assert_eq!(batches(4, &[2, 2, 1]), vec![vec![2, 2], vec![1]]);
    }

    #[test]
    fn large_requests_run_alone_and_order_is_kept() {
        assert_eq!(
            batches(64, &[10, 100, 5]),
            vec![vec![10], vec![100], vec![5]]
        );
        let arrivals = [5, 60, 3, 2, 64, 1, 70, 7];
        let flat: Vec<usize> = batches(64, &arrivals).concat();
        assert_eq!(flat, arrivals, "every request once, in arrival order");
        for b in batches(64, &arrivals) {
            assert!(b.len() == 1 || b.iter().sum::<usize>() <= 64, "{b:?}");
        }
    }
}
