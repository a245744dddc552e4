//! The kernels generated for real plans compile with NVRTC (a compiler, no
//! GPU needed: `scripts/setup.sh` installs libnvrtc.so.13 into `.local/lib`,
//! and `scripts/test.sh` puts it on LD_LIBRARY_PATH), and each step that
//! needs one gets an entry point.

use std::path::Path;

use tickserve_core::config::ModelConfig;
use tickserve_engine_cuda::import;
use tickserve_engine_cuda::kernels::{
    Launch, compile, lowerable, module_source, resident, resident_split,
};
use tickserve_engine_cuda::plan::Op;

use crate::support;

use support::{fixtures, read, root};

fn plan_of(path: &Path) -> tickserve_engine_cuda::plan::Plan {
    let model = read(path);
    let signature = model.signature(&ModelConfig::default()).unwrap();
    import(&model, &signature.inputs, None).unwrap().plan
}

#[test]
fn generated_kernels_compile_with_nvrtc() {
    let dir = fixtures();
    let models = [
        root().join("config/models/alpha_mlp/1/model.onnx"),
        root().join("config/models/tick_000/1/model.onnx"),
        dir.path().join("cuda_ops/1/model.onnx"),
        dir.path().join("cuda_sequence_ops/1/model.onnx"),
        dir.path().join("cuda_conv/1/model.onnx"),
    ];
    for path in &models {
        let plan = plan_of(path);
        let (source, kernels) = module_source(&plan);
        assert!(!kernels.is_empty());
        let compiled = compile(&source, "sm_90").unwrap_or_else(|e| {
            panic!(
                "{}: {e}\n(run scripts/setup.sh; LD_LIBRARY_PATH=.local/lib)\n{source}",
                path.display()
            )
        });
        // Machine code for the architecture asked (an ELF image), so the
        // driver compiles nothing at load; the PTX beside it as a fallback.
        let cubin = compiled.cubin.as_deref().unwrap_or_default();
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "{}: no CUBIN",
            path.display()
        );
        let ptx = &compiled.ptx;
        for kernel in &kernels {
            assert!(
                ptx.contains(&format!(".entry {}(", kernel.name)),
                "{}: no entry {} in the PTX",
                path.display(),
                kernel.name
            );
        }
    }
}

#[test]
fn the_resident_kernel_compiles_with_nvrtc() {
    let plan = plan_of(&root().join("config/models/seq_lstm_step/1/model.onnx"));
    let resident = resident(&plan, &[("h_in", "h_out"), ("c_in", "c_out")]).unwrap();
    let compiled = compile(&resident.source, "sm_90").unwrap_or_else(|e| {
        panic!(
            "{e}\n(run scripts/setup.sh; LD_LIBRARY_PATH=.local/lib)\n{}",
            resident.source
        )
    });
    assert!(
        compiled
            .cubin
            .as_deref()
            .unwrap_or_default()
            .starts_with(b"\x7fELF")
    );
    assert!(
        compiled.ptx.contains(".entry resident("),
        "{}",
        compiled.ptx
    );
    // The mailbox's flags are read and written with system-scope order.
    assert!(compiled.ptx.contains("ld.acquire.sys"), "{}", compiled.ptx);
    assert!(compiled.ptx.contains("st.release.sys"), "{}", compiled.ptx);
    // A unit's gates are summed across its warp, and its weights read
    // through L2.
    assert!(compiled.ptx.contains("shfl.sync.bfly"), "{}", compiled.ptx);
    assert!(compiled.ptx.contains("ld.global.cg"), "{}", compiled.ptx);
    // A block a slot: no cluster instruction, so it runs on any GPU.
    assert!(!compiled.ptx.contains(".cluster"), "{}", compiled.ptx);
    // A slot on a cluster of four blocks: their barriers, and stores into
    // each other's shared memory.
    // Its weights on chip too: dynamic shared memory.
    let split = resident_split(
        &plan,
        &[("h_in", "h_out"), ("c_in", "c_out")],
        4,
        200 * 1024,
    )
    .unwrap();
    assert!(split.on_chip_bytes > 0);
    let compiled =
        compile(&split.source, "sm_90").unwrap_or_else(|e| panic!("{e}\n{}", split.source));
    assert!(compiled.ptx.contains(".extern .shared"), "{}", compiled.ptx);
    // An MLP into a softmax, and GRUs resetting after and before the
    // recurrent product, likewise.
    let mlp = plan_of(&root().join("config/models/alpha_mlp/1/model.onnx"));
    let mlp = resident_split(&mlp, &[], 2, 200 * 1024).unwrap();
    compile(&mlp.source, "sm_90").unwrap_or_else(|e| panic!("alpha_mlp: {e}\n{}", mlp.source));
    let steps = support::step_models();
    for name in ["gru_step", "gru_step_reset0"] {
        let plan = plan_of(&steps.path().join(format!("{name}/1/model.onnx")));
        let gru = resident_split(&plan, &[("h_in", "h_out")], 2, 200 * 1024).unwrap();
        compile(&gru.source, "sm_90").unwrap_or_else(|e| panic!("{name}: {e}\n{}", gru.source));
    }
    // The layout ops around PyTorch's stateful LSTM step (slices, joins,
    // a gather), and a grouped product, a copy and a sum of activations.
    let exported = root().join("crates/tickserve-engine-cuda/tests/exported");
    let lstm = plan_of(&exported.join("pt_lstm_state/1/model.onnx"));
    let lstm = resident_split(&lstm, &[("h_in", "h_out"), ("c_in", "c_out")], 2, 0).unwrap();
    compile(&lstm.source, "sm_90")
        .unwrap_or_else(|e| panic!("pt_lstm_state: {e}\n{}", lstm.source));
    let every = plan_of(&fixtures().path().join("cuda_ops/1/model.onnx"));
    let every = resident_split(&every, &[], 2, 200 * 1024).unwrap();
    compile(&every.source, "sm_90").unwrap_or_else(|e| panic!("cuda_ops: {e}\n{}", every.source));
    for instruction in [
        "barrier.cluster.arrive.release",
        "barrier.cluster.wait.acquire",
        "mapa.shared::cluster",
        "st.shared::cluster.f32",
    ] {
        assert!(
            compiled.ptx.contains(instruction),
            "{instruction}\n{}",
            compiled.ptx
        );
    }
}

#[test]
fn softmax_and_layer_norm_run_a_warp_per_segment() {
    let plan = plan_of(&root().join("config/models/alpha_mlp/1/model.onnx"));
    let (source, kernels) = module_source(&plan);
    assert_eq!(kernels.len(), 3, "{source}");
    assert_eq!(kernels[2].launch, Launch::PerSegment(3));
    // 64 rows of 3-wide segments: 64 warps, 16 blocks of 128 threads.
    assert_eq!(kernels[2].dims(64, 3), (16, 128));
    // Gemm 1's epilogue (bias + Relu), 64 rows × 64 wide.
    assert_eq!(kernels[0].dims(64, 64), (32, 128));
    // A bad kernel is a clear error, not a panic.
    let error = compile("this is not CUDA", "sm_90").unwrap_err();
    assert!(error.to_string().contains("NVRTC"), "{error}");
}

#[test]
fn layout_ops_and_recurrent_gates_run_one_thread_per_element() {
    let dir = fixtures();
    let plan = plan_of(&dir.path().join("cuda_sequence_ops/1/model.onnx"));
    lowerable(&plan).unwrap();
    let (source, kernels) = module_source(&plan);
    let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
    // LSTM, GRU (reset after its product), Slice, GRU (reset first: a reset
    // kernel, then the gates), Gather, Concat, Transpose, and the head's
    // product, which needs no kernel.
    assert_eq!(
        names,
        [
            "step_0",
            "step_1",
            "step_2",
            "step_3_reset",
            "step_3",
            "step_4",
            "step_5",
            "step_6"
        ],
        "{source}"
    );
    assert!(kernels.iter().all(|k| k.launch == Launch::PerElement));
    // The Transpose of [batch, 5, 2] to [batch, 2, 5] reads column (c / 5, c % 5)
    // from (c % 5) * 2 + c / 5.
    assert!(
        source.contains("a[row * 10 + (0 + (col / 1 % 5) * 2 + (col / 5 % 2) * 1)]"),
        "{source}"
    );
    // The LSTM's gate kernel reads step t's projection of its row and writes
    // every step's hidden state (Y is read).
    assert!(source.contains("RECURRENT(step_0)"), "{source}");
    assert!(
        source.contains("const float* x = xw + ((long long)row * 6 + t) * 20;"),
        "{source}"
    );
    assert!(
        source.contains("y[((long long)row * 6 + t) * 5 + u] = hn;"),
        "{source}"
    );
    // One thread per hidden unit and row: 64 rows of 5, three blocks.
    assert_eq!(kernels[0].dims(64, 5), (3, 128));
}

#[test]
fn a_concat_of_three_activations_is_not_lowered() {
    let mut plan = plan_of(&root().join("config/models/alpha_mlp/1/model.onnx"));
    lowerable(&plan).unwrap();
    let input = plan.inputs[0].1;
    plan.steps[0].op = Op::Concat {
        inputs: vec![input, input, input],
        outer: 1,
        chunks: vec![50, 50, 50],
    };
    let error = lowerable(&plan).unwrap_err();
    assert!(error.contains("Concat of 3 activations"), "{error}");
}
