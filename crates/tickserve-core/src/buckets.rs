//! Signature buckets: the batch sizes a model is compiled for.
//!
//! Each bucket is one static-shape graph compiled at load. A run of n rows uses
//! the smallest bucket that holds n, padded with zeros; a request larger than
//! the largest bucket is split into runs of the largest bucket and a remainder.

/// A model's batch sizes, sorted, distinct and non-empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets(Vec<usize>);

/// The batch sizes used when a model's configuration names none.
pub const DEFAULT_BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

impl Buckets {
    /// Builds a bucket list: sizes are sorted and deduplicated, those above
    /// `max_batch` dropped. Errors when no positive size remains.
    pub fn new(sizes: &[usize], max_batch: Option<usize>) -> Result<Buckets, String> {
        if sizes.contains(&0) {
            return Err("bucket sizes must be positive; found 0".to_string());
        }
        let mut sizes: Vec<usize> = sizes
            .iter()
            .copied()
            .filter(|&s| max_batch.is_none_or(|m| s <= m))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.is_empty() {
            return Err(format!(
                "no bucket size is at most max_batch_size ({})",
                max_batch.unwrap_or(0)
            ));
        }
        Ok(Buckets(sizes))
    }

    /// The batch sizes, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.0
    }

    /// The largest batch size.
    pub fn largest(&self) -> usize {
        // Invariant of `new`: never empty.
        self.0.last().copied().unwrap_or(1)
    }

    /// The index of the smallest bucket that holds `rows` (1 ≤ rows ≤ largest).
    pub fn index_for(&self, rows: usize) -> Option<usize> {
        self.0.iter().position(|&size| size >= rows)
    }

    /// How `rows` rows run: `(bucket index, rows in this run)` for each run,
    /// full largest buckets first, then the remainder in the smallest bucket
    /// that holds it.
    pub fn plan(&self, rows: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let largest = self.largest();
        let last = self.0.len() - 1;
        let mut left = rows;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let take = left.min(largest);
            left -= take;
            let index = if take == largest {
                last
            } else {
                self.index_for(take).unwrap_or(last)
            };
            Some((index, take))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sorts_dedups_and_caps() {
        let b = Buckets::new(&[8, 1, 4, 4, 64, 2], Some(8)).unwrap();
        assert_eq!(b.sizes(), &[1, 2, 4, 8]);
        assert!(Buckets::new(&[16], Some(8)).is_err());
        assert!(Buckets::new(&[0, 1], None).is_err());
    }

    #[test]
    fn smallest_bucket_that_holds() {
        let b = Buckets::new(&DEFAULT_BUCKETS, None).unwrap();
        assert_eq!(b.index_for(1), Some(0));
        assert_eq!(b.index_for(3), Some(2));
        assert_eq!(b.index_for(64), Some(6));
        assert_eq!(b.index_for(65), None);
    }

    #[test]
    fn plan_splits_large_requests() {
        let b = Buckets::new(&DEFAULT_BUCKETS, None).unwrap();
        let plan: Vec<_> = b.plan(200).collect();
        assert_eq!(plan, vec![(6, 64), (6, 64), (6, 64), (3, 8)]);
        assert_eq!(b.plan(3).collect::<Vec<_>>(), vec![(2, 3)]);
        assert_eq!(b.plan(0).count(), 0);
        for rows in 1..=300 {
            let runs: Vec<_> = b.plan(rows).collect();
            assert_eq!(runs.iter().map(|r| r.1).sum::<usize>(), rows);
            assert!(runs.iter().all(|&(i, n)| n <= b.sizes()[i]));
        }
    }
}
