//! Metric names, each described once with its unit.
//!
//! Every crate records through these constants, so a name lives in one place.
//! Labels are bounded sets (model, version, bucket, device, protocol, code);
//! never a request id.

/// Graph compilations, labelled `family`, `bucket`, `device`: one per family ×
/// bucket × executor, however many members share it. Moves only while a new
/// family loads; a new member of a loaded family moves nothing.
pub const GRAPH_COMPILATIONS: &str = "tickserve_graph_compilations_total";
/// Requests answered, labelled `model`, `protocol`, `code`.
pub const REQUESTS: &str = "tickserve_requests_total";
/// End-to-end request duration in the server, labelled `model`, `protocol`.
pub const REQUEST_DURATION: &str = "tickserve_request_duration_seconds";
/// Time a request waited before its first run, labelled `model`.
pub const QUEUE_DURATION: &str = "tickserve_queue_duration_seconds";
/// Engine run time per bucket, labelled `model`, `bucket`, `device`.
pub const COMPUTE_DURATION: &str = "tickserve_compute_duration_seconds";
/// Rows in each engine run (requests batched together), labelled `model`.
pub const BATCH_ROWS: &str = "tickserve_batch_rows";
/// Zero rows padding each engine run up to its bucket, labelled `model`.
pub const PADDED_ROWS: &str = "tickserve_padded_rows";
/// Rows waiting in a model's queue, labelled `model`.
pub const QUEUE_ROWS: &str = "tickserve_queue_rows";
/// Requests refused by load shedding, labelled `model`, `reason`
/// (`queue_full`, `deadline_exceeded`, `inflight_limit`).
pub const REJECTIONS: &str = "tickserve_rejections_total";
/// Connections closed at once because `server.max_connections` were open,
/// or `server.max_connections_per_peer` from the connection's address,
/// labelled `protocol`, `reason` (`max_connections`,
/// `max_connections_per_peer`).
pub const CONNECTIONS_REFUSED: &str = "tickserve_connections_refused_total";
/// Requests refused before any handler ran, labelled `protocol`, `group`
/// (the endpoint group) and `reason` (`missing_key`, `wrong_key`).
pub const ACCESS_REFUSED: &str = "tickserve_access_refused_total";
/// Repository load and unload refused because model control is off,
/// labelled `protocol`.
pub const MODEL_CONTROL_REFUSED: &str = "tickserve_model_control_refused_total";
/// TLS handshakes that failed (no or an untrusted client certificate, a
/// client that does not speak TLS), labelled `protocol`.
pub const TLS_HANDSHAKE_FAILURES: &str = "tickserve_tls_handshake_failures_total";
/// Times the TLS certificate and key were loaded anew from their files.
pub const TLS_RELOADS: &str = "tickserve_tls_reloads_total";
/// Resident memory of the server process, in bytes (read at each scrape).
pub const PROCESS_RESIDENT_MEMORY: &str = "tickserve_process_resident_memory_bytes";
/// Requests waiting per priority level, labelled `model`, `level`.
pub const PRIORITY_QUEUE_REQUESTS: &str = "tickserve_priority_queue_requests";
/// Requests a priority level refused, labelled `model`, `level`, `reason`
/// (`queue_full`: its `max_queue_size`; `timeout`: refused once waiting
/// past a deadline, its level's `default_timeout` with `reject` included).
pub const PRIORITY_REJECTIONS: &str = "tickserve_priority_rejections_total";
/// Sequences a stateful model keeps now, labelled `model`.
pub const SEQUENCES_ACTIVE: &str = "tickserve_sequences_active";
/// Sequences started (`sequence_start`, a state write, a restart after
/// expiry), labelled `model`.
pub const SEQUENCE_STARTS: &str = "tickserve_sequence_starts_total";
/// Sequences ended (`sequence_end`, or dropped), labelled `model`.
pub const SEQUENCE_ENDS: &str = "tickserve_sequence_ends_total";
/// Sequences ended for sitting idle past `max_sequence_idle`, labelled `model`.
pub const SEQUENCE_EXPIRIES: &str = "tickserve_sequence_expiries_total";
/// Bytes the server's live allocations hold (jemalloc's `stats.allocated`,
/// read at each scrape): what a leak would grow, without the allocator's own
/// free pages.
pub const HEAP_ALLOCATED: &str = "tickserve_heap_allocated_bytes";
/// Bytes of physical memory the allocator holds (jemalloc's `stats.resident`:
/// live allocations, their pages' free space and its own metadata).
pub const HEAP_RESIDENT: &str = "tickserve_heap_resident_bytes";
/// CPU time of the server process, user plus system, in seconds (read at each scrape).
pub const PROCESS_CPU: &str = "tickserve_process_cpu_seconds_total";
/// 1 for each loaded model version, labelled `model`, `version`, `family`
/// (its family key): joins any model series to its family.
pub const MODEL_INFO: &str = "tickserve_model_info";
/// Model readiness (1 ready, 0 not), labelled `model`, `version`.
pub const MODEL_READY: &str = "tickserve_model_ready";
/// Runs that bound another member's weights than the executor's previous
/// run, labelled `family`, `device`.
pub const WEIGHT_SWAPS: &str = "tickserve_weight_swaps_total";
/// Runs that held rows of several family members, each row with its own
/// member's weights (one launch), labelled `family`, `device`.
pub const MIXED_MEMBER_RUNS: &str = "tickserve_mixed_member_runs_total";
/// Runs of the smallest bucket an idle executor made to stay warm
/// (`keep_warm`), labelled `family`, `device`; never counted as requests.
pub const KEEP_WARM_RUNS: &str = "tickserve_keep_warm_runs_total";
/// Model versions loaded while serving or at start, labelled `model`,
/// `outcome` (`loaded`, `failed`).
pub const MODEL_LOADS: &str = "tickserve_model_loads_total";
/// Model versions that stopped serving (unloaded, replaced by a reload, or
/// dropped by the version policy), labelled `model`.
pub const MODEL_UNLOADS: &str = "tickserve_model_unloads_total";
/// How long the last change of a model took, from reading its directory to
/// the switch (loading and warming its new versions), labelled `model`.
pub const MODEL_SWITCH_SECONDS: &str = "tickserve_model_switch_seconds";
/// The version each label names, labelled `model`, `label`; removed labels
/// read 0.
pub const MODEL_LABEL_VERSION: &str = "tickserve_model_label_version";
/// Requests that named no version, by the version a model's `[split]`
/// sent them to, labelled `model`, `version`.
pub const SPLIT_REQUESTS: &str = "tickserve_split_requests_total";
/// The largest absolute difference between a shadow's answer and its
/// primary's, per mirrored request, labelled `model`, `primary`, `shadow`.
pub const SHADOW_MAX_ABS_DIFF: &str = "tickserve_shadow_max_abs_diff";
/// Rows a shadow answered, by whether their top class (arg-max, or sign)
/// agreed with the primary's, labelled `model`, `primary`, `shadow`, `agree`.
pub const SHADOW_ROWS: &str = "tickserve_shadow_rows_total";
/// A shadow's own run time per mirrored request, labelled `model`,
/// `primary`, `shadow`.
pub const SHADOW_DURATION: &str = "tickserve_shadow_duration_seconds";
/// Mirrored requests a shadow did not answer, labelled `model`, `primary`,
/// `shadow`, `reason` (`busy`: it would have waited; `failed`).
pub const SHADOW_DROPPED: &str = "tickserve_shadow_dropped_total";
/// GPU time of each bucket run, measured with CUDA events around the graph
/// launch, labelled `family`, `bucket`, `device` (`gpu:N`).
pub const DEVICE_COMPUTE_DURATION: &str = "tickserve_device_compute_duration_seconds";
/// Device memory tickserve holds (weights, bucket buffers, workspaces),
/// labelled `device` (`gpu:N`).
pub const DEVICE_MEMORY: &str = "tickserve_device_memory_bytes";
/// Device memory in use on the whole device as the driver reports it
/// (`cuMemGetInfo`: every process and context, tickserve's included),
/// labelled `device` (`gpu:N`), sampled whenever tickserve allocates or
/// frees device memory.
pub const DEVICE_MEMORY_USED: &str = "tickserve_device_memory_used_bytes";

/// Answers withheld because an output broke a guard, labelled `model`,
/// `version`, `output` and `guard` (`min`, `max`, `max_step`, `finite`).
pub const GUARD_TRIPS: &str = "tickserve_guard_trips_total";

/// 1 while a model version is halted (the kill switch or its breaker),
/// labelled `model` and `version`; 0 once resumed.
pub const MODEL_HALTED: &str = "tickserve_model_halted";

/// Connections closed because their peer left an answer untaken for
/// `server.send_timeout`, labelled `protocol`.
pub const SEND_TIMEOUTS: &str = "tickserve_send_timeouts_total";

/// Panics on a shared-memory front-end thread (each is restarted), labelled
/// `thread`.
pub const SHM_THREAD_PANICS: &str = "tickserve_shm_thread_panics_total";

/// Warm runs a shared-memory front-end thread of the latency mode made on
/// its own core after `latency.warm` without a request, labelled `thread`;
/// never counted as requests.
pub const SHM_WARM_RUNS: &str = "tickserve_shm_warm_runs_total";

/// Journal records written, labelled `model`.
pub const JOURNAL_RECORDS: &str = "tickserve_journal_records_total";
/// Bytes written to journal files.
pub const JOURNAL_BYTES: &str = "tickserve_journal_bytes_total";
/// Journal records dropped, labelled `reason` (`full`: the queue was at
/// `journal.max_queued_bytes`; `io`: a write failed; `stopped`: the writer
/// had stopped).
pub const JOURNAL_DROPPED: &str = "tickserve_journal_dropped_total";
/// Requests refused because their record could not be kept
/// (`journal.when_full = "refuse"`), labelled `reason`.
pub const JOURNAL_REFUSED: &str = "tickserve_journal_refused_total";
/// Bytes of records waiting for the journal's writer.
pub const JOURNAL_QUEUED_BYTES: &str = "tickserve_journal_queued_bytes";
/// Time one `fsync` of a journal file took.
pub const JOURNAL_FSYNC_DURATION: &str = "tickserve_journal_fsync_duration_seconds";
/// Journal write and fsync failures (each logged at most once a minute).
pub const JOURNAL_ERRORS: &str = "tickserve_journal_errors_total";

/// Histogram buckets for durations, in seconds: 10 µs to 100 ms.
pub const DURATION_BUCKETS: [f64; 16] = [
    10e-6, 25e-6, 50e-6, 75e-6, 100e-6, 150e-6, 250e-6, 500e-6, 750e-6, 1e-3, 2e-3, 5e-3, 10e-3,
    25e-3, 50e-3, 100e-3,
];

/// Histogram buckets for a shadow's largest absolute difference: exact,
/// float noise, then decades up to 1.
pub const DIFF_BUCKETS: [f64; 9] = [0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0];

/// Histogram buckets for row counts (batch rows, padded rows).
pub const ROW_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Registers every metric's description and unit with the installed recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        GRAPH_COMPILATIONS,
        Unit::Count,
        "Graph compilations by model, bucket and device; flat once models are ready."
    );
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Inference requests answered, by model, protocol and code."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from a request's decode to its response, by model and protocol."
    );
    describe_histogram!(
        QUEUE_DURATION,
        Unit::Seconds,
        "Time a request waited before its first run."
    );
    describe_histogram!(
        COMPUTE_DURATION,
        Unit::Seconds,
        "Engine run time per bucket."
    );
    describe_counter!(
        JOURNAL_RECORDS,
        Unit::Count,
        "Journal records written, by model."
    );
    describe_counter!(
        JOURNAL_BYTES,
        Unit::Bytes,
        "Bytes written to journal files."
    );
    describe_counter!(
        JOURNAL_DROPPED,
        Unit::Count,
        "Journal records dropped, by reason (full, io, stopped)."
    );
    describe_counter!(
        JOURNAL_REFUSED,
        Unit::Count,
        "Requests refused because their journal record could not be kept."
    );
    describe_gauge!(
        JOURNAL_QUEUED_BYTES,
        Unit::Bytes,
        "Bytes of records waiting for the journal's writer."
    );
    describe_histogram!(
        JOURNAL_FSYNC_DURATION,
        Unit::Seconds,
        "Time one fsync of a journal file took."
    );
    describe_counter!(
        JOURNAL_ERRORS,
        Unit::Count,
        "Journal write and fsync failures."
    );
    describe_gauge!(
        PROCESS_RESIDENT_MEMORY,
        Unit::Bytes,
        "Resident memory of the server process."
    );
    describe_gauge!(
        PRIORITY_QUEUE_REQUESTS,
        Unit::Count,
        "Requests waiting, per priority level."
    );
    describe_counter!(
        PRIORITY_REJECTIONS,
        Unit::Count,
        "Requests a priority level refused (queue_full, timeout)."
    );
    describe_gauge!(
        SEQUENCES_ACTIVE,
        Unit::Count,
        "Sequences a stateful model keeps now."
    );
    describe_counter!(
        SEQUENCE_STARTS,
        Unit::Count,
        "Sequences started (sequence_start, a state write, a restart after expiry)."
    );
    describe_counter!(
        SEQUENCE_ENDS,
        Unit::Count,
        "Sequences ended (sequence_end, or dropped)."
    );
    describe_counter!(
        SEQUENCE_EXPIRIES,
        Unit::Count,
        "Sequences ended for sitting idle past max_sequence_idle."
    );
    describe_gauge!(
        HEAP_ALLOCATED,
        Unit::Bytes,
        "Bytes the server's live allocations hold (jemalloc stats.allocated)."
    );
    describe_gauge!(
        HEAP_RESIDENT,
        Unit::Bytes,
        "Physical memory the allocator holds (jemalloc stats.resident)."
    );
    describe_counter!(
        PROCESS_CPU,
        Unit::Seconds,
        "CPU time of the server process, user plus system."
    );
    describe_gauge!(
        MODEL_INFO,
        Unit::Count,
        "1 for each loaded model version, with its family key."
    );
    describe_gauge!(QUEUE_ROWS, Unit::Count, "Rows waiting in a model's queue.");
    describe_counter!(
        MIXED_MEMBER_RUNS,
        Unit::Count,
        "Runs that held rows of several family members, each with its own weights."
    );
    describe_counter!(
        WEIGHT_SWAPS,
        Unit::Count,
        "Runs that bound another family member's weights than the run before."
    );
    describe_counter!(
        KEEP_WARM_RUNS,
        Unit::Count,
        "Runs of the smallest bucket an idle executor made to stay warm (keep_warm)."
    );
    describe_counter!(
        MODEL_LOADS,
        Unit::Count,
        "Model versions loaded, by model and outcome (loaded, failed)."
    );
    describe_counter!(
        MODEL_UNLOADS,
        Unit::Count,
        "Model versions that stopped serving, by model."
    );
    describe_gauge!(
        MODEL_SWITCH_SECONDS,
        Unit::Seconds,
        "How long the last change of a model took: reading, loading and warming its new versions, then the switch."
    );
    describe_histogram!(
        SHADOW_MAX_ABS_DIFF,
        Unit::Count,
        "The largest absolute difference between a shadow's answer and its primary's, per mirrored request."
    );
    describe_counter!(
        SHADOW_ROWS,
        Unit::Count,
        "Rows a shadow answered, by whether their top class (arg-max, or sign) agreed with the primary's."
    );
    describe_histogram!(
        SHADOW_DURATION,
        Unit::Seconds,
        "A shadow's own run time per mirrored request."
    );
    describe_counter!(
        SHADOW_DROPPED,
        Unit::Count,
        "Mirrored requests a shadow did not answer: busy (it would have waited) or failed."
    );
    describe_counter!(
        SPLIT_REQUESTS,
        Unit::Count,
        "Requests that named no version, by the version the model's split sent them to."
    );
    describe_gauge!(
        MODEL_LABEL_VERSION,
        Unit::Count,
        "The version each label of a model names (0: the label was removed)."
    );
    describe_counter!(
        REJECTIONS,
        Unit::Count,
        "Requests refused by load shedding, by model and reason."
    );
    describe_counter!(
        ACCESS_REFUSED,
        Unit::Count,
        "Requests refused for a missing or wrong key, by protocol, endpoint group and reason."
    );
    describe_counter!(
        MODEL_CONTROL_REFUSED,
        Unit::Count,
        "Repository load and unload refused because security.model_control_mode is none, by protocol."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        Unit::Count,
        "TLS handshakes that failed (no or an untrusted client certificate, plain text on a TLS port), by protocol."
    );
    describe_counter!(
        TLS_RELOADS,
        Unit::Count,
        "Times the TLS certificate and key were loaded anew from their files."
    );
    describe_counter!(
        SEND_TIMEOUTS,
        Unit::Count,
        "Connections closed because their peer left an answer untaken for server.send_timeout, \
         by protocol."
    );
    describe_counter!(
        SHM_WARM_RUNS,
        Unit::Count,
        "Warm runs a latency-mode shared-memory thread made on its own core after latency.warm \
         without a request, by thread; not requests."
    );
    describe_counter!(
        SHM_THREAD_PANICS,
        Unit::Count,
        "Panics on a shared-memory front-end thread, by thread; the server is not ready while \
         the thread is down, and it starts again."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        Unit::Count,
        "Connections closed at once because server.max_connections were open, by protocol."
    );
    describe_histogram!(
        DEVICE_COMPUTE_DURATION,
        Unit::Seconds,
        "GPU time per bucket run (CUDA events), by family, bucket and device."
    );
    describe_gauge!(
        DEVICE_MEMORY,
        Unit::Bytes,
        "Device memory held by tickserve, by device."
    );
    describe_gauge!(
        MODEL_HALTED,
        Unit::Count,
        "1 while a model version is halted (kill switch or breaker), by model and version."
    );
    describe_counter!(
        GUARD_TRIPS,
        Unit::Count,
        "Answers withheld because an output broke a guard of its model.toml, by model, version, \
         output and guard (min, max, finite)."
    );
    describe_gauge!(
        DEVICE_MEMORY_USED,
        Unit::Bytes,
        "Device memory in use on the whole device (the driver's count, every process), by device."
    );
    describe_gauge!(
        MODEL_READY,
        Unit::Count,
        "1 when a model version is ready to serve."
    );
}
