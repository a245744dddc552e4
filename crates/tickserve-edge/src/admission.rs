//! Admission at the edge: a slot among `server.max_inflight` requests and
//! the request's bytes in `server.max_inflight_bytes`, both refused at once
//! (RESOURCE_EXHAUSTED / 429) when full. Each is a guard that gives back
//! what it holds when dropped, whichever way the request ends.
//!
//! A request body's bytes (an HTTP body, a gRPC message) are held as they
//! arrive, before any handler has the whole body ([`BodyBytes`], made by the
//! listener for every request): in the server-wide budget and in its
//! connection's (`server.max_connection_bytes`). A body that would go over
//! either is cut off with the refusal. The inference pipeline takes what a
//! body holds ([`BodyBytes::take`]) and keeps it until the answer is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tickserve_core::Error;

use super::Edge;

/// One admitted inference request; dropping it lets another in.
pub struct Slot(Arc<Edge>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The bytes one connection holds now, and the most it may
/// (`server.max_connection_bytes`).
#[derive(Debug)]
pub struct ConnectionBudget {
    held: AtomicUsize,
    limit: usize,
}

impl ConnectionBudget {
    /// A connection's budget of `limit` bytes.
    pub fn new(limit: usize) -> ConnectionBudget {
        ConnectionBudget {
            held: AtomicUsize::new(0),
            limit,
        }
    }
}

/// Bytes held in the server-wide budget (and, for a body, in its
/// connection's); dropping it gives them back.
pub struct HeldBytes {
    edge: Arc<Edge>,
    bytes: usize,
    connection: Option<Arc<ConnectionBudget>>,
    connection_bytes: usize,
}

impl HeldBytes {
    /// Holds `other`'s bytes in this hold too.
    pub fn join(&mut self, mut other: HeldBytes) {
        self.bytes += std::mem::take(&mut other.bytes);
        if self.connection.is_none() {
            self.connection = other.connection.take();
        }
        self.connection_bytes += std::mem::take(&mut other.connection_bytes);
    }

    /// Bytes held in the server-wide budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` more, counted even over the budget: for what already
    /// exists and must be kept until sent (a finished answer).
    pub fn add_anyway(&mut self, bytes: usize) {
        self.edge.inflight_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.bytes += bytes;
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.edge
            .inflight_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some(connection) = &self.connection {
            connection
                .held
                .fetch_sub(self.connection_bytes, Ordering::AcqRel);
        }
    }
}

/// A request body's bytes, held as they arrive (see the module's notes).
pub struct BodyBytes {
    held: Mutex<HeldBytes>,
}

impl BodyBytes {
    /// An empty hold for a body on a connection with `connection`'s budget.
    pub fn new(edge: &Arc<Edge>, connection: Arc<ConnectionBudget>) -> BodyBytes {
        BodyBytes {
            held: Mutex::new(HeldBytes {
                edge: Arc::clone(edge),
                bytes: 0,
                connection: Some(connection),
                connection_bytes: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HeldBytes> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `bytes` more that arrived, or refuses them when they would go
    /// over the server's budget or the connection's.
    pub fn add(&self, bytes: usize) -> Result<(), Error> {
        let mut held = self.lock();
        let edge = Arc::clone(&held.edge);
        let before = edge.inflight_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > edge.max_inflight_bytes {
            edge.inflight_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Error::OverloadedBytes {
                limit: edge.max_inflight_bytes,
            });
        }
        if let Some(connection) = &held.connection {
            let before = connection.held.fetch_add(bytes, Ordering::AcqRel);
            if before.saturating_add(bytes) > connection.limit {
                connection.held.fetch_sub(bytes, Ordering::AcqRel);
                edge.inflight_bytes.fetch_sub(bytes, Ordering::AcqRel);
                return Err(Error::ConnectionBytes {
                    limit: connection.limit,
                });
            }
        }
        held.bytes += bytes;
        held.connection_bytes += bytes;
        Ok(())
    }

    /// What the body holds now, moved out: kept by whoever takes it (the
    /// request it became) instead of the body.
    pub fn take(&self) -> HeldBytes {
        let mut held = self.lock();
        HeldBytes {
            edge: Arc::clone(&held.edge),
            bytes: std::mem::take(&mut held.bytes),
            connection: held.connection.clone(),
            connection_bytes: std::mem::take(&mut held.connection_bytes),
        }
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
            connection: None,
            connection_bytes: 0,
        })
    }

    /// Bytes of requests held now, every front end together.
    pub fn inflight_bytes(&self) -> usize {
        self.inflight_bytes.load(Ordering::Acquire)
    }
}
