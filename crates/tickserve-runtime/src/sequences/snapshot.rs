//! Sequence snapshots: every stateful model's sequences written to one file
//! at shutdown (after the drain, when no request runs) and read back at the
//! next start, so that a drain-and-restart keeps every sequence's state
//! (`runtime.sequence_snapshot` in `tickserve.toml`).
//!
//! The file, little-endian throughout:
//!
//! ```text
//! "tickserve-sequences 1\n"
//! u32 models; per model:
//!   str name, str version, u32 states; per state: str input, str datatype, u64 row bytes
//!   u64 sequences; per sequence:
//!     u8 kind (0 number, 1 text), then u64 number or str text
//!     u64 ticks, then each state's row bytes
//! str = u32 length, then UTF-8 bytes
//! ```
//!
//! A model is restored only when it is loaded, keeps state, and its state
//! pairs have the names, datatypes and sizes the file says; otherwise it is
//! skipped with a warning (a changed model must not run on another model's
//! state). The file is renamed `*.restored` once read, so that a later
//! crash-and-restart does not bring back state older than what served since.

use std::path::Path;

use bytes::Bytes;
use tickserve_core::sequence::{SequenceId, SequenceSpec};

use crate::handle::ModelHandle;

const MAGIC: &[u8] = b"tickserve-sequences 1\n";

/// Writes every stateful model's sequences in `handles` to `path`
/// (atomically: a temporary file, then a rename); returns how many.
pub fn write(path: &Path, handles: &[std::sync::Arc<ModelHandle>]) -> Result<usize, String> {
    let mut out = Vec::from(MAGIC);
    let stateful: Vec<_> = handles
        .iter()
        .filter_map(|h| h.sequences().map(|s| (h, s)))
        .collect();
    put_u32(&mut out, stateful.len());
    let mut total = 0;
    for (handle, sequences) in stateful {
        let spec = sequences.spec();
        put_str(&mut out, &handle.name);
        put_str(&mut out, &handle.version);
        put_u32(&mut out, spec.states.len());
        for state in &spec.states {
            put_str(&mut out, &state.input.name);
            put_str(&mut out, state.input.datatype.as_str());
            put_u64(&mut out, state.input.row_bytes() as u64);
        }
        let all = sequences.snapshot();
        put_u64(&mut out, all.len() as u64);
        for (id, ticks, rows) in &all {
            match id {
                SequenceId::Number(n) => {
                    out.push(0);
                    put_u64(&mut out, *n);
                }
                SequenceId::Text(s) => {
                    out.push(1);
                    put_str(&mut out, s);
                }
            }
            put_u64(&mut out, *ticks);
            for row in rows {
                out.extend_from_slice(row);
            }
        }
        total += all.len();
    }
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, &out)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(total)
}

/// Restores the sequences of `path` into the models of `handles` that
/// match (see the module's notes); returns how many came back. A missing
/// file restores nothing.
pub fn restore(path: &Path, handles: &[std::sync::Arc<ModelHandle>]) -> Result<usize, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let restored = read(&bytes, handles).map_err(|e| format!("{}: {e}", path.display()))?;
    let done = path.with_extension("restored");
    std::fs::rename(path, &done).map_err(|e| format!("cannot rename {}: {e}", path.display()))?;
    Ok(restored)
}

fn read(bytes: &[u8], handles: &[std::sync::Arc<ModelHandle>]) -> Result<usize, String> {
    let mut input = Reader { bytes, at: 0 };
    if input.take(MAGIC.len())? != MAGIC {
        return Err("not a tickserve sequence snapshot".to_string());
    }
    let mut restored = 0;
    for _ in 0..input.u32()? {
        let name = input.str()?;
        let version = input.str()?;
        let mut states = Vec::new();
        for _ in 0..input.u32()? {
            states.push((input.str()?, input.str()?, input.u64()?));
        }
        let target = handles
            .iter()
            .find(|h| h.name == name && h.version == version)
            .and_then(|h| h.sequences());
        let matches = target.is_some_and(|s| same_states(s.spec(), &states));
        if target.is_some() && !matches {
            tracing::warn!(
                model = name,
                version,
                "the model's state pairs changed since the snapshot: its sequences are not restored"
            );
        }
        let mut entries = Vec::new();
        for _ in 0..input.u64()? {
            let id = match input.take(1)?[0] {
                0 => SequenceId::Number(input.u64()?),
                1 => SequenceId::Text(input.str()?),
                kind => return Err(format!("unknown sequence id kind {kind}")),
            };
            let ticks = input.u64()?;
            let mut rows = Vec::with_capacity(states.len());
            for (_, _, row_bytes) in &states {
                let len = usize::try_from(*row_bytes).map_err(|e| e.to_string())?;
                rows.push(Bytes::copy_from_slice(input.take(len)?));
            }
            entries.push((id, ticks, rows));
        }
        if let (Some(sequences), true) = (target, matches) {
            restored += sequences.restore(entries);
        }
    }
    Ok(restored)
}

fn same_states(spec: &SequenceSpec, states: &[(String, String, u64)]) -> bool {
    spec.states.len() == states.len()
        && spec
            .states
            .iter()
            .zip(states)
            .all(|(s, (name, datatype, bytes))| {
                s.input.name == *name
                    && s.input.datatype.as_str() == datatype
                    && s.input.row_bytes() as u64 == *bytes
            })
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// Checked reads: a short or corrupt file is an error, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("the file ends early (at byte {})", self.at))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn str(&mut self) -> Result<String, String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_foreign_file_is_an_error_not_a_panic() {
        assert!(read(b"hello", &[]).is_err());
        let mut file = Vec::from(MAGIC);
        put_u32(&mut file, 1);
        put_str(&mut file, "m");
        assert!(read(&file, &[]).unwrap_err().contains("ends early"));
        // A huge count with nothing behind it.
        let mut file = Vec::from(MAGIC);
        file.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(read(&file, &[]).is_err());
    }
}
