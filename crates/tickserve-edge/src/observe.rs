//! The metrics every request records, under the protocol that carried it
//! and the model it named. Which recorder takes them is the process's
//! choice (the server installs Prometheus's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use tickserve_core::Error;
use tickserve_core::metrics as names;

/// Set once a recorder is installed ([`recorder_installed`]): a metric
/// handle taken before would record nowhere for good.
static RECORDING: AtomicBool = AtomicBool::new(false);

/// Says a global recorder is installed: from now on a request's metric
/// handles are registered once and reused.
pub fn recorder_installed() {
    RECORDING.store(true, Ordering::Release);
}

/// Which front end answered.
#[derive(Debug, Clone, Copy)]
pub enum Protocol {
    /// KServe v2 over HTTP/JSON.
    Http,
    /// KServe v2 over gRPC.
    Grpc,
    /// KServe v2 over gRPC, on a `ModelStreamInfer` stream.
    GrpcStream,
    /// The shared-memory front end.
    Shm,
    /// TF Serving's REST API (`/v1/models/...`).
    TfServingRest,
    /// TF Serving's gRPC API (`tensorflow.serving.PredictionService`).
    TfServingGrpc,
}

impl Protocol {
    /// The `protocol` label of every metric (`http`, `grpc`, `grpc_stream`,
    /// `shm`, `tfs_rest`, `tfs_grpc`).
    pub const fn label(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
            Protocol::GrpcStream => "grpc_stream",
            Protocol::Shm => "shm",
            Protocol::TfServingRest => "tfs_rest",
            Protocol::TfServingGrpc => "tfs_grpc",
        }
    }

    /// This protocol's place in a `[_; PROTOCOLS]`.
    const fn index(self) -> usize {
        match self {
            Protocol::Http => 0,
            Protocol::Grpc => 1,
            Protocol::GrpcStream => 2,
            Protocol::Shm => 3,
            Protocol::TfServingRest => 4,
            Protocol::TfServingGrpc => 5,
        }
    }
}

/// The number of [`Protocol`]s.
const PROTOCOLS: usize = 6;

/// The metrics of a model's successful requests over one protocol.
struct Answered {
    requests: metrics::Counter,
    duration: metrics::Histogram,
}

/// Each model label's [`Answered`] handles, by protocol.
/// Hashed with FxHash, as the runtime's models: the keys are the names of
/// models that answered.
type AnsweredHandles =
    HashMap<String, [Option<Arc<Answered>>; PROTOCOLS], rustc_hash::FxBuildHasher>;

/// Registered once per model label and protocol, then reused: registering a
/// metric (its key built, its labels copied, the registry searched) costs
/// more than everything else a request records. Bounded like the labels:
/// names of models in the repository.
static ANSWERED: OnceLock<RwLock<AnsweredHandles>> = OnceLock::new();

/// `model`'s handles over `protocol`, registered on first use; `None` before
/// the recorder is installed (a handle taken then would record nowhere).
fn answered(protocol: Protocol, model: &str) -> Option<Arc<Answered>> {
    if !RECORDING.load(Ordering::Acquire) {
        return None;
    }
    let table = ANSWERED.get_or_init(Default::default);
    let slot = protocol.index();
    if let Some(found) = table
        .read()
        .ok()
        .and_then(|t| t.get(model).and_then(|by| by[slot].clone()))
    {
        return Some(found);
    }
    let mut table = table.write().ok()?;
    let by = table.entry(model.to_string()).or_default();
    Some(Arc::clone(by[slot].get_or_insert_with(|| {
        Arc::new(Answered {
            requests: metrics::counter!(names::REQUESTS, "model" => model.to_string(),
                "protocol" => protocol.label(), "code" => "ok"),
            duration: metrics::histogram!(names::REQUEST_DURATION,
                "model" => model.to_string(), "protocol" => protocol.label()),
        })
    })))
}

/// Records one answered inference request. `model` is the label: only names
/// of models in the repository, so a client cannot grow the label set.
#[allow(clippy::disallowed_methods)] // request latency is the machine's time
pub fn record_request(protocol: Protocol, model: &str, started: Instant, error: Option<&Error>) {
    if error.is_none()
        && let Some(handles) = answered(protocol, model)
    {
        handles.requests.increment(1);
        handles.duration.record(started.elapsed().as_secs_f64());
        return;
    }
    let code = match error {
        None => "ok",
        Some(e) => e.kind().as_str(),
    };
    // Label strings are copied per request: the recorder owns its keys.
    metrics::counter!(names::REQUESTS, "model" => model.to_string(), "protocol" => protocol.label(), "code" => code)
        .increment(1);
    metrics::histogram!(names::REQUEST_DURATION, "model" => model.to_string(), "protocol" => protocol.label())
        .record(started.elapsed().as_secs_f64());
    if let Some(Error::Overloaded { .. }) = error {
        metrics::counter!(names::REJECTIONS, "model" => model.to_string(), "reason" => "inflight_limit")
            .increment(1);
    }
}
