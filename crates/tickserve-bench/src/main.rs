//! `tickserve-bench`: the per-tick benchmark. N instances, each its own
//! stream of ticks (a sequence of a stateful or windowed model, or a stream
//! of rows of a stateless one), one tick a request, over shared memory or
//! gRPC. Closed loop by default (each instance sends its next tick when the
//! last is answered); with `--interval`, open loop: tick t of every instance
//! is due at t × interval after the start, and its latency counts from when
//! it was due (a late tick's wait included, so a slow answer cannot hide the
//! ones it delayed). The shared-memory front end takes 32 clients: past 32
//! instances, a client thread drives several instances in turn (tick t of
//! each, then tick t + 1). It reports end-to-end latency (taken before the
//! request is written and after the answer is read, as STAC-ML takes it) as
//! median, p99, p99.9, max and max/median, the throughput, the server's own
//! compute time for the same requests (from each shared-memory answer's
//! header; gRPC answers carry none), and the largest difference from ONNX
//! Runtime run here on the same ticks, carrying each instance's state
//! itself, and that reference's own time per tick (ONNX Runtime called
//! directly: the floor). Warm-up ticks are sent first and not counted.
//!
//!     tickserve-bench --repository DIR --model bench_lstm --instances 1 --ticks 10000
//!     tickserve-bench --repository DIR --model bench_lstm --transport grpc --grpc http://127.0.0.1:8001
//!     tickserve-bench --repository DIR --model bench_lstm --interval 100ms --ticks 200
//!
//! One table, and one JSON line (`--json`: the line only).

#![allow(clippy::disallowed_methods)] // a benchmark measures the machine's time

mod reference;
mod stats;
mod workload;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use tickserve_client::{BlockingGrpcClient, ParamValue, Parameter, ShmClient, Tensor};

use crate::reference::Reference;
use crate::stats::Percentiles;
use crate::workload::{Memory, Workload};

/// The per-tick benchmark over shared memory.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The model repository the server serves (the harness reads the model
    /// and its `model.toml` from it, for the reference).
    #[arg(long)]
    repository: PathBuf,
    /// The model.
    #[arg(long)]
    model: String,
    /// Instances, each its own stream of ticks on its own thread.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Ticks each instance sends and counts.
    #[arg(long, default_value_t = 10_000)]
    ticks: usize,
    /// Ticks each instance sends first, not counted.
    #[arg(long, default_value_t = 1000)]
    warmup: usize,
    /// The server's shared-memory service (`shm.service`).
    #[arg(long, default_value = "tickserve")]
    service: String,
    /// How the ticks travel: `shm` (shared memory) or `grpc`.
    #[arg(long, value_enum, default_value = "shm")]
    transport: Transport,
    /// The server's gRPC address, for `--transport grpc`.
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    grpc: String,
    /// Open loop: every instance's next counted tick is due this long after
    /// its last was due (`10ms`, `1s`); closed loop without it. Instance i
    /// of N ticks i/N of an interval after instance 0 (instruments tick at
    /// their own phases), unless `--aligned`.
    #[arg(long, value_parser = humantime::parse_duration)]
    interval: Option<Duration>,
    /// Open loop: every instance's tick falls due at the same instant (a
    /// burst of N ticks each interval) instead of at phases spread over it.
    #[arg(long)]
    aligned: bool,
    /// The ONNX Runtime library for the reference.
    #[arg(
        long,
        env = "TICKSERVE_ONNXRUNTIME_LIBRARY",
        default_value = ".local/lib/libonnxruntime.so.1.31.1"
    )]
    onnxruntime_library: PathBuf,
    /// Print only the JSON line.
    #[arg(long)]
    json: bool,
    /// How long a shared-memory client polls for its answer before it
    /// yields its core between polls (`20us`, the client's default; `0s`
    /// when the instances' threads outnumber the cores they run on).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20us")]
    client_spin: Duration,
    /// How an open-loop instance waits for its next tick's due time:
    /// `sleep` (the OS wakes it, some microseconds late, and the lateness
    /// counts), or `spin` (it polls the clock on its core, as a client of the
    /// latency mode does).
    #[arg(long, value_enum, default_value = "sleep")]
    client_wait: Wait,
}

/// How a client waits for a tick's due time (`--client-wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Wait {
    /// `std::thread::sleep`.
    Sleep,
    /// Poll the clock.
    Spin,
}

/// How the ticks travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Transport {
    /// Shared memory (the server's `[shm]`).
    Shm,
    /// gRPC (the v2 inference protocol).
    Grpc,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Grpc => "grpc",
        }
    }
}

/// One client thread's connection.
enum Connection {
    Shm(Box<ShmClient>),
    Grpc(Box<BlockingGrpcClient>),
}

impl Connection {
    fn open(args: &Settings) -> Result<Connection, String> {
        match args.transport {
            Transport::Shm => ShmClient::connect_to(&args.service)
                .map(|mut c| {
                    c.set_spin(args.client_spin);
                    Connection::Shm(Box::new(c))
                })
                .map_err(|e| e.to_string()),
            Transport::Grpc => BlockingGrpcClient::connect(&args.grpc)
                .map(|c| Connection::Grpc(Box::new(c)))
                .map_err(|e| e.to_string()),
        }
    }

    /// Sends one tick; its outputs, and the server's compute time when the
    /// answer says it.
    fn infer(
        &mut self,
        model: &str,
        tick: Tensor,
        params: &[Parameter<'_>],
    ) -> Result<(Vec<Tensor>, Option<Duration>), String> {
        match self {
            Connection::Shm(client) => {
                let outputs = client
                    .infer_with(model, &[tick], params)
                    .map_err(|e| e.to_string())?;
                Ok((outputs, client.last_timing().map(|(_, c)| c)))
            }
            Connection::Grpc(client) => client
                .infer_with(model, &[tick], params)
                .map(|outputs| (outputs, None))
                .map_err(|e| e.to_string()),
        }
    }
}

/// What every client thread runs with.
#[derive(Debug, Clone)]
struct Settings {
    transport: Transport,
    service: String,
    grpc: String,
    warmup: usize,
    ticks: usize,
    interval: Option<Duration>,
    /// Every instance's phase in the interval: `i / phases` of it (1: aligned).
    phases: u32,
    client_spin: Duration,
    client_wait: Wait,
}

/// What one instance measured.
struct Measured {
    /// End-to-end time of each counted tick.
    latency: Vec<Duration>,
    /// The server's compute time of each counted tick.
    compute: Vec<Duration>,
    /// Every tick's answer (the first output's first value), warm-up included.
    answers: Vec<f32>,
}

fn main() -> std::process::ExitCode {
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tickserve-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let workload = Arc::new(Workload::read(&args.repository, &args.model)?);
    let instances = args.instances.max(1);
    let clients = instances.min(MAX_CLIENTS);
    let start = Arc::new(Barrier::new(clients + 1));
    let settings = Settings {
        transport: args.transport,
        service: args.service.clone(),
        grpc: args.grpc.clone(),
        warmup: args.warmup,
        ticks: args.ticks,
        interval: args.interval,
        phases: if args.aligned {
            1
        } else {
            u32::try_from(instances).unwrap_or(u32::MAX)
        },
        client_spin: args.client_spin,
        client_wait: args.client_wait,
    };
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (workload, start) = (Arc::clone(&workload), Arc::clone(&start));
            let settings = settings.clone();
            let mine: Vec<usize> = (c..instances).step_by(clients).collect();
            std::thread::spawn(move || client(&workload, &settings, &mine, &start))
        })
        .collect();
    start.wait();
    let began = Instant::now();
    let mut measured: Vec<(usize, Measured)> = Vec::with_capacity(instances);
    for thread in threads {
        measured.extend(thread.join().map_err(|_| "a client thread panicked")??);
    }
    let elapsed = began.elapsed();

    // The reference, after the run (so it takes no core from it); its own
    // time per counted tick is the floor: ONNX Runtime called directly.
    let mut worst = 0.0f64;
    let mut direct = Vec::new();
    for (i, m) in &measured {
        let i = *i;
        let mut reference = Reference::new(&args.onnxruntime_library, &workload)?;
        for (t, answer) in m.answers.iter().enumerate() {
            let tick = workload.tick(i, t);
            let started = Instant::now();
            let want = reference.step(&tick)?;
            if t >= args.warmup {
                direct.push(started.elapsed());
            }
            let difference = f64::from((answer - want).abs()) / f64::from(want.abs()).max(1.0);
            worst = worst.max(difference);
        }
    }
    let floor = Percentiles::of(&mut direct);
    let mut latency: Vec<Duration> = measured
        .iter()
        .flat_map(|(_, m)| m.latency.clone())
        .collect();
    let mut compute: Vec<Duration> = measured
        .iter()
        .flat_map(|(_, m)| m.compute.clone())
        .collect();
    let counted = latency.len();
    let e2e = Percentiles::of(&mut latency);
    // Only shared-memory answers say what the server took.
    let server = (!compute.is_empty()).then(|| Percentiles::of(&mut compute));
    let throughput = counted as f64 / elapsed.as_secs_f64();
    let interval_us = args.interval.map(|i| i.as_secs_f64() * 1e6);
    let line = serde_json::json!({
        "model": workload.name, "transport": args.transport.name(), "instances": instances,
        "ticks": args.ticks, "warmup": args.warmup, "interval_us": interval_us,
        "aligned": args.aligned,
        "client_spin_us": args.client_spin.as_secs_f64() * 1e6,
        "client_wait": format!("{:?}", args.client_wait).to_lowercase(),
        "p50_us": e2e.p50, "p99_us": e2e.p99, "p999_us": e2e.p999, "max_us": e2e.max,
        "max_over_median": e2e.max / e2e.p50.max(f64::MIN_POSITIVE),
        "throughput_per_s": throughput,
        "compute_p50_us": server.map(|s| s.p50), "compute_p99_us": server.map(|s| s.p99),
        "onnxruntime_direct_p50_us": floor.p50, "onnxruntime_direct_p99_us": floor.p99,
        "max_relative_error": worst,
    });
    if !args.json {
        let mode = args
            .interval
            .map_or_else(|| "closed loop".to_string(), |i| format!("every {i:?}"));
        println!("{} over {}, {mode}:", workload.name, args.transport.name());
        println!(
            "| model | instances | p50 µs | p99 µs | p99.9 µs | max µs | max/median | ticks/s | compute p50 / p99 µs | ONNX Runtime direct p50 / p99 µs | max rel. error |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        println!(
            "| {} | {instances} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {:.1} / {:.1} | {:.1e} |",
            workload.name,
            e2e.p50,
            e2e.p99,
            e2e.p999,
            e2e.max,
            e2e.max / e2e.p50.max(f64::MIN_POSITIVE),
            throughput,
            server.map_or_else(
                || "-".to_string(),
                |s| format!("{:.0} / {:.0}", s.p50, s.p99)
            ),
            floor.p50,
            floor.p99,
            worst
        );
    }
    println!("{line}");
    Ok(())
}

/// The shared-memory front end's client limit (`shm::MAX_CLIENTS`).
const MAX_CLIENTS: usize = 32;

/// One client thread driving `instances` in turn: `warmup` ticks of each,
/// then (after every thread has warmed up) `ticks` counted ones, each
/// instance's next tick sent when its last was answered, or when it is due
/// (`interval`).
fn client(
    workload: &Workload,
    settings: &Settings,
    instances: &[usize],
    start: &Barrier,
) -> Result<Vec<(usize, Measured)>, String> {
    let (warmup, ticks) = (settings.warmup, settings.ticks);
    let mut connection = Connection::open(settings)?;
    let mut measured: Vec<(usize, Measured)> = instances
        .iter()
        .map(|&i| {
            (
                i,
                Measured {
                    latency: Vec::with_capacity(ticks),
                    compute: Vec::with_capacity(ticks),
                    answers: Vec::with_capacity(warmup + ticks),
                },
            )
        })
        .collect();
    let shape = [1, workload.features as i64];
    let mut send = |i: usize,
                    t: usize,
                    due: Option<Instant>|
     -> Result<(Duration, Option<Duration>, f32), String> {
        let tick = Tensor::from_f32(&workload.input, &shape, &workload.tick(i, t));
        let params = [
            Parameter {
                name: "sequence_id",
                value: ParamValue::Uint(i as u64 + 1),
            },
            Parameter {
                name: "sequence_start",
                value: ParamValue::Bool(t == 0),
            },
        ];
        let params = if workload.memory == Memory::None {
            &params[..0]
        } else {
            &params[..]
        };
        if let Some(due) = due {
            match settings.client_wait {
                Wait::Sleep => {
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                Wait::Spin => {
                    while Instant::now() < due {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        let sent = Instant::now();
        let (outputs, compute) = connection
            .infer(&workload.name, tick, params)
            .map_err(|e| format!("instance {i}, tick {t}: {e}"))?;
        // Open loop: from when the tick was due (a late one's wait counts).
        let took = due.map_or(sent, |d| d.min(sent)).elapsed();
        let answer = outputs
            .first()
            .and_then(Tensor::to_f32)
            .and_then(|v| v.first().copied())
            .ok_or_else(|| format!("instance {i}, tick {t}: no FP32 output"))?;
        Ok((took, compute, answer))
    };
    // Every thread warms up before any counts (a failed warm-up still meets
    // the others at the start, then says why).
    let mut warm = Ok(());
    'warming: for t in 0..warmup {
        for (i, m) in measured.iter_mut() {
            match send(*i, t, None) {
                Ok((_, _, answer)) => m.answers.push(answer),
                Err(e) => {
                    warm = Err(e);
                    break 'warming;
                }
            }
        }
    }
    start.wait();
    warm?;
    let began = Instant::now();
    for (n, t) in (warmup..warmup + ticks).enumerate() {
        // The first counted tick is due one interval after the warm-up, as
        // every later one is after the one before: none finds the path warm
        // from a tick just answered.
        let due = settings
            .interval
            .map(|every| began + every.saturating_mul(u32::try_from(n + 1).unwrap_or(u32::MAX)));
        for (i, m) in measured.iter_mut() {
            // Instance i's phase: i / phases of an interval later.
            let phase = |every: Duration| {
                let i = u32::try_from(*i).unwrap_or(u32::MAX) % settings.phases.max(1);
                every / settings.phases.max(1) * i
            };
            let due = due
                .zip(settings.interval)
                .map(|(d, every)| d + phase(every));
            let (took, compute, answer) = send(*i, t, due)?;
            m.answers.push(answer);
            m.latency.push(took);
            m.compute.extend(compute);
        }
    }
    Ok(measured)
}
