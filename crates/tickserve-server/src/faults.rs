//! Faults a test injects into a running server, to check that the server
//! survives them: the supervision of its threads, say. Public for the
//! integration tests only (hidden from the docs): not an API. Each hook is one
//! relaxed atomic load when no fault is armed.

use std::sync::atomic::{AtomicBool, Ordering};

static SHM_PANIC: AtomicBool = AtomicBool::new(false);

/// Arms one panic: the next request a shared-memory thread takes panics it.
pub fn panic_next_shm_request() {
    SHM_PANIC.store(true, Ordering::Release);
}

/// Called as a shared-memory thread takes a request: panics once if armed.
pub(crate) fn shm_request() {
    if SHM_PANIC.load(Ordering::Relaxed) && SHM_PANIC.swap(false, Ordering::AcqRel) {
        panic!("injected fault: a panic on a shared-memory thread");
    }
}
