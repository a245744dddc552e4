//! The journal's writer as the edge drives it: records of a loaded model's
//! versions handed to [`Journal`], then its directory read back with
//! `verify` and `read`. No server: what a front end adds is the server's
//! `features::journal` tests.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tickserve_core::Error;
use tickserve_core::config::WhenFull;
use tickserve_journal::Journal;
use tickserve_journal::read::{read_file, scan_dir};

use crate::support::{
    alpha_files, handle, journal, journal_by_hand, numbered, record, report, written,
};

#[test]
fn records_are_written_in_order_one_numbered_chained_stream_per_version() {
    let (journal, dir) = journal(|_| {});
    let (one, two) = (handle("alpha", "1"), handle("alpha", "2"));
    for (i, h) in [&one, &two, &one, &one, &two].into_iter().enumerate() {
        assert!(journal.submit(record(h, &format!("r{i}"), 10)).is_none());
    }
    journal.flush();
    assert_eq!(
        written(dir.path()),
        [
            ("alpha/1".to_string(), numbered(&["r0", "r2", "r3"])),
            ("alpha/2".to_string(), numbered(&["r1", "r4"])),
        ]
    );
    let before_close = report(dir.path());
    for s in &before_close.streams {
        assert!(s.gaps.is_empty() && s.broken_chain.is_empty(), "{s:?}");
        assert!(!s.closed, "a file still open has no end marker: {s:?}");
    }
    // More records after a flush continue each stream's numbering.
    journal.submit(record(&one, "r5", 10));
    journal.close();
    let report = report(dir.path());
    let counts: Vec<(u64, usize, bool)> = report
        .streams
        .iter()
        .map(|s| (s.records, s.files, s.closed))
        .collect();
    assert_eq!(counts, [(4, 1, true), (2, 1, true)], "{report:?}");
    for s in &report.streams {
        assert!(s.gaps.is_empty() && s.broken_chain.is_empty(), "{s:?}");
        assert_eq!(
            (s.truncated_tail.as_deref(), s.damaged_files.len()),
            (None, 0)
        );
        assert_eq!(s.model_digest, one.digest);
    }
    assert_eq!(report.runs.len(), 1, "{report:?}");
    assert_eq!(report.runs[0].run, journal.run());
    assert_eq!(report.runs[0].dropped, Some(0));
    assert!(report.runs[0].final_count, "{report:?}");
}

#[test]
fn files_and_directories_are_the_servers_users_only() {
    use std::os::unix::fs::PermissionsExt;
    let (journal, dir) = journal(|_| {});
    journal.submit(record(&handle("alpha", "1"), "r", 10));
    journal.close();
    let version_dir = dir.path().join("journal/alpha/1");
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .expect("it exists")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&dir.path().join("journal")), 0o700);
    assert_eq!(mode(&version_dir), 0o700);
    let files = alpha_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert_eq!(name, format!("{}-000000000000.arrows", journal.run()));
    assert_eq!(mode(&files[0]), 0o600);
}

#[test]
fn only_journaled_models_are_wanted_and_sampling_takes_exactly_its_fraction() {
    let (every, _dir) = journal(|_| {});
    let (alpha, beta) = (handle("alpha", "1"), handle("beta", "1"));
    assert!((0..10).all(|_| every.wants(&alpha)));
    assert!((0..10).all(|_| !every.wants(&beta)));
    let (quarter, _dir) = journal(|c| c.sample = 0.25);
    let taken: Vec<bool> = (0..12).map(|_| quarter.wants(&alpha)).collect();
    assert_eq!(taken.iter().filter(|&&t| t).count(), 3, "{taken:?}");
    assert!(!quarter.wants(&beta));
    let (none, _dir) = journal(|c| c.sample = 0.0);
    assert!((0..10).all(|_| !none.wants(&alpha)));
}

#[test]
fn a_file_past_rotate_bytes_is_closed_and_the_next_batch_begins_a_new_one() {
    // Each record is larger than rotate_bytes: each flush's batch ends up
    // in a file of its own, numbered from its first record.
    let (journal, dir) = three_batches_at_64_kib_rotation(70_000);
    let report = report(dir.path());
    let s = &report.streams[0];
    assert_eq!((s.files, s.records, s.closed), (3, 3, true), "{s:?}");
    assert!(s.gaps.is_empty() && s.broken_chain.is_empty() && s.damaged_files.is_empty());
    let names: Vec<String> = alpha_files(dir.path())
        .iter()
        .map(|f| {
            f.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let run = journal.run();
    assert_eq!(
        names,
        [0, 1, 2].map(|first| format!("{run}-{first:012}.arrows"))
    );
}

/// A closed journal rotating at 64 KiB that took three records of
/// `record_bytes` each, one batch at a time (a flush after each).
fn three_batches_at_64_kib_rotation(record_bytes: usize) -> (Arc<Journal>, tempfile::TempDir) {
    let (journal, dir) = journal(|c| c.rotate_bytes = 64 * 1024);
    let alpha = handle("alpha", "1");
    for i in 0..3 {
        journal.submit(record(&alpha, &format!("r{i}"), record_bytes));
        journal.flush();
    }
    journal.close();
    (journal, dir)
}

#[test]
fn batches_below_rotate_bytes_share_one_file() {
    let (_journal, dir) = three_batches_at_64_kib_rotation(1_000);
    let s = &report(dir.path()).streams[0];
    assert_eq!((s.files, s.records, s.closed), (1, 3, true), "{s:?}");
}

#[test]
fn a_file_older_than_rotate_interval_is_closed_and_the_next_record_begins_a_new_one() {
    let (journal, dir, clock) = journal_by_hand(|c| c.rotate_interval = Duration::from_millis(20));
    let alpha = handle("alpha", "1");
    journal.submit(record(&alpha, "r0", 10));
    journal.flush();
    assert!(!report(dir.path()).streams[0].closed, "closed while young");
    // The writer closes it once it is old, with no record to write (a
    // flush wakes the writer at once; it looks at least once a second).
    clock.advance(Duration::from_millis(40));
    journal.flush();
    let idle = report(dir.path());
    assert!(idle.streams[0].closed, "{idle:?}");
    journal.submit(record(&alpha, "r1", 10));
    journal.close();
    let s = &report(dir.path()).streams[0];
    assert_eq!((s.files, s.records, s.closed), (2, 2, true), "{s:?}");
    assert!(s.gaps.is_empty() && s.broken_chain.is_empty());
}

#[test]
fn in_drop_mode_what_does_not_fit_the_queue_is_dropped_and_every_record_is_accounted_for() {
    let (journal, dir) = journal(|c| c.max_queued_bytes = 64 * 1024);
    let alpha = handle("alpha", "1");
    // Two 40 KB records do not fit 64 KiB together: while the writer
    // gathers (20 ms between takes), most are dropped.
    let sent = 200;
    for i in 0..sent {
        assert!(
            journal
                .submit(record(&alpha, &format!("r{i}"), 40_000))
                .is_none()
        );
    }
    journal.close();
    let report = report(dir.path());
    let s = &report.streams[0];
    let dropped = journal.dropped();
    assert!(dropped > 0, "{s:?}");
    assert_eq!(s.records + dropped, sent, "{s:?}");
    assert_eq!(report.runs[0].dropped, Some(dropped), "{report:?}");
    assert!(s.gaps.is_empty() && s.broken_chain.is_empty(), "{s:?}");
    // Each written record says how many were dropped before it, and the
    // drop count names how many came after the last.
    let after = report.runs[0].dropped_after_last_record.expect("known");
    assert_eq!(s.dropped_so_far + after, dropped, "{report:?}");
}

#[test]
fn a_record_larger_than_the_queue_is_kept_when_the_queue_is_empty() {
    let (journal, dir) = journal(|c| c.max_queued_bytes = 64 * 1024);
    journal.submit(record(&handle("alpha", "1"), "big", 100_000));
    journal.close();
    assert_eq!(journal.dropped(), 0);
    assert_eq!(report(dir.path()).streams[0].records, 1);
}

#[test]
fn writes_that_fail_drop_and_count_their_records_and_leave_no_empty_file() {
    let (journal, dir) = journal(|_| {});
    let alpha = handle("alpha", "1");
    journal.fail_writes(true);
    for i in 0..3 {
        journal.submit(record(&alpha, &format!("lost{i}"), 10));
    }
    journal.flush();
    assert_eq!(journal.dropped(), 3);
    assert_eq!(
        alpha_files(dir.path()),
        Vec::<std::path::PathBuf>::new(),
        "a file that holds no record is removed"
    );
    journal.fail_writes(false);
    journal.submit(record(&alpha, "kept0", 10));
    journal.submit(record(&alpha, "kept1", 10));
    journal.close();
    assert_eq!(
        written(dir.path()),
        [("alpha/1".to_string(), numbered(&["kept0", "kept1"]))]
    );
    let report = report(dir.path());
    assert_eq!(report.streams[0].dropped_so_far, 3, "{report:?}");
    assert_eq!(report.runs[0].dropped, Some(3), "{report:?}");
}

#[test]
fn a_record_handed_over_after_close_is_dropped_and_counted() {
    let (journal, dir) = journal(|_| {});
    journal.close();
    assert!(
        journal
            .submit(record(&handle("alpha", "1"), "late", 10))
            .is_none()
    );
    assert_eq!(journal.dropped(), 1);
    assert!(report(dir.path()).streams.is_empty());
}

#[tokio::test]
async fn in_refuse_mode_an_answer_waits_for_its_record_and_a_failing_journal_refuses_but_probes_once_a_second()
 {
    let (journal, dir, clock) = journal_by_hand(|c| c.when_full = WhenFull::Refuse);
    let alpha = handle("alpha", "1");
    assert!(journal.refuses());
    assert!(journal.admit("alpha").is_ok());
    let reply = journal.submit(record(&alpha, "r0", 10)).expect("a reply");
    assert_eq!(reply.await, Ok(true));
    assert_eq!(
        report(dir.path()).streams[0].records,
        1,
        "written before the reply"
    );

    journal.fail_writes(true);
    let lost = journal.submit(record(&alpha, "lost", 10)).expect("a reply");
    assert_eq!(lost.await, Ok(false));
    assert_eq!(journal.dropped(), 1);
    let refusal = |r: Result<(), Error>| match r {
        Err(Error::JournalUnavailable { model, reason }) => format!("{model}: {reason}"),
        other => format!("not refused: {other:?}"),
    };
    // Failing: refused, except one request a second to find out whether
    // it can write again.
    let mut admitted = 0;
    for _ in 0..5 {
        match journal.admit("alpha") {
            Ok(()) => admitted += 1,
            r => assert_eq!(refusal(r), "alpha: its last write failed"),
        }
    }
    assert!(admitted <= 1, "{admitted} of 5 probes at once");
    journal.fail_writes(false);
    clock.advance(Duration::from_millis(999));
    assert_eq!(
        refusal(journal.admit("alpha")),
        "alpha: its last write failed",
        "a probe before the second is up"
    );
    clock.advance(Duration::from_millis(101));
    assert!(journal.admit("alpha").is_ok(), "the probe, a second later");
    assert_eq!(
        refusal(journal.admit("alpha")),
        "alpha: its last write failed"
    );
    let probe = journal
        .submit(record(&alpha, "probe", 10))
        .expect("a reply");
    assert_eq!(probe.await, Ok(true));
    assert!(journal.admit("alpha").is_ok(), "writing again");
    journal.close();
    assert_eq!(
        written(dir.path()),
        [("alpha/1".to_string(), numbered(&["r0", "probe"]))]
    );
}

#[tokio::test]
async fn in_refuse_mode_every_record_is_answered_written_or_not() {
    let (journal, dir) = journal(|c| {
        c.when_full = WhenFull::Refuse;
        c.max_queued_bytes = 64 * 1024;
    });
    let alpha = handle("alpha", "1");
    // 40 KB records at once: one that finds the queue taken is answered
    // false at once; each answer is true (written) or false (dropped and
    // counted), never lost.
    let replies: Vec<_> = (0..50)
        .map(|i| {
            journal
                .submit(record(&alpha, &format!("r{i}"), 40_000))
                .expect("a reply")
        })
        .collect();
    let (mut kept, mut lost) = (0u64, 0u64);
    for reply in replies {
        match reply.await {
            Ok(true) => kept += 1,
            Ok(false) => lost += 1,
            Err(e) => panic!("a reply lost: {e}"),
        }
    }
    assert_eq!(lost, journal.dropped());
    assert!(kept >= 1);
    journal.close();
    assert_eq!(report(dir.path()).streams[0].records, kept);
}

#[test]
fn a_journal_dropped_without_close_still_ends_its_files() {
    let (journal, dir) = journal(|_| {});
    journal.submit(record(&handle("alpha", "1"), "r", 10));
    drop(journal);
    let report = report(dir.path());
    assert!(report.streams[0].closed, "{report:?}");
    assert!(report.runs[0].final_count, "{report:?}");
}

#[test]
fn the_writer_thread_yields_to_the_threads_that_answer() {
    let (_journal, _dir) = journal(|_| {});
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux's /proc");
    let nice: Vec<i64> = tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            (comm.trim() == "tickserve-journ").then_some(())?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // Field 19 (nice), counted after the parenthesised name.
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        nice.contains(&10),
        "the writer threads' nice values: {nice:?}"
    );
}

#[test]
fn in_drop_mode_records_that_arrive_together_are_written_as_one_batch() {
    let (journal, dir) = journal(|_| {});
    let alpha = handle("alpha", "1");
    // 200 records, one every 100 µs: the writer gathers for 20 ms between
    // takes, so a handful of batches hold them all, not one each.
    let records = 200;
    for i in 0..records {
        journal.submit(record(&alpha, &format!("r{i}"), 10));
        std::thread::sleep(Duration::from_micros(100));
    }
    journal.close();
    let scanned = scan_dir(&dir.path().join("journal")).expect("the journal reads");
    let batches: Vec<usize> = scanned
        .streams
        .values()
        .flatten()
        .flat_map(|f| read_file(&f.path).expect("a journal file").batches)
        .map(|b| b.num_rows())
        .collect();
    assert_eq!(batches.iter().sum::<usize>(), records);
    assert!(batches.len() * 10 <= records, "batches of {batches:?} rows");
}

#[test]
fn the_drop_count_reaches_its_file_while_the_journal_runs() {
    let (journal, dir, clock) = journal_by_hand(|_| {});
    let alpha = handle("alpha", "1");
    // Past the first second: the count file is rewritten at most once a
    // second, and only when the count moved.
    clock.advance(Duration::from_millis(1_100));
    journal.fail_writes(true);
    for i in 0..3 {
        journal.submit(record(&alpha, &format!("lost{i}"), 10));
    }
    journal.flush();
    let runs = tickserve_journal::drops::read_all(&dir.path().join("journal"));
    let counts: Vec<(u64, bool)> = runs.iter().map(|d| (d.dropped, d.last)).collect();
    assert_eq!(counts, [(3, false)], "while it runs");
    journal.close();
    let runs = tickserve_journal::drops::read_all(&dir.path().join("journal"));
    let counts: Vec<(u64, bool)> = runs.iter().map(|d| (d.dropped, d.last)).collect();
    assert_eq!(counts, [(3, true)], "once it closed");
}

#[test]
fn in_refuse_mode_a_full_queue_is_refused_naming_its_limit() {
    let (journal, _dir) = journal(|c| {
        c.when_full = WhenFull::Refuse;
        c.max_queued_bytes = 64 * 1024;
    });
    let alpha = handle("alpha", "1");
    // A 16 MiB record takes the writer milliseconds: admitting right after
    // handing it over finds the queue over its limit.
    let mut full = 0;
    for _ in 0..3 {
        let reply = journal.submit(record(&alpha, "big", 16 << 20));
        match journal.admit("alpha") {
            Ok(()) => {}
            Err(Error::JournalUnavailable { model, reason }) => {
                assert_eq!(
                    (model.as_str(), reason.as_str()),
                    (
                        "alpha",
                        "its queue is at journal.max_queued_bytes (65536 bytes)"
                    )
                );
                full += 1;
            }
            Err(other) => panic!("{other}"),
        }
        drop(reply);
        journal.flush();
    }
    assert!(full >= 1, "never full");
}
