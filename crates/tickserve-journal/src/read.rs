//! Reading a journal directory back: its files, grouped into streams (one
//! model version's records in one run), and each file's record batches, one
//! at a time.
//!
//! Bounded memory: [`scan_dir`] reads each file's header only (its stream and
//! first record number, and whether it ends with the end marker), and
//! [`JournalFile::batches`] reads a file's record batches one by one, so that
//! `verify` and `replay` hold one record batch (at most 4,096 records) at a
//! time, however large the journal. Each run's count of records dropped after
//! the last one written is in a file of its own ([`crate::drops`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;

use crate::schema::{DIGEST, FIRST_RECORD, MODEL, RUN, VERSION};

/// The end-of-stream marker a finished file ends with.
const END_MARKER: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// One journal file, its header read.
#[derive(Debug)]
pub struct JournalFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its stream: run, model, version, model file digest.
    pub stream: StreamId,
    /// The number of its first record.
    pub first: u64,
    /// It ends with the stream's end marker (closed by its writer).
    pub finished: bool,
    /// What its predictions were computed on (`name → value`); empty for a
    /// file of a server that did not say.
    pub machine: std::collections::BTreeMap<String, String>,
}

/// Which stream a file belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId {
    /// The run (server process) that wrote it.
    pub run: String,
    /// The model's name.
    pub model: String,
    /// Its version.
    pub version: String,
    /// The SHA-256 of its `model.onnx`.
    pub digest: String,
}

/// A journal directory, its files' headers read.
#[derive(Debug)]
pub struct Journal {
    /// Each stream's files, in record order.
    pub streams: BTreeMap<StreamId, Vec<JournalFile>>,
    /// Files that are not journal files, or whose header cannot be read.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Every `*.arrows` file under `dir`, its header read, grouped by stream,
/// each stream's files in record order; files that cannot be read at all in
/// `unreadable`.
pub fn scan_dir(dir: &Path) -> Result<Journal, String> {
    let mut paths = Vec::new();
    walk(dir, &mut paths).map_err(|e| format!("{}: {e}", dir.display()))?;
    paths.sort();
    let mut streams: BTreeMap<StreamId, Vec<JournalFile>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for path in paths {
        match JournalFile::open(&path) {
            Ok(file) => streams.entry(file.stream.clone()).or_default().push(file),
            Err(e) => unreadable.push((path, e)),
        }
    }
    for files in streams.values_mut() {
        files.sort_by_key(|f| f.first);
    }
    Ok(Journal {
        streams,
        unreadable,
    })
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&path, out)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "arrows") {
            out.push(path);
        }
    }
    Ok(())
}

impl JournalFile {
    /// Reads `path`'s header: its stream, its first record's number, and
    /// whether it ends with the end marker.
    pub fn open(path: &Path) -> Result<JournalFile, String> {
        let (reader, finished) = stream_reader(path)?;
        let schema = reader.schema();
        let meta = schema.metadata();
        let get = |key: &str| {
            meta.get(key)
                .cloned()
                .ok_or_else(|| format!("not a journal file: its schema has no {key}"))
        };
        let stream = StreamId {
            run: get(RUN)?,
            model: get(MODEL)?,
            version: get(VERSION)?,
            digest: get(DIGEST)?,
        };
        let first = get(FIRST_RECORD)?
            .parse()
            .map_err(|e| format!("{FIRST_RECORD}: {e}"))?;
        let machine = meta
            .get(crate::schema::MACHINE)
            .and_then(|m| serde_json::from_str(m).ok())
            .unwrap_or_default();
        Ok(JournalFile {
            path: path.to_path_buf(),
            stream,
            first,
            finished,
            machine,
        })
    }

    /// Its record batches, read one at a time: each whole batch, then, if
    /// the file ends in a partial one (a crash, or a failed write), one
    /// `Err` saying what the reader found, and nothing after it.
    pub fn batches(&self) -> Result<Batches, String> {
        let (reader, _) = stream_reader(&self.path)?;
        Ok(Batches {
            reader: Some(reader),
        })
    }
}

/// A file's record batches, one at a time ([`JournalFile::batches`]).
pub struct Batches {
    reader: Option<StreamReader<BufReader<File>>>,
}

impl Iterator for Batches {
    type Item = Result<RecordBatch, String>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.reader.as_mut()?.next()?;
        if next.is_err() {
            self.reader = None;
        }
        Some(next.map_err(|e| e.to_string()))
    }
}

/// A reader of `path`'s record stream, past its schema, and whether the file
/// ends with the end marker.
fn stream_reader(path: &Path) -> Result<(StreamReader<BufReader<File>>, bool), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let finished = ends_with_marker(&mut file).map_err(|e| e.to_string())?;
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let reader = StreamReader::try_new(BufReader::new(file), None)
        .map_err(|e| format!("not a journal file: {e}"))?;
    Ok((reader, finished))
}

/// One journal file read whole (a file is at most `journal.rotate_bytes`):
/// its header, its whole record batches, and what stopped the reading before
/// its end, if anything.
#[derive(Debug)]
pub struct ReadFile {
    /// The header.
    pub file: JournalFile,
    /// Its whole record batches.
    pub batches: Vec<RecordBatch>,
    /// A partial record batch at its end: what the reader said.
    pub damage: Option<String>,
}

/// Reads one file whole.
pub fn read_file(path: &Path) -> Result<ReadFile, String> {
    let file = JournalFile::open(path)?;
    let mut batches = Vec::new();
    let mut damage = None;
    for batch in file.batches()? {
        match batch {
            Ok(batch) => batches.push(batch),
            Err(e) => damage = Some(e),
        }
    }
    Ok(ReadFile {
        file,
        batches,
        damage,
    })
}

fn ends_with_marker(file: &mut File) -> std::io::Result<bool> {
    // A file shorter than the marker cannot end with it: the seek before
    // its start fails.
    if file
        .seek(SeekFrom::End(-(END_MARKER.len() as i64)))
        .is_err()
    {
        return Ok(false);
    }
    let mut tail = [0u8; 8];
    file.read_exact(&mut tail)?;
    Ok(tail == END_MARKER)
}
