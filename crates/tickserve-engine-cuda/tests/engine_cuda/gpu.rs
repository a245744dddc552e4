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

use crate::resident::{Ticker, le_bytes};
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
    CudaEngine::new(CudaOptions {
        tf32: false,
        eager,
        ..CudaOptions::default()
    })
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

impl OnDevice {
    /// Asks slot `slot` for a tick of `member`: every plan input's floats.
    fn ask(&mut self, slot: usize, member: usize, inputs: &[Vec<f32>]) {
        let bytes: Vec<Vec<u8>> = inputs.iter().map(|x| le_bytes(x)).collect();
        self.0.ask(slot, member, |i| &bytes[i]).unwrap();
    }

    /// Waits for slot `slot`'s answer: every plan output's floats.
    fn wait(&mut self, slot: usize) -> Vec<Vec<f32>> {
        let mut outputs = vec![Vec::new(); self.0.layout().outputs.len()];
        self.0
            .wait(slot, |o, bytes| outputs[o] = support::floats(bytes))
            .unwrap();
        outputs
    }
}

/// Slot 0 of a resident kernel on the device.
impl crate::resident::Ticker for OnDevice {
    fn tick(&mut self, member: usize, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
        self.ask(0, member, inputs);
        self.wait(0)
    }

    fn state(&self) -> Vec<f32> {
        self.0.state(0).unwrap()
    }

    fn put(&mut self, member: usize, weights: &[Vec<f32>]) {
        self.0.put(member, weights).unwrap();
    }

    fn states_given(&self) -> u64 {
        self.0.mailboxes().states_given()
    }
}

/// `path`'s resident kernel started on gpu:0 with `slots` slots on the
/// file's weights.
fn resident_on_device(path: &std::path::Path, state: &[(&str, &str)], slots: usize) -> OnDevice {
    resident_split_on_device(path, state, slots, (1, 0))
}

/// [`resident_on_device`] with each slot on a cluster of `split` blocks,
/// each holding up to `on_chip` bytes of its share of the weights.
fn resident_split_on_device(
    path: &std::path::Path,
    state: &[(&str, &str)],
    slots: usize,
    (split, on_chip): (usize, usize),
) -> OnDevice {
    assert!(
        !Gpus::probe().devices().is_empty(),
        "no GPU: {}",
        Gpus::probe().describe()
    );
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let (_, plan, weights) = crate::resident::plan_of(path);
    let layout =
        tickserve_engine_cuda::kernels::resident_split(&plan, state, split, on_chip).unwrap();
    OnDevice(
        tickserve_engine_cuda::resident::ResidentKernel::start(
            &ctx,
            0,
            layout,
            &weights,
            128,
            slots,
            std::time::Duration::from_secs(1),
        )
        .unwrap(),
    )
}

/// The resident kernel on the device: `seq_lstm_step` and `bench_lstm`, 10,000
/// ticks each through the mapped mailbox, the state handed back as the
/// server does, equal ONNX Runtime's with its own state fed back (1e-5),
/// the kept state read back equal; a member added while it runs answers
/// with its weights from its first tick; the kernel stops when told.
/// Prints each tick's round trip (the mailbox written to the answer seen)
/// and a round of 64 slots: measured, never asserted.
#[test]
#[ignore = "needs a GPU"]
#[allow(clippy::disallowed_methods)] // the round trip's time is the point
fn the_resident_kernel_ticks_on_the_device_as_onnx_runtime_does() {
    use crate::resident::{
        BENCH_LSTM_STATE, STATE, members_match_reference, scaled_member, ticks_match,
    };
    let step = root().join("config/models/seq_lstm_step/1/model.onnx");
    let mut kernel = resident_on_device(&step, &STATE, 1);
    ticks_match(&mut kernel, &step, &STATE, 10_000, 1000);
    kernel.0.stop().unwrap();
    let other = scaled_member(&step);
    let mut kernel = resident_on_device(&step, &STATE, 1);
    members_match_reference(&mut kernel, &other);
    kernel.0.stop().unwrap();

    let bench = support::bench_models();
    let path = bench.path().join("bench_lstm/1/model.onnx");
    let mut kernel = resident_on_device(&path, &BENCH_LSTM_STATE, 1);
    ticks_match(&mut kernel, &path, &BENCH_LSTM_STATE, 10_000, 5000);
    let mut micros = round_trips(&mut kernel, &path);
    kernel.0.stop().unwrap();
    summary("resident bench_lstm tick", &mut micros);
    let (_, plan, weights) = crate::resident::plan_of(&path);
    let widths: Vec<usize> = plan
        .inputs
        .iter()
        .map(|(_, v)| plan.values[*v].width)
        .collect();

    // 64 slots, each its own member (the file's weights scaled) and its own
    // sequence, all asked before any answer is awaited: each checked against
    // the plan's reference for 50 rounds, then 2,000 rounds timed (a round:
    // the first ask to the last answer).
    let mut kernel = resident_on_device(&path, &BENCH_LSTM_STATE, 64);
    let members: Vec<Vec<Vec<f32>>> = (0..64)
        .map(|m| {
            let f = 1.0 - m as f32 / 256.0;
            weights
                .iter()
                .map(|w| w.iter().map(|x| x * f).collect())
                .collect()
        })
        .collect();
    for (m, member) in members.iter().enumerate().skip(1) {
        kernel.0.put(m, member).unwrap();
    }
    let mut states: Vec<Vec<Vec<f32>>> = (0..64)
        .map(|_| widths.iter().map(|w| vec![0.0f32; *w]).collect())
        .collect();
    let mut rounds = Vec::with_capacity(2_000);
    for round in 0..2_050u64 {
        for (slot, inputs) in states.iter_mut().enumerate() {
            inputs[0] = tickserve_engine_cuda::reference::random_rows(
                90_000 + round * 64 + slot as u64,
                widths[0],
            );
        }
        let started = std::time::Instant::now();
        for (slot, inputs) in states.iter().enumerate() {
            kernel.ask(slot, slot, inputs);
        }
        let answers: Vec<Vec<Vec<f32>>> = (0..64).map(|slot| kernel.wait(slot)).collect();
        let took = started.elapsed().as_secs_f64() * 1e6;
        for (slot, got) in answers.iter().enumerate() {
            if round < 50 {
                let inputs: Vec<&[f32]> = states[slot].iter().map(Vec::as_slice).collect();
                let want = tickserve_engine_cuda::reference::run(&plan, &members[slot], &inputs, 1);
                assert!(
                    crate::resident::close(got[0][0], want[0][0]),
                    "round {round} slot {slot}: resident {}, the reference {}",
                    got[0][0],
                    want[0][0]
                );
            }
            for k in &kernel.0.layout().state {
                states[slot][k.input].clone_from(&got[k.output]);
            }
        }
        if round >= 50 {
            rounds.push(took);
        }
    }
    assert_eq!(kernel.0.mailboxes().states_given(), 0);
    kernel.0.stop().unwrap();
    summary(
        "resident bench_lstm, 64 slots ticking at once: a round",
        &mut rounds,
    );
}

/// Slot 0's round trip (the mailbox written to the answer seen), in µs,
/// over 20,000 ticks of `path`'s plan after 1,000 of warm-up, the state
/// handed back each tick as the server does.
#[allow(clippy::disallowed_methods)] // the round trip's time is the point
fn round_trips(kernel: &mut OnDevice, path: &std::path::Path) -> Vec<f64> {
    let (_, plan, _) = crate::resident::plan_of(path);
    let mut held: Vec<Vec<f32>> = (plan.inputs.iter())
        .map(|(_, v)| vec![0.0f32; plan.values[*v].width])
        .collect();
    held[0].fill(0.25);
    let kept = kernel.0.layout().state.clone();
    let mut micros = Vec::with_capacity(20_000);
    for t in 0..21_000 {
        let started = std::time::Instant::now();
        let got = Ticker::tick(kernel, 0, &held);
        if t >= 1_000 {
            micros.push(started.elapsed().as_secs_f64() * 1e6);
        }
        for k in &kept {
            held[k.input].clone_from(&got[k.output]);
        }
    }
    micros
}

/// A slot on a thread-block cluster (each block a share of every step's
/// units, stored into every block's shared memory), its weights through
/// L2 or held on chip (200 KiB a block, what fits): `seq_lstm_step` on 3
/// blocks and `bench_lstm` on 1, 2, 4 and 8 tick as ONNX Runtime does over
/// 2,000 ticks; prints `bench_lstm`'s round trip for each (a block a slot
/// through L2: `the_resident_kernel_ticks_on_the_device_as_onnx_runtime_does`).
#[test]
#[ignore = "needs a GPU"]
fn a_slot_split_over_a_cluster_ticks_as_onnx_runtime_does() {
    use crate::resident::{BENCH_LSTM_STATE, STATE, ticks_match};
    const ON_CHIP: usize = 200 * 1024;
    let step = root().join("config/models/seq_lstm_step/1/model.onnx");
    let mut kernel = resident_split_on_device(&step, &STATE, 1, (3, ON_CHIP));
    ticks_match(&mut kernel, &step, &STATE, 2_000, 1200);
    kernel.0.stop().unwrap();
    let bench = support::bench_models();
    let path = bench.path().join("bench_lstm/1/model.onnx");
    for (split, on_chip) in [
        (2, 0),
        (4, 0),
        (8, 0),
        (1, ON_CHIP),
        (2, ON_CHIP),
        (4, ON_CHIP),
        (8, ON_CHIP),
    ] {
        let mut kernel = resident_split_on_device(&path, &BENCH_LSTM_STATE, 1, (split, on_chip));
        let held = kernel.0.layout().on_chip_bytes;
        ticks_match(&mut kernel, &path, &BENCH_LSTM_STATE, 2_000, 5200);
        let mut micros = round_trips(&mut kernel, &path);
        kernel.0.stop().unwrap();
        summary(
            &format!(
                "resident bench_lstm tick, a slot on {split} blocks, {} KiB of weights on chip a block",
                held / 1024
            ),
            &mut micros,
        );
    }
}

/// Bucket `bucket` of `model` and of `graphs` run with member `member` on
/// the same fresh inputs: the same answers (1e-5); whether `model`'s run
/// was its kernel's (no device time measured).
fn answers_as_graphs(
    model: &mut tickserve_engine_cuda::ResidentModel,
    graphs: &mut tickserve_engine_cuda::CudaModel,
    (bucket, member): (usize, MemberId),
    seed: &mut u64,
) -> bool {
    let inputs = fill(model, bucket, seed);
    for (i, bytes) in inputs.iter().enumerate() {
        graphs.input_mut(bucket, i).copy_from_slice(bytes);
    }
    model.run(bucket, member).unwrap();
    graphs.run(bucket, member).unwrap();
    for o in 0..model.signature().outputs.len() {
        assert_close(
            model.output(bucket, o),
            graphs.output(bucket, o),
            &format!("bucket {bucket}, member {member}, output {o}"),
        );
    }
    model.device_time().is_none()
}

/// `bench_lstm`'s state pairs as its `model.toml` writes them.
fn bench_lstm_state() -> Vec<tickserve_core::sequence::StateConfig> {
    state_configs(&crate::resident::BENCH_LSTM_STATE)
}

/// State pairs (input, output) as a `model.toml`'s `[[sequence.state]]`.
fn state_configs(pairs: &[(&str, &str)]) -> Vec<tickserve_core::sequence::StateConfig> {
    pairs
        .iter()
        .map(|(i, o)| tickserve_core::sequence::StateConfig {
            input: (*i).to_string(),
            output: (*o).to_string(),
            initial_file: None,
        })
        .collect()
}

/// `bench_lstm` compiled through the engine's trait with `resident` (or
/// not) on gpu:0, buckets 1 and 64.
fn bench_lstm_compiled(
    path: &std::path::Path,
    resident: Option<tickserve_core::ResidentRequest<'_>>,
) -> Box<dyn CompiledModel> {
    let onnx = read(path);
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let graph = tickserve_onnx::ModelGraph { onnx, signature };
    let engine = CudaEngine::new(CudaOptions::default());
    tickserve_core::Engine::compile(
        &engine,
        &tickserve_core::CompileRequest {
            family: "bench_lstm",
            graph: &graph,
            buckets: &Buckets::new(&[1, 64], None).unwrap(),
            weights: None,
            device: tickserve_core::Device::Gpu(0),
            check: false,
            resident,
        },
    )
    .unwrap()
}

/// A family compiled with `gpu_mode = "resident"` runs its buckets on the
/// resident kernel and answers as its graphs do (1e-5): bucket 1 ticking
/// one sequence, its state handed back as the server does, and bucket 64
/// holding rows of 64 members added after load. Prints the bucket-1 run's
/// time through the engine's trait (inputs written, run, outputs read), on
/// the kernel and on the graphs: measured, never asserted.
#[test]
#[ignore = "needs a GPU"]
#[allow(clippy::disallowed_methods)] // the run's time is the point
fn a_family_compiled_resident_answers_as_its_graphs_do() {
    let bench = support::bench_models();
    let path = bench.path().join("bench_lstm/1/model.onnx");
    let state = bench_lstm_state();
    let asked = tickserve_core::ResidentRequest {
        required: true,
        state: &state,
    };
    let mut resident = bench_lstm_compiled(&path, Some(asked));
    let mut graphs = bench_lstm_compiled(&path, None);
    assert!(resident.device_time().is_none(), "runs on the graphs");
    let onnx = read(&path);
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let imported = import(&onnx, &signature.inputs, None).unwrap();
    for m in 1..64u32 {
        let weights = scaled(&imported.weights, 1.0 - m as f32 / 256.0);
        resident.add_member(m, &weights).unwrap();
        graphs.add_member(m, &weights).unwrap();
    }
    let inputs = signature.inputs.len();
    let fed_back = fed_back(&signature);
    let mut seed = 11u64;
    let mut timed = |model: &mut dyn CompiledModel, other: &mut dyn CompiledModel| {
        let mut micros = Vec::with_capacity(20_000);
        for t in 0..21_000 {
            let started = std::time::Instant::now();
            let x = tickserve_engine_cuda::reference::random_rows(seed + t, 32);
            model.input_mut(0, 0).copy_from_slice(&le_bytes(&x));
            model.run(0, SOLE_MEMBER).unwrap();
            for &(i, o) in &fed_back {
                let next = model.output(0, o).to_vec();
                model.input_mut(0, i).copy_from_slice(&next);
            }
            if t >= 1_000 {
                micros.push(started.elapsed().as_secs_f64() * 1e6);
            }
            if t < 200 {
                // The same tick on the other mode: the same answer.
                for i in 0..inputs {
                    let fed = model.input_mut(0, i).to_vec();
                    if fed_back.iter().all(|&(si, _)| si != i) {
                        other.input_mut(0, i).copy_from_slice(&fed);
                    }
                }
                other.run(0, SOLE_MEMBER).unwrap();
                assert_close(model.output(0, 0), other.output(0, 0), &format!("tick {t}"));
                for &(i, o) in &fed_back {
                    let next = model.output(0, o).to_vec();
                    other.input_mut(0, i).copy_from_slice(&next);
                }
            }
        }
        seed += 100_000;
        micros
    };
    let mut on_kernel = timed(resident.as_mut(), graphs.as_mut());
    summary("resident bench_lstm bucket-1 run (engine)", &mut on_kernel);
    let mut on_graphs = timed(graphs.as_mut(), resident.as_mut());
    summary("graphs bench_lstm bucket-1 run (engine)", &mut on_graphs);
    // Bucket 64: a row of each member, the same inputs on both.
    let members: Vec<MemberId> = (0..64).collect();
    for round in 0..20u64 {
        for i in 0..inputs {
            let len = resident.input_mut(1, i).len() / 4;
            let x = le_bytes(&tickserve_engine_cuda::reference::random_rows(
                round * 8 + i as u64,
                len,
            ));
            resident.input_mut(1, i).copy_from_slice(&x);
            graphs.input_mut(1, i).copy_from_slice(&x);
        }
        resident.run_members(1, &members).unwrap();
        graphs.run_members(1, &members).unwrap();
        for o in 0..signature.outputs.len() {
            assert_close(
                resident.output(1, o),
                graphs.output(1, o),
                &format!("round {round} bucket 64 output {o}"),
            );
        }
    }
}

/// `bench_lstm` on gpu:0, buckets 1 and 64: run resident through
/// [`CudaEngine::compile_resident_with`] with `options`, and on its graphs
/// alone.
fn bench_lstm_resident_and_graphs(
    options: &tickserve_engine_cuda::ResidentOptions,
) -> (
    tickserve_engine_cuda::ResidentModel,
    tickserve_engine_cuda::CudaModel,
) {
    let bench = support::bench_models();
    let path = bench.path().join("bench_lstm/1/model.onnx");
    resident_and_graphs(&path, &bench_lstm_state(), options)
}

/// The model at `path` on gpu:0, buckets 1 and 64, its state paired as
/// `state` says: run resident with `options`, and on its graphs alone.
fn resident_and_graphs(
    path: &std::path::Path,
    state: &[tickserve_core::sequence::StateConfig],
    options: &tickserve_engine_cuda::ResidentOptions,
) -> (
    tickserve_engine_cuda::ResidentModel,
    tickserve_engine_cuda::CudaModel,
) {
    let onnx = read(path);
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let imported = import(&onnx, &signature.inputs, None).unwrap();
    let cuda = CudaEngine::new(CudaOptions::default());
    let buckets = Buckets::new(&[1, 64], None).unwrap();
    let request = CudaCompileRequest {
        family: "resident",
        imported: &imported,
        signature: &signature,
        buckets: &buckets,
        ordinal: 0,
        first_member: SOLE_MEMBER,
    };
    let resident = cuda.compile_resident_with(&request, state, options);
    let model = match resident.unwrap() {
        Ok(model) => model,
        Err((why, _)) => panic!("{}: not resident: {why}", path.display()),
    };
    let graphs = cuda.compile(&request).unwrap();
    (model, graphs)
}

/// PyTorch's stateful LSTM step (its state sliced per layer and joined
/// again) and a graph of every dense op the importer takes (a product over
/// groups, copies, a sum of two activations), each compiled resident, on
/// one block a slot and on clusters of 2 with their weights on chip: bucket
/// 1 runs on the kernel and answers as the graphs do, run after run.
#[test]
#[ignore = "needs a GPU"]
fn a_family_compiled_resident_from_layout_and_elementwise_ops_answers_as_its_graphs_do() {
    let exported = root().join("crates/tickserve-engine-cuda/tests/exported");
    let fixtures = fixtures();
    let models = [
        (
            exported.join("pt_lstm_state/1/model.onnx"),
            state_configs(&crate::resident::STATE),
        ),
        (fixtures.path().join("cuda_ops/1/model.onnx"), Vec::new()),
    ];
    let shapes = [
        tickserve_engine_cuda::ResidentOptions::default(),
        tickserve_engine_cuda::ResidentOptions {
            split: 2,
            on_chip: usize::MAX,
            ..Default::default()
        },
    ];
    let mut seed = 11;
    for (path, state) in &models {
        for options in &shapes {
            let (mut model, mut graphs) = resident_and_graphs(path, state, options);
            for run in 0..20 {
                assert!(
                    answers_as_graphs(&mut model, &mut graphs, (0, SOLE_MEMBER), &mut seed),
                    "{} split {}: run {run} off the kernel",
                    path.display(),
                    options.split
                );
            }
        }
    }
}

/// Per `bench_lstm` state pair: its input's index among the signature's
/// inputs, and its output's among the outputs.
fn fed_back(signature: &tickserve_onnx::PartialSignature) -> Vec<(usize, usize)> {
    crate::resident::BENCH_LSTM_STATE
        .iter()
        .map(|(i, o)| {
            let input = signature.inputs.iter().position(|t| t.name == *i).unwrap();
            let output = signature.outputs.iter().position(|t| t.0 == *o).unwrap();
            (input, output)
        })
        .collect()
}

/// A resident family whose kernel stops answering (its blocks told to
/// return behind the model's back) fails over to its graphs on that run:
/// the run answers, as the graphs answer, and every later run is the
/// graphs' (device time measured again); never a hang.
#[test]
#[ignore = "needs a GPU"]
fn a_resident_family_whose_kernel_stops_answering_fails_over_to_its_graphs() {
    let (mut model, mut graphs) = bench_lstm_resident_and_graphs(&Default::default());
    let mut seed = 3;
    let mut same_run = |model: &mut tickserve_engine_cuda::ResidentModel,
                        graphs: &mut tickserve_engine_cuda::CudaModel| {
        answers_as_graphs(model, graphs, (1, SOLE_MEMBER), &mut seed)
    };
    same_run(&mut model, &mut graphs);
    assert!(model.is_resident() && model.device_time().is_none());
    model.kernel().unwrap().mailboxes().stop_all();
    same_run(&mut model, &mut graphs);
    assert!(!model.is_resident(), "still resident");
    same_run(&mut model, &mut graphs);
    assert!(model.device_time().is_some(), "not on the graphs");
}

/// A resident family ticks sequences as the executor does: each round some
/// of 62 sequences, in another order, as the first rows of bucket 64 (the
/// rest padding, left unrun: `run_rows`), and two more by turns alone in
/// bucket 1. Every row answers as the graphs do on the same inputs, and,
/// each row placed on the slot its sequence last ticked in, no tick brings
/// its state over the bus.
#[test]
#[ignore = "needs a GPU"]
fn sequences_keep_their_slots_on_a_resident_family_and_bring_no_state() {
    let (mut model, mut graphs) = bench_lstm_resident_and_graphs(&Default::default());
    let bench = support::bench_models();
    let onnx = read(&bench.path().join("bench_lstm/1/model.onnx"));
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let fed_back = fed_back(&signature);
    let state_of = |i: usize| fed_back.iter().position(|&(si, _)| si == i);
    // Each sequence's state, as the server holds it: zeros at first.
    let widths: Vec<usize> = (0..signature.inputs.len())
        .map(|i| model.input_mut(0, i).len())
        .collect();
    let mut states: Vec<Vec<Vec<u8>>> = (0..64)
        .map(|_| {
            fed_back
                .iter()
                .map(|&(i, _)| vec![0u8; widths[i]])
                .collect()
        })
        .collect();
    let outputs = signature.outputs.len();
    let mut seed = 40u64;
    // Sequences `rows` as the first rows of bucket `bucket`, on both.
    let mut tick = |model: &mut tickserve_engine_cuda::ResidentModel,
                    graphs: &mut tickserve_engine_cuda::CudaModel,
                    bucket: usize,
                    rows: &[usize],
                    round: u64| {
        for (r, &s) in rows.iter().enumerate() {
            for (i, &width) in widths.iter().enumerate() {
                let bytes = match state_of(i) {
                    Some(k) => states[s][k].clone(),
                    None => {
                        seed += 1;
                        le_bytes(&tickserve_engine_cuda::reference::random_rows(
                            seed,
                            width / 4,
                        ))
                    }
                };
                model.input_mut(bucket, i)[r * width..(r + 1) * width].copy_from_slice(&bytes);
                graphs.input_mut(bucket, i)[r * width..(r + 1) * width].copy_from_slice(&bytes);
            }
        }
        model.run_rows(bucket, rows.len(), &[SOLE_MEMBER]).unwrap();
        graphs.run(bucket, SOLE_MEMBER).unwrap();
        for o in 0..outputs {
            let width = model.output(bucket, o).len() / model.buckets().sizes()[bucket];
            for (r, &s) in rows.iter().enumerate() {
                let got = &model.output(bucket, o)[r * width..(r + 1) * width];
                let want = &graphs.output(bucket, o)[r * width..(r + 1) * width];
                assert_close(got, want, &format!("round {round} sequence {s} output {o}"));
                if let Some(k) = fed_back.iter().position(|&(_, so)| so == o) {
                    states[s][k] = got.to_vec();
                }
            }
        }
    };
    for round in 0..100u64 {
        let rows = crate::resident::round_rows(round, 62);
        tick(&mut model, &mut graphs, 1, &rows, round);
        tick(
            &mut model,
            &mut graphs,
            0,
            &[62 + (round % 2) as usize],
            round,
        );
    }
    assert!(model.is_resident(), "failed over");
    assert_eq!(model.states_given(), 0, "ticks that brought their state");
}

/// A resident family whose weight table holds two members: a third runs
/// on its graphs (and answers as they do) while the first two stay on the
/// kernel; a member removed frees its row for the next; a member replaced
/// by weights its graphs refuse keeps its old weights, on the kernel.
#[test]
#[ignore = "needs a GPU"]
fn a_member_the_resident_table_cannot_hold_runs_on_the_graphs() {
    let (mut model, mut graphs) =
        bench_lstm_resident_and_graphs(&tickserve_engine_cuda::ResidentOptions {
            members: 2,
            ..Default::default()
        });
    let bench = support::bench_models();
    let onnx = read(&bench.path().join("bench_lstm/1/model.onnx"));
    let signature = onnx.signature(&ModelConfig::default()).unwrap();
    let imported = import(&onnx, &signature.inputs, None).unwrap();
    let member = |m: u32| scaled(&imported.weights, 1.0 - m as f32 / 16.0);
    for m in 1..=3 {
        model.add_member(m, &member(m)).unwrap();
        graphs.add_member(m, &member(m)).unwrap();
    }
    let mut seed = 77;
    // Member `m`'s bucket-1 run on both, on the same inputs: where it ran
    // (the kernel measures no device time) and the same answer.
    let mut resident =
        |model: &mut tickserve_engine_cuda::ResidentModel,
         graphs: &mut tickserve_engine_cuda::CudaModel,
         m: u32| { answers_as_graphs(model, graphs, (0, m), &mut seed) };
    assert!(
        resident(&mut model, &mut graphs, 1),
        "member 1 off the kernel"
    );
    assert!(
        !resident(&mut model, &mut graphs, 2),
        "member 2 on a full table"
    );
    assert!(resident(&mut model, &mut graphs, SOLE_MEMBER));
    assert!(model.is_resident(), "failed over");
    // Member 1 removed: member 3, added again, takes its row.
    model.remove_member(1);
    graphs.remove_member(1);
    model.add_member(3, &member(3)).unwrap();
    graphs.add_member(3, &member(3)).unwrap();
    assert!(
        resident(&mut model, &mut graphs, 3),
        "member 3 off the kernel"
    );
    // Weights the graphs refuse (one tensor short): member 3 keeps its old
    // weights, on the kernel.
    let short = &member(4)[1..];
    assert!(model.add_member(3, short).is_err());
    assert!(
        resident(&mut model, &mut graphs, 3),
        "member 3 lost its row"
    );
}

/// A family on clusters of 8 blocks, its weights on chip: the device does
/// not hold 64 slots of 8 blocks at once, so the kernel has fewer slots and
/// bucket 64 runs on the graphs, bucket 1 on the kernel; both answer as
/// the graphs do.
#[test]
#[ignore = "needs a GPU"]
fn a_bucket_larger_than_the_slots_the_device_holds_runs_on_the_graphs() {
    let options = tickserve_engine_cuda::ResidentOptions {
        split: 8,
        on_chip: usize::MAX,
        ..Default::default()
    };
    let (mut model, mut graphs) = bench_lstm_resident_and_graphs(&options);
    let kernel = model.kernel().unwrap();
    let (slots, held) = (kernel.slots(), kernel.layout().on_chip_bytes);
    println!("bench_lstm on clusters of 8: {slots} slots, {held} bytes of weights on chip a block");
    assert!(
        slots < 64 && held > 0,
        "{slots} slots, {held} bytes on chip"
    );
    let mut seed = 5;
    for _ in 0..3 {
        for bucket in [0, 1] {
            let resident =
                answers_as_graphs(&mut model, &mut graphs, (bucket, SOLE_MEMBER), &mut seed);
            assert_eq!(resident, bucket == 0, "bucket {bucket}");
        }
    }
}

/// A family on its CUDA graphs dropped (unloaded) on the device where
/// another family's resident kernel runs: the drop returns within 5 s, and
/// the resident family still answers on its kernel. Where freeing device
/// memory waits for the device to go idle (which a resident kernel never
/// lets it), the drop waits for ever: the test then stops the kernel (so
/// the drop returns) and fails saying so.
#[test]
#[ignore = "needs a GPU"]
fn a_graphs_family_unloads_while_a_resident_kernel_runs() {
    let (mut model, graphs) = bench_lstm_resident_and_graphs(&Default::default());
    let (done, dropped) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(graphs);
        let _ = done.send(());
    });
    let returned = dropped
        .recv_timeout(std::time::Duration::from_secs(5))
        .is_ok();
    if !returned {
        model.kernel().unwrap().mailboxes().stop_all();
    }
    dropper.join().unwrap();
    assert!(
        returned,
        "dropping a family on CUDA graphs waited for the resident kernel of another"
    );
    let mut seed = 9;
    fill(&mut model, 0, &mut seed);
    model.run(0, SOLE_MEMBER).unwrap();
    assert!(model.is_resident() && model.device_time().is_none());
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
