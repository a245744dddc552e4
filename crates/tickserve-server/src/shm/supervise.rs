//! A front-end thread's supervision: a panic is counted and logged, the
//! server reports not ready while the thread is down, and the thread starts
//! again after a back-off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Context_;
use super::serve::serve;

/// The first wait before a thread that panicked starts again; it doubles
/// with each panic in a row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait before a thread that keeps panicking starts again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs thread `index`'s loop until `stop`; a panic is counted and logged,
/// the server reports not ready while the thread is down, and the loop
/// starts again after a back-off (a panic a minute after the last starts
/// the back-off afresh).
#[allow(clippy::disallowed_methods)] // the restart back-off is the machine's time
pub(super) fn supervise(index: usize, context: &Context_, stop: &AtomicBool) {
    let mut backoff = FIRST_BACKOFF;
    let mut last_panic: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(context, stop)));
        let Err(panic) = run else {
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        metrics::counter!(tickserve_core::metrics::SHM_THREAD_PANICS, "thread" => index.to_string())
            .increment(1);
        if last_panic.is_some_and(|t| t.elapsed() > Duration::from_secs(60)) {
            backoff = FIRST_BACKOFF;
        }
        last_panic = Some(Instant::now());
        tracing::error!(thread = index, panic = %what, backoff = ?backoff,
            "a shared-memory thread panicked; it starts again after the back-off");
        context.edge.thread_down();
        let until = Instant::now() + backoff;
        while Instant::now() < until && !stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        context.edge.thread_up();
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
