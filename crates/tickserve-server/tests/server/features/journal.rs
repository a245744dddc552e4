//! The prediction journal against a real server: every front end's
//! requests recorded exactly, with the outputs the clients got bit for bit
//! (read with pyarrow and polars, `tests/python/journal_check.py`), verified
//! and replayed bit for bit; `verify` finds a truncated tail, a gap and an
//! edited record; a journal that cannot write drops and counts (`drop`) or
//! refuses with 503 and answers nothing unrecorded (`refuse`).

use crate::support;

use std::path::Path;
use std::sync::Arc;

use tickserve_core::config::{ServerConfig, WhenFull};
use tickserve_journal::read::read_file;
use tickserve_journal::verify::verify;

/// The sample repository's models and the fixtures' tree ensemble.
fn mixed_repository() -> tempfile::TempDir {
    let dir = support::fixture_repository();
    let samples = support::root().join("config/models");
    std::fs::remove_dir_all(dir.path().join("alpha_mlp")).unwrap();
    for model in [
        "alpha_mlp",
        "seq_lstm",
        "seq_lstm_step",
        "seq_lstm_window",
        "tick_000",
        "tick_001",
    ] {
        std::os::unix::fs::symlink(samples.join(model), dir.path().join(model)).unwrap();
    }
    dir
}

/// `support::config` with the journal on, writing into `journal`.
pub(super) fn journaled(repository: &Path, journal: &Path) -> ServerConfig {
    let mut config = support::config(repository);
    config.journal.enabled = true;
    config.journal.directory = journal.to_path_buf();
    config
}

/// Waits until every record handed over so far is written and synced.
pub(super) async fn flush(server: &tickserve_server::Server) {
    let journal = Arc::clone(server.edge().journal.as_ref().unwrap());
    tokio::task::spawn_blocking(move || journal.flush())
        .await
        .unwrap();
}

fn alpha_body(n: usize) -> serde_json::Value {
    let data: Vec<f32> = (0..50).map(|i| (i * 7 + n) as f32 * 0.01).collect();
    serde_json::json!({
        "id": format!("r-{n}"),
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": data}]
    })
}

async fn post_alpha(base: &str, n: usize) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{base}/v2/models/alpha_mlp/infer"))
        .json(&alpha_body(n))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_end_is_journaled_bit_for_bit_verified_and_replayed() {
    let repository = mixed_repository();
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(repository.path(), journal.path());
    let service = format!("tickserve-test-{}-journal", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    let server = support::start(&config).await;
    let sent = journal.path().join("../sent.json");
    let sent = sent.as_os_str();
    let send: [&std::ffi::OsStr; 6] = [
        "send".as_ref(),
        "--sent".as_ref(),
        sent,
        "--service".as_ref(),
        service.as_ref(),
        "--count".as_ref(),
    ];
    let mut args = send.to_vec();
    args.push("420".as_ref());
    support::run_python_check(&server, "journal_check.py", &args, "sent 420").await;
    // Every answered request's record was handed over before its answer.
    flush(&server).await;
    let read: [&std::ffi::OsStr; 5] = [
        "read".as_ref(),
        "--sent".as_ref(),
        sent,
        "--journal".as_ref(),
        journal.path().as_os_str(),
    ];
    support::run_python_check(&server, "journal_check.py", &read, "journal matches: 420").await;

    let report = verify(journal.path()).unwrap();
    print!("{}", report.text());
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 420);
    assert!(report.streams.iter().all(|s| s.truncated_tail.is_none()));
    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    print!("{}", replay.text());
    assert_eq!(replay.records, 420);
    assert_eq!(replay.identical, 420, "{}", replay.text());
    assert!(replay.mismatches.is_empty() && replay.not_replayed.is_empty());
    server.shutdown().await.unwrap();
}

/// Rewrites `path` with one value of its first batch's `request_id` column
/// changed, as an editor of the file would.
fn edit_a_record(path: &Path) {
    use arrow_array::StringArray;
    let file = read_file(path).unwrap();
    let batch = &file.batches[0];
    let index = batch.schema().index_of("request_id").unwrap();
    let mut ids: Vec<String> = batch
        .column(index)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .iter()
        .map(|s| s.unwrap().to_string())
        .collect();
    ids[0] = "edited".into();
    replace_column(path, &file, index, Arc::new(StringArray::from(ids)));
}

/// Rewrites `path` (read as `file`) with column `index` of its first record
/// batch replaced by `column`, every other batch as it was.
fn replace_column(
    path: &Path,
    file: &tickserve_journal::read::ReadFile,
    index: usize,
    column: arrow_array::ArrayRef,
) {
    let batch = &file.batches[0];
    let mut columns = batch.columns().to_vec();
    columns[index] = column;
    let edited = arrow_array::RecordBatch::try_new(batch.schema(), columns).unwrap();
    let out = std::fs::File::create(path).unwrap();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(out, &batch.schema()).unwrap();
    writer.write(&edited).unwrap();
    for batch in &file.batches[1..] {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
}

/// A record that holds no output (its client asked for none: older servers
/// answered `"outputs": []` so) is rerun with nothing to compare, not a
/// mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reruns_a_record_without_outputs_and_finds_nothing_to_compare() {
    let journal = tempfile::tempdir().unwrap();
    let config = journaled(&support::root().join("config/models"), journal.path());
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..3 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    flush(&server).await;
    // The first record's outputs as such a record holds them: none.
    let files = walk(journal.path());
    let file = read_file(&files[0]).unwrap();
    let batch = &file.batches[0];
    let index = batch.schema().index_of("output.probabilities").unwrap();
    use arrow_array::cast::AsArray;
    let (field, offsets, values, _) = batch.column(index).as_list::<i32>().clone().into_parts();
    let kept = (0..batch.num_rows()).map(|r| r != 0).collect::<Vec<_>>();
    let nulls = arrow_buffer::NullBuffer::from(kept);
    let column = arrow_array::ListArray::new(field, offsets, values, Some(nulls));
    replace_column(&files[0], &file, index, Arc::new(column));
    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    print!("{}", replay.text());
    assert_eq!(replay.replayed, 3, "{}", replay.text());
    assert_eq!(replay.nothing_to_compare, 1, "{}", replay.text());
    assert_eq!(replay.identical, 2, "{}", replay.text());
    assert!(replay.mismatches.is_empty(), "{}", replay.text());
    server.shutdown().await.unwrap();
}

/// Every file names what its predictions were computed on; replay says
/// which of it differs on the machine it runs on before it compares bits
/// (here: a file rewritten as if made on a CPU with other extensions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_file_names_its_machine_and_replay_says_what_differs_here() {
    let journal = tempfile::tempdir().unwrap();
    let config = journaled(&support::root().join("config/models"), journal.path());
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..2 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    flush(&server).await;
    let files = walk(journal.path());
    let header = tickserve_journal::read::JournalFile::open(&files[0]).unwrap();
    for name in [
        "server",
        "onnxruntime",
        "cpu",
        "cpu_isa",
        "gpus",
        "cuda_driver",
        "cuda_libraries",
        "os",
        "arch",
    ] {
        assert!(
            header.machine.contains_key(name),
            "{name}: {:?}",
            header.machine
        );
    }
    assert!(
        header.machine["onnxruntime"].contains("1.31"),
        "{:?}",
        header.machine
    );
    assert_eq!(header.machine["onnxruntime_intra_op_threads"], "1");
    assert!(
        header.machine["cuda_libraries"].starts_with("cuBLAS "),
        "{:?}",
        header.machine
    );
    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    assert!(replay.machine_differences.is_empty(), "{}", replay.text());

    // The same records, as if computed where the CPU had AVX-512.
    let file = read_file(&files[0]).unwrap();
    let batch = &file.batches[0];
    let schema = batch.schema();
    let mut meta = schema.metadata().clone();
    let mut machine = header.machine.clone();
    machine.insert("cpu_isa".into(), "sse4_2 avx2 avx512f".into());
    meta.insert(
        "tickserve.machine".to_string(),
        serde_json::to_string(&machine).unwrap(),
    );
    let schema = Arc::new(schema.as_ref().clone().with_metadata(meta));
    let out = std::fs::File::create(&files[0]).unwrap();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(out, &schema).unwrap();
    for batch in &file.batches {
        let batch =
            arrow_array::RecordBatch::try_new(Arc::clone(&schema), batch.columns().to_vec())
                .unwrap();
        writer.write(&batch).unwrap();
    }
    writer.finish().unwrap();
    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    let text = replay.text();
    assert_eq!(replay.machine_differences.len(), 1, "{text}");
    assert!(
        text.starts_with("MACHINE DIFFERS: cpu_isa: recorded 'sse4_2 avx2 avx512f', here '"),
        "{text}"
    );
    // The bits still compare (here they are the same).
    assert_eq!(replay.identical, 2, "{text}");
    server.shutdown().await.unwrap();
}

/// An answer a guard withheld is recorded with what the model said, status
/// `withheld` and the message naming the guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_answer_is_recorded_with_its_outputs_and_the_guard() {
    use arrow_array::cast::AsArray;
    let repository = tempfile::tempdir().unwrap();
    support::deploy_version(repository.path(), "alpha_mlp", 1, "alpha_mlp");
    std::fs::write(
        repository.path().join("alpha_mlp/model.toml"),
        "[[guard]]\noutput = \"probabilities\"\nmax = 0.0\n",
    )
    .unwrap();
    let journal = tempfile::tempdir().unwrap();
    let server = support::start(&journaled(repository.path(), journal.path())).await;
    let base = format!("http://{}", server.http_addr);
    assert_eq!(post_alpha(&base, 0).await.as_u16(), 422);
    flush(&server).await;
    let file = read_file(&walk(journal.path())[0]).unwrap();
    let batch = &file.batches[0];
    let column = |name: &str| batch.column(batch.schema().index_of(name).unwrap()).clone();
    assert_eq!(column("status").as_string::<i32>().value(0), "withheld");
    let error = column("error");
    let error = error.as_string::<i32>().value(0);
    assert!(error.contains("guard on output 'probabilities'"), "{error}");
    let outputs = column("output.probabilities");
    assert!(outputs.is_valid(0), "the model's outputs are kept");
    server.shutdown().await.unwrap();
}

/// A halt and a resume are records of the version's stream, between its
/// predictions: status `halted` / `resumed`, the reason in `error`, the
/// front end they came over; a refused request while halted is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halts_and_resumes_are_records_between_the_predictions() {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.risk.control = tickserve_core::config::RiskControl::Open;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let control = |verb: &'static str| {
        let url = format!("{base}/v2/models/alpha_mlp/versions/1/{verb}");
        async move {
            let answer = reqwest::Client::new()
                .post(url)
                .json(&serde_json::json!({"reason": "limits breached"}))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), 200);
        }
    };
    assert_eq!(post_alpha(&base, 0).await.as_u16(), 200);
    control("halt").await;
    assert_eq!(post_alpha(&base, 1).await.as_u16(), 423);
    control("resume").await;
    assert_eq!(post_alpha(&base, 2).await.as_u16(), 200);
    flush(&server).await;
    let statuses = records(journal.path());
    let kinds: Vec<&str> = statuses.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["ok", "halted", "halted", "resumed", "ok"],
        "{statuses:?}"
    );
    assert_eq!(statuses[1].1, "http");
    assert!(
        statuses[1]
            .2
            .as_deref()
            .unwrap()
            .contains("limits breached"),
        "{statuses:?}"
    );
    assert!(
        statuses[3].2.as_deref().unwrap().starts_with("resumed"),
        "{statuses:?}"
    );
    server.shutdown().await.unwrap();
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
}

/// `post_alpha`'s request `n` with Monte Carlo `parameters`.
fn alpha_mc(n: usize, parameters: serde_json::Value) -> serde_json::Value {
    let mut body = alpha_body(n);
    body["parameters"] = parameters;
    body
}

/// Replay reruns each Monte Carlo summary as it was asked, counts a record
/// that failed at first, reports an output changed since (and by how much),
/// and refuses records made by another model file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reruns_every_summary_counts_failures_and_finds_changed_outputs() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Float32Type;
    use arrow_array::{FixedSizeListArray, Float32Array, ListArray};
    let journal = tempfile::tempdir().unwrap();
    let config = journaled(&support::root().join("config/models"), journal.path());
    let server = support::start(&config).await;
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    let plain = alpha_body(0);
    let quantiles = alpha_mc(
        1,
        serde_json::json!({"mc_samples": 8, "mc_seed": 7, "mc_noise_sigma": 0.05,
        "mc_output": "quantiles", "mc_quantiles": "0.1,0.9"}),
    );
    let samples = alpha_mc(
        2,
        serde_json::json!({"mc_samples": 4, "mc_seed": 7, "mc_noise_sigma": 0.05,
        "mc_output": "samples"}),
    );
    let moments = alpha_mc(
        3,
        serde_json::json!({"mc_samples": 8, "mc_seed": 7, "mc_noise_sigma": 0.05}),
    );
    for body in [&plain, &quantiles, &samples, &moments] {
        let (status, answer) = support::post_json(&url, body).await;
        assert_eq!(status, 200, "{answer}");
    }
    // A request refused after its model was found is recorded, as failed.
    let mut wrong = alpha_body(4);
    wrong["inputs"][0]["shape"] = serde_json::json!([1, 49]);
    wrong["inputs"][0]["data"] = serde_json::json!(vec![0.5; 49]);
    let (status, _) = support::post_json(&url, &wrong).await;
    assert_eq!(status, 400);
    flush(&server).await;

    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    print!("{}", replay.text());
    assert_eq!(replay.records, 5, "{}", replay.text());
    assert_eq!(replay.identical, 4, "{}", replay.text());
    assert_eq!(replay.failed_originally, 1, "{}", replay.text());
    assert!(
        replay.text().contains(
            "5 records: 4 replayed, 4 bit-identical, 0 with no output to compare, 0 mismatched"
        ),
        "{}",
        replay.text()
    );

    // The plain record's first probability, changed by 0.5 after the fact.
    let files = walk(journal.path());
    let file = read_file(&files[0]).unwrap();
    let batch = &file.batches[0];
    let index = batch.schema().index_of("output.probabilities").unwrap();
    let (field, offsets, rows, nulls) = batch.column(index).as_list::<i32>().clone().into_parts();
    let (row_field, size, values, row_nulls) = rows.as_fixed_size_list().clone().into_parts();
    let mut floats = values.as_primitive::<Float32Type>().values().to_vec();
    floats[0] += 0.5;
    let rows = FixedSizeListArray::new(
        row_field,
        size,
        Arc::new(Float32Array::from(floats)),
        row_nulls,
    );
    let column = ListArray::new(field, offsets, Arc::new(rows), nulls);
    replace_column(&files[0], &file, index, Arc::new(column));
    let replay = tickserve_journal::replay::replay(journal.path(), &server.edge().runtime)
        .await
        .unwrap();
    assert_eq!(replay.mismatches.len(), 1, "{}", replay.text());
    assert!(
        replay.mismatches[0].contains("probabilities: differs"),
        "{}",
        replay.text()
    );
    assert!(
        (replay.worst_difference - 0.5).abs() < 1e-6,
        "{}",
        replay.text()
    );
    server.shutdown().await.unwrap();

    // Another alpha_mlp/1/model.onnx: its records are not rerun on it.
    let other = tempfile::tempdir().unwrap();
    support::deploy_version(other.path(), "alpha_mlp", 1, "tick_000");
    let mut config = support::config(other.path());
    config.journal.enabled = false;
    let runtime = tickserve_runtime::Runtime::load(&config).unwrap();
    let replay = tickserve_journal::replay::replay(journal.path(), &runtime)
        .await
        .unwrap();
    assert_eq!(replay.replayed, 0, "{}", replay.text());
    assert!(
        replay.not_replayed[0].contains("the records were made by"),
        "{}",
        replay.text()
    );
    runtime.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_a_truncated_tail_a_gap_and_an_edited_record() {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    // Small files: the requests below fill several.
    config.journal.rotate_bytes = 64 * 1024;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..600 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
        if n % 50 == 49 {
            // One record batch per flush: rotation happens between batches.
            flush(&server).await;
        }
    }
    server.shutdown().await.unwrap();
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 600);
    assert!(report.streams[0].closed, "{}", report.text());
    let mut files: Vec<_> = walk(journal.path());
    files.sort();
    assert!(files.len() >= 3, "{} files", files.len());

    // A crash: the last file ends in part of a record batch.
    let last = files.last().unwrap();
    let len = std::fs::metadata(last).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(last).unwrap();
    file.set_len(len - 100).unwrap();
    let report = verify(journal.path()).unwrap();
    print!("{}", report.text());
    assert!(report.sound(), "{}", report.text());
    assert!(report.streams[0].truncated_tail.is_some());
    assert!(!report.streams[0].closed, "{}", report.text());
    assert!(report.text().contains("its last file is not closed"));
    assert!(report.records() < 600);

    // An edited record breaks the chain there.
    edit_a_record(&files[1]);
    let report = verify(journal.path()).unwrap();
    print!("{}", report.text());
    assert!(!report.sound());
    assert_eq!(report.streams[0].broken_chain.len(), 1, "{}", report.text());
    assert!(report.streams[0].gaps.is_empty());
    let before = report.records();

    // A removed file is a gap: exactly its records.
    std::fs::remove_file(&files[1]).unwrap();
    let report = verify(journal.path()).unwrap();
    print!("{}", report.text());
    assert_eq!(report.streams[0].gaps.len(), 1, "{}", report.text());
    let [first, last] = report.streams[0].gaps[0];
    assert!(first > 0 && first <= last, "{}", report.text());
    assert_eq!(
        last - first + 1,
        before - report.records(),
        "{}",
        report.text()
    );
}

/// The record files (`*.arrows`) under `dir`.
/// Every record under `dir`, in file order: (status, protocol, error).
pub(super) fn records(dir: &Path) -> Vec<(String, String, Option<String>)> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    let mut records = Vec::new();
    for path in walk(dir) {
        for batch in &read_file(&path).unwrap().batches {
            let column = |name: &str| batch.column(batch.schema().index_of(name).unwrap()).clone();
            let (status, error, protocol) = (column("status"), column("error"), column("protocol"));
            let error = error.as_string::<i32>();
            for row in 0..batch.num_rows() {
                records.push((
                    status.as_string::<i32>().value(row).to_string(),
                    protocol.as_string::<i32>().value(row).to_string(),
                    error.is_valid(row).then(|| error.value(row).to_string()),
                ));
            }
        }
    }
    records
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "arrows") {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_cannot_write_drops_and_counts_in_drop_mode() {
    if support::alone(
        module_path!(),
        "a_journal_that_cannot_write_drops_and_counts_in_drop_mode",
    ) {
        return;
    }
    let journal = tempfile::tempdir().unwrap();
    let config = journaled(&support::root().join("config/models"), journal.path());
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let handle = Arc::clone(server.edge().journal.as_ref().unwrap());
    handle.fail_writes(true);
    for n in 0..20 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    flush(&server).await;
    assert_eq!(handle.dropped(), 20);
    let metrics = support::metrics_text(&base).await;
    assert!(
        support::counter_total(&metrics, "tickserve_journal_dropped_total") >= 20.0,
        "{metrics}"
    );
    // The disk has room again: records are written again.
    handle.fail_writes(false);
    for n in 20..30 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    server.shutdown().await.unwrap();
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 10);
    assert_eq!(report.streams[0].dropped_so_far, 20);
    // Every drop came before a written record: none after the last.
    assert_eq!(report.runs[0].dropped, Some(20), "{}", report.text());
    assert_eq!(report.runs[0].dropped_after_last_record, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_dropped_after_the_last_written_one_are_counted_in_the_journal() {
    let journal = tempfile::tempdir().unwrap();
    let config = journaled(&support::root().join("config/models"), journal.path());
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..5 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    flush(&server).await;
    let handle = Arc::clone(server.edge().journal.as_ref().unwrap());
    handle.fail_writes(true);
    for n in 5..25 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    flush(&server).await;
    assert_eq!(handle.dropped(), 20);
    server.shutdown().await.unwrap();
    handle.fail_writes(false);
    drop(handle);
    let report = verify(journal.path()).unwrap();
    print!("{}", report.text());
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 5);
    let stream = &report.streams[0];
    assert_eq!(
        (stream.model.as_str(), stream.version.as_str()),
        ("alpha_mlp", "1")
    );
    assert_eq!(stream.model_digest.len(), 64, "{}", stream.model_digest);
    // The records' own count stops at their last: 0.
    assert_eq!(report.streams[0].dropped_so_far, 0);
    // A file that is no journal file is named, and the rest still verified.
    std::fs::write(journal.path().join("stray.arrows"), b"not arrow").unwrap();
    let report = verify(journal.path()).unwrap();
    assert_eq!(report.unreadable.len(), 1, "{}", report.text());
    assert!(
        report.unreadable[0].contains("stray.arrows"),
        "{}",
        report.text()
    );
    assert_eq!(report.records(), 5);
    std::fs::remove_file(journal.path().join("stray.arrows")).unwrap();
    let run = &report.runs[0];
    assert_eq!(run.dropped, Some(20), "{}", report.text());
    assert_eq!(run.dropped_after_last_record, Some(20));
    assert!(run.final_count, "{}", report.text());
    assert!(
        report
            .text()
            .contains("20 records dropped in all, 20 of them after its last record")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_cannot_write_refuses_with_503_in_refuse_mode_and_answers_nothing_unrecorded()
 {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.journal.when_full = WhenFull::Refuse;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let handle = Arc::clone(server.edge().journal.as_ref().unwrap());
    assert_eq!(post_alpha(&base, 0).await, reqwest::StatusCode::OK);
    handle.fail_writes(true);
    let mut answered = 1;
    let mut refused = 0;
    for n in 1..40 {
        match post_alpha(&base, n).await {
            reqwest::StatusCode::OK => answered += 1,
            reqwest::StatusCode::SERVICE_UNAVAILABLE => refused += 1,
            other => panic!("request {n}: {other}"),
        }
    }
    assert_eq!(answered, 1, "an answer left without its record");
    assert_eq!(refused, 39);
    // The message says why, over gRPC too.
    let mut grpc = tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        format!("http://{}", server.grpc_addr),
    )
    .await
    .unwrap();
    let status = grpc
        .model_infer(support::grpc_alpha_row())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("journal"), "{}", status.message());
    // Room again: within a second one request finds out, and serving resumes.
    handle.fail_writes(false);
    let mut back = false;
    for n in 40..240 {
        if post_alpha(&base, n).await == reqwest::StatusCode::OK {
            back = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(back, "serving did not resume once the journal could write");
    server.shutdown().await.unwrap();
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
    // Every answer has its record: the first and the one after recovery.
    assert_eq!(report.records(), 2, "{}", report.text());
}

/// A tick of `seq_lstm_step`'s sequence 7 (8 features of `value`).
fn seq_tick(start: bool, value: f32) -> serde_json::Value {
    seq_tick_of(7, start, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_refused_for_its_record_leaves_its_sequence_as_it_was() {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.journal.when_full = WhenFull::Refuse;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let step = format!("{base}/v2/models/seq_lstm_step/infer");
    let read = || async {
        let url = format!("{base}/v2/models/seq_lstm_step/sequences/read");
        let body = serde_json::json!({"parameters": {"sequence_id": 7}});
        let (status, state) = support::post_json(&url, &body).await;
        assert_eq!(status, 200, "{state}");
        (
            state["outputs"].clone(),
            state["parameters"]["ticks"].clone(),
        )
    };
    let (status, answer) = support::post_json(&step, &seq_tick(true, 0.5)).await;
    assert_eq!(status, 200, "{answer}");
    let before = read().await;
    assert_eq!(before.1, serde_json::json!(1));

    // The journal fails: a tick that runs is answered 503 for its record,
    // and the sequence has not moved (a client may retry it).
    let handle = Arc::clone(server.edge().journal.as_ref().unwrap());
    handle.fail_writes(true);
    let (status, answer) = support::post_json(&step, &seq_tick(false, 0.25)).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(
        read().await,
        before,
        "a tick answered 503 moved its sequence"
    );
    // Once the journal writes again, the retried tick applies once.
    handle.fail_writes(false);
    let mut applied = None;
    for _ in 0..200 {
        let (status, answer) = support::post_json(&step, &seq_tick(false, 0.25)).await;
        if status == 200 {
            applied = Some(answer);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(applied.is_some(), "serving did not resume");
    let after = read().await;
    assert_eq!(after.1, serde_json::json!(2));
    assert_ne!(after.0, before.0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_opt_out_and_the_sample_fraction_is_exact() {
    // Every model out by default: nothing is recorded.
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.model_defaults.journal = false;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..10 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    server.shutdown().await.unwrap();
    assert_eq!(verify(journal.path()).unwrap().records(), 0);
    assert!(walk(journal.path()).is_empty());

    // Every model in, a quarter of the requests recorded: exactly 10 of 40.
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.journal.sample = 0.25;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    for n in 0..40 {
        assert_eq!(post_alpha(&base, n).await, reqwest::StatusCode::OK);
    }
    server.shutdown().await.unwrap();
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_names_the_key_and_the_traceparent_it_came_with_in_an_owner_only_file() {
    use arrow_array::cast::AsArray;
    use sha2::Digest;
    const KEY: &str = "journal-test-key";
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    support::restrict_every_group(
        &mut config,
        "admin-key",
        KEY,
        &[tickserve_core::config::FrontEnd::Http],
    );
    let server = support::start(&config).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let status = reqwest::Client::new()
        .post(format!(
            "http://{}/v2/models/alpha_mlp/infer",
            server.http_addr
        ))
        .header("admin-key", KEY)
        .header("traceparent", traceparent)
        .json(&alpha_body(0))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, reqwest::StatusCode::OK);
    server.shutdown().await.unwrap();
    let files = walk(journal.path());
    assert_eq!(files.len(), 1);
    // The records hold every input and output: the server's user alone reads them.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let dir = std::fs::metadata(files[0].parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir & 0o777, 0o700, "{dir:o}");
    let file = read_file(&files[0]).unwrap();
    let batch = &file.batches[0];
    let key = batch.column_by_name("key").unwrap().as_string::<i32>();
    let digest = sha2::Sha256::digest(KEY.as_bytes());
    let expected: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(key.value(0), expected);
    let trace = batch
        .column_by_name("traceparent")
        .unwrap()
        .as_string::<i32>();
    assert_eq!(trace.value(0), traceparent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_end_by_age_as_well_as_by_size() {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.journal.rotate_interval = std::time::Duration::from_millis(200);
    // The writer ages its files on a clock the test moves.
    config.clock = tickserve_core::Clock::by_hand();
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    // Three bursts, each past the last file's age.
    for burst in 0..3 {
        for n in 0..5 {
            assert_eq!(
                post_alpha(&base, burst * 5 + n).await,
                reqwest::StatusCode::OK
            );
        }
        flush(&server).await;
        config.clock.advance(std::time::Duration::from_millis(300));
    }
    server.shutdown().await.unwrap();
    let files = walk(journal.path());
    assert_eq!(files.len(), 3, "{files:?}");
    let report = verify(journal.path()).unwrap();
    assert!(report.sound(), "{}", report.text());
    assert_eq!(report.records(), 15);
    assert_eq!(report.streams[0].files, 3);
}

/// Each record file's stream version, and its records' count.
fn records_per_version(dir: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for path in walk(dir) {
        let file = read_file(&path).unwrap();
        let rows: usize = file
            .batches
            .iter()
            .map(arrow_array::RecordBatch::num_rows)
            .sum();
        *out.entry(file.file.stream.version.clone()).or_insert(0) += rows;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_models_sequence_is_journaled_under_the_version_that_keeps_it() {
    let repository = tempfile::tempdir().unwrap();
    for v in [1, 2] {
        support::deploy_version(repository.path(), "journal_split", v, "seq_lstm_step");
    }
    let state =
        std::fs::read_to_string(support::root().join("config/models/seq_lstm_step/model.toml"))
            .unwrap();
    std::fs::write(
        repository.path().join("journal_split/model.toml"),
        format!("version_policy = \"all\"\n\n[split]\nstable = 50\ncanary = 50\n\n{state}"),
    )
    .unwrap();
    std::fs::write(
        repository.path().join("journal_split/labels.toml"),
        "stable = 1\ncanary = 2\n",
    )
    .unwrap();
    let journal = tempfile::tempdir().unwrap();
    let server = support::start(&journaled(repository.path(), journal.path())).await;
    let url = format!("http://{}/v2/models/journal_split/infer", server.http_addr);
    // One sequence, 40 ticks: the split draws either version for each, and
    // every tick goes to the version the sequence started on.
    let mut answered = std::collections::BTreeSet::new();
    for t in 0..40 {
        answered.insert(support::answered_version(&url, &seq_tick_of(3, t == 0, 0.1)).await);
    }
    assert_eq!(answered.len(), 1, "{answered:?}");
    flush(&server).await;
    server.shutdown().await.unwrap();
    // Its 40 records are in that version's file, none in the other's.
    let counts = records_per_version(journal.path());
    let kept = answered.into_iter().next().unwrap();
    assert_eq!(counts.get(&kept), Some(&40), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 40, "{counts:?}");
}

/// A tick of sequence `id` of `seq_lstm_step` (8 features of `value`).
fn seq_tick_of(id: u64, start: bool, value: f32) -> serde_json::Value {
    serde_json::json!({
        "parameters": {"sequence_id": id, "sequence_start": start},
        "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": vec![value; 8]}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prediction_the_journal_cannot_keep_is_refused_before_it_is_computed() {
    let journal = tempfile::tempdir().unwrap();
    let mut config = journaled(&support::root().join("config/models"), journal.path());
    config.journal.when_full = WhenFull::Refuse;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let handle = Arc::clone(server.edge().journal.as_ref().unwrap());
    let runs = || {
        server
            .edge()
            .runtime
            .model("alpha_mlp", None)
            .unwrap()
            .replica_runs()
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(post_alpha(&base, 1).await, reqwest::StatusCode::OK);
    flush(&server).await;
    // The journal cannot write: the first request finds out (it runs, its
    // record fails, it is refused); from then on requests are refused at
    // admission and the model does not run for them (but for one probe a
    // second, which may fall in here).
    handle.fail_writes(true);
    let before = runs();
    for n in 2..12 {
        assert_eq!(
            post_alpha(&base, n).await,
            reqwest::StatusCode::SERVICE_UNAVAILABLE
        );
    }
    let ran = runs() - before;
    assert!(ran <= 2, "10 refused requests, {ran} runs");
    handle.fail_writes(false);
    server.shutdown().await.unwrap();
}
