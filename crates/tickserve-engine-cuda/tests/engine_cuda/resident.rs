//! The resident kernel, run on the CPU: its CUDA C compiled by the host's
//! C++ compiler behind an emulation of one block (its threads are OS
//! threads, a block barrier a `std::barrier`, shared arrays statics, the
//! mailbox's acquire and release the same orders on host atomics), started
//! once on its own thread, and ticked through its mailbox as the host will
//! tick it: the inputs written, the asked tick raised with release order,
//! the answered tick awaited with acquire order. A sequence's 10,000 ticks,
//! its state kept only in the kernel's state buffer, give what ONNX Runtime
//! gives with the state fed back, within 1e-5; a member's weights swapped
//! between two ticks give what the plan's reference gives with them; a
//! negative tick ends the kernel. What it cannot show: the device's memory
//! model over PCIe, its scheduling, the round trip's time.

use std::path::Path;
use std::time::{Duration, Instant};

use tickserve_core::CompiledModel;
use tickserve_core::config::ModelConfig;
use tickserve_engine_cuda::kernels::{RESIDENT_BLOCK, Resident, resident};
use tickserve_engine_cuda::mailbox::Mailboxes;
use tickserve_engine_cuda::plan::{Cell, Op, Plan};
use tickserve_engine_cuda::reference::{self, random_rows};
use tickserve_engine_cuda::{arrange, import};

use crate::support;

use support::{bench_models, floats, onnx_runtime, read, root};

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
};
static thread_local tickserve_arena* tickserve_shared;
static thread_local std::barrier<>* tickserve_block;
#define SHARED(type, name, n) type* name = (type*)tickserve_shared->get(__COUNTER__, sizeof(type) * (n))
#define SYNC() tickserve_block->arrive_and_wait()
#define FENCE() std::atomic_thread_fence(std::memory_order_seq_cst)
static inline int load_acquire(const int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_release(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
"#;

/// Starts the kernel as `blocks` blocks of `threads` threads, all at once;
/// returns once every block has.
const LAUNCH: &str = r#"
extern "C" void tickserve_run_resident(int* box, const u64* table, float* state,
        unsigned int blocks, unsigned int threads) {
    std::vector<std::barrier<>*> barriers;
    std::vector<tickserve_arena*> arenas;
    std::vector<std::thread> all;
    for (unsigned int b = 0; b < blocks; ++b) {
        barriers.push_back(new std::barrier<>(threads));
        arenas.push_back(new tickserve_arena());
    }
    for (unsigned int b = 0; b < blocks; ++b)
        for (unsigned int i = 0; i < threads; ++i)
            all.emplace_back([&, b, i] {
                blockIdx.x = b; blockDim.x = threads; threadIdx.x = i;
                tickserve_block = barriers[b];
                tickserve_shared = arenas[b];
                resident(box, table, state);
            });
    for (auto& t : all) t.join();
    for (unsigned int b = 0; b < blocks; ++b) { delete barriers[b]; delete arenas[b]; }
}
"#;

type Run = unsafe extern "C" fn(*mut i32, *const u64, *mut f32, u32, u32);

/// The longest a tick may take here before the test fails (no hang).
const TICK_BOUND: Duration = Duration::from_secs(10);

/// A resident kernel running on its own thread, and its slots' mailboxes.
struct Running {
    /// The slots' mailboxes, over `mailbox`: the host's half as the device
    /// runs it.
    mailboxes: Mailboxes,
    /// Each slot's mailbox, `mailbox_words` apart: the two flag words, then
    /// the floats.
    mailbox: Vec<i32>,
    /// One pointer per slot and weight slot, slot-major.
    table: Vec<u64>,
    weight_slots: usize,
    state: Vec<f32>,
    state_floats: usize,
    kernel: Option<std::thread::JoinHandle<()>>,
    _library: libloading::Library,
    _dir: tempfile::TempDir,
}

impl Running {
    /// Builds `resident`'s kernel and starts it with one block of `threads`
    /// threads per entry of `members` (that slot's member's weights, one
    /// vector per weight slot).
    fn start(resident: &Resident, members: &[&[Vec<f32>]], threads: u32) -> Running {
        let (library, dir) =
            support::host_library(&format!("{EMULATION}\n{}\n{LAUNCH}", resident.source));
        let slots = members.len();
        let mut mailbox = vec![0; slots * resident.mailbox_words];
        // SAFETY: `mailbox` holds `slots` mailboxes; its heap buffer is
        // neither moved nor freed while `Running` (and so `mailboxes`)
        // lives; only the kernel's threads touch it besides.
        let mailboxes =
            unsafe { Mailboxes::new(mailbox.as_mut_ptr(), resident, slots, TICK_BOUND) };
        let mut running = Running {
            mailboxes,
            mailbox,
            table: members
                .iter()
                .flat_map(|m| m.iter().map(|w| w.as_ptr() as u64))
                .collect(),
            weight_slots: members[0].len(),
            state: vec![0.0; slots * resident.state_floats],
            state_floats: resident.state_floats,
            kernel: None,
            _library: library,
            _dir: dir,
        };
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
        let blocks = slots as u32;
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

    /// Asks slot `slot` for a tick ([`Mailboxes::ask`]).
    fn ask(&mut self, slot: usize, inputs: &[(usize, &[f32])]) {
        self.mailboxes.ask(slot, inputs).unwrap();
    }

    /// Waits for slot `slot`'s answer ([`Mailboxes::wait`]): its floats.
    fn wait(&mut self, slot: usize) -> Vec<f32> {
        self.mailboxes.wait(slot).unwrap()
    }

    /// One tick of slot `slot`.
    fn tick(&mut self, slot: usize, inputs: &[(usize, &[f32])]) -> Vec<f32> {
        self.ask(slot, inputs);
        self.wait(slot)
    }

    /// Points slot `slot` at other weights, between two of its ticks.
    fn swap(&mut self, slot: usize, weights: &[Vec<f32>]) {
        let row = &mut self.table[slot * self.weight_slots..(slot + 1) * self.weight_slots];
        for (pointer, w) in row.iter_mut().zip(weights) {
            *pointer = w.as_ptr() as u64;
        }
    }

    /// Slot `slot`'s state, between two of its ticks.
    fn state_of(&self, slot: usize) -> Vec<f32> {
        self.state[slot * self.state_floats..(slot + 1) * self.state_floats].to_vec()
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

/// A resident kernel the tests tick: emulated here, or on a GPU (`gpu`).
pub trait Ticker {
    /// One tick: the non-state inputs (offset, values) in, the mailbox's
    /// floats after the answer.
    fn tick(&mut self, inputs: &[(usize, &[f32])]) -> Vec<f32>;
    /// The state the kernel keeps, read back between ticks.
    fn state(&self) -> Vec<f32>;
    /// Another member's weights (one vector per slot, alive as long as the
    /// kernel), between two ticks.
    fn swap(&mut self, weights: &[Vec<f32>]);
}

/// Slot 0 of an emulated kernel.
impl Ticker for Running {
    fn tick(&mut self, inputs: &[(usize, &[f32])]) -> Vec<f32> {
        Running::tick(self, 0, inputs)
    }

    fn state(&self) -> Vec<f32> {
        self.state_of(0)
    }

    fn swap(&mut self, weights: &[Vec<f32>]) {
        Running::swap(self, 0, weights);
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
fn ticks_match_onnx_runtime(path: &Path, state: &[(&str, &str)], ticks: u64, seed: u64) {
    let (_, plan, weights) = plan_of(path);
    let layout = resident(&plan, state).unwrap();
    // The block's loops stride over its threads: 8 here (256 OS threads at
    // a barrier would make this test minutes long; the full block below).
    let mut kernel = Running::start(&layout, &[&weights], 8);
    ticks_match(&mut kernel, path, state, ticks, seed);
    kernel.stop();
}

/// `path`'s plan ticked `ticks` times through `kernel` (its state paired as
/// `state` says) against ONNX Runtime fed its own state back: every tick's
/// outputs within 1e-5, and the state read back from the kernel at the end.
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
    let width = |v: usize| plan.values[v].width;
    // Each input's values: fed from the kernel's mailbox or, for a state
    // input, ONNX Runtime's own last output (zeros at first).
    let mut fed: Vec<Vec<f32>> = plan
        .inputs
        .iter()
        .map(|(_, v)| vec![0.0; width(*v)])
        .collect();
    for t in 0..ticks {
        for (i, at) in layout.inputs.iter().enumerate() {
            if at.is_some() {
                fed[i] = random_rows(seed + t * 16 + i as u64, fed[i].len());
            }
        }
        let mailbox: Vec<(usize, &[f32])> = layout
            .inputs
            .iter()
            .zip(&fed)
            .filter_map(|(at, x)| at.map(|at| (at, x.as_slice())))
            .collect();
        let got = kernel.tick(&mailbox);
        for (i, data) in fed.iter().enumerate() {
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            ort.input_mut(0, i).copy_from_slice(&bytes);
        }
        ort.run(0, tickserve_core::SOLE_MEMBER).unwrap();
        let want: Vec<Vec<f32>> = (0..names.len()).map(|o| floats(ort.output(0, o))).collect();
        for (o, at) in layout.outputs.iter().enumerate() {
            let Some(at) = at else { continue };
            for (j, w) in want[o].iter().enumerate() {
                let g = got[at + j];
                assert!(
                    close(g, *w),
                    "{} tick {t} {}[{j}]: resident {g}, onnxruntime {w}",
                    path.display(),
                    names[o]
                );
            }
        }
        for (input, output) in state {
            let i = plan.inputs.iter().position(|(n, _)| n == input).unwrap();
            let o = names.iter().position(|n| n == output).unwrap();
            fed[i].clone_from(&want[o]);
        }
    }
    // The state the kernel kept, read back: ONNX Runtime's after the last tick.
    let kept = kernel.state();
    for ((input, _), &(at, w)) in state.iter().zip(&layout.state) {
        let i = plan.inputs.iter().position(|(n, _)| n == input).unwrap();
        for (j, (g, want)) in kept[at..at + w].iter().zip(&fed[i]).enumerate() {
            assert!(
                close(*g, *want),
                "{} {input}[{j}] kept: resident {g}, onnxruntime {want}",
                path.display()
            );
        }
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
    // tick in; prediction out; h and c kept in the state buffer alone.
    assert_eq!(layout.inputs, vec![Some(0), None, None]);
    assert_eq!(layout.outputs, vec![Some(8), None, None]);
    assert_eq!(layout.state, vec![(0, 16), (16, 16)]);
    ticks_match_onnx_runtime(&step, &STATE, 10_000, 1000);
    // bench_lstm: two layers of 128 on 32 features, each layer's h and c kept.
    let bench = bench_models();
    ticks_match_onnx_runtime(
        &bench.path().join("bench_lstm/1/model.onnx"),
        &BENCH_LSTM_STATE,
        10_000,
        5000,
    );
}

/// `seq_lstm_step` ticked through `kernel` (started with the file's
/// weights) 20 times, then 20 more after its member is swapped for the
/// file's weights scaled by 0.75: each tick as the plan's reference gives it
/// with the member of that tick, the state carried across the swap.
pub fn swap_matches_reference(kernel: &mut dyn Ticker, other: &[Vec<f32>]) {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let (mut h, mut c) = (vec![0.0f32; 16], vec![0.0f32; 16]);
    for t in 0..40u64 {
        let member = if t < 20 { &weights[..] } else { other };
        if t == 20 {
            kernel.swap(other);
        }
        let x = random_rows(2000 + t, 8);
        let got = kernel.tick(&[(0, &x)]);
        let want = reference_tick(&plan, member, &x, &mut h, &mut c);
        assert!(
            close(got[8], want),
            "tick {t}: resident {}, the reference {want}",
            got[8]
        );
    }
}

/// One tick of `seq_lstm_step`'s `plan` by the plan's reference with
/// `member`'s weights: its prediction, `h` and `c` moved on.
fn reference_tick(
    plan: &Plan,
    member: &[Vec<f32>],
    x: &[f32],
    h: &mut Vec<f32>,
    c: &mut Vec<f32>,
) -> f32 {
    let want = reference::run(plan, member, &[x, h, c], 1);
    h.clone_from(&want[1]);
    c.clone_from(&want[2]);
    want[0][0]
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
fn a_member_swapped_between_ticks_answers_with_its_weights_from_the_next() {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let other = scaled_member(&path);
    let layout = resident(&plan, &STATE).unwrap();
    // The whole block, as the device launches it.
    let mut kernel = Running::start(&layout, &[&weights], RESIDENT_BLOCK);
    swap_matches_reference(&mut kernel, &other);
    kernel.stop();
}

#[test]
fn slots_tick_at_once_each_its_own_sequence_with_its_own_member() {
    let path = root().join("config/models/seq_lstm_step/1/model.onnx");
    let (_, plan, weights) = plan_of(&path);
    let other = scaled_member(&path);
    let layout = resident(&plan, &STATE).unwrap();
    // Four slots (one block each), members alternating; slot 3 changes
    // member halfway.
    let mut members: Vec<&[Vec<f32>]> = vec![&weights, &other, &weights, &other];
    let mut kernel = Running::start(&layout, &members, 8);
    let mut states = vec![(vec![0.0f32; 16], vec![0.0f32; 16]); members.len()];
    for round in 0..200u64 {
        if round == 100 {
            kernel.swap(3, &weights);
            members[3] = &weights;
        }
        let ticks: Vec<Vec<f32>> = (0..members.len() as u64)
            .map(|slot| random_rows(7000 + round * 8 + slot, 8))
            .collect();
        // Every slot asked before any answer is awaited: the blocks run at
        // once.
        for (slot, x) in ticks.iter().enumerate() {
            kernel.ask(slot, &[(0, x)]);
        }
        for (slot, x) in ticks.iter().enumerate() {
            let got = kernel.wait(slot);
            let (h, c) = &mut states[slot];
            let want = reference_tick(&plan, members[slot], x, h, c);
            assert!(
                close(got[8], want),
                "round {round} slot {slot}: resident {}, the reference {want}",
                got[8]
            );
        }
    }
    for (slot, (h, c)) in states.iter().enumerate() {
        let kept = kernel.state_of(slot);
        for (j, (g, w)) in kept.iter().zip(h.iter().chain(c)).enumerate() {
            assert!(
                close(*g, *w),
                "slot {slot} state[{j}]: resident {g}, the reference {w}"
            );
        }
    }
    kernel.stop();
}

#[test]
fn a_plan_outside_the_resident_set_is_refused_naming_what_is_not_in_it() {
    let models = root().join("config/models");
    let refused = |path: &Path, state: &[(&str, &str)]| {
        let (_, plan, _) = plan_of(path);
        resident(&plan, state).unwrap_err()
    };
    let softmax = refused(&models.join("alpha_mlp/1/model.onnx"), &[]);
    assert!(softmax.contains("is a softmax"), "{softmax}");
    let window = refused(&models.join("seq_lstm/1/model.onnx"), &[]);
    assert!(window.contains("a window of 30 steps"), "{window}");
    let step = models.join("seq_lstm_step/1/model.onnx");
    let unknown = refused(&step, &[("h_in", "h_next")]);
    assert!(unknown.contains("h_in -> h_next"), "{unknown}");
    let (_, plan, _) = plan_of(&step);
    let mut gru = plan.clone();
    if let Op::Recurrent(layer) = &mut gru.steps[0].op {
        layer.cell = Cell::Gru {
            linear_before_reset: true,
        };
    }
    let error = resident(&gru, &STATE).unwrap_err();
    assert!(error.contains("is a GRU"), "{error}");
    let mut wide = plan;
    wide.values[0].width = 20_000;
    let error = resident(&wide, &STATE).unwrap_err();
    assert!(error.contains("a resident block holds at most"), "{error}");
}
