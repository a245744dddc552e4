//! Closed-loop or paced latency of one-row `alpha_mlp` requests through the
//! Rust client, over shared memory or gRPC; prints one JSON line (p50, p99,
//! requests, this process's CPU per request). Used by scripts/bench/bench_shm.py.
//!
//!     cargo run --release -p tickserve-client --example latency -- \
//!         shm|grpc ADDRESS_OR_SERVICE CONCURRENCY SECONDS [INTERVAL_US [sleep|spin]]
//!
//! INTERVAL_US > 0 paces each worker to one request per interval (sparse
//! traffic, as a desk sees it), sleeping between requests (`sleep`, the
//! default) or polling the clock (`spin`, as a strategy process that spins
//! on its market-data feed would); 0 or absent: as fast as answers come.

#![allow(clippy::disallowed_methods)] // a benchmark measures the machine's time

use std::time::{Duration, Instant};

use tickserve_client::{BlockingGrpcClient, ShmClient, Tensor};

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: latency shm|grpc ADDRESS_OR_SERVICE CONCURRENCY SECONDS [INTERVAL_US]");
        std::process::exit(2);
    }
    let (mode, target) = (args[1].clone(), args[2].clone());
    let concurrency: usize = args[3].parse().unwrap_or(1);
    let seconds: f64 = args[4].parse().unwrap_or(5.0);
    let interval = Duration::from_micros(args.get(5).and_then(|a| a.parse().ok()).unwrap_or(0));
    let spin_wait = args.get(6).is_some_and(|a| a == "spin");
    let features: Vec<f32> = (0..50).map(|i| (i as f32 * 0.1).sin()).collect();
    let input = Tensor::from_f32("features", &[1, 50], &features);
    let cpu_before = cpu_seconds();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (mode, target, input) = (mode.clone(), target.clone(), input.clone());
            std::thread::spawn(move || {
                let mut infer: Box<dyn FnMut() -> bool> = if mode == "shm" {
                    let mut client = reached(
                        ShmClient::connect_to(&target),
                        "the shared-memory service",
                        &target,
                    );
                    Box::new(move || {
                        client
                            .infer("alpha_mlp", std::slice::from_ref(&input))
                            .is_ok()
                    })
                } else {
                    let client = reached(
                        BlockingGrpcClient::connect(&target),
                        "the gRPC server",
                        &target,
                    );
                    Box::new(move || {
                        client
                            .infer("alpha_mlp", std::slice::from_ref(&input))
                            .is_ok()
                    })
                };
                for _ in 0..200 {
                    infer(); // warm-up
                }
                let mut latencies = Vec::new();
                let started = Instant::now();
                let mut next = started;
                while started.elapsed().as_secs_f64() < seconds {
                    if !interval.is_zero() {
                        if spin_wait {
                            while Instant::now() < next {
                                std::hint::spin_loop();
                            }
                        } else {
                            let now = Instant::now();
                            if next > now {
                                std::thread::sleep(next - now);
                            }
                        }
                        next += interval;
                    }
                    let t0 = Instant::now();
                    assert!(infer(), "a request failed");
                    latencies.push(t0.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all: Vec<Duration> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    let cpu = cpu_seconds() - cpu_before;
    all.sort_unstable();
    let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "{{\"mode\": \"{mode}\", \"concurrency\": {concurrency}, \"requests\": {}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"client_cpu_us\": {:.1}}}",
        all.len(),
        q(0.50),
        q(0.99),
        cpu * 1e6 / all.len().max(1) as f64
    );
}

/// The client `connected` made, or exits (status 2) naming `what` it could not reach.
fn reached<C, E: std::fmt::Display>(connected: Result<C, E>, what: &str, target: &str) -> C {
    connected.unwrap_or_else(|e| {
        eprintln!("latency: cannot reach {what} {target}: {e}");
        std::process::exit(2)
    })
}
