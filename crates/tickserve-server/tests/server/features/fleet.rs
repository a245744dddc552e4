//! Replicas as one fleet on a real etcd (Debian's etcd-server on loopback):
//! a sequence's ticks on any replica answer as one server would, a sequence
//! moves with its version, a start elsewhere ends the old copy, a drain
//! hands every sequence over, a killed replica's sequences are told lost
//! (naming no host or process), two ticks claiming at once both run, a
//! halt sent to one replica halts every replica and outlives restarts, and
//! a breaker tripped on one replica halts its version on every replica.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tickserve_core::config::{FleetConfig, ServerConfig};
use tickserve_testing::etcd::Etcd;

use super::risk;
use super::sequences::{body, post, prediction, tick};
use crate::support;

/// Posts `body` until it is not refused as "not run, retry it" (503), as a
/// client or a balancer retries; at most 10 s.
async fn post_retrying(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let started = Instant::now();
    loop {
        let (status, answer) = post(client, url, body).await;
        if status != 503 || started.elapsed() > Duration::from_secs(10) {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A repository with `seq_lstm_step` at `versions`, the newest `versions`
/// served side by side.
fn repository(versions: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let own = support::sample_toml("seq_lstm_step").unwrap();
    for version in 1..=versions {
        support::sample(dir.path(), "seq_lstm_step", "seq_lstm_step", version, None);
    }
    let toml = format!("version_policy = {{ latest = {versions} }}\n{own}");
    std::fs::write(dir.path().join("seq_lstm_step/model.toml"), toml).unwrap();
    dir
}

fn fleet_of(etcd: &Etcd, prefix: &str) -> FleetConfig {
    FleetConfig {
        endpoints: etcd.endpoints(),
        prefix: prefix.to_string(),
        lease: Duration::from_secs(1),
        handoff_wait: Duration::from_secs(2),
        ..FleetConfig::default()
    }
}

fn in_fleet(repository: &std::path::Path, etcd: &Etcd, prefix: &str) -> ServerConfig {
    let mut config = support::config(repository);
    config.fleet = Some(fleet_of(etcd, prefix));
    config.risk.control = tickserve_core::config::RiskControl::Open;
    config
}

fn infer(server: &tickserve_server::Server, version: Option<&str>) -> String {
    match version {
        Some(v) => format!(
            "http://{}/v2/models/seq_lstm_step/versions/{v}/infer",
            server.http_addr
        ),
        None => format!("http://{}/v2/models/seq_lstm_step/infer", server.http_addr),
    }
}

/// A configuration file for a replica of fleet `prefix` on `repository`
/// (written into it), for [`support::spawn_server`]: risk control open, halts
/// kept in the fleet's store only.
fn replica_file(repository: &std::path::Path, etcd: &Etcd, prefix: &str) -> std::path::PathBuf {
    let file = repository.join(format!("replica-{prefix}.toml"));
    std::fs::write(
        &file,
        format!(
            "[repository]\npath = \"{}\"\n[runtime]\nonnxruntime_library = \"{}\"\n\
             [risk]\ncontrol = \"open\"\nhalts_file = \"\"\n\
             [fleet]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\nlease = \"1s\"\n",
            repository.display(),
            support::root()
                .join(".local/lib/libonnxruntime.so.1.31.1")
                .display(),
            etcd.endpoints()[0],
        ),
    )
    .unwrap();
    file
}

/// `tickserve_model_halted` for `seq_lstm_step` version 1 in the metrics
/// of the server at `http` (`host:port`); `None` before it was ever set.
async fn halted_gauge(http: &str) -> Option<f64> {
    let text = support::metrics_text(&format!("http://{http}")).await;
    text.lines()
        .filter(|l| l.starts_with(tickserve_core::metrics::MODEL_HALTED))
        .filter(|l| l.contains("model=\"seq_lstm_step\"") && l.contains("version=\"1\""))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hand_sequences_over_asked_and_drained_and_a_killed_ones_are_lost() {
    let etcd = Etcd::start();
    let repository = repository(1);
    let config = in_fleet(repository.path(), &etcd, "handover");
    let (a, b) = (support::start(&config).await, support::start(&config).await);
    // The answers of one server that keeps every tick of the sequence.
    let single = support::start(&support::config(repository.path())).await;
    let http = reqwest::Client::new();
    let (a_url, b_url, single_url) = (infer(&a, None), infer(&b, None), infer(&single, None));
    // Ticks 0-3 on a; 4-7 on b, which asks a for the sequence (a lives);
    // 8-9 on a again, which asks b.
    for t in 0..10 {
        let url = if (4..8).contains(&t) { &b_url } else { &a_url };
        let one = body(json!("EURUSD"), t == 0, false, &tick(3, t));
        let (status, got) = post_retrying(&http, url, &one).await;
        assert_eq!(status, 200, "tick {t}: {got}");
        let (_, want) = post(&http, &single_url, &one).await;
        assert_eq!(prediction(&got), prediction(&want), "tick {t}");
    }
    // a drains: it hands the sequence over as it stops; b takes it.
    a.shutdown().await.unwrap();
    for t in 10..12 {
        let one = body(json!("EURUSD"), false, false, &tick(3, t));
        let (status, got) = post_retrying(&http, &b_url, &one).await;
        assert_eq!(status, 200, "tick {t}: {got}");
        let (_, want) = post(&http, &single_url, &one).await;
        assert_eq!(prediction(&got), prediction(&want), "tick {t}");
    }
    // A sequence never started anywhere is not active, as on one server.
    let (status, answer) = post(
        &http,
        &b_url,
        &body(json!("nowhere"), false, false, &tick(0, 0)),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        answer["error"].as_str().unwrap().contains("is not active"),
        "{answer}"
    );

    // A replica killed (SIGKILL) takes its sequences with it: once its lease
    // ends, their next tick elsewhere says the state is lost and how to
    // start again, naming no host, process or path.
    let killed = support::spawn_server(
        &replica_file(repository.path(), &etcd, "handover"),
        &support::root(),
    );
    let killed_url = format!("http://{}/v2/models/seq_lstm_step/infer", killed.http);
    let (status, _) = post(
        &http,
        &killed_url,
        &body(json!(77), true, false, &tick(1, 0)),
    )
    .await;
    assert_eq!(status, 200);
    drop(killed);
    let (status, answer) =
        post_retrying(&http, &b_url, &body(json!(77), false, false, &tick(1, 1))).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("sequence 77's state is lost")
            && message.contains("stopped without handing it over")
            && message.contains("sequence_start = true"),
        "{message}"
    );
    assert!(
        !message.contains(&std::process::id().to_string()) && !message.contains("replica-"),
        "names no process or host: {message}"
    );
    let (status, _) = post(&http, &b_url, &body(json!(77), false, false, &tick(1, 1))).await;
    assert_eq!(status, 400, "still lost until started again");
    let (status, _) = post(&http, &b_url, &body(json!(77), true, false, &tick(1, 0))).await;
    assert_eq!(status, 200, "started again");
    b.shutdown().await.unwrap();
    single.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_moves_with_its_version_when_two_are_served() {
    let etcd = Etcd::start();
    let repository = repository(2);
    let config = in_fleet(repository.path(), &etcd, "versions");
    let (a, b) = (support::start(&config).await, support::start(&config).await);
    let single = support::start(&support::config(repository.path())).await;
    let http = reqwest::Client::new();
    // Started on version 1 by name; every later tick names no version (the
    // default is 2): it stays on version 1 wherever it lands.
    let steps: [(&tickserve_server::Server, usize); 8] = [
        (&a, 0),
        (&a, 1),
        (&b, 2),
        (&b, 3),
        (&a, 4),
        (&b, 5),
        (&b, 6),
        (&a, 7),
    ];
    for (server, t) in steps {
        let version = (t == 0).then_some("1");
        let one = body(json!("v1-seq"), t == 0, false, &tick(5, t));
        let (status, got) = post_retrying(&http, &infer(server, version), &one).await;
        assert_eq!(status, 200, "tick {t}: {got}");
        assert_eq!(got["model_version"], "1", "tick {t}");
        let (_, want) = post(&http, &infer(&single, version), &one).await;
        assert_eq!(prediction(&got), prediction(&want), "tick {t}");
    }
    // a keeps it now; a drain hands it to b's version 1, not its default.
    a.shutdown().await.unwrap();
    let one = body(json!("v1-seq"), false, false, &tick(5, 8));
    let (status, got) = post_retrying(&http, &infer(&b, None), &one).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["model_version"], "1");
    let (_, want) = post(&http, &infer(&single, None), &one).await;
    assert_eq!(prediction(&got), prediction(&want));
    b.shutdown().await.unwrap();
    single.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_started_again_elsewhere_is_never_answered_from_the_old_copy() {
    let etcd = Etcd::start();
    let repository = repository(1);
    let config = in_fleet(repository.path(), &etcd, "restart");
    let (a, b) = (support::start(&config).await, support::start(&config).await);
    let single = support::start(&support::config(repository.path())).await;
    let http = reqwest::Client::new();
    // Ticks 0-3 on a; the client starts the sequence again on b (tick 4
    // with sequence_start); tick 5 lands on a again.
    for t in 0..6 {
        let server = if t == 4 { &b } else { &a };
        let one = body(json!(9), t == 0 || t == 4, false, &tick(7, t));
        let (status, got) = post_retrying(&http, &infer(server, None), &one).await;
        assert_eq!(status, 200, "tick {t}: {got}");
        let (_, want) = post(&http, &infer(&single, None), &one).await;
        assert_eq!(
            prediction(&got),
            prediction(&want),
            "tick {t}: answered from the state the client restarted"
        );
    }
    for server in [a, b, single] {
        server.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ticks_claiming_one_sequence_at_once_both_run_in_turn() {
    let etcd = Etcd::start();
    let repository = repository(1);
    let config = in_fleet(repository.path(), &etcd, "race");
    let (a, b) = (support::start(&config).await, support::start(&config).await);
    let http = reqwest::Client::new();
    let (status, _) = post(
        &http,
        &infer(&a, None),
        &body(json!("r"), true, false, &tick(2, 0)),
    )
    .await;
    assert_eq!(status, 200);
    let (one, two) = (
        body(json!("r"), false, false, &tick(2, 1)),
        body(json!("r"), false, false, &tick(2, 2)),
    );
    let b_url = infer(&b, None);
    let (first, second) = tokio::join!(post(&http, &b_url, &one), post(&http, &b_url, &two));
    assert_eq!((first.0, second.0), (200, 200), "{first:?} {second:?}");
    for server in [a, b] {
        server.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_sent_to_one_replica_halts_every_replica_and_outlives_restarts() {
    let etcd = Etcd::start();
    let repository = repository(1);
    let config = in_fleet(repository.path(), &etcd, "halts");
    let (a, b) = (support::start(&config).await, support::start(&config).await);
    // A replica in a process of its own: its metrics are its own.
    let d = support::spawn_server(
        &replica_file(repository.path(), &etcd, "halts"),
        &support::root(),
    );
    let http = reqwest::Client::new();
    let halt = format!(
        "http://{}/v2/models/seq_lstm_step/versions/1/halt",
        a.http_addr
    );
    let (status, answer) = post(&http, &halt, &json!({"reason": "desk halt"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["kept"], true, "{answer}");
    // The answer came once every replica applied it: b refuses at once,
    // and d's gauge says halted.
    assert_eq!(answer["fleet"]["replicas"], 3, "{answer}");
    assert_eq!(answer["fleet"]["applied"], 3, "{answer}");
    assert_eq!(halted_gauge(&d.http).await, Some(1.0));
    let one = body(json!(1), true, false, &tick(1, 0));
    let (status, refused) = post(&http, &infer(&b, None), &one).await;
    assert_eq!(status, 423, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("halted"),
        "{refused}"
    );
    // A replica that starts now reads the halt before it serves.
    let c = support::start(&config).await;
    let (status, answer) = post(&http, &infer(&c, None), &one).await;
    assert!(
        status != 200 && answer["error"].as_str().unwrap().contains("halted"),
        "{answer}"
    );
    // Resumed through c: a serves again.
    let resume = format!(
        "http://{}/v2/models/seq_lstm_step/versions/1/resume",
        c.http_addr
    );
    assert_eq!(post(&http, &resume, &json!({})).await.0, 200);
    let started = Instant::now();
    while post(&http, &infer(&a, None), &one).await.0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a still refuses"
        );
    }
    while halted_gauge(&d.http).await != Some(0.0) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "d's gauge still says halted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for server in [a, b, c] {
        server.shutdown().await.unwrap();
    }
}

/// A halt a live replica has not applied within the lease's TTL is
/// answered as not kept, saying how many replicas applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_a_live_replica_has_not_applied_is_answered_as_not_kept() {
    let etcd = Etcd::start();
    let repository = repository(1);
    let a = support::start(&in_fleet(repository.path(), &etcd, "partial")).await;
    // A member whose lease lives but which never follows the halts.
    let granted = etcd.ctl(&["lease", "grant", "60"]);
    let lease = granted.split_whitespace().nth(1).unwrap();
    etcd.ctl(&["put", "--lease", lease, "partial/members/ghost", "ghost"]);
    let halt = format!(
        "http://{}/v2/models/seq_lstm_step/versions/1/halt",
        a.http_addr
    );
    let (status, answer) = post(&reqwest::Client::new(), &halt, &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["kept"], false, "{answer}");
    assert_eq!(answer["fleet"]["replicas"], 2, "{answer}");
    assert_eq!(answer["fleet"]["applied"], 1, "{answer}");
    a.shutdown().await.unwrap();
}

/// A breaker tripped on one replica halts its version on every replica,
/// and the replica where it tripped journals the halt, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_tripped_on_one_replica_halts_every_replica_and_is_journaled() {
    let etcd = Etcd::start();
    let repository = tempfile::tempdir().unwrap();
    support::sample(
        repository.path(),
        "alpha_mlp",
        "guarded",
        1,
        Some(
            "[[guard]]\noutput = \"probabilities\"\nmax = 0.9\n[breaker]\ntrips = 1\nwindow = \"1m\"\n",
        ),
    );
    let journal = tempfile::tempdir().unwrap();
    let mut config = super::journal::journaled(repository.path(), journal.path());
    config.fleet = Some(fleet_of(&etcd, "breakers"));
    let a = support::start(&config).await;
    let b = support::start(&in_fleet(repository.path(), &etcd, "breakers")).await;
    let http = reqwest::Client::new();
    let url = |server: &tickserve_server::Server| {
        format!("http://{}/v2/models/guarded/infer", server.http_addr)
    };
    let (good, tripping) = (risk::body(0.0), risk::body(-5.0));
    assert_eq!(post(&http, &url(&b), &good).await.0, 200);

    // One trip on a halts the version there at once, then on b.
    assert_eq!(post(&http, &url(&a), &tripping).await.0, 422);
    let (status, answer) = post(&http, &url(&a), &good).await;
    assert_eq!(status, 423, "{answer}");
    let started = Instant::now();
    let answer = loop {
        let (status, answer) = post(&http, &url(&b), &good).await;
        if status == 423 {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b still answers ({status}): {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("is halted: by its breaker"),
        "{answer}"
    );

    super::journal::flush(&a).await;
    let halts: Vec<_> = super::journal::records(journal.path())
        .into_iter()
        .filter(|(status, _, _)| status == "halted")
        .collect();
    // The halt itself (over `breaker`) and the refused request after it.
    assert_eq!(halts.len(), 2, "{halts:?}");
    assert_eq!(halts[0].1, "breaker", "{halts:?}");
    assert!(
        halts[0]
            .2
            .as_deref()
            .unwrap()
            .contains("1 guard trips within 1m"),
        "{halts:?}"
    );
    for server in [a, b] {
        server.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_gone_stateless_requests_and_halts_hold_and_ticks_are_refused_then_recover() {
    let mut etcd = Etcd::start();
    let repository = repository(1);
    support::sample(repository.path(), "alpha_mlp", "alpha", 1, None);
    support::sample(repository.path(), "tick_000", "tick", 1, None);
    let config = in_fleet(repository.path(), &etcd, "outage");
    let a = support::start(&config).await;
    let http = reqwest::Client::new();
    let alpha = |server: &tickserve_server::Server| {
        format!("http://{}/v2/models/alpha/infer", server.http_addr)
    };
    let row = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50],
                                 "data": vec![0.1; 50]}]});
    let (status, _) = post(
        &http,
        &infer(&a, None),
        &body(json!("s"), true, false, &tick(4, 0)),
    )
    .await;
    assert_eq!(status, 200);
    let halt = format!("http://{}/v2/models/alpha/versions/1/halt", a.http_addr);
    assert_eq!(post(&http, &halt, &json!({})).await.0, 200);
    etcd.kill(0);
    // Within the lease the sequence is still served; past 3/4 of it, refused
    // as not run, naming the store. Stateless requests never wait on etcd,
    // and the halt stays in force.
    let started = Instant::now();
    let mut t = 1;
    let refused = loop {
        let (status, answer) = post(
            &http,
            &infer(&a, None),
            &body(json!("s"), false, false, &tick(4, t)),
        )
        .await;
        if status != 200 {
            break (status, answer);
        }
        t += 1;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still answered without etcd"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.0, 503, "{:?}", refused.1);
    let message = refused.1["error"].as_str().unwrap().to_string();
    assert!(
        message.contains("cannot reach the fleet's store") && message.contains("retry it"),
        "{message}"
    );
    let start = body(json!("new"), true, false, &tick(5, 0));
    assert_eq!(
        post(&http, &infer(&a, None), &start).await.0,
        503,
        "a start needs the store"
    );
    let stateless = Instant::now();
    let (status, answer) = post(&http, &alpha(&a), &row).await;
    assert_eq!(status, 423, "the halt stays in force: {answer}");
    let features = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                      "data": vec![0.1; 16]}]});
    let (status, answer) = post(
        &http,
        &format!("http://{}/v2/models/tick/infer", a.http_addr),
        &features,
    )
    .await;
    assert_eq!(
        status, 200,
        "a stateless model serves without etcd: {answer}"
    );
    assert!(
        stateless.elapsed() < Duration::from_secs(1),
        "stateless requests waited on etcd"
    );
    // etcd returns: the replica proves its lease again (or joins again), and
    // sequences work; the old one answers or is told lost, never restarted.
    etcd.restart(0);
    etcd.wait_healthy();
    let started = Instant::now();
    loop {
        let (status, answer) = post(
            &http,
            &infer(&a, None),
            &body(json!("after"), true, false, &tick(7, 0)),
        )
        .await;
        if status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no recovery: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, answer) = post(
        &http,
        &infer(&a, None),
        &body(json!("s"), false, false, &tick(4, t)),
    )
    .await;
    assert!(
        status == 200
            || answer["error"]
                .as_str()
                .unwrap_or_default()
                .contains("state is lost"),
        "{status} {answer}"
    );
    a.shutdown().await.unwrap();
}
