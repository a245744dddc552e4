//! Runs held open at a gate: a test engine wrapped around the real ONNX
//! Runtime engine, where a row whose first feature is [`HOLD`] waits until
//! the test opens the gate. What an executor does while another run holds it
//! can then be checked without timing anything.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tickserve_core::InferRequest;
use tickserve_core::config::ServerConfig;
use tickserve_engine_cuda::Gpus;
use tickserve_runtime::{Engines, Runtime};

use super::{copy_sample_model, hooked_engine, library, request};

/// A first feature that holds its run at the gate.
pub const HOLD: f32 = 5555.0;

/// Where held runs wait, and how many are waiting.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    held: AtomicUsize,
}

impl Gate {
    fn pass(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    /// Lets every held run (and every later one) go on.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    /// Runs waiting at the gate now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits (at most 10 s) until `count` runs are held.
    pub fn wait_for(&self, count: usize) {
        let started = Instant::now();
        while self.held() < count && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(self.held(), count, "runs held at the gate");
    }
}

/// Opens its gate when dropped: a test that fails while a run is held
/// ends instead of waiting for that run forever.
pub struct OpenOnDrop(pub Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// `alpha_mlp` with `model_toml`, on the gated engine; every request goes
/// through an executor thread (nothing runs on the caller's).
pub fn gated_runtime(model_toml: &str) -> (Arc<Runtime>, Arc<Gate>, tempfile::TempDir) {
    gated_runtime_with(model_toml, |c| c.runtime.inline_budget = Duration::ZERO)
}

/// `alpha_mlp` with `model_toml`, on the gated engine, the server's
/// configuration `adjust`ed.
pub fn gated_runtime_with(
    model_toml: &str,
    adjust: impl FnOnce(&mut ServerConfig),
) -> (Arc<Runtime>, Arc<Gate>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some(model_toml));
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    adjust(&mut config);
    let gate = Arc::new(Gate::default());
    let engine = hooked_engine({
        let gate = Arc::clone(&gate);
        Arc::new(move |firsts: &[f32]| {
            if firsts.first() == Some(&HOLD) {
                gate.pass();
            }
            Ok(())
        })
    });
    let engines = Engines::new(engine.clone(), engine, Gpus::Absent("test".into()));
    (
        Arc::new(Runtime::load_with(&config, engines).unwrap()),
        gate,
        dir,
    )
}

/// Shuts `runtime` down once the test's tasks have let go of it.
pub fn stop(runtime: Arc<Runtime>) {
    Arc::try_unwrap(runtime)
        .ok()
        .expect("the tasks are done")
        .shutdown();
}

/// A one-row `alpha_mlp` request at `priority` whose first feature is `first`.
pub fn row(priority: u64, first: f32) -> InferRequest {
    let values: Vec<f32> = std::iter::once(first)
        .chain((1..50).map(|i| i as f32 / 64.0))
        .collect();
    let mut row = request("alpha_mlp", "features", vec![1, 50], &values);
    row.request.priority = priority;
    row
}
