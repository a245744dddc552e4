//! The shared-memory front end against a real server, through the Rust
//! client (`tickserve-client`): answers equal gRPC's for the same rows,
//! bad input gets the other front ends' error kinds (and a good request
//! after it is served), the metrics say `protocol="shm"`, and request
//! parameters (sequences, priority, timeout) ride in the parameter block. (Every sample
//! model against onnxruntime through the Python client:
//! `tests/python/shm_check.py`.)

use crate::support;

use tickserve_client::{ClientError, GrpcClient, ParamValue, Parameter, ShmClient, Tensor};

/// A server on the sample repository with `[shm]` on, under a service name
/// of this test's own (tests run at once).
async fn server(name: &str) -> (tickserve_server::Server, String) {
    server_with(name, |_| {}).await
}

/// [`server`], its configuration adjusted first.
async fn server_with(
    name: &str,
    adjust: impl FnOnce(&mut tickserve_core::config::ServerConfig),
) -> (tickserve_server::Server, String) {
    let mut config = support::config(&support::root().join("config/models"));
    let service = format!("tickserve-test-{}-{name}", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    adjust(&mut config);
    (support::start(&config).await, service)
}

fn alpha_row(seed: f32) -> Tensor {
    let values: Vec<f32> = (0..50).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
    Tensor::from_f32("features", &[1, 50], &values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_answers_equal_grpc() {
    if support::alone(module_path!(), "shared_memory_answers_equal_grpc") {
        return;
    }
    let (server, service) = server("equal").await;
    let grpc = GrpcClient::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let answers = tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        (0..20)
            .map(|i| client.infer("alpha_mlp", &[alpha_row(i as f32)]).unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (i, answer) in answers.iter().enumerate() {
        let expected = grpc
            .infer("alpha_mlp", &[alpha_row(i as f32)])
            .await
            .unwrap();
        assert_eq!(answer, &expected, "row {i}");
        assert_eq!(answer[0].name, "probabilities");
        assert_eq!(answer[0].shape, vec![1, 3]);
    }
    let metrics = support::metrics_text(&format!("http://{}", server.http_addr)).await;
    // Other tests of this binary count in the same process-wide metrics: at least these 20.
    let served: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"tickserve_requests_total{model="alpha_mlp",protocol="shm",code="ok"} "#,
            )
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(served >= 20.0, "{metrics}");
    server.shutdown().await.unwrap();
}

/// The clients the front end takes at once (`shm::MAX_CLIENTS` in the server).
const MAX_CLIENTS: usize = 32;

/// As many clients as the front end takes, each a node of its own with its
/// own notifier (as every `ShmClient` is), connect at once and are each
/// served; one more is refused when it connects, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_up_to_the_limit_is_served_and_one_more_is_refused() {
    if support::alone(
        module_path!(),
        "every_client_up_to_the_limit_is_served_and_one_more_is_refused",
    ) {
        return;
    }
    let (_server, service) = server("many").await;
    let (answers, refused) = tokio::task::spawn_blocking(move || {
        let mut clients: Vec<ShmClient> = (0..MAX_CLIENTS)
            .map(|i| ShmClient::connect_to(&service).unwrap_or_else(|e| panic!("client {i}: {e}")))
            .collect();
        let refused = ShmClient::connect_to(&service).err();
        let answers: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, client)| {
                client
                    .infer("alpha_mlp", &[alpha_row(i as f32)])
                    .unwrap_or_else(|e| panic!("client {i}: {e}"))
            })
            .collect();
        (answers, refused)
    })
    .await
    .unwrap();
    assert_eq!(answers.len(), MAX_CLIENTS);
    assert!(answers.iter().all(|a| a[0].shape == vec![1, 3]));
    let refused = refused.expect("a client past the limit is refused");
    assert!(
        matches!(&refused, ClientError::Disconnected(m) if m.contains("takes no more clients")),
        "{refused}"
    );
}

/// An answer larger than `shm.max_answer_bytes` is refused, naming the
/// model and the limit; a small answer after it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_answer_limit_is_refused_by_name() {
    let (_server, service) = server_with("answers", |c| c.shm.max_answer_bytes = 4096).await;
    tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        // 400 rows of 3 probabilities: 4,800 bytes of data alone.
        let rows = Tensor::from_f32("features", &[400, 50], &vec![0.5; 400 * 50]);
        match client.infer("alpha_mlp", &[rows]) {
            Err(ClientError::Server { code, message }) => {
                assert_eq!(code, "INVALID_ARGUMENT", "{message}");
                assert!(
                    message.contains("alpha_mlp")
                        && message.contains("at most 4096")
                        && message.contains("shm.max_answer_bytes"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let answer = client.infer("alpha_mlp", &[alpha_row(1.0)]).unwrap();
        assert_eq!(answer[0].shape, vec![1, 3]);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_same_error_kinds_and_harms_nothing() {
    let (server, service) = server("errors").await;
    tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        let code = |result: Result<Vec<Tensor>, ClientError>| match result {
            Err(ClientError::Server { code, message }) => (code, message),
            other => panic!("{other:?}"),
        };
        let (c, m) = code(client.infer("no_such_model", &[alpha_row(0.0)]));
        assert_eq!(c, "NOT_FOUND", "{m}");
        let mut wrong_name = alpha_row(0.0);
        wrong_name.name = "x".into();
        let (c, m) = code(client.infer("alpha_mlp", &[wrong_name]));
        assert_eq!(c, "INVALID_ARGUMENT");
        assert!(m.contains("alpha_mlp") && m.contains("'x'"), "{m}");
        let short = Tensor::from_f32("features", &[1, 50], &[0.0; 49]);
        let (c, m) = code(client.infer("alpha_mlp", &[short]));
        assert_eq!(c, "INVALID_ARGUMENT", "{m}");
        let mut nan = alpha_row(0.0);
        nan.data[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        let (c, m) = code(client.infer("alpha_mlp", &[nan]));
        assert_eq!(c, "INVALID_ARGUMENT", "{m}");
        let too_many = Tensor::from_f32("features", &[100_000, 50], &vec![0.0; 5_000_000]);
        let (c, m) = code(client.infer("alpha_mlp", &[too_many]));
        assert_eq!(c, "PAYLOAD_TOO_LARGE", "{m}");
        // And a good request after all of them.
        let answer = client.infer("alpha_mlp", &[alpha_row(1.0)]).unwrap();
        assert_eq!(answer[0].shape, vec![1, 3]);
    })
    .await
    .unwrap();
    server.shutdown().await.unwrap();
}

/// The Python client on every sample model against onnxruntime, the bad-input
/// cases, and a client killed mid-request (`tests/python/shm_check.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_matches_onnxruntime_and_survives_a_killed_client() {
    let (server, service) = server("python").await;
    let repository = support::root().join("config/models");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--service".as_ref(),
        service.as_ref(),
        "--repository".as_ref(),
        repository.as_os_str(),
    ];
    support::run_python_check(&server, "shm_check.py", &args, "done").await;
    server.shutdown().await.unwrap();
}

/// A client that outlives its server: after a restart under the same
/// service, its next call is served (its cached handle is refused as stale
/// and looked up again, or the connection is opened anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_goes_on_after_the_server_restarts() {
    let mut config = support::config(&support::root().join("config/models"));
    let service = format!("tickserve-test-{}-restart", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    let server = support::start(&config).await;
    let mut client = tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        client.infer("tick_003", &[tick_row()]).unwrap();
        client.infer("alpha_mlp", &[alpha_row(0.0)]).unwrap();
        client
    })
    .await
    .unwrap();
    let before = tokio::task::spawn_blocking(move || {
        let answer = client.infer("alpha_mlp", &[alpha_row(2.0)]).unwrap();
        (client, answer)
    })
    .await
    .unwrap();
    client = before.0;
    server.shutdown().await.unwrap();

    let server = support::start(&config).await;
    let after = tokio::task::spawn_blocking(move || {
        // The new server gives out handles anew: alpha_mlp may not be its
        // first. At most one call fails while the client reconnects.
        let mut last = None;
        for _ in 0..3 {
            match client.infer("alpha_mlp", &[alpha_row(2.0)]) {
                Ok(answer) => return answer,
                Err(e) => last = Some(e),
            }
        }
        panic!("the client did not recover: {last:?}");
    })
    .await
    .unwrap();
    assert_eq!(after, before.1, "another model answered after the restart");
    server.shutdown().await.unwrap();
}

fn tick_row() -> Tensor {
    Tensor::from_f32("features", &[1, 16], &[0.5; 16])
}

/// One tick of `seq_lstm_step`: 8 features.
fn step_tick(t: usize) -> Vec<f32> {
    (0..8).map(|i| ((t * 8 + i) as f32 * 0.21).sin()).collect()
}

/// The same ticks of one sequence over shared memory (with its parameters
/// in the block) and over HTTP give the same answers: the server kept the
/// sequence's state between shared-memory requests. `priority` rides along;
/// a parameter of the wrong type is INVALID_ARGUMENT naming it; of a
/// parameter given twice, the last counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_and_priority_parameters_ride_in_the_parameter_block() {
    let (server, service) = server("parameters").await;
    let base = format!("http://{}", server.http_addr);
    let over_shm = tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        let answers: Vec<Vec<Tensor>> = (0..5)
            .map(|t| {
                let parameters = [
                    Parameter {
                        name: "sequence_id",
                        value: ParamValue::Str("AAPL"),
                    },
                    Parameter {
                        name: "sequence_start",
                        value: ParamValue::Bool(t == 0),
                    },
                    Parameter {
                        name: "priority",
                        value: ParamValue::Uint(1),
                    },
                    Parameter {
                        name: "timeout",
                        value: ParamValue::Int(0),
                    },
                ];
                let tick = Tensor::from_f32("tick", &[1, 8], &step_tick(t));
                client
                    .infer_with("seq_lstm_step", &[tick], &parameters)
                    .unwrap()
            })
            .collect();
        // Without sequence parameters a stateful model refuses, naming them.
        let tick = Tensor::from_f32("tick", &[1, 8], &step_tick(0));
        let refused = client.infer("seq_lstm_step", std::slice::from_ref(&tick));
        let Err(ClientError::Server { code, message }) = refused else {
            panic!("{refused:?}");
        };
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(message.contains("sequence_id"), "{message}");
        for (name, value, words) in [
            (
                "sequence_id",
                ParamValue::Double(1.5),
                "parameter sequence_id must be",
            ),
            (
                "priority",
                ParamValue::Str("high"),
                "parameter priority must be",
            ),
            ("timeout", ParamValue::Int(-1), "parameter timeout must be"),
        ] {
            let refused = client.infer_with(
                "seq_lstm_step",
                std::slice::from_ref(&tick),
                &[Parameter { name, value }],
            );
            let Err(ClientError::Server { code, message }) = refused else {
                panic!("{name}: {refused:?}");
            };
            assert_eq!(code, "INVALID_ARGUMENT", "{name}: {message}");
            assert!(message.contains(words), "{name}: {message}");
        }
        // A parameter given twice: the last counts, as over HTTP and gRPC.
        let twice = [
            Parameter {
                name: "sequence_id",
                value: ParamValue::Str("AAPL"),
            },
            Parameter {
                name: "priority",
                value: ParamValue::Uint(1),
            },
            Parameter {
                name: "priority",
                value: ParamValue::Str("high"),
            },
        ];
        let refused = client.infer_with("seq_lstm_step", std::slice::from_ref(&tick), &twice);
        let Err(ClientError::Server { code, message }) = refused else {
            panic!("the first of two priorities counted: {refused:?}");
        };
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(message.contains("parameter priority must be"), "{message}");
        answers
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    for (t, answer) in over_shm.iter().enumerate() {
        let body = serde_json::json!({
            "inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8], "data": step_tick(t)}],
            "parameters": {"sequence_id": "MSFT", "sequence_start": t == 0},
        });
        let reply: serde_json::Value = http
            .post(format!("{base}/v2/models/seq_lstm_step/infer"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let expected: Vec<f32> = reply["outputs"][0]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let output = answer
            .iter()
            .find(|o| o.name == reply["outputs"][0]["name"])
            .unwrap();
        let got = output.to_f32().unwrap();
        assert_eq!(got.len(), expected.len(), "tick {t}");
        for (g, e) in got.iter().zip(&expected) {
            assert!(
                (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                "tick {t}: {got:?} vs {expected:?}"
            );
        }
    }
    server.shutdown().await.unwrap();
}

/// The header's `timeout_us` is the request's deadline: 1 µs runs out
/// before the request is computed, and the server says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_in_the_header_is_kept() {
    let (server, service) = server("deadline").await;
    tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        client.set_deadline(Some(std::time::Duration::from_micros(1)));
        let refused = client.infer("alpha_mlp", &[alpha_row(0.0)]);
        let Err(ClientError::Server { code, message }) = refused else {
            panic!("a 1 µs deadline was not kept: {refused:?}");
        };
        assert_eq!(code, "DEADLINE_EXCEEDED", "{message}");
        assert!(message.contains("alpha_mlp"), "{message}");
        client.set_deadline(None);
        client.infer("alpha_mlp", &[alpha_row(0.0)]).unwrap();
    })
    .await
    .unwrap();
    server.shutdown().await.unwrap();
}

/// Eight sequences of `seq_lstm_step`, three ticks each, every tick of the
/// eight sent at once by eight clients while the front-end thread is held
/// (so that they wait together in one round), over a server with
/// `shm.gather` as given: each sequence's answers in tick order, and the
/// model's runs and requests.
async fn eight_sequences_at_once(gather: bool) -> (Vec<Vec<Vec<f32>>>, u64, u64) {
    let name = if gather { "gather-on" } else { "gather-off" };
    let (server, service) = server_with(name, |c| c.shm.gather = gather).await;
    const SEQUENCES: usize = 8;
    const TICKS: usize = 3;
    let start = std::sync::Arc::new(std::sync::Barrier::new(SEQUENCES + 1));
    let clients: Vec<_> = (0..SEQUENCES)
        .map(|s| {
            let (service, start) = (service.clone(), std::sync::Arc::clone(&start));
            std::thread::spawn(move || {
                let mut client = ShmClient::connect_to(&service).unwrap();
                (0..TICKS)
                    .map(|t| {
                        start.wait();
                        let parameters = [
                            Parameter {
                                name: "sequence_id",
                                value: ParamValue::Uint(s as u64 + 1),
                            },
                            Parameter {
                                name: "sequence_start",
                                value: ParamValue::Bool(t == 0),
                            },
                        ];
                        let tick = Tensor::from_f32("tick", &[1, 8], &step_tick(s * TICKS + t));
                        let answer = client
                            .infer_with("seq_lstm_step", &[tick], &parameters)
                            .unwrap();
                        answer[0].to_f32().unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for _ in 0..TICKS {
        // Every client is about to send: the thread waits while they do.
        tickserve_server::faults::stall_next_shm_round(std::time::Duration::from_millis(300));
        let start = std::sync::Arc::clone(&start);
        tokio::task::spawn_blocking(move || start.wait())
            .await
            .unwrap();
    }
    let mut answers = Vec::new();
    for client in clients {
        answers.push(
            tokio::task::spawn_blocking(move || client.join().unwrap())
                .await
                .unwrap(),
        );
    }
    let stats = server
        .edge()
        .runtime
        .model("seq_lstm_step", None)
        .unwrap()
        .stats
        .snapshot();
    server.shutdown().await.unwrap();
    (answers, stats.execution_count, stats.inference_count)
}

/// The rows of a round's requests of one model run together on the
/// front-end thread (`shm.gather`, on by default): eight sequences' ticks
/// that wait together run in fewer runs than requests, and each sequence's
/// answers, tick after tick, are what the same ticks give run one request
/// a run (`shm.gather = false`), within 1e-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_rows_of_several_sequences_run_together_and_answer_as_alone() {
    if support::alone(
        module_path!(),
        "a_rounds_rows_of_several_sequences_run_together_and_answer_as_alone",
    ) {
        return;
    }
    let (together, runs, requests) = eight_sequences_at_once(true).await;
    assert_eq!(requests, 24);
    assert!(
        runs < requests,
        "{runs} runs for {requests} requests: the round's rows did not meet"
    );
    let (alone, runs, requests) = eight_sequences_at_once(false).await;
    assert_eq!(
        (runs, requests),
        (24, 24),
        "one run a request without gathering"
    );
    for (s, (got, want)) in together.iter().zip(&alone).enumerate() {
        for (t, (got, want)) in got.iter().zip(want).enumerate() {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "sequence {s} tick {t}: {g} gathered, {w} alone"
                );
            }
        }
    }
}

/// The first CPU this process may run on (`Cpus_allowed_list`).
fn first_allowed_cpu() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    let first = list.trim().split([',', '-']).next().unwrap();
    first.parse().unwrap()
}

/// This process's thread named `name`: its `/proc/self/task/TID` folder.
fn thread_named(name: &str) -> std::path::PathBuf {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|task| {
            std::fs::read_to_string(task.join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
        .unwrap_or_else(|| panic!("no thread named {name}"))
}

/// The scheduler state of a thread (`R` running or runnable, `S` asleep).
fn state(task: &std::path::Path) -> char {
    let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
    // The state follows the command name's closing parenthesis.
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// The latency mode (`[latency] cores`): the front-end thread is pinned to
/// its core and never sleeps, idle or not (every look at it finds it
/// running), answers as usual, and with `latency.warm` runs its last model
/// again while idle (counted apart from requests). Without it, the same
/// thread sleeps once idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latency_mode_pins_its_front_end_thread_which_never_sleeps_and_stays_warm() {
    if support::alone(
        module_path!(),
        "the_latency_mode_pins_its_front_end_thread_which_never_sleeps_and_stays_warm",
    ) {
        return;
    }
    let cpu = first_allowed_cpu();
    // Looks every 5 ms: 40 of them (200 ms) for the thread that must never
    // sleep; for the thread that must, until it is seen asleep, at most 400
    // (2 s: on a loaded machine it may be runnable, waiting for a core, when
    // looked at, or cleaning up after clients of other tests).
    let looks = |task: std::path::PathBuf, latency: bool| async move {
        let mut states = String::new();
        for _ in 0..(if latency { 40 } else { 400 }) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            states.push(state(&task));
            if !latency && states.ends_with('S') {
                break;
            }
        }
        states
    };
    for latency in [false, true] {
        let (server, service) = server_with(&format!("latency-{latency}"), |config| {
            if latency {
                config.latency.cores = vec![cpu];
                config.latency.warm = std::time::Duration::from_millis(1);
            }
        })
        .await;
        let answers = tokio::task::spawn_blocking(move || {
            let mut client = ShmClient::connect_to(&service).unwrap();
            client.set_spin(std::time::Duration::MAX);
            (0..20)
                .map(|i| client.infer("alpha_mlp", &[alpha_row(i as f32)]).unwrap())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        assert_eq!(answers.len(), 20);
        assert_eq!(answers[0][0].shape, vec![1, 3]);
        let task = thread_named("shm-0");
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        let states = looks(task, latency).await;
        let base = format!("http://{}", server.http_addr);
        let warm_runs = support::counter_total(
            &support::metrics_text(&base).await,
            tickserve_core::metrics::SHM_WARM_RUNS,
        );
        if latency {
            assert_eq!(allowed, cpu.to_string(), "the thread is not pinned");
            assert!(
                states.chars().all(|s| s == 'R'),
                "the latency mode's front-end thread slept: {states}"
            );
            assert!(warm_runs >= 1.0, "no warm run while idle: {warm_runs}");
        } else {
            assert!(
                states.contains('S'),
                "an idle front-end thread never slept: {states}"
            );
            assert_eq!(warm_runs, 0.0, "a warm run without latency.warm");
        }
        server.shutdown().await.unwrap();
    }
}

/// A latency core this process may not run on stops the start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latency_core_the_process_may_not_use_stops_the_start() {
    let mut config = support::config(&support::root().join("config/models"));
    config.latency.cores = vec![1 << 20];
    let error = tickserve_server::Server::start(&config)
        .await
        .err()
        .expect("the start went on");
    assert!(
        error
            .to_string()
            .contains("latency.cores names core 1048576"),
        "{error}"
    );
}
