//! A sequence tick's new state between its run and its answer: kept only
//! once the answer may go, with the values its model's `max_step` guards
//! compare the next tick with (kept in the sequence's entry beside its
//! state).

use bytes::Bytes;
use tickserve_core::InferResponse;
use tickserve_core::sequence::SequenceControl;

use super::Turn;

/// A sequence tick's new state, not yet kept ([`crate::ModelHandle::run_held`]):
/// [`HeldState::apply`] keeps it; dropped, the sequence stays as it was
/// before the tick (a start leaves no sequence behind). It holds the
/// sequence's turn until then.
#[derive(Debug)]
pub struct HeldState {
    pub(crate) turn: Turn,
    pub(crate) control: SequenceControl,
    pub(crate) next: Vec<Bytes>,
    pub(crate) window_ticks: u64,
    /// The sequence's last answered values of the outputs `max_step`
    /// guards watch, before this tick.
    pub(crate) previous: Vec<(String, Bytes)>,
    /// This tick's values of those outputs.
    pub(crate) answered: Vec<(String, Bytes)>,
}

impl HeldState {
    /// Keeps the tick's new state (or ends the sequence, for its last tick)
    /// and its answered values for the `max_step` guards, and passes the
    /// turn on.
    pub fn apply(self) {
        self.turn
            .finish(&self.control, self.next, self.window_ticks, self.answered);
    }

    /// Remembers this tick's values of the outputs the model's `max_step`
    /// guards watch (`step_outputs`), for its sequence's next tick.
    pub(crate) fn remember<'a>(
        &mut self,
        answer: &InferResponse,
        step_outputs: impl Iterator<Item = &'a str>,
    ) {
        self.answered = step_outputs
            .filter_map(|output| {
                let tensor = answer.outputs.iter().find(|o| *o.name == *output)?;
                Some((output.to_string(), tensor.data.clone()))
            })
            .collect();
    }

    /// The sequence's last answered values of `output` before this tick
    /// (kept for an output a `max_step` guard watches), if it has any.
    pub fn previous(&self, output: &str) -> Option<&[u8]> {
        self.previous
            .iter()
            .find(|(name, _)| name == output)
            .map(|(_, values)| values.as_ref())
    }
}
