//! The host's half of the resident kernel's mailboxes ([`kernels::resident`]
//! lays them out): a slot's tick written (its inputs, its member, its state
//! where the slot does not already hold it) and asked with release order,
//! its answer awaited with acquire order within a bound and read out. The
//! same code drives the kernel on a device (over mapped host memory) and
//! its emulation on the CPU (over plain memory), and makes no CUDA call.
//!
//! [`kernels::resident`]: crate::kernels::resident

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tickserve_core::EngineError;

use crate::kernels::{ANSWERED_WORD, ASKED_WORD, DATA_WORD, GIVEN_WORD, MEMBER_WORD, Resident};
use crate::placement::Placement;

/// Every slot's mailbox, and each slot's last tick asked.
#[derive(Debug)]
pub struct Mailboxes {
    base: *mut i32,
    /// Words of one slot's mailbox.
    words: usize,
    layout: Resident,
    /// Per slot: its last tick asked, and whether its answer is still
    /// awaited.
    asked: Vec<(i32, bool)>,
    bound: Duration,
    /// Ticks that brought their state (the slot held another).
    given: u64,
    /// A tick went unanswered: the slots' state is unknown from then on.
    lost: bool,
    /// Which slot runs each row of a run ([`Mailboxes::place`]).
    placement: Placement,
}

impl Mailboxes {
    /// The mailboxes of `slots` slots laid out as `layout` says, from
    /// `base`; a wait longer than `bound` is an error.
    ///
    /// # Safety
    ///
    /// `base` must be aligned and valid for reads and writes of `slots ×
    /// layout.mailbox_words` `i32` words for as long as the result lives,
    /// zeroed at first (as the state buffers are), and touched by nothing
    /// but the result and the kernel's blocks.
    pub unsafe fn new(
        base: *mut i32,
        layout: &Resident,
        slots: usize,
        bound: Duration,
    ) -> Mailboxes {
        Mailboxes {
            base,
            words: layout.mailbox_words,
            layout: Resident {
                source: String::new(),
                ..layout.clone()
            },
            asked: vec![(0, false); slots],
            bound,
            given: 0,
            lost: false,
            placement: Placement::new(slots),
        }
    }

    /// How many slots.
    pub fn slots(&self) -> usize {
        self.asked.len()
    }

    /// How many ticks brought their state to a slot that held another.
    pub fn states_given(&self) -> u64 {
        self.given
    }

    fn check(&self, slot: usize) -> Result<(), EngineError> {
        if self.lost {
            return Err(EngineError::DeviceLost(
                "the resident kernel left a tick unanswered".to_string(),
            ));
        }
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

    /// The bytes of `floats` floats at float `at` of slot `slot`'s data
    /// (`slot` checked by the callers, `at + floats` inside the layout).
    fn region(&self, slot: usize, at: usize) -> *mut u8 {
        self.base
            .wrapping_add(slot * self.words + DATA_WORD + at)
            .cast::<u8>()
    }

    /// Writes into `out` the slot each of `rows` rows of a run ticks in,
    /// row `r`'s plan input `i` being `inputs(r, i)`: the slot that holds
    /// the row's state where a free one does, else the one least recently
    /// used ([`Placement`]); a slot whose tick is unanswered, never. With
    /// no state, row `r` in slot `r`.
    pub fn place<'a>(
        &mut self,
        rows: usize,
        inputs: impl Fn(usize, usize) -> &'a [u8],
        out: &mut Vec<usize>,
    ) -> Result<(), EngineError> {
        if self.lost {
            return self.check(0);
        }
        let refused = |why: String| EngineError::Internal(format!("placing a resident run: {why}"));
        let Some(first) = self.layout.state.first() else {
            out.clear();
            out.extend(0..rows);
            return match (0..rows).find(|&s| self.asked.get(s).is_none_or(|a| a.1)) {
                Some(slot) => Err(refused(format!("slot {slot} may not take a tick"))),
                None => Ok(()),
            };
        };
        // The first eight bytes of the state's first input: its key.
        let key = |bytes: &[u8]| {
            let mut key = [0u8; 8];
            let n = bytes.len().min(8);
            key[..n].copy_from_slice(&bytes[..n]);
            u64::from_le_bytes(key)
        };
        let (input, width) = (first.input, first.width * 4);
        let (asked, placement) = (&self.asked, &mut self.placement);
        let held = |slot: usize| {
            // SAFETY: the slot's region of its first state pair, inside its
            // floats (the layout's); not pending, so its block writes it no
            // more until its next tick.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    self.base
                        .wrapping_add(slot * self.words + DATA_WORD + first.mailbox)
                        .cast::<u8>(),
                    width,
                )
            };
            (!asked[slot].1).then(|| key(bytes))
        };
        placement
            .place(rows, |row| key(inputs(row, input)), held, out)
            .map_err(refused)
    }

    /// Asks slot `slot` for a tick of member `member` (its row of the
    /// weight table): `inputs(i)` plan input `i`'s floats as little-endian
    /// bytes. A state input is written only where it differs
    /// from the state the slot holds (the last tick's, kept in its mailbox
    /// and on the device alike), and the tick then says it brings its own.
    /// The tick is raised last (a counter from 1, back to 1 after
    /// `i32::MAX`) with release order. A slot whose last tick is not yet
    /// answered is refused.
    pub fn ask<'a>(
        &mut self,
        slot: usize,
        member: usize,
        inputs: impl Fn(usize) -> &'a [u8],
    ) -> Result<(), EngineError> {
        self.check(slot)?;
        let (last, pending) = self.asked[slot];
        let member = i32::try_from(member)
            .map_err(|_| EngineError::Internal(format!("resident member {member}")))?;
        if pending {
            return Err(EngineError::Internal(format!(
                "slot {slot} asked for a tick before its tick {last} was answered"
            )));
        }
        for (i, &(_, floats)) in self.layout.inputs.iter().enumerate() {
            if inputs(i).len() != floats * 4 {
                return Err(EngineError::Internal(format!(
                    "a resident tick's input {i}: {} bytes, and the plan's are {}",
                    inputs(i).len(),
                    floats * 4
                )));
            }
        }
        // SAFETY (every region below): inside the slot's floats (the
        // layout's offsets and widths, `inputs` checked against them); the
        // slot's block reads them only after the tick is raised below, and
        // wrote them last before its previous answer, read with acquire.
        let held = |k: &crate::kernels::Kept| unsafe {
            std::slice::from_raw_parts(self.region(slot, k.mailbox), k.width * 4)
        };
        let given = self.layout.state.iter().any(|k| held(k) != inputs(k.input));
        for (i, &(at, _)) in self.layout.inputs.iter().enumerate() {
            let state = self.layout.state.iter().any(|k| k.input == i);
            let bytes = inputs(i);
            if !state || given {
                // SAFETY: see above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        self.region(slot, at),
                        bytes.len(),
                    );
                }
            }
        }
        self.given += u64::from(given);
        self.flag(slot, MEMBER_WORD)
            .store(member, Ordering::Relaxed);
        self.flag(slot, GIVEN_WORD)
            .store(i32::from(given), Ordering::Relaxed);
        let asked = if last == i32::MAX { 1 } else { last + 1 };
        self.flag(slot, ASKED_WORD).store(asked, Ordering::Release);
        self.asked[slot] = (asked, true);
        Ok(())
    }

    /// Waits (spinning, within the bound) for slot `slot`'s answer to the
    /// tick last asked and hands `read` each plan output's floats, as
    /// little-endian bytes (`read(o, bytes)`). Past the bound: `DeviceLost`,
    /// and every later tick is refused.
    #[allow(clippy::disallowed_methods)] // the watchdog's bound is the machine's time
    pub fn wait(
        &mut self,
        slot: usize,
        mut read: impl FnMut(usize, &[u8]),
    ) -> Result<(), EngineError> {
        self.check(slot)?;
        let (asked, pending) = self.asked[slot];
        if !pending {
            return Err(EngineError::Internal(format!(
                "slot {slot} awaited with no tick asked"
            )));
        }
        let answered = self.flag(slot, ANSWERED_WORD);
        let started = std::time::Instant::now();
        let mut spins = 0u32;
        while answered.load(Ordering::Acquire) != asked {
            spins = spins.wrapping_add(1);
            // Read the clock only now and then: the answer is microseconds.
            if spins.is_multiple_of(1024) && started.elapsed() > self.bound {
                self.lost = true;
                return Err(EngineError::DeviceLost(format!(
                    "the resident kernel did not answer slot {slot}'s tick {asked} within {:?}",
                    self.bound
                )));
            }
            std::hint::spin_loop();
        }
        for (o, &(at, floats)) in self.layout.outputs.iter().enumerate() {
            // SAFETY: inside the slot's floats (the layout's); answered, so
            // its block writes nothing more until its next tick.
            read(o, unsafe {
                std::slice::from_raw_parts(self.region(slot, at), floats * 4)
            });
        }
        self.asked[slot].1 = false;
        Ok(())
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
    use crate::kernels::Kept;

    /// One slot: one input float, a state of two floats, one output float.
    fn layout() -> Resident {
        Resident {
            source: String::new(),
            inputs: vec![(0, 1), (1, 2)],
            outputs: vec![(3, 1), (1, 2)],
            state: vec![Kept {
                input: 1,
                output: 1,
                mailbox: 1,
                offset: 0,
                width: 2,
            }],
            mailbox_floats: 4,
            mailbox_words: 96,
            state_floats: 2,
            weight_slots: 1,
            split: 1,
            on_chip_bytes: 0,
        }
    }

    fn bytes(floats: &[f32]) -> Vec<u8> {
        floats.iter().flat_map(|f| f.to_le_bytes()).collect()
    }

    /// Word `word` of the mailbox at `base`.
    fn word(base: *mut i32, word: usize) -> i32 {
        // SAFETY: a word of the test's one mailbox, aligned.
        unsafe { AtomicI32::from_ptr(base.add(word)).load(Ordering::Acquire) }
    }

    /// The "kernel" answers tick `tick`: output `out`, state `state`.
    fn answer(base: *mut i32, tick: i32, out: f32, state: [f32; 2]) {
        // SAFETY: words of the test's one mailbox, aligned.
        unsafe {
            let data = base.add(DATA_WORD).cast::<f32>();
            data.add(3).write_volatile(out);
            data.add(1).write_volatile(state[0]);
            data.add(2).write_volatile(state[1]);
            AtomicI32::from_ptr(base.add(ANSWERED_WORD)).store(tick, Ordering::Release);
        }
    }

    /// Asks slot `slot` for a tick of `member`: input `x`, state `state`.
    fn ask(
        boxes: &mut Mailboxes,
        slot: usize,
        member: usize,
        x: &[f32],
        state: &[f32],
    ) -> Result<(), EngineError> {
        let (x, state) = (bytes(x), bytes(state));
        boxes.ask(slot, member, |i| if i == 0 { &x } else { &state })
    }

    /// Waits for slot 0's answer: its output and state.
    fn wait(boxes: &mut Mailboxes) -> Result<(Vec<u8>, Vec<u8>), EngineError> {
        let mut got = (Vec::new(), Vec::new());
        boxes.wait(0, |o, b| {
            if o == 0 { &mut got.0 } else { &mut got.1 }.extend_from_slice(b)
        })?;
        Ok(got)
    }

    #[test]
    fn a_tick_brings_its_state_only_where_the_slot_holds_another() {
        let mut memory = vec![0i32; 96];
        let base = memory.as_mut_ptr();
        // SAFETY: `memory` holds one zeroed mailbox of 96 words and
        // outlives `boxes`.
        let mut boxes = unsafe { Mailboxes::new(base, &layout(), 1, Duration::from_secs(5)) };
        // The first tick of a zero state: the slot holds it already.
        ask(&mut boxes, 0, 3, &[1.5], &[0.0, 0.0]).unwrap();
        let flags = |base| {
            (
                word(base, ASKED_WORD),
                word(base, MEMBER_WORD),
                word(base, GIVEN_WORD),
            )
        };
        assert_eq!(flags(base), (1, 3, 0));
        // A second tick before the first is answered: refused.
        let early = ask(&mut boxes, 0, 3, &[1.5], &[0.0, 0.0]).unwrap_err();
        assert!(early.to_string().contains("before its tick 1"), "{early}");
        answer(base, 1, 2.5, [0.25, 0.5]);
        assert_eq!(
            wait(&mut boxes).unwrap(),
            (bytes(&[2.5]), bytes(&[0.25, 0.5]))
        );
        // The state it answered, given back: not written, the kept one used.
        ask(&mut boxes, 0, 3, &[1.0], &[0.25, 0.5]).unwrap();
        assert_eq!(flags(base), (2, 3, 0));
        assert_eq!(boxes.states_given(), 0);
        answer(base, 2, 3.5, [0.75, 1.0]);
        wait(&mut boxes).unwrap();
        // Another state (a restart): written, and the tick says so.
        ask(&mut boxes, 0, 4, &[1.0], &[0.0, 0.0]).unwrap();
        assert_eq!(flags(base), (3, 4, 1));
        // SAFETY: the state region of the test's one mailbox.
        let written = unsafe { base.add(DATA_WORD + 1).cast::<f32>().read_volatile() };
        assert_eq!((written, boxes.states_given()), (0.0, 1));
        answer(base, 3, 4.5, [0.0, 0.0]);
        wait(&mut boxes).unwrap();
        // Inputs not the plan's, a slot it does not have, a wait with no
        // tick asked: refused.
        assert!(ask(&mut boxes, 0, 0, &[1.0, 2.0], &[0.0, 0.0]).is_err());
        assert!(ask(&mut boxes, 1, 0, &[1.0], &[0.0, 0.0]).is_err());
        assert!(wait(&mut boxes).is_err());
        boxes.stop_all();
        assert_eq!(word(base, ASKED_WORD), -1);
    }

    #[test]
    fn sequences_placed_by_their_state_keep_their_slots_and_bring_none() {
        let mut memory = vec![0i32; 2 * 96];
        let base = memory.as_mut_ptr();
        // SAFETY: `memory` holds two zeroed mailboxes of 96 words and
        // outlives `boxes`.
        let mut boxes = unsafe { Mailboxes::new(base, &layout(), 2, Duration::from_secs(5)) };
        let x = bytes(&[1.0]);
        // One tick of a sequence of state `state` alone in a run: its slot,
        // asked; the "kernel" answers that slot with state `next`.
        let tick = |boxes: &mut Mailboxes, state: [f32; 2], next: [f32; 2]| {
            let state = bytes(&state);
            let mut out = Vec::new();
            let inputs = |_: usize, i: usize| if i == 0 { &x[..] } else { &state[..] };
            boxes.place(1, inputs, &mut out).unwrap();
            let slot = out[0];
            boxes.ask(slot, 0, |i| inputs(0, i)).unwrap();
            // SAFETY: slot `slot`'s mailbox, inside `memory`.
            answer(
                unsafe { base.add(slot * 96) },
                boxes.asked[slot].0,
                0.0,
                next,
            );
            boxes.wait(slot, |_, _| ()).unwrap();
            slot
        };
        // Two sequences ticking by turns, each in a run of its own: each
        // keeps a slot, and no tick brings its state (one slot for both
        // would have brought it on every tick but the first).
        let (a, b) = ([0.25, 0.5], [0.75, 1.0]);
        assert_eq!(tick(&mut boxes, [0.0; 2], a), 0);
        assert_eq!(tick(&mut boxes, [0.0; 2], b), 1);
        assert_eq!(tick(&mut boxes, a, [0.5, 0.5]), 0);
        assert_eq!(tick(&mut boxes, b, [1.5, 1.5]), 1);
        assert_eq!(boxes.states_given(), 0);
        // A slot awaiting its answer takes no row, even one of its state.
        ask(&mut boxes, 0, 0, &[1.0], &[0.5, 0.5]).unwrap();
        let mut out = Vec::new();
        let held = bytes(&[0.5, 0.5]);
        boxes
            .place(1, |_, i| if i == 0 { &x[..] } else { &held[..] }, &mut out)
            .unwrap();
        assert_eq!(out, [1]);
        let refused = boxes
            .place(2, |_, i| if i == 0 { &x[..] } else { &held[..] }, &mut out)
            .unwrap_err();
        assert!(refused.to_string().contains("2 rows"), "{refused}");
    }

    #[test]
    fn a_tick_not_answered_within_the_bound_is_device_lost_and_ends_the_mailboxes() {
        let mut memory = vec![0i32; 96];
        let base = memory.as_mut_ptr();
        // SAFETY: as above.
        let mut boxes = unsafe { Mailboxes::new(base, &layout(), 1, Duration::from_millis(20)) };
        ask(&mut boxes, 0, 0, &[1.5], &[0.0, 0.0]).unwrap();
        // Nobody answers: an error naming the slot and the tick, not a hang.
        let lost = wait(&mut boxes).unwrap_err();
        assert!(lost.to_string().contains("slot 0's tick 1"), "{lost}");
        assert!(matches!(lost, EngineError::DeviceLost(_)));
        // The slot's state is unknown now: every later tick refused.
        answer(base, 1, 2.5, [0.0, 0.0]);
        let after = ask(&mut boxes, 0, 0, &[1.5], &[0.0, 0.0]).unwrap_err();
        assert!(matches!(after, EngineError::DeviceLost(_)), "{after}");
    }
}
