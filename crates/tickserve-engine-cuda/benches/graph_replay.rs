//! Graph replay time per bucket on the GPU, from CUDA events: the median and
//! p99 of 1000 runs after 100 warm-up runs, for `alpha_mlp` and a `tick_*`
//! family member, plus the host-side time of a whole run (stage, launch,
//! wait); then the same sequence issued eagerly (`runtime.cuda_eager`), the
//! graph's gain. Then rows of different members in one launch: for
//! `tick_000` and `seq_lstm_step` with 64 members (the file's weights
//! scaled, one factor per member), each bucket holding one row of each of
//! as many members, run as one launch (`run_members`) against one bucket-1
//! run per member, one after another (what a batch of one member's rows
//! does). Prints the device's name; says so and exits without a GPU.
//!
//!     cargo bench -p tickserve-engine-cuda --bench graph_replay

#![allow(clippy::disallowed_methods)] // a benchmark measures the machine's time

use std::path::Path;
use std::time::Instant;

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, MemberId, SOLE_MEMBER};
use tickserve_engine_cuda::{CudaCompileRequest, CudaEngine, CudaOptions, Gpus, import};
use tickserve_onnx::OnnxModel;

#[path = "../tests/engine_cuda/support/members.rs"]
mod members;

use members::scaled;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Median and p99 of `samples` (µs).
fn spread(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// Rows of 64 members in one launch against one run per member.
fn members_in_one_launch(
    root: &Path,
    buckets: &Buckets,
    name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let engine = CudaEngine::new(CudaOptions::default());
    let bytes = std::fs::read(root.join(format!("config/models/{name}/1/model.onnx")))?;
    let model = OnnxModel::parse(&bytes)?;
    let signature = model.signature(&ModelConfig::default())?;
    let (graph, weights) = model.with_weights_as_inputs()?;
    let imported = import(&graph, &signature.inputs, Some(&weights)).map_err(|e| e.to_string())?;
    let mut compiled = engine.compile(&CudaCompileRequest {
        family: name,
        imported: &imported,
        signature: &signature,
        buckets,
        ordinal: 0,
        first_member: SOLE_MEMBER,
    })?;
    for m in 1..64 {
        compiled.add_member(m, &scaled(&imported.weights, 1.0 + m as f32 / 256.0))?;
    }
    println!(
        "{name}, one row of each of N members: N, one launch device median / p99 (µs), \
         host median / p99 (µs); N bucket-1 runs one after another, host median / p99 (µs)"
    );
    for (bucket, &size) in buckets.sizes().iter().enumerate().skip(1) {
        let members: Vec<MemberId> = (0..size as MemberId).collect();
        let (mut device, mut host, mut apart) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..600 {
            let started = Instant::now();
            compiled.run_members(bucket, &members)?;
            let elapsed = started.elapsed();
            let device_time = compiled.device_time();
            let started = Instant::now();
            for &m in &members {
                compiled.run(0, m)?;
            }
            if i >= 100 {
                host.push(elapsed.as_secs_f64() * 1e6);
                device.push(device_time.map_or(f64::NAN, |t| t.as_secs_f64() * 1e6));
                apart.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        let ((d50, d99), (h50, h99), (a50, a99)) = (spread(device), spread(host), spread(apart));
        println!(
            "  {size:>3}  {d50:>7.2} / {d99:>7.2}   {h50:>7.2} / {h99:>7.2}   {a50:>8.2} / {a99:>8.2}"
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpus = Gpus::probe();
    let Some(gpu) = gpus.devices().first() else {
        println!("no GPU: {}", gpus.describe());
        return Ok(());
    };
    println!("device: gpu:0 {}", gpu.name);
    let root = std::env::var_os("TICKSERVE_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let buckets = Buckets::new(&[1, 2, 4, 8, 16, 32, 64], None)?;
    for (name, eager) in [
        ("alpha_mlp", false),
        ("tick_000", false),
        ("alpha_mlp", true),
        ("tick_000", true),
    ] {
        let engine = CudaEngine::new(CudaOptions {
            tf32: false,
            eager,
            ..CudaOptions::default()
        });
        let mode = if eager { "eager" } else { "graph" };
        let bytes = std::fs::read(root.join(format!("config/models/{name}/1/model.onnx")))
            .map_err(|e| e.to_string())?;
        let model = OnnxModel::parse(&bytes)?;
        let signature = model.signature(&ModelConfig::default())?;
        let (graph, weights) = model.with_weights_as_inputs()?;
        let imported =
            import(&graph, &signature.inputs, Some(&weights)).map_err(|e| e.to_string())?;
        let mut compiled = engine.compile(&CudaCompileRequest {
            family: name,
            imported: &imported,
            signature: &signature,
            buckets: &buckets,
            ordinal: 0,
            first_member: SOLE_MEMBER,
        })?;
        println!(
            "{name} ({mode}): bucket, device median / p99 (µs, CUDA events), whole run median / p99 (µs, host)"
        );
        for (bucket, size) in buckets.sizes().iter().enumerate() {
            let mut device = Vec::with_capacity(1000);
            let mut host = Vec::with_capacity(1000);
            for i in 0..1100 {
                let started = Instant::now();
                compiled.run(bucket, SOLE_MEMBER)?;
                let elapsed = started.elapsed();
                if i >= 100 {
                    host.push(elapsed.as_secs_f64() * 1e6);
                    device.push(
                        compiled
                            .device_time()
                            .map_or(f64::NAN, |t| t.as_secs_f64() * 1e6),
                    );
                }
            }
            device.sort_by(f64::total_cmp);
            host.sort_by(f64::total_cmp);
            println!(
                "  {size:>3}  {:>7.2} / {:>7.2}   {:>7.2} / {:>7.2}",
                percentile(&device, 0.5),
                percentile(&device, 0.99),
                percentile(&host, 0.5),
                percentile(&host, 0.99)
            );
        }
    }
    for name in ["tick_000", "seq_lstm_step"] {
        if let Err(e) = members_in_one_launch(&root, &buckets, name) {
            println!("{name}: {e}");
        }
    }
    Ok(())
}
