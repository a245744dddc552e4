//! `tickserve-bench`: the per-tick benchmark. N instances, each its own
//! stream of ticks (a sequence of a stateful or windowed model, or a stream
//! of rows of a stateless one), one tick a request, closed loop (each
//! instance sends its next tick when the last is answered), over shared
//! memory. The shared-memory front end takes 32 clients: past 32 instances,
//! a client thread drives several instances in turn (tick t of each, then
//! tick t + 1). It reports end-to-end latency (taken before the request is
//! written and after the answer is read, as STAC-ML takes it) as median,
//! p99, p99.9, max and max/median, the throughput, the server's own compute
//! time for the same requests (from each answer's header), and the largest
//! difference from ONNX Runtime run here on the same ticks, carrying each
//! instance's state itself, and that reference's own time per tick (ONNX
//! Runtime called directly: the floor). Warm-up ticks are sent first and not
//! counted.
//!
//!     tickserve-bench --repository DIR --model bench_lstm --instances 1 --ticks 10000
//!
//! One table, and one JSON line (`--json`: the line only).

mod reference;
mod stats;
mod workload;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use tickserve_client::{ParamValue, Parameter, ShmClient, Tensor};

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
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (workload, start) = (Arc::clone(&workload), Arc::clone(&start));
            let (service, warmup, ticks) = (args.service.clone(), args.warmup, args.ticks);
            let mine: Vec<usize> = (c..instances).step_by(clients).collect();
            std::thread::spawn(move || client(&workload, &service, &mine, (warmup, ticks), &start))
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
    let server = Percentiles::of(&mut compute);
    let throughput = counted as f64 / elapsed.as_secs_f64();
    let line = serde_json::json!({
        "model": workload.name, "transport": "shm", "instances": instances,
        "ticks": args.ticks, "warmup": args.warmup,
        "p50_us": e2e.p50, "p99_us": e2e.p99, "p999_us": e2e.p999, "max_us": e2e.max,
        "max_over_median": e2e.max / e2e.p50.max(f64::MIN_POSITIVE),
        "throughput_per_s": throughput,
        "compute_p50_us": server.p50, "compute_p99_us": server.p99,
        "onnxruntime_direct_p50_us": floor.p50, "onnxruntime_direct_p99_us": floor.p99,
        "max_relative_error": worst,
    });
    if !args.json {
        println!(
            "| model | instances | p50 µs | p99 µs | p99.9 µs | max µs | max/median | ticks/s | compute p50 / p99 µs | ONNX Runtime direct p50 / p99 µs | max rel. error |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        println!(
            "| {} | {instances} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1e} |",
            workload.name,
            e2e.p50,
            e2e.p99,
            e2e.p999,
            e2e.max,
            e2e.max / e2e.p50.max(f64::MIN_POSITIVE),
            throughput,
            server.p50,
            server.p99,
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
/// instance's next tick sent when its last was answered.
fn client(
    workload: &Workload,
    service: &str,
    instances: &[usize],
    (warmup, ticks): (usize, usize),
    start: &Barrier,
) -> Result<Vec<(usize, Measured)>, String> {
    let mut client = ShmClient::connect_to(service).map_err(|e| e.to_string())?;
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
    let mut send = |i: usize, t: usize| -> Result<(Duration, Duration, f32), String> {
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
        let sent = Instant::now();
        let outputs = client
            .infer_with(&workload.name, &[tick], params)
            .map_err(|e| format!("instance {i}, tick {t}: {e}"))?;
        let took = sent.elapsed();
        let answer = outputs
            .first()
            .and_then(Tensor::to_f32)
            .and_then(|v| v.first().copied())
            .ok_or_else(|| format!("instance {i}, tick {t}: no FP32 output"))?;
        let compute = client.last_timing().map_or(Duration::ZERO, |(_, c)| c);
        Ok((took, compute, answer))
    };
    // Every thread warms up before any counts (a failed warm-up still meets
    // the others at the start, then says why).
    let mut warm = Ok(());
    'warming: for t in 0..warmup {
        for (i, m) in measured.iter_mut() {
            match send(*i, t) {
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
    for t in warmup..warmup + ticks {
        for (i, m) in measured.iter_mut() {
            let (took, compute, answer) = send(*i, t)?;
            m.answers.push(answer);
            m.latency.push(took);
            m.compute.push(compute);
        }
    }
    Ok(measured)
}
