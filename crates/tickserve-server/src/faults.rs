//! Faults a test injects into a running server, to check that the server
//! survives them: the supervision of its threads, say. Public for the
//! integration tests only (hidden from the docs): not an API. Each hook is one
//! relaxed atomic load when no fault is armed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

static SHM_PANIC: AtomicBool = AtomicBool::new(false);
static SHM_STALL_US: AtomicU64 = AtomicU64::new(0);

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

/// Arms one stall: the next shared-memory thread about to take a round
/// sleeps `stall` first, so that the requests sent meanwhile wait together.
pub fn stall_next_shm_round(stall: Duration) {
    let micros = u64::try_from(stall.as_micros()).unwrap_or(u64::MAX).max(1);
    SHM_STALL_US.store(micros, Ordering::Release);
}

/// Called as a shared-memory thread is about to take a round: sleeps once if
/// armed.
pub(crate) fn shm_round() {
    if SHM_STALL_US.load(Ordering::Relaxed) > 0 {
        let micros = SHM_STALL_US.swap(0, Ordering::AcqRel);
        std::thread::sleep(Duration::from_micros(micros));
    }
}
