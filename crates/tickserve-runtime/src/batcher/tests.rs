#![allow(clippy::disallowed_methods)] // tests pass instants of the machine's clock to the batcher
use super::*;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Req {
    rows: usize,
    at: Instant,
    deadline: Option<Instant>,
    member: MemberId,
    level: u32,
    delay_at: Option<Instant>,
}

impl Queued for Req {
    fn rows(&self) -> usize {
        self.rows
    }
    fn admitted(&self) -> Instant {
        self.at
    }
    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    fn member(&self) -> MemberId {
        self.member
    }
    fn level(&self) -> u32 {
        self.level
    }
    fn delay_at(&self) -> Option<Instant> {
        self.delay_at
    }
    fn delay(&mut self) {
        self.level = DELAYED;
        self.delay_at = None;
    }
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn req(rows: usize, at: Instant) -> Req {
    Req {
        rows,
        at,
        deadline: None,
        member: 0,
        level: 1,
        delay_at: None,
    }
}

fn at_level(level: u32, rows: usize, at: Instant) -> Req {
    Req {
        level,
        ..req(rows, at)
    }
}

/// Decides and takes the next batch, as an executor does.
fn next_batch(q: &mut Batcher<Req>, now: Instant) -> Vec<Req> {
    let mut batch = Vec::new();
    if let Decision::Run(n) = q.decide(now, true) {
        q.take(n, &mut batch);
    }
    batch
}

#[test]
fn a_higher_level_goes_first_and_arrival_order_holds_within_a_level() {
    let t0 = Instant::now();
    let mut q = Batcher::new(2, us(0));
    q.push(at_level(2, 1, t0));
    q.push(at_level(2, 1, t0 + us(1)));
    q.push(at_level(1, 1, t0 + us(2)));
    q.push(at_level(3, 1, t0 + us(3)));
    q.push(at_level(1, 1, t0 + us(4)));
    let order: Vec<(u32, Instant)> = std::iter::from_fn(|| {
        let b = next_batch(&mut q, t0 + us(10));
        (!b.is_empty()).then_some(b)
    })
    .flatten()
    .map(|r| (r.level, r.at))
    .collect();
    assert_eq!(
        order,
        vec![
            (1, t0 + us(2)),
            (1, t0 + us(4)),
            (2, t0),
            (2, t0 + us(1)),
            (3, t0 + us(3)),
        ]
    );
}

#[test]
fn lower_levels_fill_the_room_a_higher_level_leaves() {
    let t0 = Instant::now();
    let mut q = Batcher::new(8, us(0));
    q.push(at_level(2, 3, t0));
    q.push(at_level(1, 4, t0 + us(1)));
    let batch = next_batch(&mut q, t0 + us(2));
    assert_eq!(
        batch.iter().map(|r| r.level).collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn a_delayed_request_moves_behind_every_level() {
    let t0 = Instant::now();
    let mut q = Batcher::new(1, us(0));
    q.push(Req {
        delay_at: Some(t0 + us(100)),
        ..at_level(1, 1, t0)
    });
    q.push(at_level(3, 1, t0 + us(1)));
    q.push(at_level(2, 1, t0 + us(2)));
    // Before its delay time it is first.
    q.delay_overdue(t0 + us(99));
    assert_eq!(next_batch(&mut q.clone_for_test(), t0 + us(99))[0].level, 1);
    q.delay_overdue(t0 + us(100));
    let order: Vec<u32> = std::iter::from_fn(|| {
        let b = next_batch(&mut q, t0 + us(100));
        (!b.is_empty()).then_some(b)
    })
    .flatten()
    .map(|r| r.level)
    .collect();
    assert_eq!(order, vec![2, 3, DELAYED]);
}

fn of(member: MemberId, rows: usize, at: Instant) -> Req {
    Req {
        member,
        ..req(rows, at)
    }
}

#[test]
fn an_empty_queue_waits_for_a_request() {
    let q: Batcher<Req> = Batcher::new(64, us(0));
    assert_eq!(q.decide(Instant::now(), false), Decision::Empty);
}

#[test]
fn with_no_delay_a_free_executor_runs_what_is_queued_at_once() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(0));
    q.push(req(1, t0));
    assert_eq!(q.decide(t0, false), Decision::Run(1));
    q.push(req(3, t0));
    assert_eq!(q.decide(t0, false), Decision::Run(2));
}

#[test]
fn max_queue_delay_is_respected() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(250));
    q.push(req(1, t0));
    q.push(req(2, t0 + us(100)));
    // The oldest has waited less than 250 µs: wait for company until then.
    assert_eq!(
        q.decide(t0 + us(100), false),
        Decision::WaitUntil(t0 + us(250))
    );
    assert_eq!(
        q.decide(t0 + us(249), false),
        Decision::WaitUntil(t0 + us(250))
    );
    // Not a microsecond longer.
    assert_eq!(q.decide(t0 + us(250), false), Decision::Run(2));
}

#[test]
fn a_full_bucket_goes_early() {
    let t0 = Instant::now();
    let mut q = Batcher::new(8, us(1_000));
    q.push(req(5, t0));
    assert_eq!(q.decide(t0, false), Decision::WaitUntil(t0 + us(1_000)));
    q.push(req(3, t0));
    assert_eq!(
        q.decide(t0, false),
        Decision::Run(2),
        "8 of 8 rows: no reason to wait"
    );
    q.push(req(1, t0));
    assert_eq!(
        q.decide(t0, false),
        Decision::Run(2),
        "the third does not fit: it opens the next batch"
    );
}

#[test]
fn a_request_that_cannot_join_sends_the_batch_at_once() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(1_000));
    q.push(req(40, t0));
    q.push(req(30, t0));
    assert_eq!(q.decide(t0, false), Decision::Run(1));
}

#[test]
fn a_request_larger_than_the_largest_bucket_goes_alone() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(1_000));
    q.push(req(200, t0));
    q.push(req(1, t0));
    assert_eq!(q.decide(t0, false), Decision::Run(1));
}

#[test]
fn expired_requests_are_taken_out_before_they_run() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(0));
    q.push(Req {
        deadline: Some(t0 + us(10)),
        ..req(1, t0)
    });
    q.push(req(2, t0));
    q.push(Req {
        deadline: Some(t0 + us(500)),
        ..req(4, t0)
    });
    let mut expired = Vec::new();
    q.take_expired(t0 + us(10), &mut expired);
    assert_eq!(expired.iter().map(|r| r.rows).collect::<Vec<_>>(), vec![1]);
    let mut batch = Vec::new();
    match q.decide(t0 + us(10), false) {
        Decision::Run(n) => q.take(n, &mut batch),
        other => panic!("{other:?}"),
    }
    assert_eq!(batch.iter().map(|r| r.rows).collect::<Vec<_>>(), vec![2, 4]);
    assert!(q.is_empty());
}

#[test]
fn a_model_whose_rows_mix_runs_one_request_at_a_time() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(1_000));
    q.one_request_per_run();
    for rows in [1, 2, 3] {
        q.push(req(rows, t0));
    }
    let mut ran = Vec::new();
    while let Decision::Run(n) = q.decide(t0, false) {
        assert_eq!(n, 1, "two requests in one run");
        let mut batch = Vec::new();
        q.take(n, &mut batch);
        ran.extend(batch.iter().map(|r| r.rows));
    }
    assert_eq!(ran, [1, 2, 3]);
}

#[test]
fn at_once_sends_without_waiting() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(10_000));
    q.push(req(1, t0));
    assert_eq!(q.decide(t0, true), Decision::Run(1));
}

#[test]
fn every_request_runs_once_in_arrival_order() {
    let t0 = Instant::now();
    let arrivals = [5, 60, 3, 2, 64, 1, 70, 7, 33, 31, 1];
    let mut q = Batcher::new(64, us(0));
    for &rows in &arrivals {
        q.push(req(rows, t0));
    }
    let mut ran = Vec::new();
    while let Decision::Run(n) = q.decide(t0, false) {
        let mut batch = Vec::new();
        q.take(n, &mut batch);
        let rows: usize = batch.iter().map(|r| r.rows).sum();
        assert!(batch.len() == 1 || rows <= 64, "{batch:?}");
        ran.extend(batch.iter().map(|r| r.rows));
    }
    assert_eq!(ran, arrivals);
}

#[test]
fn a_batch_holds_one_member_the_oldest_requests_member() {
    let t0 = Instant::now();
    let mut q = Batcher::new(64, us(0));
    q.push(of(1, 2, t0));
    q.push(of(2, 3, t0));
    q.push(of(1, 4, t0));
    let mut batch = Vec::new();
    assert_eq!(q.decide(t0, false), Decision::Run(2));
    q.take(2, &mut batch);
    assert_eq!(batch, vec![of(1, 2, t0), of(1, 4, t0)]);
    batch.clear();
    assert_eq!(q.decide(t0, false), Decision::Run(1));
    q.take(1, &mut batch);
    assert_eq!(batch, vec![of(2, 3, t0)]);
    assert!(q.is_empty());
}

#[test]
fn where_members_mix_a_batch_is_the_oldest_requests_whatever_their_members() {
    let t0 = Instant::now();
    let mut q = Batcher::new(8, us(0));
    q.mix_members();
    q.push(of(1, 2, t0));
    q.push(of(2, 3, t0));
    q.push(of(1, 2, t0));
    q.push(of(3, 2, t0));
    let mut batch = Vec::new();
    // 2 + 3 + 2 rows fit the 8-row bucket; the fourth would not.
    assert_eq!(q.decide(t0, false), Decision::Run(3));
    q.take(3, &mut batch);
    assert_eq!(batch, vec![of(1, 2, t0), of(2, 3, t0), of(1, 2, t0)]);
    batch.clear();
    assert_eq!(q.decide(t0, false), Decision::Run(1));
    q.take(1, &mut batch);
    assert_eq!(batch, vec![of(3, 2, t0)]);
    assert!(q.is_empty());
}

#[test]
fn a_quiet_member_is_not_starved_by_a_hot_one() {
    // Member 1 sends 1000 one-row requests; member 2 sends one after the
    // first 100. Member 2 runs as soon as the hot requests that came
    // before it have run: after ceil(100 / 8) batches, not after all 1000.
    let t0 = Instant::now();
    let mut q = Batcher::new(8, us(0));
    for i in 0..1000u64 {
        if i == 100 {
            q.push(of(2, 1, t0 + us(i)));
        }
        q.push(of(1, 1, t0 + us(i)));
    }
    let mut runs = 0;
    loop {
        let Decision::Run(n) = q.decide(t0 + us(2000), false) else {
            panic!("member 2 never ran");
        };
        let mut batch = Vec::new();
        q.take(n, &mut batch);
        runs += 1;
        assert!(batch.iter().all(|r| r.member == batch[0].member));
        if batch[0].member == 2 {
            break;
        }
    }
    assert_eq!(runs, 100usize.div_ceil(8) + 1);
}

/// A deadline exactly at `now` has passed ("at or before"), and a queue
/// holding only passed deadlines is swept whole.
#[test]
fn deadlines_at_or_before_now_are_swept_even_when_every_request_has_one() {
    let t0 = Instant::now();
    let now = t0 + us(100);
    let due = |deadline| Req {
        deadline: Some(deadline),
        ..req(1, t0)
    };
    let mut b = Batcher::new(64, us(0));
    b.push(due(now));
    let mut expired = Vec::new();
    b.take_expired(now, &mut expired);
    assert_eq!(expired.len(), 1, "a deadline exactly at now has passed");
    assert!(b.is_empty());
    let mut b = Batcher::new(64, us(0));
    b.push(due(t0));
    b.push(due(t0 + us(50)));
    let mut expired = Vec::new();
    b.take_expired(now, &mut expired);
    assert_eq!(expired.len(), 2, "every request's deadline passed");
    assert!(b.is_empty());
    let mut b = Batcher::new(64, us(0));
    b.push(due(now + us(1)));
    b.take_expired(now, &mut expired);
    assert_eq!(expired.len(), 2, "a deadline after now stays queued");
    assert!(!b.is_empty());
}

/// A delay time exactly at `now` has come, and a queue whose every
/// request is overdue moves them all behind the level order.
#[test]
fn delays_at_or_before_now_move_requests_back_even_when_every_request_is_overdue() {
    let t0 = Instant::now();
    let now = t0 + us(100);
    let overdue = |delay_at| Req {
        delay_at: Some(delay_at),
        ..at_level(1, 1, t0)
    };
    let mut b = Batcher::new(64, us(0));
    b.push(overdue(now));
    b.push(overdue(t0));
    b.delay_overdue(now);
    assert!(
        b.entries
            .iter()
            .all(|j| j.level == DELAYED && j.delay_at.is_none()),
        "both moved back, the one due exactly now included"
    );
    let mut b = Batcher::new(64, us(0));
    b.push(overdue(t0));
    b.push(overdue(t0 + us(1)));
    b.delay_overdue(now);
    assert!(
        b.entries.iter().all(|j| j.level == DELAYED),
        "every request overdue, every one moved back"
    );
    let mut b = Batcher::new(64, us(0));
    b.push(overdue(now + us(1)));
    b.delay_overdue(now);
    assert_eq!(b.entries[0].level, 1, "not due yet");
}
