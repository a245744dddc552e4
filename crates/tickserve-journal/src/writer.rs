//! The journal's two halves: [`Journal`], which the edge calls on the
//! request path (is this request journaled, may it run, here is its
//! record), and the writer thread, which batches records into Arrow record
//! batches and writes them, off the request path.
//!
//! The queue between them is bounded in bytes (`journal.max_queued_bytes`).
//! A record that does not fit, or whose write fails, is dropped and counted;
//! with `when_full = "refuse"` the request is refused instead, before it
//! computes, and an answer waits until its record is written.
//!
//! Files: `DIRECTORY/MODEL/VERSION/RUN-FIRST.arrows`, Arrow IPC streams
//! (a crash leaves every whole record batch readable), one stream of
//! records per model version and file digest, numbered from 0 and chained
//! ([`crate::digest`]) within a run (one server process); and
//! `DIRECTORY/RUN.dropped.json`, the run's drop count ([`crate::drops`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use tickserve_core::config::{JournalConfig, WhenFull};
use tickserve_core::{Clock, Error, metrics as names};
use tickserve_runtime::ModelHandle;
use tokio::sync::oneshot;

use crate::batch::{self, Position};
use crate::digest::genesis;
use crate::record::Record;
use crate::schema::Layout;

/// The most records the writer puts in one record batch.
const MAX_BATCH_RECORDS: usize = 4096;

/// How often a failing journal lets one request through in `refuse` mode, to
/// find out whether it can write again.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// In `drop` mode, how long the writer lets records gather after writing
/// before it takes the next: under load it wakes once per interval, not
/// once per record (a wake-up costs the request path a system call and the
/// core a context switch). In `refuse` mode an answer waits for its record,
/// so the writer takes each as it comes.
const GATHER_INTERVAL: Duration = Duration::from_millis(20);

/// The writer thread's nice value: it yields to the threads that answer
/// requests when they share a core, and still gets about a tenth of a busy
/// core (Linux's weights: 110 against 1024), far more than it needs (about
/// 1.8 µs per record: docs/journal.md).
const WRITER_NICE: i32 = 10;

/// How often a failure is logged, at most.
const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The request path's side of the journal.
pub struct Journal {
    config: JournalConfig,
    run: String,
    shared: Arc<Shared>,
    /// Unlocked on the request path: a `Sender` is `Sync`.
    sender: Sender<Message>,
    thread: Mutex<Option<JoinHandle<()>>>,
    sampled: AtomicU64,
}

/// What both halves see.
#[derive(Default)]
struct Shared {
    queued_bytes: AtomicUsize,
    dropped: AtomicU64,
    /// The last write failed (cleared by the next that succeeds).
    failing: AtomicBool,
    /// When a failing journal last let a request through (ms since start).
    last_probe_ms: AtomicU64,
    /// Every write fails as on a full disk ([`Journal::fail_writes`]).
    fail_writes: Arc<AtomicBool>,
    started: Option<Instant>,
    /// What files, probes and the drop count age by (`journal.clock`).
    clock: Clock,
}

enum Message {
    Record(Box<Record>, Option<oneshot::Sender<bool>>),
    /// Write and fsync everything before it, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
    /// Write everything before it, end every file, stop.
    Stop,
}

impl Journal {
    /// Starts the journal's writer over `config.directory` (made if missing);
    /// every file it writes names `machine` (what the predictions are
    /// computed on: `Runtime::machine`). Its files, its probe of a failing
    /// disk and its drop count age on `clock`.
    pub fn start(
        config: &JournalConfig,
        machine: &std::collections::BTreeMap<String, String>,
        clock: &Clock,
    ) -> Result<Arc<Journal>, String> {
        private_dir(&config.directory).map_err(|e| {
            format!(
                "journal.directory {}: cannot create it: {e}",
                config.directory.display()
            )
        })?;
        // Reserving the run's drop-count file reserves its name.
        let run = crate::drops::reserve(&config.directory, &run_name())
            .map_err(|e| format!("journal.directory {}: {e}", config.directory.display()))?;
        let shared = Arc::new(Shared {
            started: Some(clock.now()),
            clock: clock.clone(),
            ..Shared::default()
        });
        let (sender, receiver) = mpsc::channel();
        let writer = Writer {
            config: config.clone(),
            run: run.clone(),
            machine: serde_json::to_string(machine).unwrap_or_default(),
            shared: Arc::clone(&shared),
            streams: HashMap::new(),
            last_log: None,
            last_fsync: clock.now(),
            drops_written: 0,
            drops_at: clock.now(),
        };
        let thread = std::thread::Builder::new()
            .name("tickserve-journal".into())
            .spawn(move || {
                lower_priority();
                writer.serve(receiver)
            })
            .map_err(|e| format!("cannot start the journal's writer thread: {e}"))?;
        tracing::info!(directory = %config.directory.display(), %run, "journal on");
        Ok(Arc::new(Journal {
            config: config.clone(),
            run,
            shared,
            sender,
            thread: Mutex::new(Some(thread)),
            sampled: AtomicU64::new(0),
        }))
    }

    /// This run's name (the first part of its files' names).
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Whether a request to `handle` is journaled: the model is, and the
    /// request falls in `journal.sample` (every n-th, exactly the fraction).
    pub fn wants(&self, handle: &ModelHandle) -> bool {
        if !handle.settings.journal {
            return false;
        }
        let f = self.config.sample;
        if f >= 1.0 {
            return true;
        }
        sampled(self.sampled.fetch_add(1, Ordering::Relaxed), f)
    }

    /// Whether an answer must wait for its record (`when_full = "refuse"`).
    pub fn refuses(&self) -> bool {
        self.config.when_full == WhenFull::Refuse
    }

    /// In `refuse` mode, whether a journaled request to `model` may run:
    /// refused while the queue is full or the journal cannot write (one
    /// request a second goes through to find out whether it can again).
    pub fn admit(&self, model: &str) -> Result<(), Error> {
        if !self.refuses() {
            return Ok(());
        }
        let refuse = |reason: &str| {
            metrics::counter!(names::JOURNAL_REFUSED, "reason" => reason.to_string()).increment(1);
            Err(Error::JournalUnavailable {
                model: model.to_string(),
                reason: match reason {
                    "full" => format!(
                        "its queue is at journal.max_queued_bytes ({} bytes)",
                        self.config.max_queued_bytes
                    ),
                    _ => "its last write failed".to_string(),
                },
            })
        };
        if self.shared.queued_bytes.load(Ordering::Relaxed) >= self.config.max_queued_bytes {
            return refuse("full");
        }
        if self.shared.failing.load(Ordering::Relaxed) {
            let now = self.shared.now_ms();
            let last = self.shared.last_probe_ms.load(Ordering::Relaxed);
            let due = now.saturating_sub(last) >= PROBE_INTERVAL.as_millis() as u64;
            if !(due
                && self
                    .shared
                    .last_probe_ms
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok())
            {
                return refuse("io");
            }
        }
        Ok(())
    }

    /// Hands `record` to the writer. In `drop` mode, `None`: a record that
    /// does not fit the queue is dropped and counted. In `refuse` mode, what
    /// to await before answering: `true` once the record is written, `false`
    /// if it could not be kept.
    pub fn submit(&self, record: Record) -> Option<oneshot::Receiver<bool>> {
        let bytes = record.queued_bytes();
        let queued = self.shared.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        let refuse = self.refuses();
        if queued.saturating_add(bytes) > self.config.max_queued_bytes && queued > 0 {
            self.shared.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.shared.drop_records(1, "full");
            return refuse.then(|| {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(false);
                rx
            });
        }
        let (reply, answer) = if refuse {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let sent = self
            .sender
            .send(Message::Record(Box::new(record), reply))
            .is_ok();
        if !sent {
            self.shared.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.shared.drop_records(1, "stopped");
        }
        answer
    }

    /// Waits until every record handed over so far is written and synced
    /// (tests, and an operator's `kill` after a drain).
    pub fn flush(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.sender.send(Message::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Stops the writer after it has written what it holds; each file ends
    /// with the stream's end marker and is synced.
    pub fn close(&self) {
        let _ = self.sender.send(Message::Stop);
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }

    /// Makes every write fail, as on a full disk (`ENOSPC`: a new file is
    /// still created, its writes fail), until called with `false`: for
    /// tests, and for drills of what `when_full` does.
    pub fn fail_writes(&self, on: bool) {
        self.shared.fail_writes.store(on, Ordering::Relaxed);
    }

    /// Records dropped so far in this run.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.map_or(0, |s| {
            self.clock
                .since(s)
                .as_millis()
                .try_into()
                .unwrap_or(u64::MAX)
        })
    }

    fn drop_records(&self, n: u64, reason: &'static str) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(names::JOURNAL_DROPPED, "reason" => reason).increment(n);
    }
}

/// Whether the `n`-th journaled request (from 0) is recorded at sampling
/// fraction `f`: exactly `floor(n * f)` of the first `n` are, evenly spread.
fn sampled(n: u64, f: f64) -> bool {
    let n = n as f64;
    ((n + 1.0) * f).floor() > (n * f).floor()
}

/// Gives the calling thread [`WRITER_NICE`] (Linux: nice is per thread).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take plain integers and touch no
        // memory of ours.
        let set = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, WRITER_NICE)
        };
        if set != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(),
                "cannot lower the journal writer's priority; it competes with requests as an equal");
        }
    }
}

/// A run's name: its start in UTC and the process id
/// (`20261124T103137Z-4242`).
#[allow(clippy::disallowed_methods)] // a run is named by its start on the wall clock
fn run_name() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z-{}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        std::process::id()
    )
}

/// The date of `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Which stream a record belongs to: model, version, file digest.
type StreamKey = (String, String, String);

/// The writer thread's state.
struct Writer {
    config: JournalConfig,
    run: String,
    /// What this process computes on, as JSON, for every file's schema.
    machine: String,
    shared: Arc<Shared>,
    streams: HashMap<StreamKey, Stream>,
    last_log: Option<Instant>,
    last_fsync: Instant,
    /// The drop count the run's drop-count file holds, and when it was
    /// last written ([`crate::drops`]).
    drops_written: u64,
    drops_at: Instant,
}

/// How often the run's drop-count file is rewritten, at most, while the
/// count moves.
const DROPS_INTERVAL: Duration = Duration::from_secs(1);

/// One model version's records in this run.
struct Stream {
    layout: Layout,
    position: Position,
    file: Option<OpenFile>,
}

/// The file a stream writes now.
struct OpenFile {
    writer: StreamWriter<BufWriter<Counting>>,
    schema: SchemaRef,
    opened: Instant,
    /// Written since the last fsync.
    dirty: bool,
    /// Where it is.
    path: PathBuf,
    /// Record batches written whole.
    batches: u64,
}

/// A file that counts the bytes written to it.
struct Counting {
    file: File,
    written: u64,
    fail: Arc<AtomicBool>,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.fail.load(Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Writer {
    fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    fn serve(mut self, receiver: Receiver<Message>) {
        let mut pending: Vec<(Box<Record>, Option<oneshot::Sender<bool>>)> = Vec::new();
        let mut stopping = false;
        while !stopping {
            let wait = self.next_deadline();
            let first = match receiver.recv_timeout(wait) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut flushes = Vec::new();
            let mut next = first;
            while let Some(message) = next {
                match message {
                    Message::Record(record, reply) => pending.push((record, reply)),
                    Message::Flush(done) => flushes.push(done),
                    Message::Stop => stopping = true,
                }
                if pending.len() >= MAX_BATCH_RECORDS {
                    self.write(&mut pending);
                }
                next = receiver.try_recv().ok();
            }
            self.write(&mut pending);
            let sync_due = self
                .config
                .fsync
                .interval()
                .is_some_and(|i| self.clock().since(self.last_fsync) >= i);
            if sync_due || !flushes.is_empty() {
                self.sync();
            }
            self.rotate_old();
            self.write_drops(false);
            let flushed = !flushes.is_empty();
            for done in flushes {
                let _ = done.send(());
            }
            if self.config.when_full == WhenFull::Drop && !flushed && !stopping {
                std::thread::sleep(GATHER_INTERVAL);
            }
        }
        self.write(&mut pending);
        for stream in self.streams.values_mut() {
            if let Some(file) = stream.file.take() {
                finish(file);
            }
        }
        // Records handed over after the stop are dropped and counted (and a
        // waiting answer is refused as its reply sender goes).
        let late = receiver
            .try_iter()
            .filter(|m| matches!(m, Message::Record(..)))
            .count();
        if late > 0 {
            self.shared.drop_records(late as u64, "stopped");
        }
        self.write_drops(true);
    }

    /// Rewrites the run's drop-count file: the last time (`last`), or when
    /// the count moved and [`DROPS_INTERVAL`] has passed since the last
    /// write. A failed write is tried again at the next.
    fn write_drops(&mut self, last: bool) {
        let dropped = self.shared.dropped.load(Ordering::Relaxed);
        let due =
            dropped != self.drops_written && self.clock().since(self.drops_at) >= DROPS_INTERVAL;
        if !(last || due) {
            return;
        }
        self.drops_at = self.clock().now();
        let drops = crate::drops::Drops {
            run: self.run.clone(),
            dropped,
            last,
        };
        match crate::drops::write(&self.config.directory, &drops) {
            Ok(()) => self.drops_written = dropped,
            Err(e) => tracing::warn!(error = %e, "the run's drop count could not be written"),
        }
    }

    /// How long to wait for a record before syncing or rotating.
    fn next_deadline(&self) -> Duration {
        let sync = self
            .config
            .fsync
            .interval()
            .map(|i| i.saturating_sub(self.clock().since(self.last_fsync)));
        sync.unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(1))
    }

    /// Writes `pending` (emptied), grouped by stream in arrival order.
    fn write(&mut self, pending: &mut Vec<(Box<Record>, Option<oneshot::Sender<bool>>)>) {
        if pending.is_empty() {
            return;
        }
        let mut groups: Vec<(StreamKey, Vec<usize>)> = Vec::new();
        for (i, (record, _)) in pending.iter().enumerate() {
            let key = (
                record.handle.name.clone(),
                record.handle.version.clone(),
                record.handle.digest.clone(),
            );
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let mut outcome = vec![false; pending.len()];
        for (key, members) in groups {
            let records: Vec<&Record> = members.iter().map(|&i| &*pending[i].0).collect();
            let ok = match self.write_group(&key, &records) {
                Ok(()) => true,
                Err(e) => {
                    self.failed(&key, &e);
                    self.shared.drop_records(records.len() as u64, "io");
                    false
                }
            };
            if ok {
                metrics::counter!(names::JOURNAL_RECORDS, "model" => key.0.clone())
                    .increment(records.len() as u64);
                self.shared.failing.store(false, Ordering::Relaxed);
            }
            for i in members {
                outcome[i] = ok;
            }
        }
        let bytes: usize = pending.iter().map(|(r, _)| r.queued_bytes()).sum();
        let left = self.shared.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        metrics::gauge!(names::JOURNAL_QUEUED_BYTES).set(left.saturating_sub(bytes) as f64);
        for ((_, reply), ok) in pending.drain(..).zip(outcome) {
            if let Some(reply) = reply {
                let _ = reply.send(ok);
            }
        }
    }

    /// Writes one stream's records as one record batch, opening (or
    /// rotating to) a file first.
    fn write_group(&mut self, key: &StreamKey, records: &[&Record]) -> Result<(), String> {
        let run = self.run.clone();
        let stream = self.streams.entry(key.clone()).or_insert_with(|| Stream {
            layout: Layout::of(&records[0].handle),
            position: Position {
                next: 0,
                chain: genesis(&run, &key.0, &key.1, &key.2),
            },
            file: None,
        });
        let rotate = stream.file.as_ref().is_some_and(|f| {
            f.writer.get_ref().get_ref().written >= self.config.rotate_bytes
                || self.shared.clock.since(f.opened) >= self.config.rotate_interval
        });
        if rotate && let Some(file) = stream.file.take() {
            finish(file);
        }
        let schema = match &stream.file {
            Some(file) => Arc::clone(&file.schema),
            None => {
                let schema = stream.layout.schema(
                    &run,
                    (&key.0, &key.1, &key.2),
                    &self.machine,
                    stream.position.next,
                );
                let path = file_path(&self.config.directory, key, &run, stream.position.next);
                let opened = self.shared.clock.now();
                stream.file = Some(open(&path, &schema, &self.shared.fail_writes, opened)?);
                schema
            }
        };
        let mut position = stream.position.clone();
        let dropped = self.shared.dropped.load(Ordering::Relaxed);
        let batch = batch::build(&schema, &stream.layout, records, &mut position, dropped)
            .map_err(|e| format!("building a record batch: {e}"))?;
        let Some(file) = stream.file.as_mut() else {
            return Err("no file open".to_string());
        };
        let before = file.writer.get_ref().get_ref().written;
        if let Err(e) = file.writer.write(&batch).and_then(|()| file.writer.flush()) {
            // The file may end in part of a batch now: the next batch
            // begins a new file. A file that holds no whole batch (its
            // first write failed: a full disk) is removed, not left behind
            // empty.
            if let Some(file) = stream.file.take()
                && file.batches == 0
            {
                let _ = std::fs::remove_file(&file.path);
            }
            return Err(format!("writing: {e}"));
        }
        file.dirty = true;
        file.batches += 1;
        metrics::counter!(names::JOURNAL_BYTES).increment(
            file.writer
                .get_ref()
                .get_ref()
                .written
                .saturating_sub(before),
        );
        stream.position = position;
        Ok(())
    }

    /// fsyncs every file written since the last.
    #[allow(clippy::disallowed_methods)] // the fsync histogram measures the machine's time
    fn sync(&mut self) {
        self.last_fsync = self.clock().now();
        let mut errors = Vec::new();
        for (key, stream) in &mut self.streams {
            let Some(file) = stream.file.as_mut().filter(|f| f.dirty) else {
                continue;
            };
            let started = Instant::now();
            match file.writer.get_ref().get_ref().file.sync_data() {
                Ok(()) => {
                    file.dirty = false;
                    metrics::histogram!(names::JOURNAL_FSYNC_DURATION)
                        .record(started.elapsed().as_secs_f64());
                }
                Err(e) => {
                    stream.file = None;
                    errors.push((key.clone(), format!("fsync: {e}")));
                }
            }
        }
        for (key, e) in errors {
            self.failed(&key, &e);
        }
    }

    /// Closes files older than `journal.rotate_interval` (the next record
    /// begins a new one).
    fn rotate_old(&mut self) {
        for stream in self.streams.values_mut() {
            let old = stream
                .file
                .as_ref()
                .is_some_and(|f| self.shared.clock.since(f.opened) >= self.config.rotate_interval);
            if old && let Some(file) = stream.file.take() {
                finish(file);
            }
        }
    }

    /// Counts a failure, marks the journal failing, logs at most once a minute.
    fn failed(&mut self, key: &StreamKey, error: &str) {
        metrics::counter!(names::JOURNAL_ERRORS).increment(1);
        self.shared.failing.store(true, Ordering::Relaxed);
        let now = self.clock().now();
        if self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_INTERVAL)
        {
            self.last_log = Some(now);
            tracing::error!(model = %key.0, version = %key.1, %error,
                "the journal cannot write; its records are dropped (and counted) until it can");
        }
    }
}

/// `DIRECTORY/MODEL/VERSION/RUN-FIRST.arrows`.
fn file_path(directory: &Path, key: &StreamKey, run: &str, first: u64) -> PathBuf {
    directory
        .join(&key.0)
        .join(&key.1)
        .join(format!("{run}-{first:012}.arrows"))
}

/// `dir` and its missing parents, readable by the server's user only (the
/// records hold every input and output).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// A new file at `path` with `schema`'s stream header (owner-only).
fn open(
    path: &Path,
    schema: &SchemaRef,
    fail: &Arc<AtomicBool>,
    opened: Instant,
) -> Result<OpenFile, String> {
    if let Some(dir) = path.parent() {
        private_dir(dir).map_err(|e| format!("creating its directory: {e}"))?;
    }
    let mut options = File::options();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| format!("creating a file: {e}"))?;
    let counting = Counting {
        file,
        written: 0,
        fail: Arc::clone(fail),
    };
    // Buffered: a record batch's pieces go to the file in one write.
    let writer = StreamWriter::try_new(BufWriter::with_capacity(1 << 20, counting), schema)
        .map_err(|e| format!("writing a file's header: {e}"))?;
    Ok(OpenFile {
        writer,
        schema: Arc::clone(schema),
        opened,
        dirty: true,
        path: path.to_path_buf(),
        batches: 0,
    })
}

/// Ends `file` with the stream's end marker and syncs it.
fn finish(mut file: OpenFile) {
    let _ = file.writer.finish();
    let _ = file.writer.flush();
    let _ = file.writer.get_ref().get_ref().file.sync_data();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_records_exactly_the_fraction_evenly() {
        for (f, every) in [(0.25, 4), (0.5, 2), (0.1, 10)] {
            let kept: Vec<u64> = (0..1000).filter(|&n| sampled(n, f)).collect();
            assert_eq!(kept.len() as f64, 1000.0 * f, "fraction {f}");
            assert!(
                kept.windows(2).all(|w| w[1] - w[0] == every),
                "fraction {f}: {kept:?}"
            );
        }
        assert!((0..1000).all(|n| !sampled(n, 0.0)));
    }

    /// Two journals started in one process within one second (the same
    /// date and pid: a container's pid 1 restarted at once) are two runs.
    #[test]
    fn runs_of_the_same_second_and_pid_get_names_of_their_own() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = JournalConfig {
            enabled: true,
            directory: dir.path().to_path_buf(),
            ..JournalConfig::default()
        };
        let machine = Default::default();
        let first =
            Journal::start(&config, &machine, &Clock::system()).expect("the first journal starts");
        let second =
            Journal::start(&config, &machine, &Clock::system()).expect("the second journal starts");
        assert_ne!(first.run(), second.run());
    }

    #[test]
    fn run_names_are_utc_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(20_416), (2025, 11, 24));
        assert_eq!(civil(11_016), (2000, 2, 29));
        // Past the first century of the 400-year era, and its last day.
        assert_eq!(civil(47_540), (2100, 2, 28));
        assert_eq!(civil(47_541), (2100, 3, 1));
        assert_eq!(civil(84_370), (2200, 12, 31));
        assert_eq!(civil(157_053), (2399, 12, 31));
        assert_eq!(civil(157_113), (2400, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
    }

    /// `20261124T103137Z-4242`: today's date, the time now, this process.
    #[test]
    #[allow(clippy::disallowed_methods)] // a run is named by its start on the wall clock
    fn a_run_is_named_by_its_start_and_process() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = run_name();
        let (stamp, pid) = name.split_once('-').expect("a pid after the time");
        assert_eq!(pid, std::process::id().to_string());
        let (date, time) = stamp.split_once('T').expect("a date, then a time");
        let year: u32 = date[..4].parse().expect("a year");
        assert!((2026..2100).contains(&year), "{name}");
        let time = time.strip_suffix('Z').expect("UTC");
        let part = |i: usize| -> u64 { time[i..i + 2].parse().expect("two digits") };
        let (h, m, sec) = (part(0), part(2), part(4));
        assert!(h < 24 && m < 60 && sec < 60, "{name}");
        let of_day = h * 3600 + m * 60 + sec;
        // Within a few seconds of when it was asked for (across midnight too).
        let drift = (of_day + 86_400 - before % 86_400) % 86_400;
        assert!(drift <= 5, "{name}: {drift} s from now");
    }
}
