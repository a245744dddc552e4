//! Which slot of a resident kernel runs each row of a run. A slot keeps
//! the state its last tick left, so a row goes to the slot that holds its
//! state where one does (its sequence's last tick ran there) and the tick
//! brings no state over the bus; a row no slot holds goes to the slot
//! least recently used. Rows and slots are matched on a key of the state
//! (its first eight bytes): a key that matches a state that differs
//! further on only costs that tick its state write, since the mailbox
//! compares the whole state before it skips one.
//!
//! Rows whose order is the slots' (a sequence ticking alone, or the same
//! sequences in the same order) cost one key comparison each; rows in
//! another order cost a sort of the free slots' keys. Nothing allocates
//! once the first run has sized the scratch.

/// The slots' uses, and the scratch of placing a run's rows.
#[derive(Debug)]
pub struct Placement {
    /// Per slot: the run that last used it (0: none yet).
    used: Vec<u64>,
    /// Runs placed so far.
    runs: u64,
    /// Per slot: taken by a row of the run being placed.
    taken: Vec<bool>,
    /// The run's free slots with their keys, then their last uses.
    free: Vec<(u64, usize)>,
    /// Rows of the run not placed yet.
    left: Vec<usize>,
}

impl Placement {
    /// Places rows on `slots` slots, none used yet.
    pub fn new(slots: usize) -> Placement {
        Placement {
            used: vec![0; slots],
            runs: 0,
            taken: vec![false; slots],
            free: Vec::with_capacity(slots),
            left: Vec::with_capacity(slots),
        }
    }

    /// Writes into `out` the slot of each of `rows` rows: row `r`, whose
    /// state's key is `row_key(r)`, on a slot whose key (`slot_key(s)`,
    /// `None` for a slot that may not take a tick now) is the same where a
    /// free one is, first its own (`r`); else on the free slot least
    /// recently used. More rows than free slots: an error saying so.
    pub fn place(
        &mut self,
        rows: usize,
        row_key: impl Fn(usize) -> u64,
        slot_key: impl Fn(usize) -> Option<u64>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        let slots = self.used.len();
        out.clear();
        out.resize(rows, usize::MAX);
        self.taken.fill(false);
        self.left.clear();
        // A row on its own slot: the common case, one comparison.
        for (row, placed) in out.iter_mut().enumerate() {
            let key = row_key(row);
            match (row < slots).then(|| slot_key(row)).flatten() {
                Some(held) if held == key => {
                    *placed = row;
                    self.taken[row] = true;
                }
                _ => self.left.push(row),
            }
        }
        if !self.left.is_empty() {
            self.free.clear();
            for slot in 0..slots {
                if let Some(key) = slot_key(slot).filter(|_| !self.taken[slot]) {
                    self.free.push((key, slot));
                }
            }
            if self.free.len() < self.left.len() {
                return Err(format!(
                    "{rows} rows, and {} of the resident kernel's {slots} slots may take a tick",
                    self.free.len() + rows - self.left.len()
                ));
            }
            // A row on a free slot holding its key.
            self.free.sort_unstable();
            let mut unplaced = 0;
            for i in 0..self.left.len() {
                let row = self.left[i];
                let key = row_key(row);
                let from = self.free.partition_point(|&(k, _)| k < key);
                let holding = self.free[from..]
                    .iter()
                    .take_while(|&&(k, _)| k == key)
                    .map(|&(_, slot)| slot)
                    .find(|&slot| !self.taken[slot]);
                if let Some(slot) = holding {
                    out[row] = slot;
                    self.taken[slot] = true;
                } else {
                    self.left[unplaced] = row;
                    unplaced += 1;
                }
            }
            self.left.truncate(unplaced);
            // The rest on the free slots least recently used.
            if !self.left.is_empty() {
                let used = &self.used;
                self.free
                    .sort_unstable_by_key(|&(_, slot)| (used[slot], slot));
                let mut free = self.free.iter().map(|&(_, slot)| slot);
                for &row in &self.left {
                    let slot = free
                        .by_ref()
                        .find(|&slot| !self.taken[slot])
                        .ok_or_else(|| format!("no free slot for row {row}"))?;
                    out[row] = slot;
                    self.taken[slot] = true;
                }
            }
        }
        self.runs += 1;
        for &slot in out.iter() {
            self.used[slot] = self.runs;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Places rows of keys `rows` on slots holding `held` (`None`: busy).
    fn place(placement: &mut Placement, rows: &[u64], held: &[Option<u64>]) -> Vec<usize> {
        let mut out = Vec::new();
        placement
            .place(rows.len(), |r| rows[r], |s| held[s], &mut out)
            .unwrap();
        out
    }

    #[test]
    fn a_row_goes_to_the_slot_holding_its_state_and_others_to_the_least_recently_used() {
        let mut placement = Placement::new(4);
        // Rows in the slots' order: each on its own.
        let held = [Some(10), Some(11), Some(12), Some(13)];
        assert_eq!(
            place(&mut placement, &[10, 11, 12, 13], &held),
            [0, 1, 2, 3]
        );
        // Some of the same sequences in another order: each where its
        // state is.
        assert_eq!(place(&mut placement, &[11, 10], &held), [1, 0]);
        // A sequence alone, after the others: its slot, not slot 0.
        assert_eq!(place(&mut placement, &[12], &held), [2]);
        // States no slot holds: the least recently used slots first (slot 3
        // last ran three runs ago, slot 2 in the last), a busy slot never.
        let held = [Some(10), Some(11), None, Some(13)];
        assert_eq!(place(&mut placement, &[20, 21], &held), [3, 0]);
        // Two rows of one key (two fresh sequences) take two slots.
        let held = [Some(0), Some(0), Some(5), Some(0)];
        let out = place(&mut placement, &[0, 0], &held);
        assert!(out[0] != out[1] && held[out[0]] == Some(0) && held[out[1]] == Some(0));
    }

    #[test]
    fn more_rows_than_free_slots_is_an_error_not_a_slot_twice() {
        let mut placement = Placement::new(2);
        let mut out = Vec::new();
        let refused = placement
            .place(2, |r| r as u64, |s| (s == 0).then_some(0), &mut out)
            .unwrap_err();
        assert!(
            refused.contains("1 of the resident kernel's 2 slots"),
            "{refused}"
        );
        let refused = placement
            .place(3, |r| r as u64, |s| Some(s as u64), &mut out)
            .unwrap_err();
        assert!(refused.contains("3 rows"), "{refused}");
    }
}
