//! `journal verify` over a journal the writer wrote: sound as written, then
//! damaged as a crash (a cut tail), a lost file (a gap), an edit (a broken
//! chain) or a stray file would damage it, each found and named.

use std::path::{Path, PathBuf};

use crate::support::{alpha_files, handle, journal, record, report};

/// A closed journal of `files` files of one record each (`alpha` version 1,
/// request ids `id0`, `id1`, ...), and its files in record order.
fn one_record_per_file(files: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let (journal, dir) = journal(|c| c.rotate_bytes = 64 * 1024);
    let alpha = handle("alpha", "1");
    for i in 0..files {
        // Past rotate_bytes: the next batch begins a new file.
        let mut r = record(&alpha, &format!("id{i}"), 70_000);
        r.error = Some(format!("MARK{i}{}", "e".repeat(70_000)));
        journal.submit(r);
        journal.flush();
    }
    journal.close();
    let paths = alpha_files(dir.path());
    assert_eq!(paths.len(), files);
    (dir, paths)
}

fn text(dir: &Path) -> String {
    report(dir).text()
}

#[test]
fn a_journal_as_written_is_sound_and_its_report_says_what_it_holds() {
    let (dir, _) = one_record_per_file(3);
    let report = report(dir.path());
    assert!(report.sound(), "{report:?}");
    assert_eq!(report.records(), 3);
    let s = &report.streams[0];
    assert_eq!((s.model.as_str(), s.version.as_str()), ("alpha", "1"));
    let run = &report.runs[0].run;
    let digest = &handle("alpha", "1").digest;
    assert_eq!(
        report.text(),
        format!(
            "alpha/1 (run {run}, model digest {}): 3 records in 3 files, 0 dropped by the server in the run\n\
             run {run}: 0 records dropped in all, 0 of them after its last record\n\
             3 records in 1 streams: no gap, no broken chain\n",
            &digest[..12]
        )
    );
}

#[test]
fn a_lost_file_is_a_gap_of_exactly_its_records() {
    let (dir, files) = one_record_per_file(4);
    std::fs::remove_file(&files[1]).expect("a file removed");
    let report = report(dir.path());
    assert_eq!(report.streams[0].gaps, [[1, 1]], "{report:?}");
    assert!(!report.sound());
    assert_eq!(report.records(), 3);
    std::fs::remove_file(&files[2]).expect("a file removed");
    let report = crate::support::report(dir.path());
    assert_eq!(report.streams[0].gaps, [[1, 2]], "{report:?}");
    assert!(
        report
            .text()
            .contains("  GAP: records 1 to 2 are missing\n"),
        "{}",
        report.text()
    );
}

#[test]
fn an_edited_record_breaks_the_chain_at_that_record_only() {
    let (dir, files) = one_record_per_file(3);
    let mut bytes = std::fs::read(&files[1]).expect("a journal file");
    let at = bytes
        .windows(5)
        .position(|w| w == b"MARK1")
        .expect("the record's text in its file");
    bytes[at + 4] = b'9';
    std::fs::write(&files[1], bytes).expect("the file edited");
    let report = report(dir.path());
    let s = &report.streams[0];
    assert_eq!(
        (s.broken_chain.as_slice(), s.gaps.len()),
        (&[1u64][..], 0),
        "{s:?}"
    );
    assert!(!report.sound(), "an edit alone makes the journal unsound");
    assert!(
        report
            .text()
            .contains("  BROKEN CHAIN at record 1: it was changed, or records before it were\n")
    );
}

#[test]
fn a_cut_last_file_is_a_truncated_tail_and_a_cut_earlier_file_is_damage() {
    let (dir, files) = one_record_per_file(3);
    let cut = |path: &Path| {
        let len = std::fs::metadata(path).expect("a journal file").len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("the file opens");
        file.set_len(len - 100).expect("the file cut");
    };
    cut(&files[2]);
    let report = report(dir.path());
    let s = &report.streams[0];
    assert!(
        s.truncated_tail.is_some() && s.damaged_files.is_empty(),
        "{s:?}"
    );
    assert!(!s.closed, "a cut file lost its end marker");
    assert!(
        report.sound(),
        "a crash's cut tail is not a fault: {report:?}"
    );
    assert!(text(dir.path()).contains("  its last file is not closed"));
    cut(&files[0]);
    let report = crate::support::report(dir.path());
    let s = &report.streams[0];
    assert_eq!(s.damaged_files.len(), 1, "{s:?}");
    assert!(s.damaged_files[0].starts_with(&files[0].display().to_string()));
    assert!(report.text().contains("  damaged file: "));
}

#[test]
fn a_closed_journal_is_not_said_to_be_open() {
    let (dir, _) = one_record_per_file(1);
    assert!(!text(dir.path()).contains("not closed"));
}

#[test]
fn a_file_that_is_not_a_journal_file_makes_the_journal_unsound() {
    let (dir, _) = one_record_per_file(1);
    std::fs::write(dir.path().join("journal/alpha/1/notes.arrows"), "not arrow").unwrap();
    let report = report(dir.path());
    assert_eq!(report.unreadable.len(), 1, "{report:?}");
    assert!(!report.sound());
}
