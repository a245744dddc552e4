#![allow(clippy::unwrap_used)]

use super::*;
use std::path::Path;
use tickserve_core::sequence::{SequenceConfig, SequenceControl, StateConfig};
use tickserve_core::{DataType, Signature, TensorSpec};

fn spec(max_sequences: usize, idle: Duration, action: IdleAction) -> Arc<SequenceSpec> {
    spec_of_width(max_sequences, idle, action, 1)
}

/// [`spec`] with a state of `width` floats.
fn spec_of_width(
    max_sequences: usize,
    idle: Duration,
    action: IdleAction,
    width: usize,
) -> Arc<SequenceSpec> {
    let t = |name: &str| TensorSpec {
        name: name.to_string(),
        datatype: DataType::Fp32,
        dims: vec![if name.starts_with("s_") { width } else { 1 }],
    };
    let signature = Signature {
        inputs: vec![t("x"), t("s_in")],
        outputs: vec![t("y"), t("s_out")],
    };
    let config = SequenceConfig {
        max_sequence_idle: idle,
        idle_action: action,
        max_sequences: Some(max_sequences),
        state: vec![StateConfig {
            input: "s_in".into(),
            output: "s_out".into(),
            initial_file: None,
        }],
        bind_to_key: false,
        ..SequenceConfig::default()
    };
    Arc::new(
        SequenceSpec::resolve(&config, &signature, Path::new("."))
            .unwrap()
            .unwrap(),
    )
}

fn table(max: usize) -> Arc<Sequences> {
    Arc::new(Sequences::new(
        "m",
        spec(max, Duration::ZERO, IdleAction::Error),
        Clock::by_hand(),
    ))
}

fn control(id: u64, start: bool, end: bool) -> SequenceControl {
    SequenceControl {
        id: SequenceId::Number(id),
        start,
        end,
        owner: None,
    }
}

fn row(v: f32) -> Vec<Bytes> {
    vec![Bytes::copy_from_slice(&v.to_le_bytes())]
}

fn value(rows: &[Bytes]) -> f32 {
    f32::from_le_bytes(rows[0][..4].try_into().unwrap())
}

/// One tick: takes the turn at once (or panics), returns the state it
/// ran with, and writes `next`.
fn tick(table: &Arc<Sequences>, c: &SequenceControl, next: f32) -> Result<f32, Error> {
    let purpose = Purpose::Tick { start: c.start };
    let Entry::Now(turn) = table.enter(&table.key(&c.id, None), purpose)? else {
        panic!("no one else holds the turn");
    };
    let started = turn.begin(c)?;
    turn.finish(c, row(next), 0, Vec::new());
    Ok(value(&started.state))
}

/// One tick through the fleet when the sequence is not kept here.
async fn tick_anywhere(
    table: &Arc<Sequences>,
    c: &SequenceControl,
    next: f32,
) -> Result<f32, Error> {
    let purpose = Purpose::Tick { start: c.start };
    let turn = table
        .enter(&table.key(&c.id, None), purpose)?
        .turn("m", None)
        .await?;
    let started = turn.begin(c)?;
    turn.finish(c, row(next), 0, Vec::new());
    Ok(value(&started.state))
}

/// A table of `max` sequences of version 1, in a fleet of its own replica
/// on `etcd` (prefix `prefix`).
async fn linked(
    etcd: &tickserve_testing::etcd::Etcd,
    prefix: &str,
    max: usize,
) -> (Arc<Sequences>, Arc<tickserve_fleet::Fleet>) {
    linked_as(etcd, prefix, spec(max, Duration::ZERO, IdleAction::Error)).await
}

/// [`linked`] with `spec`.
async fn linked_as(
    etcd: &tickserve_testing::etcd::Etcd,
    prefix: &str,
    spec: Arc<SequenceSpec>,
) -> (Arc<Sequences>, Arc<tickserve_fleet::Fleet>) {
    let t = Arc::new(Sequences::new("m", spec, Clock::by_hand()));
    let config = tickserve_core::config::FleetConfig {
        endpoints: etcd.endpoints(),
        prefix: prefix.to_string(),
        ..Default::default()
    };
    let fleet = tickserve_fleet::Fleet::connect(&config).await.unwrap();
    t.join_fleet(fleet.clone(), "1", Duration::from_secs(2))
        .unwrap();
    (t, fleet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_room_puts_the_state_back_and_a_later_one_takes_it() {
    let etcd = tickserve_testing::etcd::Etcd::start();
    let ((a, _fa), (b, _fb)) = (linked(&etcd, "r", 8).await, linked(&etcd, "r", 1).await);
    tick_anywhere(&a, &control(7, true, false), 5.0)
        .await
        .unwrap();
    assert!(
        a.hand_over(&a.key(&SequenceId::Number(7), None))
            .await
            .unwrap()
    );
    // b keeps one sequence already, its max: the claim fails, retryably,
    // and the state stays for the next claim.
    tick_anywhere(&b, &control(1, true, false), 1.0)
        .await
        .unwrap();
    let error = tick_anywhere(&b, &control(7, false, false), 0.0)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::SequencesFull { .. }), "{error}");
    assert!(error.to_string().contains("not run"), "{error}");
    // Room again: the claim takes it, with the state a handed over.
    tick_anywhere(&b, &control(1, false, true), 0.0)
        .await
        .unwrap();
    assert_eq!(
        tick_anywhere(&b, &control(7, false, false), 6.0)
            .await
            .unwrap(),
        5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_larger_than_the_fleets_store_takes_is_refused_at_load() {
    let etcd = tickserve_testing::etcd::Etcd::start();
    let config = tickserve_core::config::FleetConfig {
        endpoints: etcd.endpoints(),
        prefix: "big".to_string(),
        ..Default::default()
    };
    let fleet = tickserve_fleet::Fleet::connect(&config).await.unwrap();
    let wait = Duration::from_secs(1);
    // 300,000 floats: 1.2 MB of state, over etcd's value limit.
    let big = Sequences::new(
        "m",
        spec_of_width(8, Duration::ZERO, IdleAction::Error, 300_000),
        Clock::by_hand(),
    );
    let error = big.join_fleet(fleet.clone(), "1", wait).unwrap_err();
    assert!(
        error.contains("1200000 bytes") && error.contains("without [fleet]"),
        "{error}"
    );
    let small = Sequences::new(
        "m",
        spec_of_width(8, Duration::ZERO, IdleAction::Error, 1000),
        Clock::by_hand(),
    );
    small.join_fleet(fleet, "1", wait).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // waits for the fleet's task to release the record, in real time
async fn in_a_fleet_an_expired_sequence_releases_its_record_and_restarts_where_it_expired() {
    let etcd = tickserve_testing::etcd::Etcd::start();
    let idle = Duration::from_millis(20);
    let (t, _ft) = linked_as(&etcd, "x", spec(8, idle, IdleAction::Restart)).await;
    let (other, _fo) = linked(&etcd, "x", 8).await;
    tick_anywhere(&t, &control(1, true, false), 1.0)
        .await
        .unwrap();
    t.clock.advance(idle * 2);
    t.sweep();
    // Its record is gone: another replica finds no keeper, as for a
    // sequence never started (not a wait for a keeper that has nothing).
    let started = std::time::Instant::now();
    loop {
        let error = tick_anywhere(&other, &control(1, false, false), 0.0)
            .await
            .unwrap_err();
        if matches!(error, Error::SequenceNotActive { .. }) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    }
    // Where it expired, its next tick restarts it (`idle_action = "restart"`),
    // taking it over in the fleet.
    assert_eq!(
        tick_anywhere(&t, &control(1, false, false), 2.0)
            .await
            .unwrap(),
        0.0
    );
    assert_eq!(
        tick_anywhere(&t, &control(1, false, false), 3.0)
            .await
            .unwrap(),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_elsewhere_ends_the_old_copy_and_a_stale_replica_never_answers() {
    let etcd = tickserve_testing::etcd::Etcd::start();
    let ((a, fa), (b, _fb)) = (linked(&etcd, "s", 8).await, linked(&etcd, "s", 8).await);
    // a answers what b asks of it, as the server's task does.
    let mut asked = fa.asked().unwrap();
    let a_answers = Arc::clone(&a);
    tokio::spawn(async move {
        while let Some(asked) = asked.recv().await {
            let key = parse_key_text(&asked.key.key).unwrap();
            let _ = a_answers.hand_over_asked(&key).await;
        }
    });
    tick_anywhere(&a, &control(3, true, false), 1.0)
        .await
        .unwrap();
    tick_anywhere(&a, &control(3, false, false), 2.0)
        .await
        .unwrap();
    // Started again on b: a lets its copy go before b answers.
    assert_eq!(
        tick_anywhere(&b, &control(3, true, false), 10.0)
            .await
            .unwrap(),
        0.0
    );
    assert!(!a.holds(&a.key(&SequenceId::Number(3), None)));
    // A tick that reaches a now takes b's state (b hands it over), never
    // a's stale 2.0.
    let mut asked = _fb.asked().unwrap();
    let b_answers = Arc::clone(&b);
    tokio::spawn(async move {
        while let Some(asked) = asked.recv().await {
            let key = parse_key_text(&asked.key.key).unwrap();
            let _ = b_answers.hand_over_asked(&key).await;
        }
    });
    assert_eq!(
        tick_anywhere(&a, &control(3, false, false), 11.0)
            .await
            .unwrap(),
        10.0
    );
}

#[test]
fn the_last_answer_a_step_guard_reads_is_the_latest_tick_s() {
    let t = table(8);
    let answer = |v: f32| vec![("y".to_string(), Bytes::from(v.to_le_bytes().to_vec()))];
    let last = |started: &turn::TickStart| {
        started
            .last_answer
            .iter()
            .find(|(name, _)| name == "y")
            .map(|(_, b)| f32::from_le_bytes(b[..4].try_into().unwrap()))
    };
    let mut seen = Vec::new();
    for (tick, (start, value)) in [(true, 1.0), (false, 2.0), (false, 3.0)]
        .into_iter()
        .enumerate()
    {
        let c = control(4, start, false);
        let Entry::Now(turn) = t
            .enter(&t.key(&c.id, None), Purpose::Tick { start })
            .unwrap()
        else {
            panic!("tick {tick}: the turn is free");
        };
        let started = turn.begin(&c).unwrap();
        seen.push(last(&started));
        turn.finish(&c, row(0.0), 0, answer(value));
    }
    // Nothing to step from at the start; then each tick reads the one before.
    assert_eq!(seen, [None, Some(1.0), Some(2.0)]);
}

#[test]
fn state_carries_from_tick_to_tick_and_ends_with_the_sequence() {
    let t = table(8);
    assert_eq!(tick(&t, &control(1, true, false), 1.0).unwrap(), 0.0);
    assert_eq!(tick(&t, &control(1, false, false), 2.0).unwrap(), 1.0);
    assert_eq!(t.active(), 1);
    assert_eq!(tick(&t, &control(1, false, true), 3.0).unwrap(), 2.0);
    assert_eq!(t.active(), 0);
    let error = tick(&t, &control(1, false, false), 0.0).unwrap_err();
    assert!(matches!(error, Error::SequenceNotActive { .. }), "{error}");
    assert!(t.list(None).is_empty());
}

#[test]
fn an_unknown_sequence_is_refused_and_a_start_resets() {
    let t = table(8);
    let error = tick(&t, &control(5, false, false), 0.0).unwrap_err();
    assert_eq!(
        error.to_string(),
        "model 'm': sequence 5 is not active (never started, ended, dropped, or idle past \
         the model's max_sequence_idle); send its first request with sequence_start = true"
    );
    tick(&t, &control(5, true, false), 7.0).unwrap();
    assert_eq!(tick(&t, &control(5, true, false), 8.0).unwrap(), 0.0);
}

#[test]
fn sequences_keep_their_own_state() {
    let t = table(8);
    tick(&t, &control(1, true, false), 10.0).unwrap();
    tick(&t, &control(2, true, false), 20.0).unwrap();
    assert_eq!(tick(&t, &control(1, false, false), 11.0).unwrap(), 10.0);
    assert_eq!(tick(&t, &control(2, false, false), 21.0).unwrap(), 20.0);
}

#[test]
fn the_table_is_bounded() {
    let t = table(2);
    tick(&t, &control(1, true, false), 1.0).unwrap();
    tick(&t, &control(2, true, false), 1.0).unwrap();
    let error = tick(&t, &control(3, true, false), 1.0).unwrap_err();
    assert!(error.to_string().contains("keeps 2 sequences"), "{error}");
    tick(&t, &control(1, false, true), 1.0).unwrap();
    tick(&t, &control(3, true, false), 1.0).unwrap();
}

#[test]
fn turns_go_in_arrival_order_and_a_caller_that_left_is_skipped() {
    let t = table(8);
    let id = SequenceId::Number(9);
    let Entry::Now(first) = t
        .enter(&t.key(&id, None), Purpose::Tick { start: true })
        .unwrap()
    else {
        panic!()
    };
    let Entry::Waiting(mut second) = t
        .enter(&t.key(&id, None), Purpose::Tick { start: false })
        .unwrap()
    else {
        panic!()
    };
    let Entry::Waiting(third) = t
        .enter(&t.key(&id, None), Purpose::Tick { start: false })
        .unwrap()
    else {
        panic!()
    };
    let Entry::Waiting(mut fourth) = t
        .enter(&t.key(&id, None), Purpose::Tick { start: false })
        .unwrap()
    else {
        panic!()
    };
    drop(third);
    drop(first);
    let second_turn = second.try_recv().unwrap();
    assert!(
        fourth.try_recv().is_err(),
        "the fourth went before the second finished"
    );
    drop(second_turn);
    // The third left: the fourth is next.
    assert!(fourth.try_recv().is_ok());
}

#[test]
fn waiting_requests_per_sequence_are_bounded() {
    let t = table(8);
    let id = SequenceId::Number(1);
    let _holder = t
        .enter(&t.key(&id, None), Purpose::Tick { start: true })
        .unwrap();
    let mut waiting = Vec::new();
    for _ in 0..MAX_PENDING_PER_SEQUENCE {
        waiting.push(
            t.enter(&t.key(&id, None), Purpose::Tick { start: false })
                .unwrap(),
        );
    }
    let error = t
        .enter(&t.key(&id, None), Purpose::Tick { start: false })
        .unwrap_err();
    assert!(matches!(error, Error::SequencesFull { .. }), "{error}");
}

#[test]
fn an_idle_sequence_expires_with_a_clear_error_or_restarts() {
    let idle = Duration::from_millis(20);
    let t = Arc::new(Sequences::new(
        "m",
        spec(8, idle, IdleAction::Error),
        Clock::by_hand(),
    ));
    tick(&t, &control(1, true, false), 1.0).unwrap();
    tick(&t, &control(2, true, false), 1.0).unwrap();
    t.clock.advance(idle * 2);
    // Told what a sequence never started is told: the answer does not
    // say which ids exist.
    let expired = tick(&t, &control(1, false, false), 0.0).unwrap_err();
    let unknown = tick(&t, &control(77, false, false), 0.0).unwrap_err();
    assert_eq!(
        expired.to_string().replace(" 1 ", " 77 "),
        unknown.to_string()
    );
    // Sequence 2 is swept, and refused the same way.
    t.sweep();
    assert_eq!(t.active(), 0);
    assert!(t.list(None).is_empty());
    let error = tick(&t, &control(2, false, false), 0.0).unwrap_err();
    assert!(matches!(error, Error::SequenceNotActive { .. }), "{error}");
    // A start brings it back.
    tick(&t, &control(2, true, false), 5.0).unwrap();
    assert_eq!(tick(&t, &control(2, false, false), 0.0).unwrap(), 5.0);

    let t = Arc::new(Sequences::new(
        "m",
        spec(8, idle, IdleAction::Restart),
        Clock::by_hand(),
    ));
    tick(&t, &control(1, true, false), 1.0).unwrap();
    tick(&t, &control(2, true, false), 1.0).unwrap();
    t.clock.advance(idle * 2);
    t.sweep();
    for id in [1, 2] {
        let c = control(id, false, false);
        let Entry::Now(turn) = t
            .enter(&t.key(&c.id, None), Purpose::Tick { start: false })
            .unwrap()
        else {
            panic!()
        };
        let started = turn.begin(&c).unwrap();
        assert!(started.restarted, "sequence {id}");
        assert_eq!(value(&started.state), 0.0);
        turn.finish(&c, row(3.0), 0, Vec::new());
    }
    assert_eq!(tick(&t, &control(1, false, false), 0.0).unwrap(), 3.0);
}

fn expired_table(max: usize, action: IdleAction) -> (Arc<Sequences>, Duration) {
    let idle = Duration::from_millis(20);
    (
        Arc::new(Sequences::new(
            "m",
            spec(max, idle, action),
            Clock::by_hand(),
        )),
        idle,
    )
}

#[tokio::test]
async fn a_state_written_after_expiry_is_what_the_next_tick_runs_with() {
    let (t, idle) = expired_table(8, IdleAction::Restart);
    tick(&t, &control(1, true, false), 1.0).unwrap();
    t.clock.advance(idle * 2);
    t.sweep();
    t.write(&SequenceId::Number(1), row(42.0), 0, None, None)
        .await
        .unwrap();
    assert_eq!(tick(&t, &control(1, false, false), 0.0).unwrap(), 42.0);
}

/// Takes sequence `id`'s turn for a tick and gives it back without an
/// answer (the tick failed).
fn failed_tick(t: &Arc<Sequences>, id: u64, start: bool) {
    let c = control(id, start, false);
    let Entry::Now(turn) = t
        .enter(&t.key(&c.id, None), Purpose::Tick { start })
        .unwrap()
    else {
        panic!("no one else holds the turn");
    };
    turn.begin(&c).unwrap();
    drop(turn);
}

#[test]
fn a_failed_start_or_restart_leaves_no_slot_behind() {
    for action in [IdleAction::Error, IdleAction::Restart] {
        let (t, idle) = expired_table(1, action);
        tick(&t, &control(1, true, false), 1.0).unwrap();
        t.clock.advance(idle * 2);
        t.sweep();
        failed_tick(&t, 1, true);
        if action == IdleAction::Restart {
            tick(&t, &control(1, true, false), 1.0).unwrap();
            t.clock.advance(idle * 2);
            t.sweep();
            failed_tick(&t, 1, false);
            // Still remembered: its next tick restarts it.
            let c = control(1, false, false);
            let Entry::Now(turn) = t
                .enter(&t.key(&c.id, None), Purpose::Tick { start: false })
                .unwrap()
            else {
                panic!()
            };
            assert!(turn.begin(&c).unwrap().restarted);
            drop(turn);
        }
        // The table (of one) has room for another sequence.
        tick(&t, &control(2, true, false), 1.0).unwrap_or_else(|e| panic!("{action:?}: {e}"));
        assert_eq!(t.active(), 1);
    }
}

#[tokio::test]
async fn an_expired_sequence_is_neither_read_listed_nor_snapshotted_before_a_sweep() {
    let (t, idle) = expired_table(8, IdleAction::Error);
    let id = SequenceId::Number(1);
    t.write(&id, row(1.0), 0, None, None).await.unwrap();
    t.write(&SequenceId::Number(2), row(2.0), 0, None, None)
        .await
        .unwrap();
    t.clock.advance(idle * 2);
    assert!(t.list(None).is_empty());
    assert!(t.snapshot().is_empty());
    assert_eq!(t.active(), 0);
    t.write(&SequenceId::Number(3), row(3.0), 0, None, None)
        .await
        .unwrap();
    t.clock.advance(idle * 2);
    let error = t
        .read(&SequenceId::Number(3), None, None)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::SequenceNotActive { .. }), "{error}");
    assert!(matches!(
        t.remove(&id, None, None).await,
        Err(Error::SequenceNotActive { .. })
    ));
}

#[test]
fn a_start_on_a_full_table_does_not_sweep_the_whole_table() {
    let idle = Duration::from_secs(3600);
    let t = Arc::new(Sequences::new(
        "m",
        spec(64, idle, IdleAction::Error),
        Clock::by_hand(),
    ));
    for id in 0..64 {
        tick(&t, &control(id, true, false), 1.0).unwrap();
    }
    let before = t.sweeps.load(Ordering::Relaxed);
    // A thousand starts of unknown ids against the full table: each is
    // refused in constant time, none reads the whole table.
    for id in 1000..2000 {
        let error = tick(&t, &control(id, true, false), 1.0).unwrap_err();
        assert!(matches!(error, Error::SequencesFull { .. }), "{error}");
        let error = tick(&t, &control(id, false, false), 1.0).unwrap_err();
        assert!(matches!(error, Error::SequenceNotActive { .. }), "{error}");
    }
    assert_eq!(t.sweeps.load(Ordering::Relaxed), before);
}

#[test]
fn the_expired_ids_are_bounded_and_forget_the_oldest() {
    let mut expired = Expired::default();
    let id = |n| SequenceKey {
        owner: None,
        id: SequenceId::Number(n),
    };
    for n in 0..10 {
        expired.insert(id(n), 4);
    }
    assert!((0..6).all(|n| !expired.contains(&id(n))));
    assert!((6..10).all(|n| expired.contains(&id(n))));
    // Removed and remembered again, many times: the order stays bounded.
    for _ in 0..1000 {
        assert!(expired.remove(&id(9)));
        expired.insert(id(9), 4);
    }
    assert!(expired.order.len() <= 2 * 16 + 1, "{}", expired.order.len());
    expired.insert(id(10), 4);
    assert!(!expired.contains(&id(6)) && expired.contains(&id(9)));
}

#[tokio::test]
async fn state_reads_writes_and_drops_take_their_turn() {
    let t = table(8);
    let id = SequenceId::Text("AAPL".into());
    t.write(&id, row(4.0), 0, None, None).await.unwrap();
    let read = t.read(&id, None, None).await.unwrap();
    assert_eq!((read.ticks, value(&read.state)), (0, 4.0));
    let c = SequenceControl {
        id: id.clone(),
        start: false,
        end: false,
        owner: None,
    };
    assert_eq!(tick(&t, &c, 6.0).unwrap(), 4.0);
    let kept = Snapshotted {
        id: t.key(&id, None),
        ticks: 1,
        window_ticks: 0,
        state: row(6.0),
    };
    assert_eq!(t.snapshot(), vec![kept.clone()]);
    t.remove(&id, None, None).await.unwrap();
    assert!(matches!(
        t.read(&id, None, None).await,
        Err(Error::SequenceNotActive { .. })
    ));
    let back = table(8);
    assert_eq!(back.restore(vec![kept]), 1);
    assert_eq!(value(&back.read(&id, None, None).await.unwrap().state), 6.0);
}
