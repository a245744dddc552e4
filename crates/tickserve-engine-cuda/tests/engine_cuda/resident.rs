//! The resident kernel, run on the CPU: its CUDA C compiled by the host's
//! C++ compiler behind an emulation of its blocks (a block's threads are OS
//! threads, its barrier a `std::barrier`, its shared arrays an arena of its
//! own, the mailbox's acquire and release the same orders on host
//! atomics), started once, and ticked through the host's own mailbox code
//! ([`Mailboxes`]) as the device is: the inputs, member and state flag
//! written, the asked tick raised with release order, the answered tick
//! awaited with acquire order. A sequence's 10,000 ticks, the host handing
//! back the state each answer gave (so the slot runs on the state it kept)
//! and restarting it once (so that tick brings its state), give what ONNX
//! Runtime gives with its own state fed back, within 1e-5; a member added
//! while the kernel runs answers with its weights from the first tick that
//! names it; slots tick at once and sequences move between them; a negative
//! tick ends the kernel. What it cannot show: the device's memory model
//! over PCIe, its scheduling, the round trip's time.

use std::path::Path;
use std::time::{Duration, Instant};

use tickserve_core::CompiledModel;
use tickserve_core::config::ModelConfig;
use tickserve_engine_cuda::kernels::{
    MAX_SPLIT, RESIDENT_BLOCK, Resident, resident, resident_split,
};
use tickserve_engine_cuda::mailbox::Mailboxes;
use tickserve_engine_cuda::plan::Plan;
use tickserve_engine_cuda::reference::{self, random_rows};
use tickserve_engine_cuda::{arrange, import};

use crate::support;

use support::{bench_models, floats, onnx_runtime, read, root, step_models};

/// What the kernel needs to build and run as host code, before its source.
const EMULATION: &str = r#"
#define TICKSERVE_EMULATED
#include <math.h>
#include <string.h>
#include <atomic>
#include <barrier>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
struct tickserve_dim { unsigned int x, y, z; };
static thread_local tickserve_dim blockIdx, blockDim, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
template <typename T> static inline T __ldcg(const T* p) { return *p; }
// A block's shared memory: one buffer per SHARED declaration, made by the
// first of its threads to reach it.
struct tickserve_arena {
    std::mutex lock;
    std::map<int, std::vector<char>> parts;
    void* get(int id, size_t bytes) {
        std::lock_guard<std::mutex> held(lock);
        auto& part = parts[id];
        if (part.empty()) part.resize(bytes);
        return part.data();
    }
    // The declaration and byte offset of `p`, inside one of its buffers.
    std::pair<int, size_t> locate(const void* p) {
        std::lock_guard<std::mutex> held(lock);
        for (auto& [id, part] : parts) {
            const char* at = (const char*)p;
            if (at >= part.data() && at < part.data() + part.size()) return {id, at - part.data()};
        }
        abort();
    }
};
static thread_local tickserve_arena* tickserve_shared;
static thread_local std::barrier<>* tickserve_block;
// A slot's cluster: its blocks' shared memory (by part) and one barrier
// for all of their threads.
static thread_local std::vector<tickserve_arena*>* tickserve_cluster_arenas;
static thread_local std::barrier<>* tickserve_cluster;
#define SHARED(type, name, n) type* name = (type*)tickserve_shared->get(__COUNTER__, sizeof(type) * (n))
#define DYNAMIC_SHARED(type, name, n) SHARED(type, name, n)
#define SYNC() tickserve_block->arrive_and_wait()
#define CLUSTER_SYNC() tickserve_cluster->arrive_and_wait()
static inline void CLUSTER_STORE(float* local, int rank, float v) {
    auto [id, offset] = tickserve_shared->locate(local);
    tickserve_arena* peer = (*tickserve_cluster_arenas)[rank];
    std::lock_guard<std::mutex> held(peer->lock);
    *(float*)(peer->parts.at(id).data() + offset) = v;
}
#define FENCE() std::atomic_thread_fence(std::memory_order_seq_cst)
static inline int load_acquire(const int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_release(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
// Warps: 32 lanes where a block has at least 32 threads (a shuffle is an
// exchange through the warp's own buffer between two of its barriers),
// else one lane a warp (no shuffle runs).
struct tickserve_warp_t {
    std::barrier<> at;
    float lanes[32];
    explicit tickserve_warp_t(int n) : at(n) {}
};
static thread_local int tickserve_lanes;
static thread_local tickserve_warp_t* tickserve_warp;
#define LANES tickserve_lanes
static inline float SHFL_XOR(float v, int o) {
    const int lane = threadIdx.x % tickserve_lanes;
    tickserve_warp->lanes[lane] = v;
    tickserve_warp->at.arrive_and_wait();
    const float other = tickserve_warp->lanes[lane ^ o];
    tickserve_warp->at.arrive_and_wait();
    return other;
}
"#;

/// Starts the kernel as `blocks` blocks of `threads` threads, all at once;
/// returns once every block has.
const LAUNCH: &str = r#"
extern "C" void tickserve_run_resident(int* box, const u64* table, float* state,
        unsigned int blocks, unsigned int threads) {
    std::vector<std::barrier<>*> barriers;
    std::vector<tickserve_arena*> arenas;
    std::vector<tickserve_warp_t*> warps;
    std::vector<std::barrier<>*> clusters;
    std::vector<std::vector<tickserve_arena*>> cluster_arenas(blocks / CLUSTER);
    std::vector<std::thread> all;
    const int lanes = threads >= 32 ? 32 : 1;
    const unsigned int per_block = threads / lanes;
    for (unsigned int b = 0; b < blocks; ++b) {
        barriers.push_back(new std::barrier<>(threads));
        arenas.push_back(new tickserve_arena());
        cluster_arenas[b / CLUSTER].push_back(arenas[b]);
        for (unsigned int w = 0; w < per_block; ++w) warps.push_back(new tickserve_warp_t(lanes));
    }
    for (unsigned int c = 0; c < blocks / CLUSTER; ++c)
        clusters.push_back(new std::barrier<>(CLUSTER * threads));
    for (unsigned int b = 0; b < blocks; ++b)
        for (unsigned int i = 0; i < threads; ++i)
            all.emplace_back([&, b, i] {
                blockIdx.x = b; blockDim.x = threads; threadIdx.x = i;
                tickserve_block = barriers[b];
                tickserve_shared = arenas[b];
                tickserve_cluster = clusters[b / CLUSTER];
                tickserve_cluster_arenas = &cluster_arenas[b / CLUSTER];
                tickserve_lanes = lanes;
                tickserve_warp = warps[b * per_block + i / lanes];
                resident(box, table, state);
            });
    for (auto& t : all) t.join();
    for (unsigned int b = 0; b < blocks; ++b) { delete barriers[b]; delete arenas[b]; }
    for (auto* c : clusters) delete c;
    for (auto* w : warps) delete w;
}
"#;

type Run = unsafe extern "C" fn(*mut i32, *const u64, *mut f32, u32, u32);

/// The longest a tick may take here before the test fails (no hang).
const TICK_BOUND: Duration = Duration::from_secs(10);

/// Rows of the emulated kernel's weight table.
const MEMBERS: usize = 8;

/// Shared memory a block may have, as on an H100 or H200.
const ON_CHIP: usize = 227 * 1024;

/// A resident kernel running on its own thread, and its slots' mailboxes.
struct Running {
    /// The slots' mailboxes, over `mailbox`: the host's half as the device
    /// runs it.
    mailboxes: Mailboxes,
    /// Each slot's mailbox, `mailbox_words` apart: the flag words, then
    /// the floats.
    mailbox: Vec<i32>,
    /// Per member, member-major, [`MEMBERS`] rows: a pointer per weight
    /// slot, then the row's version.
    table: Vec<u64>,
    /// Rows written so far.
    versions: u64,
    /// Every member's weights written to the table: alive until the kernel
    /// is joined.
    weights: Vec<Vec<Vec<f32>>>,
    weight_slots: usize,
    state: Vec<f32>,
    state_floats: usize,
    layout: Resident,
    kernel: Option<std::thread::JoinHandle<()>>,
    _library: libloading::Library,
    _dir: tempfile::TempDir,
}

impl Running {
    /// Builds `resident`'s kernel and starts it with `slots` slots, each a
    /// cluster of `resident.split` blocks of `threads` threads, `first`
    /// (one vector per weight slot) as member 0.
    fn start(resident: &Resident, first: &[Vec<f32>], slots: usize, threads: u32) -> Running {
        let (library, dir) =
            support::host_library(&format!("{EMULATION}\n{}\n{LAUNCH}", resident.source));
        let mut mailbox = vec![0; slots * resident.mailbox_words];
        // SAFETY: `mailbox` holds `slots` zeroed mailboxes; its heap buffer
        // is neither moved nor freed while `Running` (and so `mailboxes`)
        // lives; only the kernel's threads touch it besides.
        let mailboxes =
            unsafe { Mailboxes::new(mailbox.as_mut_ptr(), resident, slots, TICK_BOUND) };
        let mut running = Running {
            mailboxes,
            mailbox,
            table: vec![0; MEMBERS * (first.len() + 1)],
            versions: 0,
            weights: Vec::new(),
            weight_slots: first.len(),
            // A copy of its slot's state a block.
            state: vec![0.0; slots * resident.split * resident.state_floats],
            state_floats: resident.state_floats,
            layout: resident.clone(),
            kernel: None,
            _library: library,
            _dir: dir,
        };
        running.put(0, first);
        // SAFETY: the symbol this test's source defines, with that
        // signature.
        let run: Run = unsafe {
            *running
                ._library
                .get::<Run>(b"tickserve_run_resident")
                .unwrap()
        };
        // The kernel's threads read the mailbox, table and state through
        // these until they are told to stop and joined ([`Running::stop`]);
        // none of the three is moved or freed before.
        let pointers = (
            running.mailbox.as_mut_ptr() as usize,
            running.table.as_ptr() as usize,
            running.state.as_mut_ptr() as usize,
        );
        let blocks = (slots * resident.split) as u32;
        running.kernel = Some(std::thread::spawn(move || {
            let (mailbox, table, state) = pointers;
            // SAFETY: see above.
            unsafe {
                run(
                    mailbox as *mut i32,
                    table as *const u64,
                    state as *mut f32,
                    blocks,
                    threads,
                )
            }
        }));
        running
    }

    /// Writes `weights` as member `member` (a row of the table), while the
    /// kernel runs; no tick of that member is running.
    fn put(&mut self, member: usize, weights: &[Vec<f32>]) {
        let kept = weights.to_vec();
        let pointers: Vec<u64> = kept.iter().map(|w| w.as_ptr() as u64).collect();
        self.weights.push(kept);
        self.write_row(member, &pointers);
    }

    /// Writes `weights` over the buffers member `member`'s row names (the
    /// same addresses, as a freed member's may come back for another) and
    /// raises the row's version; no tick is running.
    fn rewrite(&mut self, member: usize, weights: &[Vec<f32>]) {
        let stride = self.weight_slots + 1;
        let pointers = self.table[member * stride..member * stride + self.weight_slots].to_vec();
        let held = (self.weights.iter_mut())
            .find(|w| w[0].as_ptr() as u64 == pointers[0])
            .unwrap();
        for (old, new) in held.iter_mut().zip(weights) {
            old.copy_from_slice(new);
        }
        self.write_row(member, &pointers);
    }

    /// Row `member` of the table: `pointers`, then its next version.
    fn write_row(&mut self, member: usize, pointers: &[u64]) {
        self.versions += 1;
        let stride = self.weight_slots + 1;
        let row = &mut self.table[member * stride..(member + 1) * stride];
        row[..self.weight_slots].copy_from_slice(pointers);
        row[self.weight_slots] = self.versions;
    }

    /// Asks slot `slot` for a tick of `member`: every plan input's floats.
    fn ask(&mut self, slot: usize, member: usize, inputs: &[Vec<f32>]) {
        let bytes: Vec<Vec<u8>> = inputs.iter().map(|x| le_bytes(x)).collect();
        self.mailboxes.ask(slot, member, |i| &bytes[i]).unwrap();
    }

    /// Waits for slot `slot`'s answer: every plan output's floats.
    fn wait(&mut self, slot: usize) -> Vec<Vec<f32>> {
        let mut outputs = vec![Vec::new(); self.layout.outputs.len()];
        self.mailboxes
            .wait(slot, |o, bytes| outputs[o] = floats(bytes))
            .unwrap();
        outputs
    }

    /// Slot `slot`'s state, between two of its ticks.
    fn state_of(&self, slot: usize) -> Vec<f32> {
        let at = slot * self.layout.split * self.state_floats;
        self.state[at..at + self.state_floats].to_vec()
    }

    /// Tells every block to return and waits for them, within the bound.
    #[allow(clippy::disallowed_methods)] // a hang's bound: real time is the point
    fn stop(mut self) {
        self.mailboxes.stop_all();
        let kernel = self.kernel.take().unwrap();
        let started = Instant::now();
        while !kernel.is_finished() {
            assert!(started.elapsed() < TICK_BOUND, "the kernel did not return");
            std::thread::sleep(Duration::from_millis(1));
        }
        kernel.join().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed assertion: stop the kernel before its buffers go.
        if let Some(kernel) = self.kernel.take() {
            self.mailboxes.stop_all();
            let _ = kernel.join();
        }
    }
}

/// `floats` as little-endian bytes.
pub fn le_bytes(floats: &[f32]) -> Vec<u8> {
    floats.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// A resident kernel's slot 0 as the tests tick it: emulated here, or on a
/// GPU (`gpu`).
pub trait Ticker {
    /// One tick of member `member`: every plan input's floats in (the
    /// state's too, as the server holds it), every plan output's out.
    fn tick(&mut self, member: usize, inputs: &[Vec<f32>]) -> Vec<Vec<f32>>;
    /// The state the slot keeps on the device, read back between ticks.
    fn state(&self) -> Vec<f32>;
    /// Writes `weights` (one vector per weight slot) as member `member`,
    /// while the kernel runs.
    fn put(&mut self, member: usize, weights: &[Vec<f32>]);
    /// How many ticks brought their state.
    fn states_given(&self) -> u64;
}

/// Slot 0 of an emulated kernel.
impl Ticker for Running {
    fn tick(&mut self, member: usize, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
        self.ask(0, member, inputs);
        self.wait(0)
    }

    fn state(&self) -> Vec<f32> {
        self.state_of(0)
    }

    fn put(&mut self, member: usize, weights: &[Vec<f32>]) {
        Running::put(self, member, weights);
    }

    fn states_given(&self) -> u64 {
        self.mailboxes.states_given()
    }
}

pub fn plan_of(path: &Path) -> (tickserve_onnx::OnnxModel, Plan, Vec<Vec<f32>>) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None).unwrap();
    let weights = arrange(&imported.plan, &imported.weights).unwrap();
    (model, imported.plan, weights)
}

pub const STATE: [(&str, &str); 2] = [("h_in", "h_out"), ("c_in", "c_out")];

pub fn close(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

/// `path`'s plan ticked `ticks` times through the emulated resident kernel
/// ([`ticks_match`]).
fn ticks_match_onnx_runtime(
    path: &Path,
    state: &[(&str, &str)],
    ticks: u64,
    seed: u64,
    (threads, split, on_chip): (u32, usize, usize),
) {
    let (_, plan, weights) = plan_of(path);
    let layout = resident_split(&plan, state, split, on_chip).unwrap();
    let mut kernel = Running::start(&layout, &weights, 1, threads);
    ticks_match(&mut kernel, path, state, ticks, seed);
    kernel.stop();
}

/// `path`'s plan ticked `ticks` times through `kernel` (its state paired as
/// `state` says) as the server ticks a sequence, the state each answer gave
/// handed back with the next tick, and restarted (zero state) halfway,
/// against ONNX Runtime fed its own state: every tick's outputs within
/// 1e-5; only the restart's tick brought its state; the state the slot
/// kept, read back at the end, is the last answer's.
pub fn ticks_match(
    kernel: &mut dyn Ticker,
    path: &Path,
    state: &[(&str, &str)],
    ticks: u64,
    seed: u64,
) {
    let (model, plan, _) = plan_of(path);
    let layout = resident(&plan, state).unwrap();
    let engine = onnx_runtime();
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let mut ort = engine
        .compile(&tickserve_engine_ort::OrtCompileRequest {
            family: "test",
            onnx: &model,
            signature: &signature,
            buckets: &tickserve_core::Buckets::new(&[1], None).unwrap(),
            weights: None,
        })
        .unwrap();
    let names: Vec<&str> = signature.outputs.iter().map(|o| o.0.as_str()).collect();
    let planned: Vec<&str> = plan.outputs.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(names, planned, "{}", path.display());
    let zeros = |i: usize| vec![0.0f32; layout.inputs[i].1];
    // What the server would hand the kernel, and what ONNX Runtime is fed
    // (its own state back): zeros at first.
    let mut held: Vec<Vec<f32>> = (0..plan.inputs.len()).map(zeros).collect();
    let mut fed = held.clone();
    let given_before = kernel.states_given();
    for t in 0..ticks {
        if t == ticks / 2 {
            for k in &layout.state {
                held[k.input] = zeros(k.input);
                fed[k.input] = zeros(k.input);
            }
        }
        for i in 0..plan.inputs.len() {
            if !layout.state.iter().any(|k| k.input == i) {
                held[i] = random_rows(seed + t * 16 + i as u64, held[i].len());
                fed[i].clone_from(&held[i]);
            }
        }
        let got = kernel.tick(0, &held);
        for (i, data) in fed.iter().enumerate() {
            ort.input_mut(0, i).copy_from_slice(&le_bytes(data));
        }
        ort.run(0, tickserve_core::SOLE_MEMBER).unwrap();
        let want: Vec<Vec<f32>> = (0..names.len()).map(|o| floats(ort.output(0, o))).collect();
        for (o, w) in want.iter().enumerate() {
            for (j, (g, w)) in got[o].iter().zip(w).enumerate() {
                assert!(
                    close(*g, *w),
                    "{} tick {t} {}[{j}]: resident {g}, onnxruntime {w}",
                    path.display(),
                    names[o]
                );
            }
        }
        for k in &layout.state {
            held[k.input].clone_from(&got[k.output]);
            fed[k.input].clone_from(&want[k.output]);
        }
    }
    let given = kernel.states_given() - given_before;
    let restarted = u64::from(!layout.state.is_empty() && ticks / 2 > 0);
    assert_eq!(
        given,
        restarted,
        "{}: ticks that brought their state",
        path.display()
    );
    // The state the slot kept: the last answer's, exactly.
    let kept = kernel.state();
    for k in &layout.state {
        assert_eq!(
            &kept[k.offset..k.offset + k.width],
            held[k.input].as_slice(),
            "{} {} kept",
            path.display(),
            plan.inputs[k.input].0
        );
    }
}

/// `bench_lstm`'s state pairs (its model.toml's `[[sequence.state]]`).
pub const BENCH_LSTM_STATE: [(&str, &str); 4] = [
    ("h1_in", "h1_out"),
    ("c1_in", "c1_out"),
    ("h2_in", "h2_out"),
    ("c2_in", "c2_out"),
];

#[test]
fn a_sequence_ticked_through_the_mailbox_gives_what_onnx_runtime_gives() {
    let step = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, _) = plan_of(&step);
    let layout = resident(&plan, &STATE).unwrap();
    // tick in; h and c given (or kept) and answered in one region each;
    // the prediction out.
    assert_eq!(layout.inputs, vec![(0, 8), (8, 16), (24, 16)]);
    assert_eq!(layout.outputs, vec![(40, 1), (8, 16), (24, 16)]);
    let kept: Vec<(usize, usize)> = layout.state.iter().map(|k| (k.offset, k.width)).collect();
    assert_eq!(kept, vec![(0, 16), (16, 16)]);
    // The block's loops stride over its threads: 8 here, a lane a warp
    // (256 OS threads at a barrier would make 10,000 ticks minutes long).
    ticks_match_onnx_runtime(&step, &STATE, 10_000, 1000, (8, 1, ON_CHIP));
    // bench_lstm: two layers of 128 on 32 features, each layer's h and c kept.
    let bench = bench_models();
    let bench_lstm = bench.path().join("bench_lstm/1/model.onnx");
    ticks_match_onnx_runtime(&bench_lstm, &BENCH_LSTM_STATE, 10_000, 5000, (8, 1, 0));
    // The whole block, as the device launches it: eight warps of 32 lanes,
    // each unit's products summed across its warp.
    ticks_match_onnx_runtime(
        &bench_lstm,
        &BENCH_LSTM_STATE,
        4,
        7000,
        (RESIDENT_BLOCK, 1, 0),
    );
}

#[test]
fn a_slot_split_over_a_cluster_of_blocks_gives_what_onnx_runtime_gives() {
    // Each block of the slot's cluster computes its share of every step's
    // units or columns and stores them into every block's activations:
    // shares of 5, 5 and 6 units, and of 0, 0 and 1 column for the last
    // product.
    let step = root().join("config/models/seq_lstm_step/1/model.onnx");
    ticks_match_onnx_runtime(&step, &STATE, 1_000, 1100, (8, 3, ON_CHIP));
    // bench_lstm's 128 units on four blocks, then on two whole blocks.
    let bench = bench_models();
    let bench_lstm = bench.path().join("bench_lstm/1/model.onnx");
    ticks_match_onnx_runtime(
        &bench_lstm,
        &BENCH_LSTM_STATE,
        600,
        5100,
        (8, 4, 150 * 1024),
    );
    ticks_match_onnx_runtime(
        &bench_lstm,
        &BENCH_LSTM_STATE,
        2,
        7100,
        (RESIDENT_BLOCK, 2, ON_CHIP),
    );
    // On 8 blocks each holds all of its share on chip: a sixteenth-unit
    // share (16 of 128) of 4 gates of the 32 inputs and three 128-wide
    // matrices, and one column of the 128 into the prediction.
    let (_, bench_plan, _) = plan_of(&bench_lstm);
    let eighths = resident_split(&bench_plan, &BENCH_LSTM_STATE, 8, ON_CHIP).unwrap();
    assert_eq!(eighths.on_chip_bytes, (4 * 16 * (32 + 3 * 128) + 128) * 4);
    let (_, plan, _) = plan_of(&step);
    let refused = resident_split(&plan, &STATE, MAX_SPLIT + 1, 0).unwrap_err();
    assert!(refused.contains("a cluster holds 1 to 8"), "{refused}");
}

/// `seq_lstm_step` ticked through `kernel` (started with the file's
/// weights as member 0) 20 times, then `other` written as member 1 while
/// the kernel runs, then 20 ticks of member 1 and 5 of member 0 again: each
/// tick as the plan's reference gives it with its member, the sequence's
/// state carried across.
pub fn members_match_reference(kernel: &mut dyn Ticker, other: &[Vec<f32>]) {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let mut state = (vec![0.0f32; 16], vec![0.0f32; 16]);
    for t in 0..45u64 {
        if t == 20 {
            kernel.put(1, other);
        }
        let member = usize::from((20..40).contains(&t));
        let weights_of = if member == 1 { other } else { &weights[..] };
        step_matches_reference(kernel, &plan, (member, weights_of), 2000 + t, &mut state);
    }
}

/// One `seq_lstm_step` tick through `kernel` of `member` (its row, its
/// weights), a fresh input from `seed`, `state` (h, c) handed in and
/// replaced by the answer's: as the plan's reference gives it.
fn step_matches_reference(
    kernel: &mut dyn Ticker,
    plan: &Plan,
    (member, weights): (usize, &[Vec<f32>]),
    seed: u64,
    state: &mut (Vec<f32>, Vec<f32>),
) {
    let (h, c) = state;
    let x = random_rows(seed, 8);
    let got = kernel.tick(member, &[x.clone(), h.clone(), c.clone()]);
    let want = reference::run(plan, weights, &[&x, h, c], 1);
    assert!(
        close(got[0][0], want[0][0]),
        "seed {seed}: resident {}, the reference {}",
        got[0][0],
        want[0][0]
    );
    h.clone_from(&got[1]);
    c.clone_from(&got[2]);
}

/// The file's weights of `path`'s plan, scaled by 0.75: another member.
pub fn scaled_member(path: &Path) -> Vec<Vec<f32>> {
    let (_, _, weights) = plan_of(path);
    weights
        .iter()
        .map(|w| w.iter().map(|x| x * 0.75).collect())
        .collect()
}

#[test]
fn a_member_added_while_the_kernel_runs_answers_with_its_weights_from_its_first_tick() {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let other = scaled_member(&path);
    let layout = resident(&plan, &STATE).unwrap();
    // The whole block, as the device launches it.
    let mut kernel = Running::start(&layout, &weights, 1, RESIDENT_BLOCK);
    members_match_reference(&mut kernel, &other);
    // The sequence's state was handed back every tick: none brought.
    assert_eq!(kernel.states_given(), 0);
    kernel.stop();
    // With the weights held on chip: loaded again when a tick names the
    // other member, and when a member is written over with new weights
    // (held by their address, never reused while the kernel runs).
    let layout = resident_split(&plan, &STATE, 1, ON_CHIP).unwrap();
    assert!(layout.on_chip_bytes > 0);
    let mut kernel = Running::start(&layout, &weights, 1, 8);
    members_match_reference(&mut kernel, &other);
    // Member 1 (held after its first tick) written over between two of its
    // ticks: the second reads the new weights.
    let third: Vec<Vec<f32>> = (weights.iter())
        .map(|w| w.iter().map(|x| x * 0.5).collect())
        .collect();
    let mut state = (vec![0.0f32; 16], vec![0.0f32; 16]);
    for t in 0..10u64 {
        if t == 5 {
            Ticker::put(&mut kernel, 1, &third);
        }
        let member = if t < 5 { &other } else { &third };
        step_matches_reference(&mut kernel, &plan, (1, member), 3000 + t, &mut state);
    }
    // New weights at the same addresses (a freed member's may come back for
    // another): the row's version tells the held copy to go.
    let fourth: Vec<Vec<f32>> = (weights.iter())
        .map(|w| w.iter().map(|x| x * 0.25).collect())
        .collect();
    kernel.rewrite(1, &fourth);
    for t in 0..3u64 {
        step_matches_reference(&mut kernel, &plan, (1, &fourth), 3100 + t, &mut state);
    }
    kernel.stop();
}

#[test]
fn slots_tick_at_once_and_a_sequence_moved_to_another_slot_brings_its_state() {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let other = scaled_member(&path);
    let layout = resident(&plan, &STATE).unwrap();
    let mut kernel = Running::start(&layout, &weights, 4, 8);
    kernel.put(1, &other);
    let members: [&[Vec<f32>]; 2] = [&weights, &other];
    // Four sequences, members alternating; each sequence's h and c as the
    // server holds them; `at[s]` the slot sequence `s` ticks in (sequences
    // 0 and 1 trade slots at round 100, as rows of a batch may).
    let mut states = vec![(vec![0.0f32; 16], vec![0.0f32; 16]); 4];
    let mut at = [0usize, 1, 2, 3];
    for round in 0..200u64 {
        if round == 100 {
            at.swap(0, 1);
        }
        let ticks: Vec<Vec<f32>> = (0..4u64)
            .map(|s| random_rows(7000 + round * 8 + s, 8))
            .collect();
        // Every slot asked before any answer is awaited: the blocks run at
        // once.
        for (s, x) in ticks.iter().enumerate() {
            let (h, c) = &states[s];
            kernel.ask(at[s], s % 2, &[x.clone(), h.clone(), c.clone()]);
        }
        for (s, x) in ticks.iter().enumerate() {
            let got = kernel.wait(at[s]);
            let (h, c) = &mut states[s];
            let want = reference::run(&plan, members[s % 2], &[x, h, c], 1);
            assert!(
                close(got[0][0], want[0][0]),
                "round {round} sequence {s}: resident {}, the reference {}",
                got[0][0],
                want[0][0]
            );
            h.clone_from(&got[1]);
            c.clone_from(&got[2]);
        }
    }
    // Only the two ticks after the trade brought their state.
    assert_eq!(kernel.mailboxes.states_given(), 2);
    for (s, (h, c)) in states.iter().enumerate() {
        let kept = kernel.state_of(at[s]);
        let held: Vec<f32> = h.iter().chain(c).copied().collect();
        assert_eq!(kept, held, "sequence {s}'s kept state");
    }
    kernel.stop();
}

/// Which sequences tick in round `round` of `n`, in their rows' order: a
/// varying number of them, rotated, reversed every other round (rows of a
/// batch come in arrival order).
pub fn round_rows(round: u64, n: usize) -> Vec<usize> {
    let count = 1 + (round as usize * 7) % n;
    let mut rows: Vec<usize> = (0..count).map(|i| (i + round as usize * 3) % n).collect();
    if round % 2 == 1 {
        rows.reverse();
    }
    rows
}

#[test]
fn rows_placed_by_their_state_find_their_sequences_slots_in_any_order() {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let layout = resident(&plan, &STATE).unwrap();
    let mut kernel = Running::start(&layout, &weights, 4, 8);
    // Four sequences; each round some of them, in another order, as the
    // rows of one run; each row on the slot `place` gives it.
    let mut states = vec![(vec![0.0f32; 16], vec![0.0f32; 16]); 4];
    let mut slots = Vec::new();
    for round in 0..200u64 {
        let rows = round_rows(round, 4);
        let ticks: Vec<Vec<f32>> = rows
            .iter()
            .map(|&s| random_rows(9000 + round * 8 + s as u64, 8))
            .collect();
        let inputs: Vec<Vec<Vec<u8>>> = rows
            .iter()
            .zip(&ticks)
            .map(|(&s, x)| vec![le_bytes(x), le_bytes(&states[s].0), le_bytes(&states[s].1)])
            .collect();
        kernel
            .mailboxes
            .place(rows.len(), |r, i| &inputs[r][i], &mut slots)
            .unwrap();
        for (r, &slot) in slots.iter().enumerate() {
            kernel.mailboxes.ask(slot, 0, |i| &inputs[r][i]).unwrap();
        }
        for (r, &slot) in slots.clone().iter().enumerate() {
            let got = kernel.wait(slot);
            let (h, c) = &mut states[rows[r]];
            let want = reference::run(&plan, &weights, &[&ticks[r], h, c], 1);
            assert!(
                close(got[0][0], want[0][0]),
                "round {round} sequence {}: resident {}, the reference {}",
                rows[r],
                got[0][0],
                want[0][0]
            );
            h.clone_from(&got[1]);
            c.clone_from(&got[2]);
        }
    }
    // Every row found the slot its sequence last ticked in (or a fresh
    // one, for a sequence's first tick): no tick brought its state.
    assert_eq!(kernel.mailboxes.states_given(), 0);
    kernel.stop();
}

/// `gru_step`'s and `gru_step_reset0`'s state pair.
pub const GRU_STATE: [(&str, &str); 1] = [("h_in", "h_out")];

#[test]
fn a_gru_ticked_through_the_mailbox_gives_what_onnx_runtime_gives() {
    // A GRU resetting after its recurrent product (PyTorch's) runs a warp a
    // unit with no barrier; one resetting before it (ONNX's default) first
    // every unit's reset, stored into every block, then the candidate.
    let steps = step_models();
    for name in ["gru_step", "gru_step_reset0"] {
        let path = steps.path().join(format!("{name}/1/model.onnx"));
        ticks_match_onnx_runtime(&path, &GRU_STATE, 2_000, 8000, (8, 1, 0));
        ticks_match_onnx_runtime(&path, &GRU_STATE, 1_000, 8100, (8, 3, ON_CHIP));
        ticks_match_onnx_runtime(&path, &GRU_STATE, 2, 8200, (RESIDENT_BLOCK, 2, ON_CHIP));
    }
}

#[test]
fn mlps_with_softmax_or_layer_norm_ticked_through_the_mailbox_give_what_onnx_runtime_gives() {
    // alpha_mlp: two products, the last into a softmax; the exporters'
    // MLPs with layer normalization (both PyTorch exporters). No state:
    // each tick stands alone.
    let exported = root().join("crates/tickserve-engine-cuda/tests/exported");
    for path in [
        root().join("config/models/alpha_mlp/1/model.onnx"),
        exported.join("pt_mlp_norm/1/model.onnx"),
        exported.join("pt2_mlp_norm/1/model.onnx"),
    ] {
        ticks_match_onnx_runtime(&path, &[], 300, 9000, (8, 1, 0));
        ticks_match_onnx_runtime(&path, &[], 100, 9100, (8, 3, ON_CHIP));
        ticks_match_onnx_runtime(&path, &[], 2, 9200, (RESIDENT_BLOCK, 2, ON_CHIP));
    }
}

#[test]
fn an_exported_lstm_step_and_every_dense_op_tick_as_onnx_runtime_does() {
    // PyTorch's TorchScript exporter writes a stateful LSTM step with the
    // layout ops around its cell: the state's [layers, batch, hidden]
    // slices and squeezes, the gates' rearranged weights, the joins.
    let path =
        root().join("crates/tickserve-engine-cuda/tests/exported/pt_lstm_state/1/model.onnx");
    let (_, plan, _) = plan_of(&path);
    let layout = resident(&plan, &STATE).unwrap();
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s.op, tickserve_engine_cuda::plan::Op::Rearrange { .. })),
        "{:?}",
        plan.steps
    );
    assert_eq!(layout.state.len(), 2);
    ticks_match_onnx_runtime(&path, &STATE, 2_000, 9500, (8, 1, 0));
    ticks_match_onnx_runtime(&path, &STATE, 500, 9600, (8, 3, ON_CHIP));
    ticks_match_onnx_runtime(&path, &STATE, 2, 9700, (RESIDENT_BLOCK, 2, ON_CHIP));
    // Every dense op the importer takes, in one graph: a product over four
    // groups of a reshaped row, a sum of two activations, a copy, a
    // softmax beside a product.
    let fixtures = support::fixtures();
    let every = fixtures.path().join("cuda_ops/1/model.onnx");
    ticks_match_onnx_runtime(&every, &[], 300, 9800, (8, 1, 0));
    ticks_match_onnx_runtime(&every, &[], 100, 9900, (8, 3, ON_CHIP));
    ticks_match_onnx_runtime(&every, &[], 2, 9950, (RESIDENT_BLOCK, 2, ON_CHIP));
}

#[test]
fn a_plan_outside_the_resident_set_is_refused_naming_what_is_not_in_it() {
    let models = root().join("config/models");
    let refused = |path: &Path, state: &[(&str, &str)]| {
        let (_, plan, _) = plan_of(path);
        resident(&plan, state).unwrap_err()
    };
    let fixtures = support::fixtures();
    let conv = refused(&fixtures.path().join("cuda_conv/1/model.onnx"), &[]);
    assert!(conv.contains("is a convolution"), "{conv}");
    let window = refused(&models.join("seq_lstm/1/model.onnx"), &[]);
    assert!(window.contains("a window of 30 steps"), "{window}");
    let step = models.join("seq_lstm_step/1/model.onnx");
    let unknown = refused(&step, &[("h_in", "h_next")]);
    assert!(unknown.contains("h_in -> h_next"), "{unknown}");
    let twice = refused(&step, &[("h_in", "h_out"), ("h_in", "c_out")]);
    assert!(twice.contains("shares its input or output"), "{twice}");
    let (_, plan, _) = plan_of(&step);
    let mut wide = plan;
    wide.values[0].width = 20_000;
    let error = resident(&wide, &STATE).unwrap_err();
    assert!(error.contains("a resident block holds at most"), "{error}");
}
