//! The generated CUDA C, run on the CPU: each plan's module compiled by the
//! host's C++ compiler behind a small emulation of CUDA's thread indices
//! (one kernel call per thread, one thread after another; a device pointer
//! is a host pointer), its steps run in the order the engine records them
//! (the products computed here as cuBLAS computes them, the recurrent layers
//! step by step with their gate and reset kernels, the initial states copied
//! or zeroed), gives what ONNX Runtime gives within 1e-5. No GPU needed:
//! this is the kernels' own arithmetic and indexing checked where no GPU is.
//! Kernels that reduce across a warp (softmax, layer normalization) are not
//! emulated; plans with them are left to the GPU tests.

#![allow(clippy::unwrap_used, missing_docs, unsafe_code)]

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_core::{Buckets, CompiledModel, SOLE_MEMBER};
use tickserve_engine_cuda::kernels::{Kernel, gate_name, module_source, reset_name};
use tickserve_engine_cuda::plan::{Cell, Op, Plan, Recurrent, ValueId};
use tickserve_engine_cuda::reference::random_rows;
use tickserve_engine_cuda::{arrange, import};
use tickserve_engine_ort::{OrtCompileRequest, OrtEngine, OrtOptions};

mod common;

use common::{fixtures, read, root};

/// What the module needs to build and run as host code.
const EMULATION: &str = r#"
#include <math.h>
#include <string.h>
struct tickserve_dim { unsigned int x, y, z; };
static tickserve_dim blockIdx, blockDim, threadIdx;
extern "C" void tickserve_set_thread(unsigned int block, unsigned int size, unsigned int thread) {
    blockIdx.x = block; blockDim.x = size; threadIdx.x = thread;
}
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
// Not emulated: plans whose kernels reduce across a warp are left out.
static inline float __shfl_xor_sync(unsigned int, float x, int) { return x; }
"#;

type Elementwise = unsafe extern "C" fn(*mut f32, *const f32, *const f32, *const u64, i32);
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
);
type SetThread = unsafe extern "C" fn(u32, u32, u32);

/// A plan's module compiled for the host, and its kernels.
struct Module {
    library: libloading::Library,
    kernels: Vec<Kernel>,
    _dir: tempfile::TempDir,
}

impl Module {
    fn build(plan: &Plan) -> Module {
        let (source, kernels) = module_source(plan);
        let dir = tempfile::tempdir().unwrap();
        let (cpp, so) = (dir.path().join("module.cpp"), dir.path().join("module.so"));
        std::fs::write(&cpp, format!("{EMULATION}\n{source}")).unwrap();
        let built = std::process::Command::new("c++")
            .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o"])
            .arg(&so)
            .arg(&cpp)
            .output()
            .expect("a C++ compiler (c++) runs");
        assert!(
            built.status.success(),
            "{}\n{source}",
            String::from_utf8_lossy(&built.stderr)
        );
        // SAFETY: a library this test just built; its initialisers do nothing.
        let library = unsafe { libloading::Library::new(&so) }.unwrap();
        Module {
            library,
            kernels,
            _dir: dir,
        }
    }

    /// Runs `name` once per thread of a launch over `rows` rows of `width`.
    fn launch(&self, name: &str, rows: usize, width: usize, call: impl Fn(&libloading::Library)) {
        let kernel = self.kernels.iter().find(|k| k.name == name).unwrap();
        let (grid, block) = kernel.dims(rows, width);
        // SAFETY: the emulation's own setter, (u32, u32, u32).
        let set: libloading::Symbol<'_, SetThread> =
            unsafe { self.library.get(b"tickserve_set_thread") }.unwrap();
        for b in 0..grid {
            for t in 0..block {
                // SAFETY: as above.
                unsafe { set(b, block, t) };
                call(&self.library);
            }
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

/// Runs `plan` over `rows` rows of `inputs` through the emulated kernels, as
/// the engine records it; its outputs.
fn emulate(plan: &Plan, weights: &[Vec<f32>], inputs: &[Vec<f32>], rows: usize) -> Vec<Vec<f32>> {
    let module = Module::build(plan);
    let table: Vec<u64> = weights.iter().map(|w| w.as_ptr() as u64).collect();
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
                weights,
                &table,
                &mut values,
                rows,
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
            values[step.output] = product(
                &values[input],
                &weights[weight],
                transposed,
                rows * groups,
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
        module.launch(&name, rows, width, |library| {
            // SAFETY: the kernel's signature is KERNEL(name); every pointer
            // is a buffer of the sizes the plan gives it.
            unsafe {
                let kernel: libloading::Symbol<'_, Elementwise> =
                    library.get(name.as_bytes()).unwrap();
                kernel(out, a_ptr, b_ptr, table.as_ptr(), rows as i32);
            }
        });
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
    weights: &[Vec<f32>],
    table: &[u64],
    values: &mut [Vec<f32>],
    rows: usize,
) {
    let (steps, hidden) = (layer.steps, layer.hidden);
    let gh = layer.cell.gates() * hidden;
    values[h] = layer
        .initial_h
        .map_or_else(|| vec![0.0; rows * hidden], |v| values[v].clone());
    let mut cell = layer
        .initial_c
        .filter(|_| layer.cell == Cell::Lstm)
        .map_or_else(|| vec![0.0f32; rows * hidden], |v| values[v].clone());
    let xw = product(
        &values[layer.input],
        &weights[layer.w],
        true,
        rows * steps,
        layer.input_size,
        gh,
    );
    let mut y = vec![0.0f32; rows * steps * hidden];
    let resets = layer.cell
        == Cell::Gru {
            linear_before_reset: false,
        };
    for t in 0..steps {
        let hr = product(&values[h], &weights[layer.r], true, rows, hidden, gh);
        let mut hr2 = vec![0.0f32; rows * gh];
        let gates = |name: &str, h: *mut f32, c: *mut f32, y: *mut f32, hr2: *const f32| {
            module.launch(name, rows, hidden, |library| {
                // SAFETY: RECURRENT(name)'s signature; every pointer a buffer
                // of the layer's sizes.
                unsafe {
                    let kernel: libloading::Symbol<'_, Gates> =
                        library.get(name.as_bytes()).unwrap();
                    kernel(
                        h,
                        c,
                        y,
                        xw.as_ptr(),
                        hr.as_ptr(),
                        hr2,
                        table.as_ptr(),
                        rows as i32,
                        t as i32,
                    );
                }
            });
        };
        if resets {
            gates(
                &reset_name(index),
                values[h].as_mut_ptr(),
                cell.as_mut_ptr(),
                y.as_mut_ptr(),
                hr2.as_ptr(),
            );
            hr2 = product(&cell, &weights[layer.r], true, rows, hidden, gh);
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

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
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
    let mut ort = engine
        .compile(&OrtCompileRequest {
            family: "emulated",
            onnx: &model,
            signature: &signature,
            buckets: &Buckets::new(&[rows], None).unwrap(),
            weights: None,
        })
        .unwrap();
    for (i, data) in inputs.iter().enumerate() {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        ort.input_mut(0, i).copy_from_slice(&bytes);
    }
    ort.run(0, SOLE_MEMBER).unwrap();
    for (o, got) in ours.iter().enumerate() {
        let want = floats(ort.output(0, o));
        assert_eq!(got.len(), want.len(), "{} output {o}", path.display());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
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
    let engine = OrtEngine::new(
        &root().join(".local/lib/libonnxruntime.so.1.31.1"),
        OrtOptions {
            intra_op_threads: 1,
        },
    )
    .expect("run scripts/setup.sh");
    let dir = fixtures();
    let models = root().join("config/models");
    let paths = [
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
