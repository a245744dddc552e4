//! Reading a journal directory back: its files, grouped into streams (one
//! model version's records in one run), each file's record batches, and
//! whether it ended cleanly.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;

use crate::schema::{DIGEST, FIRST_RECORD, MODEL, RUN, VERSION};

/// The end-of-stream marker a finished file ends with.
const END_MARKER: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// One journal file, read.
#[derive(Debug)]
pub struct JournalFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its stream: run, model, version, model file digest.
    pub stream: StreamId,
    /// The number of its first record.
    pub first: u64,
    /// Its whole record batches.
    pub batches: Vec<RecordBatch>,
    /// It ends with the stream's end marker (closed by its writer).
    pub finished: bool,
    /// What stopped the reading before its end: a partial record batch (a
    /// crash, or a failed write).
    pub damage: Option<String>,
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

/// Every `*.arrows` file under `dir`, read, grouped by stream, each stream's
/// files in record order; files that cannot be read at all in `unreadable`.
pub fn read_dir(dir: &Path) -> Result<Journal, String> {
    let mut paths = Vec::new();
    walk(dir, &mut paths).map_err(|e| format!("{}: {e}", dir.display()))?;
    paths.sort();
    let mut streams: BTreeMap<StreamId, Vec<JournalFile>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for path in paths {
        match read_file(&path) {
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

/// A journal directory, read.
#[derive(Debug)]
pub struct Journal {
    /// Each stream's files, in record order.
    pub streams: BTreeMap<StreamId, Vec<JournalFile>>,
    /// Files that are not journal files, or whose header cannot be read.
    pub unreadable: Vec<(PathBuf, String)>,
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

/// Reads one file: its header, then record batches until its end or the
/// first that cannot be read.
pub fn read_file(path: &Path) -> Result<JournalFile, String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let finished = ends_with_marker(&mut file).map_err(|e| e.to_string())?;
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let reader = StreamReader::try_new(std::io::BufReader::new(file), None)
        .map_err(|e| format!("not a journal file: {e}"))?;
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
    let mut batches = Vec::new();
    let mut damage = None;
    for batch in reader {
        match batch {
            Ok(batch) => batches.push(batch),
            Err(e) => {
                damage = Some(e.to_string());
                break;
            }
        }
    }
    Ok(JournalFile {
        path: path.to_path_buf(),
        stream,
        first,
        batches,
        finished: finished && damage.is_none(),
        damage,
    })
}

fn ends_with_marker(file: &mut File) -> std::io::Result<bool> {
    let len = file.seek(SeekFrom::End(0))?;
    if len < END_MARKER.len() as u64 {
        return Ok(false);
    }
    file.seek(SeekFrom::End(-(END_MARKER.len() as i64)))?;
    let mut tail = [0u8; 8];
    file.read_exact(&mut tail)?;
    Ok(tail == END_MARKER)
}
