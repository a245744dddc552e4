//! A run's drop count, in a file of its own: `DIRECTORY/RUN.dropped.json`.
//!
//! Each record carries the count of records its run dropped before it
//! (`dropped_so_far`), but records dropped after a run's last written one
//! would appear nowhere. So the writer keeps the count in this file too: it
//! creates the file as the run starts (creating it reserves the run's name:
//! a second server that picks the same name, a container's pid 1 restarted
//! within the same second, takes the next free one), rewrites it at most
//! once a second while the count moves, and a last time, `final: true`, when
//! the journal closes. `verify` reads it to say how many records the run
//! dropped after its last record, or that the count is unknown.
//!
//! Rewritten whole, through a temporary file renamed over it: a reader sees
//! the old count or the new one.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What the file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// The run.
    pub run: String,
    /// Records the run dropped (counted, not written), all streams together.
    pub dropped: u64,
    /// Written as the journal closed: no record was dropped after it. False
    /// while the run goes on, or when it ended without closing (a crash):
    /// the count is then at most a second old.
    #[serde(rename = "final")]
    pub last: bool,
}

/// The file's name suffix.
pub const SUFFIX: &str = ".dropped.json";

/// Where run `run`'s file is under `directory`.
pub fn path(directory: &Path, run: &str) -> PathBuf {
    directory.join(format!("{run}{SUFFIX}"))
}

/// Reserves a run name under `directory` from `wanted`: `wanted` itself, or
/// `wanted-2`, `wanted-3`... the first whose file does not exist yet, made
/// now (owner-only) with a count of 0.
pub fn reserve(directory: &Path, wanted: &str) -> Result<String, String> {
    for n in 1..=1000u32 {
        let run = if n == 1 {
            wanted.to_string()
        } else {
            format!("{wanted}-{n}")
        };
        let mut options = std::fs::File::options();
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options
            .write(true)
            .create_new(true)
            .open(path(directory, &run))
        {
            Ok(mut file) => {
                let drops = Drops {
                    run: run.clone(),
                    dropped: 0,
                    last: false,
                };
                file.write_all(&encode(&drops))
                    .map_err(|e| format!("writing the run's drop count: {e}"))?;
                return Ok(run);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("creating the run's drop count file: {e}")),
        }
    }
    Err(format!("no free run name after {wanted}-1000"))
}

/// Rewrites run `drops.run`'s file under `directory`, and syncs it.
pub fn write(directory: &Path, drops: &Drops) -> std::io::Result<()> {
    let target = path(directory, &drops.run);
    let temporary = directory.join(format!(".{}{SUFFIX}.tmp", drops.run));
    let mut options = std::fs::File::options();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)?;
    file.write_all(&encode(drops))?;
    file.sync_data()?;
    std::fs::rename(&temporary, &target)
}

/// Every run's file under `directory` (its top level), by run; files that
/// cannot be read are left out.
pub fn read_all(directory: &Path) -> Vec<Drops> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    let mut found: Vec<Drops> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(SUFFIX)))
        .filter_map(|e| {
            // A few dozen bytes; anything larger is no drop count.
            let text = std::fs::read(e.path()).ok().filter(|t| t.len() < 4096)?;
            serde_json::from_slice(&text).ok()
        })
        .collect();
    found.sort_by(|a, b| a.run.cmp(&b.run));
    found
}

fn encode(drops: &Drops) -> Vec<u8> {
    let mut text = serde_json::to_vec(drops).unwrap_or_default();
    text.push(b'\n');
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_taken_run_name_is_not_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let first = reserve(dir.path(), "20261126T101010Z-1").unwrap();
        let second = reserve(dir.path(), "20261126T101010Z-1").unwrap();
        assert_eq!(first, "20261126T101010Z-1");
        assert_eq!(second, "20261126T101010Z-1-2");
        let counts = read_all(dir.path());
        assert_eq!(counts.len(), 2);
        assert!(counts.iter().all(|d| d.dropped == 0 && !d.last));
        let last = Drops {
            run: second.clone(),
            dropped: 659,
            last: true,
        };
        write(dir.path(), &last).unwrap();
        assert!(read_all(dir.path()).contains(&last));
    }

    #[test]
    fn a_directory_that_cannot_hold_the_file_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let error = reserve(&file, "run").unwrap_err();
        assert!(
            error.starts_with("creating the run's drop count file:"),
            "{error}"
        );
    }

    #[test]
    fn a_drop_count_file_of_4096_bytes_or_more_is_no_drop_count() {
        let dir = tempfile::tempdir().unwrap();
        let drops = Drops {
            run: "big".into(),
            dropped: 1,
            last: true,
        };
        let text = serde_json::to_string(&drops).unwrap();
        let padded = format!("{text:<4096}");
        std::fs::write(path(dir.path(), "big"), &padded).unwrap();
        assert!(read_all(dir.path()).is_empty());
        std::fs::write(path(dir.path(), "big"), &padded[..4095]).unwrap();
        assert_eq!(read_all(dir.path()), vec![drops]);
    }
}
