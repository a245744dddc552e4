//! Metrics plumbing for the server: the process-wide Prometheus recorder and
//! the per-request metrics the front ends record.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tickserve_core::Error;
use tickserve_core::metrics as names;

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder once per process (tests start several
/// servers in one process; they share it) and returns its handle.
pub fn install_recorder() -> &'static PrometheusHandle {
    PROMETHEUS.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&names::DURATION_BUCKETS)
            .expect("the duration bucket list is a non-empty constant")
            .set_buckets_for_metric(Matcher::Full(names::BATCH_ROWS.into()), &names::ROW_BUCKETS)
            .expect("the row bucket list is a non-empty constant")
            .set_buckets_for_metric(
                Matcher::Full(names::PADDED_ROWS.into()),
                &names::ROW_BUCKETS,
            )
            .expect("the row bucket list is a non-empty constant")
            .set_buckets_for_metric(
                Matcher::Full(names::SHADOW_MAX_ABS_DIFF.into()),
                &names::DIFF_BUCKETS,
            )
            .expect("the difference bucket list is a non-empty constant")
            .build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; then ours just renders nothing.
        let _ = metrics::set_global_recorder(recorder);
        names::describe();
        // Histogram samples pile up until they are folded into buckets, which
        // rendering does; without a scrape they would grow without bound.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the metrics upkeep thread; histograms fold only when /metrics is scraped");
        }
        handle
    })
}

/// The Prometheus text exposition of every metric, with the process metrics
/// read just before.
pub fn render() -> String {
    record_process();
    install_recorder().render()
}

/// Reads jemalloc's live and resident bytes (fresh: the stats epoch is
/// advanced first).
#[cfg(all(feature = "jemalloc", target_os = "linux", not(target_env = "musl")))]
fn record_heap() {
    use tikv_jemalloc_ctl::{epoch, stats};
    if epoch::advance().is_err() {
        return;
    }
    if let Ok(bytes) = stats::allocated::read() {
        metrics::gauge!(names::HEAP_ALLOCATED).set(bytes as f64);
    }
    if let Ok(bytes) = stats::resident::read() {
        metrics::gauge!(names::HEAP_RESIDENT).set(bytes as f64);
    }
}

/// Elsewhere the process allocator is the system's, which reports nothing.
#[cfg(not(all(feature = "jemalloc", target_os = "linux", not(target_env = "musl"))))]
fn record_heap() {}

/// Reads the process's resident memory and CPU time from `/proc/self` (Linux;
/// elsewhere the two metrics are simply not updated).
fn record_process() {
    if let Some(kib) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
    {
        metrics::gauge!(names::PROCESS_RESIDENT_MEMORY).set(kib * 1024.0);
    }
    record_heap();
    // Fields 14 and 15 of /proc/self/stat (after the parenthesised command name):
    // user and system time in clock ticks of USER_HZ, 100 on Linux.
    const USER_HZ: f64 = 100.0;
    if let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after_name.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
    {
        metrics::counter!(names::PROCESS_CPU).absolute((ticks as f64 / USER_HZ) as u64);
    }
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
    PROMETHEUS.get()?;
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
