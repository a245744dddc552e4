//! What the journal's tests share: two models loaded once, a journal over a
//! fresh directory, records of a refused request, and the directory read
//! back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use arrow_array::{Array, StringArray, UInt64Array};
use tickserve_core::Clock;
use tickserve_core::config::{JournalConfig, ServerConfig};
use tickserve_journal::read::{read_file, scan_dir};
use tickserve_journal::verify::{Report, verify};
use tickserve_journal::{Journal, Outputs, Record, RecordedParameters};
use tickserve_runtime::{ModelHandle, Runtime};

/// Two models loaded once for every test: `alpha` (journaled) and `beta`
/// (`journal = false` in its `model.toml`), both the sample `alpha_mlp`.
fn models() -> &'static (Runtime, tempfile::TempDir) {
    static MODELS: OnceLock<(Runtime, tempfile::TempDir)> = OnceLock::new();
    MODELS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        tickserve_testing::sample_version(dir.path(), "alpha_mlp", "alpha", 1);
        tickserve_testing::sample_version(dir.path(), "alpha_mlp", "alpha", 2);
        std::fs::write(
            dir.path().join("alpha/model.toml"),
            "version_policy = \"all\"\nbuckets = [1]\n",
        )
        .expect("alpha's model.toml");
        tickserve_testing::sample_version(dir.path(), "alpha_mlp", "beta", 1);
        std::fs::write(
            dir.path().join("beta/model.toml"),
            "journal = false\nbuckets = [1]\n",
        )
        .expect("beta's model.toml");
        let mut config = ServerConfig::default();
        config.repository.path = dir.path().to_path_buf();
        config.runtime.onnxruntime_library = tickserve_testing::onnxruntime_library();
        let runtime =
            Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");
        (runtime, dir)
    })
}

/// `model`'s loaded `version`.
pub fn handle(model: &str, version: &str) -> Arc<ModelHandle> {
    models()
        .0
        .route(model, Some(version))
        .expect("a loaded version")
        .handle
}

/// A journal over a fresh directory, `adjust`ed from the defaults, on the
/// machine's clock.
pub fn journal(adjust: impl FnOnce(&mut JournalConfig)) -> (Arc<Journal>, tempfile::TempDir) {
    journal_on(&Clock::system(), adjust)
}

/// A journal as [`journal`] makes it whose files, probe and drop count age
/// on a clock the test moves (returned with it).
pub fn journal_by_hand(
    adjust: impl FnOnce(&mut JournalConfig),
) -> (Arc<Journal>, tempfile::TempDir, Clock) {
    let clock = Clock::by_hand();
    let (journal, dir) = journal_on(&clock, adjust);
    (journal, dir, clock)
}

fn journal_on(
    clock: &Clock,
    adjust: impl FnOnce(&mut JournalConfig),
) -> (Arc<Journal>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = JournalConfig {
        enabled: true,
        directory: dir.path().join("journal"),
        ..JournalConfig::default()
    };
    adjust(&mut config);
    config.validate().expect("a valid journal config");
    let machine = [("cpu".to_string(), "test".to_string())].into();
    let journal = Journal::start(&config, &machine, clock).expect("the journal starts");
    (journal, dir)
}

/// A record of a request refused before it was validated (no tensors),
/// whose error text is `error_bytes` long: the record's size in the queue.
#[allow(clippy::disallowed_methods)] // a record's times are the wall clock
pub fn record(handle: &Arc<ModelHandle>, id: &str, error_bytes: usize) -> Record {
    let now = SystemTime::now();
    Record {
        handle: Arc::clone(handle),
        received: now,
        answered: now,
        queue: Duration::ZERO,
        compute: Duration::ZERO,
        protocol: "http",
        id: id.to_string(),
        traceparent: None,
        key: None,
        bucket: None,
        status: "invalid_argument",
        error: Some("e".repeat(error_bytes)),
        parameters: RecordedParameters::default(),
        inputs: None,
        outputs: Outputs::Model(Vec::new()),
        state: Vec::new(),
        window_ticks: None,
    }
}

pub fn report(dir: &Path) -> Report {
    verify(&dir.join("journal")).expect("the journal reads")
}

/// Every stream's request ids and record numbers, in file and record order,
/// by `model/version`.
pub fn written(dir: &Path) -> Vec<(String, Vec<(u64, String)>)> {
    let journal = scan_dir(&dir.join("journal")).expect("the journal reads");
    assert!(journal.unreadable.is_empty(), "{:?}", journal.unreadable);
    let mut out = Vec::new();
    for (stream, files) in &journal.streams {
        let mut records = Vec::new();
        for file in files {
            let read = read_file(&file.path).expect("a journal file");
            assert_eq!(read.damage, None, "{}", file.path.display());
            for batch in &read.batches {
                let numbers = batch
                    .column_by_name("record")
                    .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                    .expect("the record column");
                let ids = batch
                    .column_by_name("request_id")
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                    .expect("the request_id column");
                for i in 0..batch.num_rows() {
                    records.push((numbers.value(i), ids.value(i).to_string()));
                }
            }
        }
        out.push((format!("{}/{}", stream.model, stream.version), records));
    }
    out
}

pub fn numbered(ids: &[&str]) -> Vec<(u64, String)> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| (i as u64, id.to_string()))
        .collect()
}

/// The files of `alpha` version 1 in the journal under `dir`, in name order
/// (record order within a run); none when its directory is missing.
pub fn alpha_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join("journal/alpha/1")) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("an entry").path()).collect();
    files.sort();
    files
}
