//! The fleet's protocol against a real etcd (Debian's etcd-server, started
//! per test on loopback): ownership moves only through its keeper or after
//! its keeper's lease ended, a handed state is taken once, a dead keeper's
//! sequence is told lost, halts reach every replica, and a replica that
//! cannot reach the store fences itself.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // tests wait on other tasks in real time

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tickserve_core::config::FleetConfig;
use tickserve_core::fleet::{
    Claimed, FleetError, FleetKey, HaltRecord, HaltsFleet, SequenceFleet, Started,
};
use tickserve_fleet::Fleet;
use tickserve_testing::etcd::Etcd;

fn config(etcd: &Etcd, prefix: &str) -> FleetConfig {
    FleetConfig {
        endpoints: etcd.endpoints(),
        prefix: prefix.to_string(),
        lease: Duration::from_secs(2),
        ..FleetConfig::default()
    }
}

fn key(id: &str) -> FleetKey {
    FleetKey {
        model: "seq_lstm_step".to_string(),
        key: format!("-\nt{id}"),
    }
}

/// Answers every want of `fleet` by handing the sequence over with `state`
/// (as a replica's server does once the sequence's earlier requests are
/// answered); counts what it handed.
fn answer_wants(fleet: &Arc<Fleet>, state: &'static [u8]) -> Arc<Mutex<usize>> {
    let mut asked = fleet.asked().unwrap();
    let handed = Arc::new(Mutex::new(0));
    let (fleet, count) = (Arc::clone(fleet), Arc::clone(&handed));
    tokio::spawn(async move {
        while let Some(asked) = asked.recv().await {
            if fleet
                .hand(&asked.key, &asked.version, state.to_vec())
                .await
                .unwrap()
            {
                *count.lock().unwrap() += 1;
            }
        }
    });
    handed
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_moves_only_through_its_keeper_and_with_its_version() {
    let etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t1")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t1")).await.unwrap();
    assert_ne!(a.member(), b.member());
    let k = key("AAPL");
    let wait = Duration::from_millis(300);
    assert_eq!(b.claim(&k, "1", wait).await.unwrap(), Claimed::NeverHeld);
    assert_eq!(a.start(&k, "1", wait).await.unwrap(), Started::Here);
    assert_eq!(a.claim(&k, "1", wait).await.unwrap(), Claimed::Mine);
    // Another version's table moves nothing and learns where it lives.
    assert_eq!(
        b.claim(&k, "2", wait).await.unwrap(),
        Claimed::OnVersion("1".to_string())
    );
    eventually("b's copy of the records names version 1", || {
        b.version_of(&k).as_deref() == Some("1")
    })
    .await;
    // A live keeper that does not answer keeps it: the claim gives up, retryably.
    let busy = b.claim(&k, "1", wait).await.unwrap();
    assert!(matches!(busy, Claimed::Busy(w) if w >= wait), "{busy:?}");
    // Once it answers, the state moves once.
    let handed = answer_wants(&a, b"a's state");
    assert_eq!(
        b.claim(&k, "1", Duration::from_secs(5)).await.unwrap(),
        Claimed::State(b"a's state".to_vec())
    );
    assert_eq!(*handed.lock().unwrap(), 1);
    assert_eq!(b.claim(&k, "1", wait).await.unwrap(), Claimed::Mine);
    // a's copy is stale now: handing it again is refused.
    assert!(!a.hand(&k, "1", b"stale".to_vec()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_elsewhere_waits_for_the_keeper_to_let_go() {
    let etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t2")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t2")).await.unwrap();
    let k = key("EURUSD");
    let wait = Duration::from_millis(300);
    a.start(&k, "1", wait).await.unwrap();
    // a does not answer: the start is refused, retryably, and a keeps it.
    assert!(matches!(
        b.start(&k, "1", wait).await.unwrap(),
        Started::Busy(_)
    ));
    assert_eq!(a.claim(&k, "1", wait).await.unwrap(), Claimed::Mine);
    let handed = answer_wants(&a, b"dropped");
    assert_eq!(
        b.start(&k, "2", Duration::from_secs(5)).await.unwrap(),
        Started::Here
    );
    assert_eq!(*handed.lock().unwrap(), 1, "a let its copy go first");
    // The start began afresh: the handed state is not left for anyone.
    assert_eq!(b.claim(&k, "2", wait).await.unwrap(), Claimed::Mine);
    assert!(!a.hand(&k, "1", b"stale".to_vec()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_keepers_sequences_are_lost_and_its_handed_ones_are_not() {
    let etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t3")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t3")).await.unwrap();
    let (kept, handed) = (key("kept"), key("handed"));
    let wait = Duration::from_millis(300);
    a.start(&kept, "1", wait).await.unwrap();
    a.start(&handed, "1", wait).await.unwrap();
    // A drain hands one over; then a's lease ends (as when it is killed
    // and its TTL runs out).
    assert!(a.hand(&handed, "1", b"drained".to_vec()).await.unwrap());
    a.leave().await;
    assert_eq!(b.claim(&kept, "1", wait).await.unwrap(), Claimed::Lost);
    assert_eq!(
        b.claim(&kept, "1", wait).await.unwrap(),
        Claimed::Lost,
        "told lost until started again"
    );
    assert_eq!(
        b.claim(&handed, "1", wait).await.unwrap(),
        Claimed::State(b"drained".to_vec())
    );
    assert_eq!(b.start(&kept, "1", wait).await.unwrap(), Started::Here);
    assert_eq!(b.claim(&kept, "1", wait).await.unwrap(), Claimed::Mine);
    // An ended sequence's record goes: the next claim finds none.
    b.release(kept.clone(), "1".to_string());
    let c = Fleet::connect(&config(&etcd, "t3")).await.unwrap();
    let started = Instant::now();
    while c.claim(&kept, "1", wait).await.unwrap() != Claimed::NeverHeld {
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_at_once_take_a_handed_state_once_and_the_other_waits_its_turn() {
    let etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t4")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t4")).await.unwrap();
    let c = Fleet::connect(&config(&etcd, "t4")).await.unwrap();
    let k = key("race");
    a.start(&k, "1", Duration::from_secs(1)).await.unwrap();
    assert!(a.hand(&k, "1", b"s0".to_vec()).await.unwrap());
    // Whichever wins answers the other's want with its own next state.
    answer_wants(&b, b"s1");
    answer_wants(&c, b"s1");
    let wait = Duration::from_secs(5);
    let (from_b, from_c) = tokio::join!(b.claim(&k, "1", wait), c.claim(&k, "1", wait));
    let mut got = [from_b.unwrap(), from_c.unwrap()];
    got.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(
        got,
        [
            Claimed::State(b"s0".to_vec()),
            Claimed::State(b"s1".to_vec())
        ],
        "one took the handed state, the other waited for the winner to hand it on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halts_reach_every_replica_and_a_late_joiner_reads_them() {
    let etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t5")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t5")).await.unwrap();
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let log = Arc::clone(&seen);
    b.follow(Box::new(move |records, _| {
        for r in records {
            log.lock()
                .unwrap()
                .push((format!("{}/{}", r.model, r.version), r.halt.is_some()));
        }
    }));
    let halt = |halt: Option<&[u8]>| HaltRecord {
        model: "tick/000".to_string(),
        version: "1".to_string(),
        halt: halt.map(<[u8]>::to_vec),
    };
    a.write(halt(Some(b"{}"))).await.unwrap();
    eventually("b saw the halt", || {
        seen.lock()
            .unwrap()
            .contains(&("tick/000/1".to_string(), true))
    })
    .await;
    // A replica that joins later reads the halt in force.
    let c = Fleet::connect(&config(&etcd, "t5")).await.unwrap();
    let late: Arc<Mutex<Vec<HaltRecord>>> = Arc::default();
    let log = Arc::clone(&late);
    c.follow(Box::new(move |records, _| {
        log.lock().unwrap().extend(records)
    }));
    eventually("c read the halt at start", || {
        !late.lock().unwrap().is_empty()
    })
    .await;
    a.write(halt(None)).await.unwrap();
    eventually("b saw the resume", || {
        seen.lock()
            .unwrap()
            .contains(&("tick/000/1".to_string(), false))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_reach_the_store_fences_itself_and_recovers() {
    let mut etcd = Etcd::start();
    let a = Fleet::connect(&config(&etcd, "t6")).await.unwrap();
    let epoch = a.membership().unwrap();
    etcd.kill(0);
    // It stops acting as a keeper within 3/4 of its 2 s lease.
    let started = Instant::now();
    while a.membership().is_ok() {
        assert!(started.elapsed() < Duration::from_secs(3), "still proven");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Fenced: it says its lease may have lapsed, and takes no sequence.
    assert!(
        matches!(a.membership(), Err(FleetError::Lapsed(_))),
        "{:?}",
        a.membership()
    );
    let start = a
        .start(&key("fenced"), "1", Duration::from_millis(100))
        .await;
    assert!(matches!(start, Err(FleetError::Lapsed(_))), "{start:?}");
    etcd.restart(0);
    etcd.wait_healthy();
    let started = Instant::now();
    while a.membership().is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never proven again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its lease ended while the store was away (it was down longer than
    // the TTL, or not): either way a proven membership is back, and the
    // epoch says whether what it kept is still its own.
    assert!(a.membership().unwrap() >= epoch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_etcd_losing_its_leader_loses_no_sequence() {
    let mut etcd = Etcd::cluster(3);
    let a = Fleet::connect(&config(&etcd, "t7")).await.unwrap();
    let b = Fleet::connect(&config(&etcd, "t7")).await.unwrap();
    let wait = Duration::from_secs(5);
    for i in 0..20 {
        a.start(&key(&i.to_string()), "1", wait).await.unwrap();
    }
    let leader = etcd.leader().expect("a leader");
    eprintln!("leader {leader}");
    etcd.kill(leader);
    eprintln!("killed");
    answer_wants(&a, b"moved");
    for i in 0..20 {
        let k = key(&i.to_string());
        let claimed = loop {
            // Retried as a client retries a retryable refusal.
            match b.claim(&k, "1", wait).await {
                Ok(claimed) => break claimed,
                Err(e) => {
                    eprintln!("claim {i}: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
            }
        };
        eprintln!("claimed {i} {claimed:?}");
        assert_eq!(claimed, Claimed::State(b"moved".to_vec()), "sequence {i}");
    }
}
