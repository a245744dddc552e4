//! The deciders on where a request goes, as stages of its [`Envelope`]: a
//! halted version's requests go to its breaker's fallback or are refused;
//! the `tickserve-sequence-id` header names the sequence a request
//! continues; a sequence's tick goes to the version its state lives on, and
//! a halted version's sequence is refused, never sent to a fallback that
//! does not hold its state.

use std::sync::Arc;

use tickserve_core::Error;
use tickserve_core::sequence::SequenceControl;
use tickserve_runtime::ModelHandle;

use super::Envelope;
use crate::Edge;
use crate::params::Parameters;
use crate::sequence_key;

impl Envelope {
    /// A halted version's request goes to its fallback, when it has one
    /// that serves, or is refused.
    pub(super) fn route(&mut self) -> Result<(), Error> {
        let Some(halt) = self
            .edge
            .halts
            .check(&self.handle.name, &self.handle.version)
        else {
            return Ok(());
        };
        let Some(fallback) = fallback(&self.edge, &self.handle) else {
            return Err(halt.refusal(&self.handle));
        };
        self.halted = Some(std::mem::replace(&mut self.handle, fallback));
        Ok(())
    }

    /// A decoded request's sequence: the one the header names (which must
    /// agree with the body's), owned by the request's key, on the version
    /// its state lives on.
    pub(super) fn route_sequence(&mut self, parameters: &mut Parameters) -> Result<(), Error> {
        routing_key(&self.handle.name, self.sequence_key.take(), parameters)?;
        let Some(sequence) = parameters.sequence.as_mut() else {
            return Ok(());
        };
        sequence.owner = self.key;
        // A sequence stays on one version, the one it lives on, when the
        // request names none (a new version arrived, or a split).
        if self.sticky
            && let Some(sticky) = self
                .edge
                .runtime
                .model_for_sequence(&self.handle.name, sequence)
            && !Arc::ptr_eq(&sticky, &self.handle)
            && sticky.signature == self.handle.signature
        {
            // The version its state lives on answers, or nothing does: a
            // halted one refuses the tick (no other holds its state).
            if let Some(halt) = self.edge.halts.check(&sticky.name, &sticky.version) {
                return Err(halt.refusal(&sticky));
            }
            self.handle = sticky;
        }
        // A halted version's sequence is refused as halted, never sent to
        // the fallback that does not hold its state.
        if let Some(halted) = &self.halted
            && let Some(table) = halted.sequences()
            && let key = table.key(&sequence.id, sequence.owner)
            && (table.holds(&key)
                || table.lives_on(&key).as_deref() == Some(halted.version.as_str()))
            && let Some(halt) = self.edge.halts.check(&halted.name, &halted.version)
        {
            return Err(halt.refusal(halted));
        }
        Ok(())
    }
}

/// What answers a halted version's requests: its breaker's `fallback` (a
/// label or version of the same model), when it is there, has the same
/// signature and is not halted itself.
fn fallback(edge: &Edge, halted: &Arc<ModelHandle>) -> Option<Arc<ModelHandle>> {
    let name = halted.settings.breaker.as_ref()?.fallback.as_deref()?;
    edge.runtime
        .model(&halted.name, Some(name))
        .ok()
        .filter(|f| {
            !Arc::ptr_eq(f, halted)
                && f.signature == halted.signature
                && edge.halts.check(&f.name, &f.version).is_none()
        })
}

/// The `tickserve-sequence-id` header `key` against the body's parameters:
/// both naming a sequence must agree; the header alone names the sequence
/// the request continues.
fn routing_key(model: &str, key: Option<String>, parameters: &mut Parameters) -> Result<(), Error> {
    let Some(key) = key else {
        return Ok(());
    };
    match &parameters.sequence {
        Some(named) if !sequence_key::agrees(&key, &named.id) => Err(Error::request(
            model,
            format!(
                "the header {} ({}) and the parameter sequence_id ({}) name different sequences",
                sequence_key::NAME,
                tickserve_core::text::quote(&key),
                named.id
            ),
        )),
        Some(_) => Ok(()),
        None => {
            parameters.sequence = Some(SequenceControl {
                id: sequence_key::id(model, &key)?,
                start: false,
                end: false,
                owner: None,
            });
            Ok(())
        }
    }
}
