//! `tickserve journal verify DIR`: for each stream (one model version's
//! records in one run), how many records, whether any is missing (a gap in
//! the numbers), whether any was changed (a broken chain), and whether the
//! stream ends in a partial record batch (a crash: every record before it is
//! whole); for each run, how many records it dropped after its last written
//! one ([`crate::drops`]), or that this is unknown. Reads one record batch
//! at a time: its memory does not grow with the journal.

use std::fmt::Write as _;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use serde::Serialize;

use crate::digest::{Columns, genesis};
use crate::read::{JournalFile, scan_dir};
use crate::schema::CHAIN;

/// What `verify` found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Every stream.
    pub streams: Vec<StreamReport>,
    /// Every run, with its drop count.
    pub runs: Vec<RunReport>,
    /// Files that are not journal files.
    pub unreadable: Vec<String>,
}

/// One run's drop count.
#[derive(Debug, Default, Serialize)]
pub struct RunReport {
    /// The run.
    pub run: String,
    /// Records the run dropped in all, as its drop-count file says; `None`
    /// without one (a journal written before the file, or a damaged one).
    pub dropped: Option<u64>,
    /// The file was written as the journal closed (else at most a second
    /// before the run ended).
    pub final_count: bool,
    /// Of those, dropped after the run's last written record: the records'
    /// own counts cannot show them. `None` when `dropped` is unknown.
    pub dropped_after_last_record: Option<u64>,
}

/// One stream's findings.
#[derive(Debug, Default, Serialize)]
pub struct StreamReport {
    /// The run (server process) that wrote it.
    pub run: String,
    /// The model.
    pub model: String,
    /// Its version.
    pub version: String,
    /// The SHA-256 of its `model.onnx`.
    pub model_digest: String,
    /// Its files.
    pub files: usize,
    /// Whole records read.
    pub records: u64,
    /// Records the server dropped (counted, not written) up to its last
    /// record, over the whole run.
    pub dropped_so_far: u64,
    /// Missing record numbers, as `[first, last]` ranges.
    pub gaps: Vec<[u64; 2]>,
    /// Records whose chain digest does not follow from the one before:
    /// changed, or moved.
    pub broken_chain: Vec<u64>,
    /// The last file ends in a partial record batch (a crash): what the
    /// reader said. Every record before it is whole.
    pub truncated_tail: Option<String>,
    /// Files other than the last that end in a partial record batch (a
    /// failed write: the records after it continue in the next file).
    pub damaged_files: Vec<String>,
    /// Its last file ends with the stream's end marker: the server closed
    /// it (at shutdown, or rotating). False while the server still writes
    /// it, after a write to it failed, or when the server stopped without
    /// closing it (a crash).
    pub closed: bool,
}

impl Report {
    /// True when no record is missing and none was changed (a truncated
    /// tail, which a crash leaves, is not a fault).
    pub fn sound(&self) -> bool {
        self.unreadable.is_empty()
            && self
                .streams
                .iter()
                .all(|s| s.gaps.is_empty() && s.broken_chain.is_empty())
    }

    /// Records in every stream.
    pub fn records(&self) -> u64 {
        self.streams.iter().map(|s| s.records).sum()
    }

    /// The report for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for s in &self.streams {
            let _ = writeln!(
                out,
                "{}/{} (run {}, model digest {}): {} records in {} files, {} dropped by the server in the run",
                s.model,
                s.version,
                s.run,
                &s.model_digest.get(..12).unwrap_or(&s.model_digest),
                s.records,
                s.files,
                s.dropped_so_far
            );
            for [a, b] in s.gaps.iter().take(LISTED) {
                let _ = writeln!(out, "  GAP: records {a} to {b} are missing");
            }
            more(&mut out, s.gaps.len(), "gaps");
            for r in s.broken_chain.iter().take(LISTED) {
                let _ = writeln!(
                    out,
                    "  BROKEN CHAIN at record {r}: it was changed, or records before it were"
                );
            }
            more(&mut out, s.broken_chain.len(), "broken links");
            for f in s.damaged_files.iter().take(LISTED) {
                let _ = writeln!(out, "  damaged file: {f}");
            }
            more(&mut out, s.damaged_files.len(), "damaged files");
            if !s.closed {
                let _ = writeln!(
                    out,
                    "  its last file is not closed: the server still writes it, a write to it failed, or the server stopped without closing it"
                );
            }
            if let Some(t) = &s.truncated_tail {
                let _ = writeln!(
                    out,
                    "  truncated tail (a crash; every record before it is whole): {t}"
                );
            }
        }
        for r in &self.runs {
            let _ = match (r.dropped, r.dropped_after_last_record) {
                (Some(all), Some(after)) => writeln!(
                    out,
                    "run {}: {all} records dropped in all, {after} of them after its last record{}",
                    r.run,
                    if r.final_count {
                        ""
                    } else {
                        " (a count from while it ran: it did not close its journal)"
                    }
                ),
                _ => writeln!(
                    out,
                    "run {}: records dropped after its last record: unknown (no drop-count file)",
                    r.run
                ),
            };
        }
        for u in &self.unreadable {
            let _ = writeln!(out, "UNREADABLE: {u}");
        }
        let _ = writeln!(
            out,
            "{} records in {} streams: {}",
            self.records(),
            self.streams.len(),
            if self.sound() {
                "no gap, no broken chain"
            } else {
                "FAULTS FOUND"
            }
        );
        out
    }
}

/// How many gaps, broken links or damaged files the text report lists per
/// stream (the JSON report has them all).
const LISTED: usize = 20;

/// The line after a list cut at [`LISTED`].
fn more(out: &mut String, total: usize, what: &str) {
    if total > LISTED {
        let _ = writeln!(
            out,
            "  ... and {} more {what} (--json lists them all)",
            total - LISTED
        );
    }
}

/// Verifies every stream under `dir`, one record batch at a time.
pub fn verify(dir: &Path) -> Result<Report, String> {
    let journal = scan_dir(dir)?;
    let mut report = Report {
        unreadable: journal
            .unreadable
            .iter()
            .map(|(p, e)| format!("{}: {e}", p.display()))
            .collect(),
        ..Report::default()
    };
    for (id, files) in &journal.streams {
        let mut s = StreamReport {
            run: id.run.clone(),
            model: id.model.clone(),
            version: id.version.clone(),
            model_digest: id.digest.clone(),
            files: files.len(),
            ..StreamReport::default()
        };
        let mut expected = 0u64;
        let mut chain = genesis(&id.run, &id.model, &id.version, &id.digest);
        for (i, file) in files.iter().enumerate() {
            let damage = check_file(file, &mut s, &mut expected, &mut chain);
            if let Some(damage) = damage {
                if i + 1 == files.len() {
                    s.truncated_tail = Some(format!("{}: {damage}", file.path.display()));
                } else {
                    s.damaged_files
                        .push(format!("{}: {damage}", file.path.display()));
                }
            }
        }
        s.closed = files.last().is_some_and(|f| f.finished);
        report.streams.push(s);
    }
    report.runs = runs(dir, &report.streams);
    Ok(report)
}

/// Every run of `streams` and of the drop-count files: how many records it
/// dropped, and how many of those after its last record (the most any of
/// its records counted before it).
fn runs(dir: &Path, streams: &[StreamReport]) -> Vec<RunReport> {
    let counts = crate::drops::read_all(dir);
    let mut names: Vec<&str> = streams.iter().map(|s| s.run.as_str()).collect();
    names.extend(counts.iter().map(|d| d.run.as_str()));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|run| {
            let counted = streams
                .iter()
                .filter(|s| s.run == run)
                .map(|s| s.dropped_so_far)
                .max()
                .unwrap_or(0);
            let file = counts.iter().find(|d| d.run == run);
            RunReport {
                run: run.to_string(),
                dropped: file.map(|d| d.dropped),
                final_count: file.is_some_and(|d| d.last),
                dropped_after_last_record: file.map(|d| d.dropped.saturating_sub(counted)),
            }
        })
        .collect()
}

/// Checks `file`'s records, one record batch at a time; what stopped the
/// reading before the file's end, if anything.
fn check_file(
    file: &JournalFile,
    s: &mut StreamReport,
    expected: &mut u64,
    chain: &mut crate::digest::ChainDigest,
) -> Option<String> {
    let batches = match file.batches() {
        Ok(batches) => batches,
        Err(e) => return Some(e),
    };
    for batch in batches {
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) => return Some(e),
        };
        let batch = &batch;
        let (Some(numbers), Some(chains), Some(dropped)) = (
            batch.column_by_name("record"),
            batch.column_by_name(CHAIN),
            batch.column_by_name("dropped_so_far"),
        ) else {
            s.damaged_files.push(format!(
                "{}: a batch lacks its record, chain or dropped_so_far column",
                file.path.display()
            ));
            return None;
        };
        let (Some(numbers), Some(chains), Some(dropped)) = (
            numbers.as_primitive_opt::<UInt64Type>(),
            chains.as_fixed_size_binary_opt(),
            dropped.as_primitive_opt::<UInt64Type>(),
        ) else {
            s.damaged_files.push(format!(
                "{}: a batch's record, chain or dropped_so_far column has the wrong type",
                file.path.display()
            ));
            return None;
        };
        let mut reader = Columns::of(batch);
        for row in 0..batch.num_rows() {
            let number = numbers.value(row);
            // A record twice, or out of order, breaks the chain below: its
            // stored digest followed another record than the one before it.
            if number > *expected {
                s.gaps.push([*expected, number - 1]);
            }
            *expected = number.saturating_add(1);
            let computed = reader.link(chain, row);
            let stored: [u8; 32] = chains.value(row).try_into().unwrap_or([0; 32]);
            if computed != stored {
                s.broken_chain.push(number);
            }
            // Go on from the stored digest: one changed record is reported
            // once, not with every record after it.
            *chain = stored;
            s.records += 1;
            s.dropped_so_far = dropped.value(row);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_past_its_listed_length_says_how_many_more() {
        let mut out = String::new();
        more(&mut out, LISTED, "gaps");
        assert_eq!(out, "");
        more(&mut out, LISTED + 3, "gaps");
        assert_eq!(out, "  ... and 3 more gaps (--json lists them all)\n");
    }
}
