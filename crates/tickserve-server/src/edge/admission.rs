//! Admission at the edge: a slot among `server.max_inflight` requests and
//! the request's bytes in `server.max_inflight_bytes`, both refused at once
//! (RESOURCE_EXHAUSTED / 429) when full. Each is a guard that gives back
//! what it holds when dropped, whichever way the request ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tickserve_core::Error;

use super::Edge;

/// One admitted inference request; dropping it lets another in.
pub struct Slot(Arc<Edge>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An admitted request's bytes in the server-wide budget; dropping it gives
/// them back.
pub struct HeldBytes {
    edge: Arc<Edge>,
    bytes: usize,
}

impl HeldBytes {
    /// One hold of both `self`'s bytes and `other`'s.
    pub fn join(mut self, mut other: HeldBytes) -> HeldBytes {
        self.bytes += std::mem::take(&mut other.bytes);
        self
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.edge
            .inflight_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Edge {
    /// Admits one more inference request, or refuses it at once when the
    /// server already has `max_inflight` in flight (load shedding at the
    /// edge: it bounds the work in the server, however the load splits over
    /// models).
    pub fn admit(self: &Arc<Self>) -> Result<Slot, Error> {
        let before = self.inflight.fetch_add(1, Ordering::AcqRel);
        if self.max_inflight > 0 && before >= self.max_inflight {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Overloaded {
                limit: self.max_inflight,
            });
        }
        Ok(Slot(Arc::clone(self)))
    }

    /// Takes `bytes` (a request's body or message) into the server-wide
    /// budget, or refuses at once when they would go over it.
    pub fn admit_bytes(self: &Arc<Self>, bytes: usize) -> Result<HeldBytes, Error> {
        let before = self.inflight_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.max_inflight_bytes {
            self.inflight_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Error::OverloadedBytes {
                limit: self.max_inflight_bytes,
            });
        }
        Ok(HeldBytes {
            edge: Arc::clone(self),
            bytes,
        })
    }
}
