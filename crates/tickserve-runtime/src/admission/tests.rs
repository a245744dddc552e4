use super::*;

#[test]
fn the_queue_admits_rows_up_to_its_limit_and_no_further() {
    let model = Arc::new(ModelQueue::new("m", 8, 1000, &Priorities::default()));
    let family = Arc::new(FamilyRows::default());
    let six = Ticket::admit(&model, &family, 6, 60, 1).ok();
    assert!(six.is_some());
    assert_eq!(
        Ticket::admit(&model, &family, 3, 30, 1).err(),
        Some(Refused::Rows(6)),
        "6 + 3 rows would go over 8"
    );
    assert_eq!(model.rows(), 6, "a refused request leaves nothing behind");
    assert_eq!(family.rows(), 6);
    let two = Ticket::admit(&model, &family, 2, 20, 1);
    assert!(two.is_ok());
    drop(six);
    drop(two);
    assert_eq!((model.rows(), family.rows()), (0, 0));
}

#[test]
fn the_queue_admits_bytes_up_to_its_limit_and_no_further() {
    let model = Arc::new(ModelQueue::new("m", 100, 1000, &Priorities::default()));
    let family = Arc::new(FamilyRows::default());
    let big = Ticket::admit(&model, &family, 1, 900, 1).ok();
    assert!(big.is_some());
    assert_eq!(
        Ticket::admit(&model, &family, 1, 200, 1).err(),
        Some(Refused::Bytes(900)),
        "one row, but 900 + 200 bytes would go over 1000"
    );
    assert_eq!((model.rows(), model.bytes(), family.rows()), (1, 900, 1));
    drop(big);
    assert_eq!((model.rows(), model.bytes()), (0, 0));
}

/// Both sides of each limit: exactly the limit is admitted, one more is
/// not (a `>` made `>=` refuses the first; a `>` made `>` + 1 admits the
/// second).
#[test]
fn exactly_the_limit_is_admitted_and_one_more_is_not() {
    let model = Arc::new(ModelQueue::new("m", 8, 1000, &Priorities::default()));
    let family = Arc::new(FamilyRows::default());
    let eight = Ticket::admit(&model, &family, 8, 80, 1);
    assert!(eight.is_ok(), "8 rows into a queue of max_queue_rows = 8");
    assert_eq!(
        Ticket::admit(&model, &family, 1, 1, 1).err(),
        Some(Refused::Rows(8)),
        "a ninth row"
    );
    drop(eight);
    let full = Ticket::admit(&model, &family, 1, 1000, 1);
    assert!(
        full.is_ok(),
        "1000 bytes into a queue of max_queue_bytes = 1000"
    );
    assert_eq!(
        Ticket::admit(&model, &family, 1, 1, 1).err(),
        Some(Refused::Bytes(1000)),
        "one byte more"
    );
    drop(full);
    assert!(
        Ticket::admit(&model, &family, 9, 90, 1).is_err(),
        "9 rows into an empty queue of 8"
    );
    assert!(
        Ticket::admit(&model, &family, 1, 1001, 1).is_err(),
        "1001 bytes into an empty queue of 1000"
    );
    assert_eq!((model.rows(), model.bytes()), (0, 0));
}

/// The limits the model configuration view reports, the queue-depth
/// gauge, and the expiry counter a refused deadline moves.
#[test]
fn the_queue_reports_its_limits_depth_and_expiries() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let model = ModelQueue::new("m", 8, 1000, &Priorities::default());
    assert_eq!((model.limit(), model.byte_limit()), (8, 1000));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let snapshot = metrics::with_local_recorder(&recorder, || {
        let model = Arc::new(ModelQueue::new("counted", 8, 1000, &Priorities::default()));
        let family = Arc::new(FamilyRows::default());
        let _three = Ticket::admit(&model, &family, 3, 30, 1).unwrap();
        model.expired(1);
        model.expired(1);
        // While the three rows wait.
        snapshotter.snapshot().into_vec()
    });
    let value = |name: &str, label: Option<&str>| {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .filter(|(key, ..)| label.is_none_or(|l| key.key().labels().any(|k| k.value() == l)))
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(_) => 0.0,
            })
            .sum::<f64>()
    };
    assert_eq!(value(names::QUEUE_ROWS, None), 3.0, "three rows waiting");
    assert_eq!(value(names::REJECTIONS, Some("deadline_exceeded")), 2.0);
}

#[test]
fn a_ticket_gives_its_rows_back_once() {
    let model = Arc::new(ModelQueue::new("m", 8, 1000, &Priorities::default()));
    let family = Arc::new(FamilyRows::default());
    let mut ticket = Ticket::admit(&model, &family, 4, 40, 1).ok();
    if let Some(t) = ticket.as_mut() {
        t.release();
        t.release();
    }
    assert_eq!((model.rows(), family.rows()), (0, 0));
    drop(ticket);
    assert_eq!(
        (model.rows(), family.rows()),
        (0, 0),
        "dropped after release"
    );
}

#[test]
fn each_priority_level_admits_requests_up_to_its_max_queue_size() {
    let config: tickserve_core::priority::PriorityConfig =
        toml::from_str("priority_levels = 2\n[priority_queue_policy.2]\nmax_queue_size = 2")
            .unwrap();
    let priorities = Priorities::resolve(&config).unwrap();
    let model = Arc::new(ModelQueue::new("m", 100, 10_000, &priorities));
    let family = Arc::new(FamilyRows::default());
    let a = Ticket::admit(&model, &family, 1, 10, 2).unwrap();
    let _b = Ticket::admit(&model, &family, 1, 10, 2).unwrap();
    assert_eq!(
        Ticket::admit(&model, &family, 1, 10, 2).err(),
        Some(Refused::Level(2))
    );
    // Level 1 has no bound of its own.
    let ones: Vec<Ticket> = (0..10)
        .map(|_| Ticket::admit(&model, &family, 1, 10, 1).unwrap())
        .collect();
    assert_eq!((model.waiting_at(1), model.waiting_at(2)), (10, 2));
    drop(a);
    assert!(
        Ticket::admit(&model, &family, 1, 10, 2).is_ok(),
        "a place came free"
    );
    drop(ones);
    assert_eq!(model.waiting_at(1), 0);
    assert_eq!(
        model.rows(),
        1,
        "only _b waits: refusals left nothing behind"
    );
}
