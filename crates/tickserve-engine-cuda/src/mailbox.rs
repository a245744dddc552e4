//! The host's half of the resident kernel's mailboxes ([`kernels::resident`]
//! lays them out): a slot's inputs written and its tick asked with release
//! order, its answer awaited with acquire order within a bound. The same
//! code drives the kernel on a device (over mapped host memory) and its
//! emulation on the CPU (over plain memory), and makes no CUDA call.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tickserve_core::EngineError;

use crate::kernels::{ANSWERED_WORD, ASKED_WORD, DATA_WORD, Resident};

/// Every slot's mailbox, and each slot's last tick asked.
#[derive(Debug)]
pub struct Mailboxes {
    base: *mut i32,
    /// Words of one slot's mailbox.
    words: usize,
    /// Floats after [`DATA_WORD`] in each.
    floats: usize,
    asked: Vec<i32>,
    bound: Duration,
}

impl Mailboxes {
    /// The mailboxes of `slots` slots laid out as `layout` says, from
    /// `base`; a wait longer than `bound` is an error.
    ///
    /// # Safety
    ///
    /// `base` must be aligned and valid for reads and writes of `slots ×
    /// layout.mailbox_words` `i32` words for as long as the result lives,
    /// and touched by nothing but the result and the kernel's blocks.
    pub unsafe fn new(
        base: *mut i32,
        layout: &Resident,
        slots: usize,
        bound: Duration,
    ) -> Mailboxes {
        Mailboxes {
            base,
            words: layout.mailbox_words,
            floats: layout.mailbox_floats,
            asked: vec![0; slots],
            bound,
        }
    }

    /// How many slots.
    pub fn slots(&self) -> usize {
        self.asked.len()
    }

    fn check(&self, slot: usize) -> Result<(), EngineError> {
        if slot < self.asked.len() {
            Ok(())
        } else {
            Err(EngineError::Internal(format!(
                "slot {slot} of a resident kernel of {}",
                self.asked.len()
            )))
        }
    }

    /// Slot `slot`'s flag word `word` (`slot` checked by the callers).
    fn flag(&self, slot: usize, word: usize) -> &AtomicI32 {
        // SAFETY: an aligned word of the mailboxes (`new`'s contract), which
        // outlive `self`; the kernel reads and writes it atomically too.
        unsafe { AtomicI32::from_ptr(self.base.add(slot * self.words + word)) }
    }

    /// Slot `slot`'s floats (`slot` checked by the callers).
    fn data(&self, slot: usize) -> *mut f32 {
        self.base
            .wrapping_add(slot * self.words + DATA_WORD)
            .cast::<f32>()
    }

    /// Asks slot `slot` for a tick: `inputs` (offset after [`DATA_WORD`],
    /// values) written to its mailbox, then its asked tick raised (a counter
    /// from 1, back to 1 after `i32::MAX`) with release order.
    pub fn ask(&mut self, slot: usize, inputs: &[(usize, &[f32])]) -> Result<(), EngineError> {
        self.check(slot)?;
        let data = self.data(slot);
        for &(at, values) in inputs {
            if at.saturating_add(values.len()) > self.floats {
                return Err(EngineError::Internal(
                    "a resident tick's input past the mailbox".to_string(),
                ));
            }
            for (j, &x) in values.iter().enumerate() {
                // SAFETY: inside the slot's floats (checked above); its block
                // reads them only after the asked tick is raised below.
                unsafe { data.add(at + j).write_volatile(x) };
            }
        }
        let last = self.asked[slot];
        let asked = if last == i32::MAX { 1 } else { last + 1 };
        self.flag(slot, ASKED_WORD).store(asked, Ordering::Release);
        self.asked[slot] = asked;
        Ok(())
    }

    /// Waits (spinning, within the bound) for slot `slot`'s answer to the
    /// tick last asked: its mailbox's floats. Past the bound: `DeviceLost`.
    #[allow(clippy::disallowed_methods)] // the watchdog's bound is the machine's time
    pub fn wait(&self, slot: usize) -> Result<Vec<f32>, EngineError> {
        self.check(slot)?;
        let asked = self.asked[slot];
        let answered = self.flag(slot, ANSWERED_WORD);
        let started = std::time::Instant::now();
        let mut spins = 0u32;
        while answered.load(Ordering::Acquire) != asked {
            spins = spins.wrapping_add(1);
            // Read the clock only now and then: the answer is microseconds.
            if spins.is_multiple_of(1024) && started.elapsed() > self.bound {
                return Err(EngineError::DeviceLost(format!(
                    "the resident kernel did not answer slot {slot}'s tick {asked} within {:?}",
                    self.bound
                )));
            }
            std::hint::spin_loop();
        }
        let data = self.data(slot);
        // SAFETY: answered: the slot's block writes nothing more until its
        // next tick is asked.
        Ok((0..self.floats)
            .map(|j| unsafe { data.add(j).read_volatile() })
            .collect())
    }

    /// Tells every slot's block to return.
    pub fn stop_all(&self) {
        for slot in 0..self.asked.len() {
            self.flag(slot, ASKED_WORD).store(-1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// One slot: one input float, one output float.
    fn layout() -> Resident {
        Resident {
            source: String::new(),
            inputs: vec![Some(0)],
            outputs: vec![Some(1)],
            state: Vec::new(),
            mailbox_floats: 2,
            mailbox_words: 96,
            state_floats: 0,
        }
    }

    #[test]
    fn a_tick_not_answered_within_the_bound_is_device_lost_and_an_answer_is_read() {
        let mut memory = vec![0i32; 96];
        let base = memory.as_mut_ptr();
        // SAFETY: `memory` holds one mailbox of 96 words and outlives `boxes`.
        let mut boxes = unsafe { Mailboxes::new(base, &layout(), 1, Duration::from_millis(20)) };
        boxes.ask(0, &[(0, &[1.5])]).unwrap();
        // SAFETY: word 0 of the mailbox, aligned.
        let asked = unsafe { AtomicI32::from_ptr(base.add(ASKED_WORD)) };
        assert_eq!(asked.load(Ordering::Acquire), 1);
        // Nobody answers: an error naming the slot and the tick, not a hang.
        let lost = boxes.wait(0).unwrap_err().to_string();
        assert!(lost.contains("slot 0's tick 1"), "{lost}");
        // The "kernel" answers: its output float read back.
        // SAFETY: words of the mailbox, aligned.
        unsafe {
            base.add(DATA_WORD + 1).cast::<f32>().write_volatile(2.5);
            AtomicI32::from_ptr(base.add(ANSWERED_WORD)).store(1, Ordering::Release);
        }
        assert_eq!(boxes.wait(0).unwrap(), vec![1.5, 2.5]);
        // Past the mailbox, or a slot it does not have: refused.
        assert!(boxes.ask(0, &[(1, &[1.0, 2.0])]).is_err());
        assert!(boxes.ask(1, &[]).is_err());
        boxes.stop_all();
        assert_eq!(asked.load(Ordering::Acquire), -1);
    }
}
