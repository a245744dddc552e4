//! Sequence snapshots: every stateful model's sequences written to one file
//! at shutdown (after the drain, when no request runs) and read back at the
//! next start, so that a drain-and-restart keeps every sequence's state
//! (`runtime.sequence_snapshot` in `tickserve.toml`).
//!
//! The file, little-endian throughout:
//!
//! ```text
//! "tickserve-sequences 3\n"
//! u32 models; per model:
//!   str name, str version, u32 states; per state: str input, str datatype, u64 row bytes
//!   u32 windows; per window: str input, str datatype, u64 window bytes (N ticks)
//!   u64 sequences; per sequence:
//!     u8 kind (0 number, 1 text), then u64 number or str text
//!     u8 owner (0 none, 1: then the 8 bytes of the key's id; `bind_to_key`)
//!     u64 ticks, u64 ticks its windows hold, then each state's row bytes,
//!     then each window's bytes (oldest tick first)
//! str = u32 length, then UTF-8 bytes
//! ```
//!
//! A version-2 file has no windows (neither the window list nor the window
//! ticks); a version-1 file also no owner byte: its sequences have no owners.
//!
//! A model is restored only when it is loaded, keeps state, and its state
//! pairs and windows have the names, datatypes and sizes the file says; otherwise it is
//! skipped with a warning (a changed model must not run on another model's
//! state). The file is renamed `*.restored` once read, so that a later
//! crash-and-restart does not bring back state older than what served since.

use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use tickserve_core::TensorSpec;
use tickserve_core::sequence::{SequenceId, SequenceSpec};

use super::{KeyIdOrd, SequenceKey, Sequences, Snapshotted};

const MAGIC: &[u8] = b"tickserve-sequences 3\n";

/// The version before windows.
const MAGIC_V2: &[u8] = b"tickserve-sequences 2\n";

/// The first line of a version-1 file, read too.
const MAGIC_V1: &[u8] = b"tickserve-sequences 1\n";

/// A stateful model's sequences, with the name and version a snapshot
/// files them under.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    /// The model's name.
    pub name: &'a str,
    /// Its version.
    pub version: &'a str,
    /// Its sequences.
    pub sequences: &'a Sequences,
}

/// Writes every stateful model's sequences in `held` to `path`; returns
/// how many. The file is written as a temporary beside it (`*.partial`,
/// owner-only, created new: a symlink or anything else already at that name
/// is removed, never followed), streamed, flushed to disk, renamed over
/// `path`, and the directory flushed, so that `path` is always either the
/// previous snapshot or this one, whole.
pub fn write(path: &Path, held: &[Held<'_>]) -> Result<usize, String> {
    let temporary = path.with_extension("partial");
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
        _ => {}
    }
    let file = create_private(&temporary).map_err(fail)?;
    let mut out = std::io::BufWriter::new(file);
    let total = write_to(&mut out, held).map_err(fail)?;
    let file = out.into_inner().map_err(|e| fail(e.into_error()))?;
    file.sync_all().map_err(fail)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(fail)?;
    sync_directory(path).map_err(fail)?;
    Ok(total)
}

/// Creates `path` new, readable and writable by its owner only, without
/// following a symlink.
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path)
}

/// Flushes the directory holding `path` (its new name) to disk.
fn sync_directory(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let directory = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(directory)?.sync_all()?;
    }
    let _ = path;
    Ok(())
}

fn write_to(out: &mut impl Write, held: &[Held<'_>]) -> std::io::Result<usize> {
    out.write_all(MAGIC)?;
    put_u32(out, held.len())?;
    let mut total = 0;
    for model in held {
        let all = model.sequences.snapshot();
        encode_model(out, model.name, model.version, model.sequences.spec(), &all)?;
        total += all.len();
    }
    out.flush()?;
    Ok(total)
}

/// Writes one model's part of a snapshot: its name, version, state pairs,
/// windows and `sequences` (see the module's format).
pub(crate) fn encode_model(
    out: &mut impl Write,
    name: &str,
    version: &str,
    spec: &SequenceSpec,
    sequences: &[Snapshotted],
) -> std::io::Result<()> {
    put_str(out, name)?;
    put_str(out, version)?;
    put_u32(out, spec.states.len())?;
    for state in &spec.states {
        put_str(out, &state.input.name)?;
        put_str(out, state.input.datatype.as_str())?;
        put_u64(out, state.input.row_bytes() as u64)?;
    }
    put_u32(out, spec.windows.len())?;
    for window in &spec.windows {
        put_str(out, &window.input.name)?;
        put_str(out, window.input.datatype.as_str())?;
        put_u64(out, window.input.row_bytes() as u64)?;
    }
    put_u64(out, sequences.len() as u64)?;
    for kept in sequences {
        match &kept.id.id {
            SequenceId::Number(n) => {
                out.write_all(&[0])?;
                put_u64(out, *n)?;
            }
            SequenceId::Text(s) => {
                out.write_all(&[1])?;
                put_str(out, s)?;
            }
        }
        match kept.id.owner {
            None => out.write_all(&[0])?,
            Some(owner) => {
                out.write_all(&[1])?;
                out.write_all(&owner.0)?;
            }
        }
        put_u64(out, kept.ticks)?;
        put_u64(out, kept.window_ticks)?;
        for row in &kept.state {
            out.write_all(row)?;
        }
    }
    Ok(())
}

/// A whole snapshot (header included) of one model holding `sequences`:
/// what a hand-over file holds.
pub(crate) fn encode_one(
    name: &str,
    version: &str,
    spec: &SequenceSpec,
    sequences: &[Snapshotted],
) -> Vec<u8> {
    let mut out = Vec::from(MAGIC);
    // Writing into a Vec cannot fail.
    let _ = put_u32(&mut out, 1);
    let _ = encode_model(&mut out, name, version, spec, sequences);
    out
}

/// Restores the sequences of `path` into the models of `held` that
/// match (see the module's notes); returns how many came back. A missing
/// file restores nothing.
pub fn restore(path: &Path, held: &[Held<'_>]) -> Result<usize, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let restored = read(&bytes, held).map_err(|e| format!("{}: {e}", path.display()))?;
    let done = path.with_extension("restored");
    std::fs::rename(path, &done).map_err(|e| format!("cannot rename {}: {e}", path.display()))?;
    Ok(restored)
}

/// Reads a snapshot's bytes with no model to restore into: every check the
/// reader makes, for fuzzing (a corrupt file is an error, never a panic).
pub fn read_for_fuzzing(bytes: &[u8]) -> Result<usize, String> {
    read(bytes, &[])
}

/// One model's part of a snapshot, read.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The model's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Its state pairs' inputs: name, datatype, row bytes.
    pub states: Vec<(String, String, u64)>,
    /// Its windows' inputs: name, datatype, window bytes.
    pub windows: Vec<(String, String, u64)>,
    /// Its sequences.
    pub sequences: Vec<Snapshotted>,
}

impl Decoded {
    /// Whether `spec` has this part's state pairs and windows.
    pub fn fits(&self, spec: &SequenceSpec) -> bool {
        same_states(spec, &self.states, &self.windows)
    }
}

fn read(bytes: &[u8], held: &[Held<'_>]) -> Result<usize, String> {
    let mut restored = 0;
    for part in decode(bytes)? {
        let target = held
            .iter()
            .find(|h| h.name == part.name && h.version == part.version)
            .map(|h| h.sequences);
        let matches = target.is_some_and(|s| part.fits(s.spec()));
        if target.is_some() && !matches {
            tracing::warn!(
                model = part.name,
                version = part.version,
                "the model's state pairs or windows changed since the snapshot: its sequences are not restored"
            );
        }
        if let (Some(sequences), true) = (target, matches) {
            restored += sequences.restore(part.sequences);
        }
    }
    Ok(restored)
}

/// Reads a snapshot's bytes, model by model; a short or corrupt file is an
/// error, never a panic.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<Decoded>, String> {
    let mut input = Reader { bytes, at: 0 };
    let format = match input.take(MAGIC.len())? {
        magic if magic == MAGIC => 3,
        magic if magic == MAGIC_V2 => 2,
        magic if magic == MAGIC_V1 => 1,
        _ => return Err("not a tickserve sequence snapshot".to_string()),
    };
    let mut parts = Vec::new();
    for _ in 0..input.u32()? {
        let name = input.str()?;
        let version = input.str()?;
        let mut states = Vec::new();
        for _ in 0..input.u32()? {
            states.push((input.str()?, input.str()?, input.u64()?));
        }
        let mut windows = Vec::new();
        if format >= 3 {
            for _ in 0..input.u32()? {
                windows.push((input.str()?, input.str()?, input.u64()?));
            }
        }
        let mut sequences = Vec::new();
        for _ in 0..input.u64()? {
            let id = match input.take(1)?[0] {
                0 => SequenceId::Number(input.u64()?),
                1 => SequenceId::Text(input.str()?),
                kind => return Err(format!("unknown sequence id kind {kind}")),
            };
            let owner = match format {
                1 => None,
                _ => match input.take(1)?[0] {
                    0 => None,
                    1 => {
                        let mut key = [0u8; 8];
                        key.copy_from_slice(input.take(8)?);
                        Some(KeyIdOrd(key))
                    }
                    flag => return Err(format!("unknown owner flag {flag}")),
                },
            };
            let id = SequenceKey { owner, id };
            let ticks = input.u64()?;
            let window_ticks = if format >= 3 { input.u64()? } else { 0 };
            let mut rows = Vec::with_capacity(states.len() + windows.len());
            for (_, _, row_bytes) in states.iter().chain(&windows) {
                let len = usize::try_from(*row_bytes).map_err(|e| e.to_string())?;
                rows.push(Bytes::copy_from_slice(input.take(len)?));
            }
            sequences.push(Snapshotted {
                id,
                ticks,
                window_ticks,
                state: rows,
            });
        }
        parts.push(Decoded {
            name,
            version,
            states,
            windows,
            sequences,
        });
    }
    Ok(parts)
}

/// Whether the model's state pairs and windows are those of the file.
fn same_states(
    spec: &SequenceSpec,
    states: &[(String, String, u64)],
    windows: &[(String, String, u64)],
) -> bool {
    let same = |inputs: Vec<&TensorSpec>, file: &[(String, String, u64)]| {
        inputs.len() == file.len()
            && inputs
                .iter()
                .zip(file)
                .all(|(input, (name, datatype, bytes))| {
                    input.name == *name
                        && input.datatype.as_str() == datatype
                        && input.row_bytes() as u64 == *bytes
                })
    };
    same(spec.states.iter().map(|s| &s.input).collect(), states)
        && same(spec.windows.iter().map(|w| &w.input).collect(), windows)
}

fn put_u32(out: &mut impl Write, n: usize) -> std::io::Result<()> {
    out.write_all(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes())
}

fn put_u64(out: &mut impl Write, n: u64) -> std::io::Result<()> {
    out.write_all(&n.to_le_bytes())
}

fn put_str(out: &mut impl Write, s: &str) -> std::io::Result<()> {
    put_u32(out, s.len())?;
    out.write_all(s.as_bytes())
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

    #[cfg(unix)]
    #[test]
    fn the_file_is_owner_only_and_a_symlink_at_its_temporary_name_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sequences.bin");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, path.with_extension("partial")).unwrap();
        assert_eq!(write(&path, &[]).unwrap(), 0);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!path.with_extension("partial").exists());
        let mut expected = Vec::from(MAGIC);
        put_u32(&mut expected, 0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        // A second write replaces the first whole.
        assert_eq!(write(&path, &[]).unwrap(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn a_short_or_foreign_file_is_an_error_not_a_panic() {
        assert!(read(b"hello", &[]).is_err());
        let mut file = Vec::from(MAGIC);
        put_u32(&mut file, 1).unwrap();
        put_str(&mut file, "m").unwrap();
        assert!(read(&file, &[]).unwrap_err().contains("ends early"));
        // A huge count with nothing behind it.
        let mut file = Vec::from(MAGIC);
        file.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(read(&file, &[]).is_err());
    }
}
