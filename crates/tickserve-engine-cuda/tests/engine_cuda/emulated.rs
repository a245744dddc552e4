//! The generated CUDA C, run on the CPU: each plan's module compiled by the
//! host's C++ compiler behind a small emulation of CUDA's thread indices
//! (a warp is 32 OS threads, a shuffle a write and a read between barriers;
//! a device pointer is a host pointer), its steps run in the order the
//! engine records them
//! (the products computed here as cuBLAS computes them, the recurrent layers
//! step by step with their gate and reset kernels, the initial states copied
//! or zeroed), gives what ONNX Runtime gives within 1e-5. No GPU needed:
//! this is the kernels' own arithmetic and indexing checked where no GPU is
//! (warp reductions included; not the device's scheduling, memory or
//! cuBLAS itself). Rows of mixed members (each row its own member's weights,
//! through the table of one pointer per row and slot) give each row what
//! its member alone gives, bit for bit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tickserve_core::config::ModelConfig;

use tickserve_engine_cuda::kernels::{Kernel, gate_name, module_source, reset_name};
use tickserve_engine_cuda::plan::{Cell, Op, Plan, Recurrent, ValueId};
use tickserve_engine_cuda::reference::random_rows;
use tickserve_engine_cuda::{arrange, import};
use tickserve_engine_ort::OrtEngine;

use crate::support;

use support::{fixtures, onnx_runtime, onnx_runtime_outputs, read, root};

/// What the module needs to build and run as host code.
const EMULATION: &str = r#"
#include <math.h>
#include <string.h>
#include <barrier>
#include <thread>
#include <vector>
struct tickserve_dim { unsigned int x, y, z; };
static thread_local tickserve_dim blockIdx, blockDim, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
// A warp is 32 OS threads; a shuffle is a write, a barrier, a read, a barrier.
static thread_local std::barrier<>* tickserve_warp;
static thread_local float* tickserve_lanes;
static inline float __shfl_xor_sync(unsigned int, float x, int offset) {
    unsigned int lane = threadIdx.x % 32;
    tickserve_lanes[lane] = x;
    tickserve_warp->arrive_and_wait();
    float y = tickserve_lanes[lane ^ offset];
    tickserve_warp->arrive_and_wait();
    return y;
}
// Runs `call` for every thread of a launch of `grid` blocks of `block`
// threads, warp by warp, the 32 lanes of a warp at once.
template <typename F>
static void tickserve_launch(unsigned int grid, unsigned int block, F call) {
    for (unsigned int first = 0; first < grid * block; first += 32) {
        std::barrier<> warp(32);
        float lanes[32];
        std::vector<std::thread> threads;
        for (unsigned int lane = 0; lane < 32; ++lane) {
            unsigned int id = first + lane;
            threads.emplace_back([&, id] {
                blockIdx.x = id / block; blockDim.x = block; threadIdx.x = id % block;
                tickserve_warp = &warp; tickserve_lanes = lanes;
                call();
            });
        }
        for (auto& t : threads) t.join();
    }
}
typedef unsigned long long tickserve_u64;
typedef void (*tickserve_elementwise)(float*, const float*, const float*, const tickserve_u64*, int,
    int);
typedef void (*tickserve_gates)(float*, float*, float*, const float*, const float*, const float*,
    const tickserve_u64*, int, int, int);
extern "C" void tickserve_launch_elementwise(tickserve_elementwise kernel, unsigned int grid,
        unsigned int block, float* out, const float* a, const float* b,
        const tickserve_u64* table, int rows, int mixed) {
    tickserve_launch(grid, block, [=] { kernel(out, a, b, table, rows, mixed); });
}
extern "C" void tickserve_launch_gates(tickserve_gates kernel, unsigned int grid,
        unsigned int block, float* h, float* c, float* y, const float* xw, const float* hr,
        const float* hr2, const tickserve_u64* table, int rows, int t, int mixed) {
    tickserve_launch(grid, block, [=] { kernel(h, c, y, xw, hr, hr2, table, rows, t, mixed); });
}
"#;

type Elementwise = unsafe extern "C" fn(*mut f32, *const f32, *const f32, *const u64, i32, i32);
type Gates = unsafe extern "C" fn(
    *mut f32,
    *mut f32,
    *mut f32,
    *const f32,
    *const f32,
    *const f32,
    *const u64,
    i32,
    i32,
    i32,
);
type LaunchElementwise = unsafe extern "C" fn(
    Elementwise,
    u32,
    u32,
    *mut f32,
    *const f32,
    *const f32,
    *const u64,
    i32,
    i32,
);
type LaunchGates = unsafe extern "C" fn(
    Gates,
    u32,
    u32,
    *mut f32,
    *mut f32,
    *mut f32,
    *const f32,
    *const f32,
    *const f32,
    *const u64,
    i32,
    i32,
    i32,
);

/// A plan's module compiled for the host, and its kernels.
struct Module {
    library: libloading::Library,
    kernels: Vec<Kernel>,
    _dir: tempfile::TempDir,
}

impl Module {
    /// `plan`'s module, compiled once per source text and process: a plan
    /// is emulated over several row counts and members, and the host
    /// compiler takes most of these tests' time.
    fn build(plan: &Plan) -> Arc<Module> {
        static BUILT: Mutex<BTreeMap<String, Arc<Module>>> = Mutex::new(BTreeMap::new());
        let (source, kernels) = module_source(plan);
        let mut built = BUILT.lock().unwrap();
        if let Some(module) = built.get(&source) {
            return Arc::clone(module);
        }
        let module = Arc::new(Module::compile(&source, kernels));
        built.insert(source, Arc::clone(&module));
        module
    }

    fn compile(source: &str, kernels: Vec<Kernel>) -> Module {
        let (library, dir) = support::host_library(&format!("{EMULATION}\n{source}"));
        Module {
            library,
            kernels,
            _dir: dir,
        }
    }

    /// The grid and block of `name` over `rows` rows of `width`.
    fn dims(&self, name: &str, rows: usize, width: usize) -> (u32, u32) {
        let kernel = self.kernels.iter().find(|k| k.name == name).unwrap();
        kernel.dims(rows, width)
    }

    /// Launches elementwise kernel `name` (KERNEL's signature).
    #[allow(clippy::too_many_arguments)]
    fn elementwise(
        &self,
        name: &str,
        (grid, block): (u32, u32),
        out: *mut f32,
        a: *const f32,
        b: *const f32,
        table: &Table,
        rows: usize,
    ) {
        // SAFETY: symbols of the module this test built, with the
        // signatures its source gives them; every pointer a live buffer of
        // the sizes the plan gives it.
        unsafe {
            let kernel: libloading::Symbol<'_, Elementwise> =
                self.library.get(name.as_bytes()).unwrap();
            let launch: libloading::Symbol<'_, LaunchElementwise> =
                self.library.get(b"tickserve_launch_elementwise").unwrap();
            launch(
                *kernel,
                grid,
                block,
                out,
                a,
                b,
                table.pointers.as_ptr(),
                rows as i32,
                i32::from(table.mixed),
            );
        }
    }
}

/// `out[m, n] = x[m, k] · W` (`W` stored `[n, k]` when `transposed`), as the
/// engine's cuBLAS product computes it.
fn product(x: &[f32], w: &[f32], transposed: bool, m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            out[r * n + j] = (0..k)
                .map(|i| {
                    x[r * k + i]
                        * if transposed {
                            w[j * k + i]
                        } else {
                            w[i * n + j]
                        }
                })
                .sum();
        }
    }
    out
}

/// The products of every row: `rows` blocks of `per_row` product rows, each
/// with its own row's weight `slot` (`per_row` × `k` floats of `x` a row).
#[allow(clippy::too_many_arguments)]
fn row_products(
    x: &[f32],
    weights: &[&[Vec<f32>]],
    slot: usize,
    transposed: bool,
    per_row: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    weights
        .iter()
        .enumerate()
        .flat_map(|(r, w)| {
            let rows = &x[r * per_row * k..(r + 1) * per_row * k];
            product(rows, &w[slot], transposed, per_row, k, n)
        })
        .collect()
}

/// The weight pointers the kernels read, as the engine lays them out: one
/// member's row (`mixed` false), or one pointer per row and slot, slot-major.
struct Table {
    pointers: Vec<u64>,
    mixed: bool,
}

impl Table {
    /// The table for rows with weights `row_weights` (one entry per row).
    fn new(row_weights: &[&[Vec<f32>]], mixed: bool) -> Table {
        let slots = row_weights[0].len();
        let pointers = if mixed {
            (0..slots)
                .flat_map(|s| row_weights.iter().map(move |w| w[s].as_ptr() as u64))
                .collect()
        } else {
            row_weights[0].iter().map(|w| w.as_ptr() as u64).collect()
        };
        Table { pointers, mixed }
    }
}

/// Runs `plan` over `rows` rows of `inputs` through the emulated kernels, as
/// the engine records it, with one member's `weights`; its outputs.
fn emulate(plan: &Plan, weights: &[Vec<f32>], inputs: &[Vec<f32>], rows: usize) -> Vec<Vec<f32>> {
    emulate_rows(plan, &vec![weights; rows], false, inputs)
}

/// Runs `plan` over one row of `inputs` per entry of `row_weights`, each
/// row with its entry's weights, through the emulated kernels as the engine
/// records a run of one member (`mixed` false: every entry must then be the
/// same) or of mixed members; its outputs.
fn emulate_rows(
    plan: &Plan,
    row_weights: &[&[Vec<f32>]],
    mixed: bool,
    inputs: &[Vec<f32>],
) -> Vec<Vec<f32>> {
    let rows = row_weights.len();
    let module = Module::build(plan);
    let table = Table::new(row_weights, mixed);
    let mut values: Vec<Vec<f32>> = plan
        .values
        .iter()
        .map(|v| vec![0.0f32; rows * v.width])
        .collect();
    for ((_, v), data) in plan.inputs.iter().zip(inputs) {
        values[*v].copy_from_slice(data);
    }
    for (index, step) in plan.steps.iter().enumerate() {
        let width = plan.values[step.output].width;
        let name = format!("step_{index}");
        if let Op::Recurrent(layer) = &step.op {
            recurrent(
                &module,
                index,
                layer,
                step.output,
                row_weights,
                &table,
                &mut values,
            );
            continue;
        }
        if let Op::MatMul {
            input,
            weight,
            transposed,
            groups,
            k,
            n,
        } = step.op
        {
            values[step.output] = row_products(
                &values[input],
                row_weights,
                weight,
                transposed,
                groups,
                k,
                n,
            );
        }
        if !module.kernels.iter().any(|k| k.name == name) {
            continue;
        }
        let (a, b): (ValueId, Option<ValueId>) = match &step.op {
            Op::MatMul { .. } => (step.output, None),
            Op::Copy { input }
            | Op::Softmax { input, .. }
            | Op::LayerNorm { input, .. }
            | Op::Rearrange { input, .. } => (*input, None),
            Op::Conv1d(conv) => (conv.input, None),
            Op::Binary { a, b, .. } => (*a, Some(*b)),
            Op::Concat { inputs, .. } => (inputs[0], inputs.get(1).copied()),
            Op::Recurrent(_) => unreachable!(),
        };
        // In place after a product: `a` is `out`.
        let in_place = a == step.output;
        let a_copy = (!in_place).then(|| values[a].clone());
        let b_copy = b.map(|b| values[b].clone());
        let out = values[step.output].as_mut_ptr();
        let a_ptr = a_copy.as_ref().map_or(out.cast_const(), |v| v.as_ptr());
        let b_ptr = b_copy.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        let dims = module.dims(&name, rows, width);
        module.elementwise(&name, dims, out, a_ptr, b_ptr, &table, rows);
    }
    plan.outputs
        .iter()
        .map(|(_, v)| values[*v].clone())
        .collect()
}

/// A recurrent step as `engine/recurrent.rs` records it.
#[allow(clippy::too_many_arguments)]
fn recurrent(
    module: &Module,
    index: usize,
    layer: &Recurrent,
    h: ValueId,
    row_weights: &[&[Vec<f32>]],
    table: &Table,
    values: &mut [Vec<f32>],
) {
    let rows = row_weights.len();
    let (steps, hidden) = (layer.steps, layer.hidden);
    let gh = layer.cell.gates() * hidden;
    values[h] = layer
        .initial_h
        .map_or_else(|| vec![0.0; rows * hidden], |v| values[v].clone());
    let mut cell = layer
        .initial_c
        .filter(|_| layer.cell == Cell::Lstm)
        .map_or_else(|| vec![0.0f32; rows * hidden], |v| values[v].clone());
    let xw = row_products(
        &values[layer.input],
        row_weights,
        layer.w,
        true,
        steps,
        layer.input_size,
        gh,
    );
    let mut y = vec![0.0f32; rows * steps * hidden];
    let resets = layer.cell
        == Cell::Gru {
            linear_before_reset: false,
        };
    for t in 0..steps {
        let hr = row_products(&values[h], row_weights, layer.r, true, 1, hidden, gh);
        let mut hr2 = vec![0.0f32; rows * gh];
        let gates = |name: &str, h: *mut f32, c: *mut f32, y: *mut f32, hr2: *const f32| {
            let (grid, block) = module.dims(name, rows, hidden);
            // SAFETY: RECURRENT(name)'s signature, and the emulation's
            // launcher; every pointer a live buffer of the layer's sizes.
            unsafe {
                let kernel: libloading::Symbol<'_, Gates> =
                    module.library.get(name.as_bytes()).unwrap();
                let launch: libloading::Symbol<'_, LaunchGates> =
                    module.library.get(b"tickserve_launch_gates").unwrap();
                launch(
                    *kernel,
                    grid,
                    block,
                    h,
                    c,
                    y,
                    xw.as_ptr(),
                    hr.as_ptr(),
                    hr2,
                    table.pointers.as_ptr(),
                    rows as i32,
                    t as i32,
                    i32::from(table.mixed),
                );
            }
        };
        if resets {
            gates(
                &reset_name(index),
                values[h].as_mut_ptr(),
                cell.as_mut_ptr(),
                y.as_mut_ptr(),
                hr2.as_ptr(),
            );
            hr2 = row_products(&cell, row_weights, layer.r, true, 1, hidden, gh);
        }
        gates(
            &gate_name(index),
            values[h].as_mut_ptr(),
            cell.as_mut_ptr(),
            y.as_mut_ptr(),
            hr2.as_ptr(),
        );
    }
    if let Some(v) = layer.sequence {
        values[v] = y;
    }
    if let Some(v) = layer.last_c {
        values[v] = cell;
    }
}

/// `path`'s plan through the emulated kernels against ONNX Runtime.
fn matches_onnx_runtime(engine: &OrtEngine, path: &Path, rows: usize, seed: u64) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None).unwrap();
    let weights = arrange(&imported.plan, &imported.weights).unwrap();
    let inputs: Vec<Vec<f32>> = signature
        .inputs
        .iter()
        .enumerate()
        .map(|(i, s)| random_rows(seed + i as u64, rows * s.dims.iter().product::<usize>()))
        .collect();
    let ours = emulate(&imported.plan, &weights, &inputs, rows);
    let theirs = onnx_runtime_outputs(engine, &model, &signature, &inputs, rows);
    for (o, (got, want)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(got.len(), want.len(), "{} output {o}", path.display());
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{} output {o} element {i}: emulated kernels {g}, onnxruntime {w}",
                path.display()
            );
        }
    }
}

#[test]
fn the_generated_kernels_run_on_the_cpu_give_what_onnx_runtime_gives() {
    let engine = onnx_runtime();
    let dir = fixtures();
    let models = root().join("config/models");
    let paths = [
        models.join("alpha_mlp/1/model.onnx"),
        dir.path().join("cuda_ops/1/model.onnx"),
        models.join("seq_lstm/1/model.onnx"),
        models.join("seq_lstm_step/1/model.onnx"),
        models.join("tick_000/1/model.onnx"),
        dir.path().join("cuda_sequence_ops/1/model.onnx"),
        dir.path().join("cuda_lstm_layout0/1/model.onnx"),
        dir.path().join("cuda_conv/1/model.onnx"),
    ];
    for (rows, seed) in [(1, 51), (3, 52), (17, 53)] {
        for path in &paths {
            matches_onnx_runtime(&engine, path, rows, seed);
        }
    }
}

/// `path`'s plan over `rows` rows, each row its own member's weights (the
/// file's, scaled by a factor per member, three members in turn), against
/// each row run alone with its member's: equal bit for bit.
fn mixed_rows_match_each_member_alone(path: &Path, rows: usize, seed: u64) {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    let imported = import(&model, &signature.inputs, None).unwrap();
    let weights = arrange(&imported.plan, &imported.weights).unwrap();
    let members: Vec<Vec<Vec<f32>>> = [1.0f32, 0.75, 1.25]
        .iter()
        .map(|f| {
            weights
                .iter()
                .map(|w| w.iter().map(|x| x * f).collect())
                .collect()
        })
        .collect();
    let row_weights: Vec<&[Vec<f32>]> = (0..rows)
        .map(|r| members[r % members.len()].as_slice())
        .collect();
    let widths: Vec<usize> = signature
        .inputs
        .iter()
        .map(|s| s.dims.iter().product())
        .collect();
    let inputs: Vec<Vec<f32>> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| random_rows(seed + i as u64, rows * w))
        .collect();
    let mixed = emulate_rows(&imported.plan, &row_weights, true, &inputs);
    for (r, weights) in row_weights.iter().enumerate() {
        let row: Vec<Vec<f32>> = inputs
            .iter()
            .zip(&widths)
            .map(|(x, w)| x[r * w..(r + 1) * w].to_vec())
            .collect();
        let alone = emulate_rows(&imported.plan, &[weights], false, &row);
        for (o, (all, one)) in mixed.iter().zip(&alone).enumerate() {
            let width = one.len();
            assert_eq!(
                all[r * width..(r + 1) * width]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{} output {o} row {r} (member {})",
                path.display(),
                r % members.len()
            );
        }
    }
}

#[test]
fn rows_of_mixed_members_each_give_what_their_member_gives_alone() {
    let dir = fixtures();
    let models = root().join("config/models");
    let paths = [
        models.join("alpha_mlp/1/model.onnx"),
        dir.path().join("cuda_ops/1/model.onnx"),
        models.join("seq_lstm_step/1/model.onnx"),
        dir.path().join("cuda_sequence_ops/1/model.onnx"),
        dir.path().join("cuda_conv/1/model.onnx"),
    ];
    for path in &paths {
        mixed_rows_match_each_member_alone(path, 5, 61);
    }
}
