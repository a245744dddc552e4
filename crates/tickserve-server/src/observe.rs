//! The process-wide Prometheus recorder and the process metrics read at each
//! scrape (the per-request metrics are the edge's: [`tickserve_edge::observe`]).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
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
        tickserve_edge::observe::recorder_installed();
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
