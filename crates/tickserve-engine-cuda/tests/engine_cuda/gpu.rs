//! On a GPU (ignored elsewhere; run with `--ignored` on the GPU machine, see
//! docs/cuda.md): every bucket of `alpha_mlp`, `seq_lstm`, the `cuda_ops` and
//! `cuda_sequence_ops` fixtures (LSTM, GRU in both reset modes, the layout
//! ops) and every `tick_*` member (one family graph, members swapped by
//! pointer, run by run) gives what ONNX Runtime gives on the CPU within 1e-5
//! relative, on fresh random inputs, with CUDA graphs and eagerly; the
//! compilations counter moved once per bucket at compile and never while
//! running; `seq_lstm_step` carries its state through 100 ticks, each side
//! its own, and stays within 1e-5 of ONNX Runtime at every tick; rows of
//! several members in one launch give each row what its member gives alone
//! (`tick_*`, `seq_lstm_step` and the every-op fixtures, graphs and eagerly);
//! the resident kernel, ticked through mapped memory, gives what ONNX Runtime
//! gives over 10,000 ticks of `seq_lstm_step` and `bench_lstm`, answers a
//! swapped member with its weights, stops when told, and prints its round
//! trip.

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, MemberId, SOLE_MEMBER};
use tickserve_engine_cuda::{CudaCompileRequest, CudaEngine, CudaOptions, Gpus, import};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtModel, OrtOptions};
use tickserve_onnx::OnnxModel;

use crate::support;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::members::scaled;
use support::{fixtures, read, root};
use tickserve_core::metrics as names;

fn buckets() -> Buckets {
    Buckets::new(&[1, 2, 4, 8, 16, 32, 64], None).unwrap()
}

fn ort_model(engine: &OrtEngine, model: &OnnxModel) -> OrtModel {
    let signature = model.signature(&ModelConfig::default()).unwrap();
    engine
        .compile(&OrtCompileRequest {
            family: "reference",
            onnx: model,
            signature: &signature,
            buckets: &buckets(),
            weights: None,
        })
        .unwrap()
}

/// Fresh pseudo-random bytes of floats in [-2, 2) for every input of a bucket.
fn fill(model: &mut dyn CompiledModel, bucket: usize, seed: &mut u64) -> Vec<Vec<u8>> {
    let inputs = model.signature().inputs.len();
    (0..inputs)
        .map(|i| {
            let buffer = model.input_mut(bucket, i);
            for chunk in buffer.chunks_exact_mut(4) {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            buffer.to_vec()
        })
        .collect()
}

fn assert_close(gpu: &[u8], cpu: &[u8], what: &str) {
    for (i, (g, c)) in gpu.chunks_exact(4).zip(cpu.chunks_exact(4)).enumerate() {
        let g = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        let c = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        assert!(
            (g - c).abs() <= 1e-5 * c.abs().max(1.0),
            "{what} element {i}: gpu {g}, cpu {c}"
        );
    }
}

/// Runs `member` of `gpu` and `cpu` on the same fresh inputs in every bucket.
fn compare(
    gpu: &mut dyn CompiledModel,
    member: MemberId,
    cpu: &mut OrtModel,
    what: &str,
    seed: &mut u64,
) {
    for bucket in 0..gpu.buckets().sizes().len() {
        let inputs = fill(gpu, bucket, seed);
        for (i, data) in inputs.iter().enumerate() {
            cpu.input_mut(bucket, i).copy_from_slice(data);
        }
        gpu.run(bucket, member).unwrap();
        cpu.run(bucket, SOLE_MEMBER).unwrap();
        assert!(gpu.device_time().is_some());
        for o in 0..gpu.signature().outputs.len() {
            let size = gpu.buckets().sizes()[bucket];
            assert_close(
                gpu.output(bucket, o),
                cpu.output(bucket, o),
                &format!("{what} bucket {size} output {o}"),
            );
        }
    }
}

/// `imported` compiled on gpu:0 in every bucket, `first` its first member.
fn on_gpu(
    cuda: &CudaEngine,
    family: &str,
    imported: &tickserve_engine_cuda::Imported,
    signature: &tickserve_onnx::PartialSignature,
    first: MemberId,
) -> tickserve_engine_cuda::CudaModel {
    cuda.compile(&CudaCompileRequest {
        family,
        imported,
        signature,
        buckets: &buckets(),
        ordinal: 0,
        first_member: first,
    })
    .unwrap()
}

fn gpu_engine(eager: bool) -> CudaEngine {
    assert!(
        !Gpus::probe().devices().is_empty(),
        "no GPU: {}",
        Gpus::probe().describe()
    );
    CudaEngine::new(CudaOptions { tf32: false, eager })
}

/// The graph compilations counted (every label together) since the last call (a snapshot of the
/// debugging recorder takes its counters' values and resets them).
fn compilations(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .iter()
        .filter(|(key, ..)| key.key().name() == names::GRAPH_COMPILATIONS)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn ort_engine() -> OrtEngine {
    OrtEngine::new(
        &root().join(".local/lib/libonnxruntime.so.1.31.1"),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .unwrap()
}

/// `alpha_mlp`, `seq_lstm` and the every-op fixtures, compiled with CUDA graphs or
/// `eager`, against ONNX Runtime in every bucket; compilations counted once
/// per bucket at compile, none while running.
fn alpha_mlp_and_every_op(eager: bool) {
    let cuda = gpu_engine(eager);
    let ort = ort_engine();
    let dir = fixtures();
    let paths = [
        root().join("config/models/alpha_mlp/1/model.onnx"),
        root().join("config/models/seq_lstm/1/model.onnx"),
        dir.path().join("cuda_ops/1/model.onnx"),
        dir.path().join("cuda_sequence_ops/1/model.onnx"),
        dir.path().join("cuda_conv/1/model.onnx"),
    ];
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut seed = 1;
    metrics::with_local_recorder(&recorder, || {
        for path in paths {
            let model = read(&path);
            let signature = model.signature(&ModelConfig::default()).unwrap();
            let imported = import(&model, &signature.inputs, None).unwrap();
            let mut cpu = ort_model(&ort, &model);
            // A snapshot takes the counts since the last one: this one drops
            // what came before the GPU's compilation.
            compilations(&snapshotter);
            let mut gpu = on_gpu(&cuda, "test", &imported, &signature, SOLE_MEMBER);
            assert_eq!(
                compilations(&snapshotter),
                buckets().sizes().len() as u64,
                "one compilation per bucket"
            );
            compare(
                &mut gpu,
                SOLE_MEMBER,
                &mut cpu,
                &format!("{} (eager: {eager})", path.display()),
                &mut seed,
            );
            assert_eq!(compilations(&snapshotter), 0, "running compiled");
        }
    });
}

#[test]
#[ignore = "needs a GPU"]
fn alpha_mlp_and_every_op_match_onnx_runtime_in_every_bucket() {
    alpha_mlp_and_every_op(false);
}

#[test]
#[ignore = "needs a GPU"]
fn eagerly_too() {
    alpha_mlp_and_every_op(true);
}

#[test]
#[ignore = "needs a GPU"]
fn every_tick_member_through_one_family_graph_matches_onnx_runtime() {
    let cuda = gpu_engine(false);
    let ort = ort_engine();
    let path = |m: usize| root().join(format!("config/models/tick_{m:03}/1/model.onnx"));
    let first = read(&path(0));
    let signature = first.signature(&ModelConfig::default()).unwrap();
    let (graph, weights) = first.with_weights_as_inputs().unwrap();
    let imported = import(&graph, &signature.inputs, Some(&weights)).unwrap();
    let mut gpu = on_gpu(&cuda, "tick", &imported, &signature, 0);
    let mut cpu: Vec<OrtModel> = Vec::new();
    for m in 0..8 {
        let model = read(&path(m));
        if m > 0 {
            let (_, w) = model.with_weights_as_inputs().unwrap();
            gpu.add_member(m as MemberId, &w).unwrap();
        }
        cpu.push(ort_model(&ort, &model));
    }
    // Members in turns, twice: every run swaps the weights by pointer.
    let mut seed = 7;
    for round in 0..2 {
        for (m, cpu) in cpu.iter_mut().enumerate() {
            compare(
                &mut gpu,
                m as MemberId,
                cpu,
                &format!("round {round} tick_{m:03}"),
                &mut seed,
            );
        }
    }
    gpu.remove_member(3);
    assert!(gpu.run(0, 3).is_err(), "a removed member no longer runs");
}

#[test]
#[ignore = "needs a GPU"]
fn the_lstm_step_carries_its_state_through_100_ticks() {
    let cuda = gpu_engine(false);
    let ort = ort_engine();
    let model = read(&root().join("config/models/seq_lstm_step/1/model.onnx"));
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None).unwrap();
    let mut gpu = on_gpu(&cuda, "seq_lstm_step", &imported, &signature, SOLE_MEMBER);
    let mut cpu = ort_model(&ort, &model);
    // Inputs tick, h_in, c_in; outputs prediction, h_out, c_out.
    let bucket = buckets().sizes().len() - 1;
    let mut seed = 11;
    let (mut gpu_state, mut cpu_state): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
    for tick in 0..100 {
        let fresh = fill(&mut gpu, bucket, &mut seed);
        for (i, data) in fresh.iter().enumerate() {
            let (g, c) = match i {
                0 => (data, data),
                _ if tick == 0 => (data, data),
                _ => (&gpu_state[i - 1], &cpu_state[i - 1]),
            };
            gpu.input_mut(bucket, i).copy_from_slice(g);
            cpu.input_mut(bucket, i).copy_from_slice(c);
        }
        gpu.run(bucket, SOLE_MEMBER).unwrap();
        cpu.run(bucket, SOLE_MEMBER).unwrap();
        for o in 0..3 {
            assert_close(
                gpu.output(bucket, o),
                cpu.output(bucket, o),
                &format!("tick {tick} output {o}"),
            );
        }
        gpu_state = (1..3).map(|o| gpu.output(bucket, o).to_vec()).collect();
        cpu_state = (1..3).map(|o| cpu.output(bucket, o).to_vec()).collect();
    }
}

/// `path` as a family of three members (its weights scaled by 1, 0.75 and
/// 1.25) on gpu:0: in every bucket of two rows or more, fresh inputs run
/// once with row `r` of member `r % 3`'s (one launch), then once per member
/// alone on the same inputs; each row equals its member's run within 1e-5.
fn mixed_members_match_each_member_alone(cuda: &CudaEngine, path: &std::path::Path) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let (graph, weights) = model.with_weights_as_inputs().unwrap();
    let imported = import(&graph, &signature.inputs, Some(&weights)).unwrap();
    let mut gpu = on_gpu(cuda, "mixed", &imported, &signature, 0);
    gpu.add_member(1, &scaled(&imported.weights, 0.75)).unwrap();
    gpu.add_member(2, &scaled(&imported.weights, 1.25)).unwrap();
    assert!(gpu.mixes_members());
    let mut seed = 19;
    for (bucket, &size) in buckets().sizes().iter().enumerate().skip(1) {
        fill(&mut gpu, bucket, &mut seed);
        // Fewer members than rows: the padding rows run member 0's.
        let rows: Vec<MemberId> = (0..size.min(7) as MemberId).map(|r| r % 3).collect();
        gpu.run_members(bucket, &rows).unwrap();
        let mixed: Vec<Vec<u8>> = (0..signature.outputs.len())
            .map(|o| gpu.output(bucket, o).to_vec())
            .collect();
        for member in 0..3 {
            gpu.run(bucket, member).unwrap();
            for (o, all) in mixed.iter().enumerate() {
                let alone = gpu.output(bucket, o);
                let width = alone.len() / size;
                for r in (0..size).filter(|&r| rows.get(r).copied().unwrap_or(0) == member) {
                    assert_close(
                        &all[r * width..(r + 1) * width],
                        &alone[r * width..(r + 1) * width],
                        &format!(
                            "{} bucket {size} output {o} row {r} member {member}",
                            path.display()
                        ),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn rows_of_several_members_in_one_launch_match_each_member_alone() {
    let dir = fixtures();
    let models = root().join("config/models");
    for eager in [false, true] {
        let cuda = gpu_engine(eager);
        for path in [
            models.join("tick_000/1/model.onnx"),
            models.join("seq_lstm_step/1/model.onnx"),
            dir.path().join("cuda_ops/1/model.onnx"),
            dir.path().join("cuda_sequence_ops/1/model.onnx"),
            dir.path().join("cuda_conv/1/model.onnx"),
        ] {
            mixed_members_match_each_member_alone(&cuda, &path);
        }
    }
}

/// The resident kernel on gpu:0, as the tests tick it.
struct OnDevice(tickserve_engine_cuda::resident::ResidentKernel);

/// Slot 0 of a resident kernel on the device.
impl crate::resident::Ticker for OnDevice {
    fn tick(&mut self, inputs: &[(usize, &[f32])]) -> Vec<f32> {
        self.0.tick(0, inputs).unwrap()
    }

    fn state(&self) -> Vec<f32> {
        self.0.state(0).unwrap()
    }

    fn swap(&mut self, weights: &[Vec<f32>]) {
        self.0.swap(0, weights).unwrap();
    }
}

/// `path`'s resident kernel started on gpu:0 with `slots` slots on the
/// file's weights.
fn resident_on_device(path: &std::path::Path, state: &[(&str, &str)], slots: usize) -> OnDevice {
    assert!(
        !Gpus::probe().devices().is_empty(),
        "no GPU: {}",
        Gpus::probe().describe()
    );
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let (_, plan, weights) = crate::resident::plan_of(path);
    let layout = tickserve_engine_cuda::kernels::resident(&plan, state).unwrap();
    OnDevice(
        tickserve_engine_cuda::resident::ResidentKernel::start(
            &ctx,
            0,
            layout,
            &weights,
            slots,
            std::time::Duration::from_secs(1),
        )
        .unwrap(),
    )
}

/// The resident kernel on the device: `seq_lstm_step` and `bench_lstm`, 10,000
/// ticks each through the mapped mailbox, equal ONNX Runtime's with the
/// state fed back (1e-5), the kept state read back equal; a member swapped
/// between ticks answers with its weights from the next; the kernel stops
/// when told. Prints each tick's round trip (the mailbox written to the
/// answer seen): measured, never asserted.
#[test]
#[ignore = "needs a GPU"]
#[allow(clippy::disallowed_methods)] // the round trip's time is the point
fn the_resident_kernel_ticks_on_the_device_as_onnx_runtime_does() {
    use crate::resident::{
        BENCH_LSTM_STATE, STATE, scaled_member, swap_matches_reference, ticks_match,
    };
    let step = root().join("config/models/seq_lstm_step/1/model.onnx");
    let mut kernel = resident_on_device(&step, &STATE, 1);
    ticks_match(&mut kernel, &step, &STATE, 10_000, 1000);
    kernel.0.stop().unwrap();
    let other = scaled_member(&step);
    let mut kernel = resident_on_device(&step, &STATE, 1);
    swap_matches_reference(&mut kernel, &other);
    kernel.0.stop().unwrap();

    let bench = support::bench_models();
    let path = bench.path().join("bench_lstm/1/model.onnx");
    let mut kernel = resident_on_device(&path, &BENCH_LSTM_STATE, 1);
    ticks_match(&mut kernel, &path, &BENCH_LSTM_STATE, 10_000, 5000);
    // The round trip alone: 20,000 ticks after 1,000 of warm-up.
    let x = vec![0.25f32; 32];
    let mut micros = Vec::with_capacity(20_000);
    for t in 0..21_000 {
        let started = std::time::Instant::now();
        kernel.0.tick(0, &[(0, &x)]).unwrap();
        if t >= 1_000 {
            micros.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    kernel.0.stop().unwrap();
    summary("resident bench_lstm tick", &mut micros);

    // 64 slots, each its own member (the file's weights scaled) and its own
    // sequence, all asked before any answer is awaited: each checked against
    // the plan's reference for 50 rounds, then 2,000 rounds timed (a round:
    // the first ask to the last answer).
    let mut kernel = resident_on_device(&path, &BENCH_LSTM_STATE, 64);
    let (_, plan, weights) = crate::resident::plan_of(&path);
    let members: Vec<Vec<Vec<f32>>> = (0..64)
        .map(|m| {
            let f = 1.0 - m as f32 / 256.0;
            weights
                .iter()
                .map(|w| w.iter().map(|x| x * f).collect())
                .collect()
        })
        .collect();
    for (slot, member) in members.iter().enumerate() {
        kernel.0.swap(slot, member).unwrap();
    }
    let widths: Vec<usize> = plan
        .inputs
        .iter()
        .map(|(_, v)| plan.values[*v].width)
        .collect();
    let mut states: Vec<Vec<Vec<f32>>> = (0..64)
        .map(|_| widths[1..].iter().map(|w| vec![0.0f32; *w]).collect())
        .collect();
    let mut rounds = Vec::with_capacity(2_000);
    for round in 0..2_050u64 {
        let ticks: Vec<Vec<f32>> = (0..64u64)
            .map(|slot| {
                tickserve_engine_cuda::reference::random_rows(90_000 + round * 64 + slot, widths[0])
            })
            .collect();
        let started = std::time::Instant::now();
        for (slot, x) in ticks.iter().enumerate() {
            kernel.0.ask(slot, &[(0, x)]).unwrap();
        }
        let answers: Vec<Vec<f32>> = (0..64).map(|slot| kernel.0.wait(slot).unwrap()).collect();
        let took = started.elapsed().as_secs_f64() * 1e6;
        if round < 50 {
            for (slot, got) in answers.iter().enumerate() {
                let mut inputs: Vec<&[f32]> = vec![&ticks[slot]];
                inputs.extend(states[slot].iter().map(Vec::as_slice));
                let want = tickserve_engine_cuda::reference::run(&plan, &members[slot], &inputs, 1);
                let at = kernel.0.layout().outputs[0].unwrap();
                assert!(
                    crate::resident::close(got[at], want[0][0]),
                    "round {round} slot {slot}: resident {}, the reference {}",
                    got[at],
                    want[0][0]
                );
                // bench_lstm's outputs: the prediction, then each state in
                // the inputs' order.
                states[slot] = want[1..].to_vec();
            }
        } else {
            rounds.push(took);
        }
    }
    kernel.0.stop().unwrap();
    summary(
        "resident bench_lstm, 64 slots ticking at once: a round",
        &mut rounds,
    );
}

/// Prints `micros`' percentiles as a SUMMARY line (gpu_check.sh collects them).
fn summary(case: &str, micros: &mut [f64]) {
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    println!(
        "SUMMARY {{\"case\": \"{case}\", \"ticks\": {}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"p999_us\": {:.2}, \"max_us\": {:.2}}}",
        micros.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        micros[micros.len() - 1]
    );
}
