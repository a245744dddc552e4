//! The runtime on the real ONNX Runtime engine and the sample repository:
//! bucketed, padded and split runs give each row the answer it gets alone.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tickserve_core::Error;
use tickserve_core::config::ServerConfig;

use tickserve_runtime::{ModelHandle, Runtime, RuntimeError, VersionState};

use crate::support;
use support::{copy_sample_model, request, root};
use tokio::task::JoinHandle;

fn sample_runtime() -> Runtime {
    runtime_with(|_| {})
}

fn runtime_with(adjust: impl FnOnce(&mut ServerConfig)) -> Runtime {
    let mut config = ServerConfig::default();
    config.repository.path = root().join("config/models");
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    adjust(&mut config);
    Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)")
}

fn features(rows: usize, width: usize, seed: u32) -> Vec<f32> {
    (0..rows * width)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Each row of `x` run alone through `model` (input `features`, `width` wide):
/// the unbatched answers batched runs are compared with.
async fn single_row_answers(runtime: &Runtime, model: &str, width: usize, x: &[f32]) -> Vec<f32> {
    let mut answers = Vec::new();
    for row in x.chunks_exact(width) {
        let out = runtime
            .infer(request(model, "features", vec![1, width as i64], row))
            .await
            .unwrap();
        answers.extend(floats(&out.outputs[0].data));
    }
    answers
}

#[tokio::test]
async fn every_row_count_matches_single_row_runs() {
    let runtime = sample_runtime();
    assert!(runtime.all_ready());
    let rows = 200;
    let x = features(rows, 50, 7);
    let singles = single_row_answers(&runtime, "alpha_mlp", 50, &x).await;
    for n in [1, 3, 64, 65, 200] {
        let out = runtime
            .infer(request(
                "alpha_mlp",
                "features",
                vec![n as i64, 50],
                &x[..n * 50],
            ))
            .await
            .unwrap();
        assert_eq!(out.outputs[0].shape, vec![n as i64, 3]);
        let got = floats(&out.outputs[0].data);
        for (a, b) in got.iter().zip(&singles[..n * 3]) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-6),
                "{n} rows: {a} vs {b}"
            );
        }
    }
    runtime.shutdown();
}

#[tokio::test]
async fn refusals_name_the_problem() {
    let runtime = sample_runtime();
    let err = runtime
        .infer(request("alpha_mlp", "features", vec![1, 49], &[0.0; 49]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let err = runtime
        .infer(request("nope", "x", vec![1], &[0.0]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ModelNotFound { .. }), "{err}");
    let models = runtime.models();
    assert!(matches!(
        models["seq_lstm"].default_version(),
        Some((1, VersionState::Ready(_)))
    ));
    runtime.shutdown();
}

/// Concurrent callers, some run inline and some queued to the executor thread:
/// each gets exactly the answer for its own rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_get_their_own_rows() {
    let runtime = std::sync::Arc::new(sample_runtime());
    let x = features(150, 16, 3);
    let reference = single_row_answers(&runtime, "tick_003", 16, &x).await;
    let mut tasks = Vec::new();
    for caller in 0..48usize {
        let runtime = std::sync::Arc::clone(&runtime);
        let x = x.clone();
        let reference = reference.clone();
        tasks.push(tokio::spawn(async move {
            let start = (caller * 37) % 100;
            let rows = 1 + (caller * 53) % (150 - start);
            let out = runtime
                .infer(request(
                    "tick_003",
                    "features",
                    vec![rows as i64, 16],
                    &x[start * 16..(start + rows) * 16],
                ))
                .await
                .unwrap();
            let got = floats(&out.outputs[0].data);
            assert_eq!(got.len(), rows, "caller {caller}");
            // Equal within float rounding: a bucket's kernels may sum in
            // another order than the one-row bucket's; a mixed-up row would
            // be off by far more.
            for (a, b) in got.iter().zip(&reference[start..start + rows]) {
                assert!(
                    (a - b).abs() <= 1e-6 + 1e-5 * b.abs(),
                    "caller {caller}: {a} vs {b}"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A small deterministic generator (xorshift), so the property test needs no crate.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The batching property, with the real engine: many concurrent callers with
/// random row counts (1 to 150) and random arrival gaps, batched together
/// whenever the executor is busy; every caller gets exactly the unbatched
/// answer for its own rows — nothing lost, duplicated, mixed or padded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_callers_get_exactly_their_unbatched_rows() {
    batching_property(runtime_with(roomy_queue)).await;
}

/// The property tests send bursts of thousands of rows: give the queue room,
/// so that what is tested is batching, not shedding.
fn roomy_queue(config: &mut ServerConfig) {
    config.model_defaults.max_queue_rows = 1 << 20;
}

/// The same with two executors sharing the model's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_executors_batch_correctly() {
    batching_property(runtime_with(|c| {
        roomy_queue(c);
        c.model_defaults.executors = 2;
    }))
    .await;
}

/// The same with requests waiting up to 200 µs for company.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_delay_batches_correctly() {
    batching_property(runtime_with(|c| {
        roomy_queue(c);
        c.model_defaults.max_queue_delay = std::time::Duration::from_micros(200);
    }))
    .await;
}

async fn batching_property(runtime: Runtime) {
    let runtime = std::sync::Arc::new(runtime);
    let pool_rows = 400;
    let x = features(pool_rows, 50, 11);
    let reference = single_row_answers(&runtime, "alpha_mlp", 50, &x).await;
    let handle = runtime.model("alpha_mlp", None).unwrap();
    let runs_before = handle.stats.snapshot().execution_count;
    let mut rng = Xorshift(0x9E37_79B9_7F4A_7C15);
    let buckets = handle.settings.buckets.clone();
    let mut runs_if_alone = 0;
    let mut tasks = Vec::new();
    for caller in 0..300u64 {
        let rows = 1 + rng.below(150) as usize;
        let start = rng.below((pool_rows - rows) as u64 + 1) as usize;
        // The first 100 arrive at once; the rest at random times within 60 ms.
        let arrival = if caller < 100 { 0 } else { rng.below(60_000) };
        runs_if_alone += buckets.plan(rows).count() as u64;
        let runtime = std::sync::Arc::clone(&runtime);
        let x = x.clone();
        let want: Vec<f32> = reference[start * 3..(start + rows) * 3].to_vec();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_micros(arrival)).await;
            let out = runtime
                .infer(request(
                    "alpha_mlp",
                    "features",
                    vec![rows as i64, 50],
                    &x[start * 50..(start + rows) * 50],
                ))
                .await
                .unwrap();
            assert_eq!(
                out.outputs[0].shape,
                vec![rows as i64, 3],
                "caller {caller}"
            );
            let got = floats(&out.outputs[0].data);
            assert_eq!(
                got.len(),
                want.len(),
                "caller {caller}: no padding row returned"
            );
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1e-6),
                    "caller {caller}: {a} vs {b}"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let runs = handle.stats.snapshot().execution_count - runs_before;
    println!("{runs} engine runs for {runs_if_alone} unbatched");
    assert!(
        runs < runs_if_alone,
        "requests were batched: {runs} runs for {runs_if_alone} unbatched"
    );
}

/// Sharing off, for the server or for one model in its `model.toml`, compiles
/// that model alone with constant weights; the answers are the same either way.
#[tokio::test]
async fn sharing_can_be_turned_off_for_the_server_and_per_model() {
    let x = features(64, 16, 5);
    let off = runtime_with(|c| c.model_defaults.share_weights = false);
    assert!(off.ready_handles().iter().all(|h| !h.shares_graph));
    let scratch = tempfile::tempdir().unwrap();
    for model in ["tick_000", "tick_001"] {
        let version = scratch.path().join(model).join("1");
        std::fs::create_dir_all(&version).unwrap();
        std::fs::copy(
            root()
                .join("config/models")
                .join(model)
                .join("1/model.onnx"),
            version.join("model.onnx"),
        )
        .unwrap();
    }
    std::fs::write(
        scratch.path().join("tick_000/model.toml"),
        "share_weights = false\n",
    )
    .unwrap();
    let mixed = runtime_with(|c| c.repository.path = scratch.path().to_path_buf());
    assert!(!mixed.model("tick_000", None).unwrap().shares_graph);
    assert!(mixed.model("tick_001", None).unwrap().shares_graph);
    for model in ["tick_000", "tick_001"] {
        let want = single_row_answers(&off, model, 16, &x).await;
        let got = single_row_answers(&mixed, model, 16, &x).await;
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-6 + 1e-5 * b.abs(),
                "{model}: {a} vs {b}"
            );
        }
        let batch = mixed
            .infer(request(model, "features", vec![64, 16], &x))
            .await
            .unwrap();
        for (a, b) in floats(&batch.outputs[0].data).iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-6 + 1e-5 * b.abs(),
                "{model} batched: {a} vs {b}"
            );
        }
    }
    off.shutdown();
    mixed.shutdown();
}

#[test]
fn a_gpu_that_is_not_there_stops_the_start_naming_it() {
    use tickserve_core::config::Placement;
    let mut config = ServerConfig::default();
    config.repository.path = root().join("config/models");
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    config.model_defaults.devices = vec![Placement::Gpu(99)];
    let error = Runtime::load(&config).err().expect("no machine has gpu:99");
    assert!(matches!(error, RuntimeError::Placement(_)), "{error:?}");
    let error = error.to_string();
    assert!(
        error.contains("gpu:99") && error.contains("not available"),
        "{error}"
    );

    // The same in one model's model.toml names the model.
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("devices = [\"gpu:99\"]\n"));
    config.model_defaults.devices = vec![Placement::Auto];
    config.repository.path = dir.path().to_path_buf();
    let error = Runtime::load(&config).err().expect("no machine has gpu:99");
    assert!(matches!(error, RuntimeError::Placement(_)), "{error:?}");
    let error = error.to_string();
    assert!(
        error.contains("model alpha_mlp") && error.contains("gpu:99"),
        "{error}"
    );
}

#[tokio::test]
async fn auto_without_a_gpu_serves_on_the_cpu() {
    let runtime = sample_runtime();
    if tickserve_engine_cuda::Gpus::probe().devices().is_empty() {
        for handle in runtime.ready_handles() {
            assert_eq!(handle.device, "cpu", "{}", handle.name);
        }
    }
}

/// Two replicas of every model (here both on the CPU; on the GPU machine the
/// same routing spreads over GPUs): requests go to the shorter queue, taking
/// turns when equal, so both replicas serve and every answer is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_both_serve_and_answer_alike() {
    use tickserve_core::config::Placement;
    let runtime = std::sync::Arc::new(runtime_with(|c| {
        c.model_defaults.devices = vec![Placement::Cpu, Placement::Cpu];
    }));
    assert!(runtime.all_ready());
    let handle = runtime.model("tick_002", None).unwrap();
    assert_eq!(handle.device, "cpu,cpu");
    let x = features(40, 16, 5);
    let alone = single_row_answers(&runtime, "tick_002", 16, &x).await;
    let mut tasks = Vec::new();
    for (i, row) in x.chunks_exact(16).enumerate() {
        let runtime = std::sync::Arc::clone(&runtime);
        let row = row.to_vec();
        tasks.push(tokio::spawn(async move {
            let out = runtime
                .infer(request("tick_002", "features", vec![1, 16], &row))
                .await
                .unwrap();
            (i, floats(&out.outputs[0].data))
        }));
    }
    for task in tasks {
        // Batched rows run in another bucket than one row alone; ONNX
        // Runtime's kernels differ per bucket size by a few ulps.
        let (i, got) = task.await.unwrap();
        assert!(
            (got[0] - alone[i]).abs() <= 1e-5,
            "row {i}: {got:?} vs {}",
            alone[i]
        );
    }
    let runs = handle.replica_runs();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter().all(|(_, n)| *n > 0),
        "both replicas ran: {runs:?}"
    );
}

/// On the GPU machine (`--ignored`): two replicas on gpu:0 (so two executors,
/// each with its own stream, handle and graphs, on one card) both serve and
/// answer what the CPU answers; `seq_lstm` (an LSTM) is placed there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a GPU"]
async fn two_executors_on_one_gpu_both_serve_and_match_the_cpu() {
    use tickserve_core::config::Placement;
    let gpu = std::sync::Arc::new(runtime_with(|c| {
        c.model_defaults.devices = vec![Placement::Gpu(0), Placement::Gpu(0)];
    }));
    // The reference runs on the CPU by name: `auto` is the GPU on this machine.
    let cpu = runtime_with(|c| c.model_defaults.devices = vec![Placement::Cpu]);
    assert_eq!(cpu.model("alpha_mlp", None).unwrap().device, "cpu");
    assert!(gpu.all_ready());
    assert_eq!(gpu.model("alpha_mlp", None).unwrap().device, "gpu:0,gpu:0");
    assert_eq!(gpu.model("seq_lstm", None).unwrap().device, "gpu:0,gpu:0");
    for (model, width) in [("alpha_mlp", 50), ("tick_005", 16)] {
        let x = features(64, width, 9);
        let want = cpu
            .infer(request(model, "features", vec![64, width as i64], &x))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let gpu = std::sync::Arc::clone(&gpu);
            let x = x.clone();
            tasks.push(tokio::spawn(async move {
                gpu.infer(request(model, "features", vec![64, width as i64], &x))
                    .await
                    .unwrap()
            }));
        }
        for task in tasks {
            let got = task.await.unwrap();
            for (g, c) in floats(&got.outputs[0].data)
                .iter()
                .zip(floats(&want.outputs[0].data))
            {
                assert!(
                    (g - c).abs() <= 1e-5 * c.abs().max(1.0),
                    "{model}: gpu {g}, cpu {c}"
                );
            }
        }
        let runs = gpu.model(model, None).unwrap().replica_runs();
        assert!(runs.iter().all(|(_, n)| *n > 0), "{model}: {runs:?}");
    }
    // Executors joined before the process exits: dropped unjoined, they still held
    // their CUDA contexts while the driver tore down, and the binary exited 139 after
    // its test passed (H200, driver 580.159).
    let gpu = std::sync::Arc::try_unwrap(gpu)
        .unwrap_or_else(|_| panic!("every task that held the GPU runtime has ended"));
    gpu.shutdown();
    cpu.shutdown();
}

/// On the GPU machine (`--ignored`): one-row requests of the eight `tick_*`
/// members (one family) at once, round after round, on gpu:0: rows of
/// several members share runs (fewer than half as many runs as requests,
/// where batches of one member would need one run per request) and every
/// answer is what the CPU answers for that member and row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a GPU"]
async fn rows_of_several_members_share_gpu_runs_and_match_the_cpu() {
    use tickserve_core::config::Placement;
    const ROUNDS: usize = 20;
    let members: Vec<String> = (0..8).map(|m| format!("tick_{m:03}")).collect();
    let x = features(ROUNDS * members.len(), 16, 13);
    let cpu = runtime_with(|c| c.model_defaults.devices = vec![Placement::Cpu]);
    let mut want = Vec::new();
    for (i, row) in x.chunks_exact(16).enumerate() {
        let m = &members[i % members.len()];
        let out = cpu.infer(request(m, "features", vec![1, 16], row)).await;
        want.push(floats(&out.unwrap().outputs[0].data));
    }
    let gpu = Arc::new(runtime_with(|c| {
        c.model_defaults.devices = vec![Placement::Gpu(0)];
        c.model_defaults.max_queue_delay = std::time::Duration::from_micros(500);
    }));
    let handle = gpu.model("tick_000", None).unwrap();
    assert_eq!(handle.device, "gpu:0");
    let before = runs_so_far(&handle);
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for (m, name) in members.iter().enumerate() {
            let (gpu, name) = (Arc::clone(&gpu), name.clone());
            let i = round * members.len() + m;
            let row = x[i * 16..(i + 1) * 16].to_vec();
            tasks.push(tokio::spawn(async move {
                let out = gpu
                    .infer(request(&name, "features", vec![1, 16], &row))
                    .await;
                (i, floats(&out.unwrap().outputs[0].data))
            }));
        }
        for task in tasks {
            let (i, got) = task.await.unwrap();
            for (g, c) in got.iter().zip(&want[i]) {
                assert!(
                    (g - c).abs() <= 1e-5 * c.abs().max(1.0),
                    "request {i} ({}): gpu {g}, cpu {c}",
                    members[i % members.len()]
                );
            }
        }
    }
    let runs = runs_so_far(&handle) - before;
    let requests = (ROUNDS * members.len()) as u64;
    assert!(
        runs * 2 < requests,
        "{runs} runs for {requests} requests of 8 members"
    );
    drop(handle);
    let gpu = Arc::try_unwrap(gpu)
        .unwrap_or_else(|_| panic!("every task that held the GPU runtime has ended"));
    gpu.shutdown();
    cpu.shutdown();
}

/// Bucket runs of a model's families (by any member, on any replica) so far.
fn runs_so_far(handle: &ModelHandle) -> u64 {
    handle.replica_runs().iter().map(|(_, n)| n).sum()
}

/// Rows in the one request that keeps `seq_lstm`'s executor busy: 512 bucket
/// runs, a few hundred milliseconds.
const BUSY_ROWS: usize = 32_768;

/// A runtime whose `seq_lstm` executor has taken one `BUSY_ROWS`-row request
/// (so later requests queue behind it): the runtime, `seq_lstm`'s handle,
/// its run count before that request, and the task awaiting the request.
async fn busy_seq_lstm() -> (Arc<Runtime>, Arc<ModelHandle>, u64, JoinHandle<()>) {
    let runtime = Arc::new(runtime_with(|config| {
        config.model_defaults.max_request_rows = BUSY_ROWS;
        config.model_defaults.max_queue_rows = 2 * BUSY_ROWS;
    }));
    let handle = runtime.model("seq_lstm", None).unwrap();
    let before = runs_so_far(&handle);
    let big = request(
        "seq_lstm",
        "window",
        vec![BUSY_ROWS as i64, 30, 8],
        &features(BUSY_ROWS, 240, 3),
    );
    let busy = tokio::spawn({
        let runtime = Arc::clone(&runtime);
        async move {
            runtime.infer(big).await.unwrap();
        }
    });
    // Bounded: a setup request that is refused (or never runs) fails here,
    // naming why, instead of hanging the suite.
    let started = std::time::Instant::now();
    while runs_so_far(&handle) == before {
        assert!(
            !busy.is_finished(),
            "the busy request ended before it ran (refused?); runs still {before}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the busy request did not start running within 10 s"
        );
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    (runtime, handle, before, busy)
}

/// Waits for `busy`, then shuts the runtime down, which returns once the
/// executors have answered everything queued: after it, run counts are final.
async fn finish(runtime: Arc<Runtime>, busy: JoinHandle<()>) {
    busy.await.unwrap();
    let Ok(runtime) = Arc::try_unwrap(runtime) else {
        panic!("a task still holds the runtime");
    };
    runtime.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_left_is_never_computed() {
    let (runtime, handle, before, busy) = busy_seq_lstm().await;
    let callers: Vec<_> = (0..5)
        .map(|i| {
            let runtime = Arc::clone(&runtime);
            tokio::spawn(async move {
                let x = features(1, 240, 100 + i);
                let _ = runtime
                    .infer(request("seq_lstm", "window", vec![1, 30, 8], &x))
                    .await;
            })
        })
        .collect();
    // Each caller is admitted and queued behind the busy executor...
    while handle.queue.rows() < 5 {
        assert!(
            !busy.is_finished(),
            "the executor was free before the callers queued"
        );
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    // ...then leaves, as a client that hung up does.
    for caller in &callers {
        caller.abort();
    }
    for caller in callers {
        let _ = caller.await;
    }
    finish(runtime, busy).await;
    // The busy request's runs, and nothing for the callers that left.
    assert_eq!(runs_so_far(&handle) - before, (BUSY_ROWS / 64) as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_expires_in_the_queue_is_refused_and_never_computed() {
    let (runtime, handle, before, busy) = busy_seq_lstm().await;
    let mut late = request("seq_lstm", "window", vec![1, 30, 8], &features(1, 240, 9));
    late.request.deadline = Some(Instant::now() + Duration::from_millis(1));
    let err = runtime.infer(late).await.unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
    finish(runtime, busy).await;
    assert_eq!(runs_so_far(&handle) - before, (BUSY_ROWS / 64) as u64);
}

/// Writes `repository/name/1/model.onnx`: `y = features · W`, `W` (4 × 2) a
/// `Constant` node of `w` (no initializer: the graph holds every value).
fn weightless_model(repository: &std::path::Path, name: &str, w: [f32; 8]) {
    let dir = repository.join(name).join("1");
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "import onnx, sys\n\
         from onnx import helper as h, TensorProto as T\n\
         w = h.make_tensor('w', T.FLOAT, [4, 2], {w:?})\n\
         g = h.make_graph([h.make_node('Constant', [], ['W'], value=w),\n\
                           h.make_node('MatMul', ['features', 'W'], ['y'])], 'g',\n\
             [h.make_tensor_value_info('features', T.FLOAT, ['N', 4])],\n\
             [h.make_tensor_value_info('y', T.FLOAT, ['N', 2])])\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)])\n\
         m.ir_version = 8\n\
         onnx.save(m, sys.argv[1])\n"
    );
    let status = std::process::Command::new(root().join(".venv/bin/python"))
        .args(["-c", &script])
        .arg(dir.join("model.onnx"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "writing {name} failed (run scripts/setup.sh)"
    );
}

/// Models whose graphs hold all their values (`Constant` nodes) share a
/// compiled graph only with models of the same values, and each loads.
#[tokio::test]
async fn models_of_one_weightless_graph_each_load() {
    let repository = tempfile::tempdir().unwrap();
    let ones = [1.0; 8];
    weightless_model(repository.path(), "const_a", ones);
    weightless_model(repository.path(), "const_b", ones);
    weightless_model(repository.path(), "const_c", [2.0; 8]);
    let mut config = ServerConfig::default();
    config.repository.path = repository.path().to_path_buf();
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    let runtime = Runtime::load(&config).unwrap();
    let x = [1.0, 2.0, 3.0, 4.0];
    for (model, expected) in [("const_a", 10.0), ("const_b", 10.0), ("const_c", 20.0)] {
        let answer = runtime
            .infer(request(model, "features", vec![1, 4], &x))
            .await
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(
            floats(&answer.outputs[0].data),
            vec![expected; 2],
            "{model}"
        );
    }
}
