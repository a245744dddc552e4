//! `tickserve check` and `tickserve check --cuda-reference`, run as a user runs
//! them: each model's engine and why one is not compiled; one line per
//! model in the documented form, exit 0 when every model matches ONNX
//! Runtime or is refused by name, non-zero on a mismatch.

use std::path::Path;
use std::process::{Command, Output};

use crate::support;

fn cuda_reference(repository: &Path, extra: &[&str]) -> (Output, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tickserve"))
        .args([
            "check",
            "--cuda-reference",
            "--config",
            "config/tickserve.toml",
        ])
        .arg("--model-repository")
        .arg(repository)
        .args(extra)
        .current_dir(support::root())
        .env(
            "TICKSERVE_ONNXRUNTIME_LIBRARY",
            support::root().join(".local/lib/libonnxruntime.so.1.31.1"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    (output, stdout)
}

/// `tickserve check` on `repository`, with the sample configuration.
fn check(repository: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tickserve"))
        .args(["check", "--config", "config/tickserve.toml"])
        .arg("--model-repository")
        .arg(repository)
        .current_dir(support::root())
        .env(
            "TICKSERVE_ONNXRUNTIME_LIBRARY",
            support::root().join(".local/lib/libonnxruntime.so.1.31.1"),
        )
        .output()
        .unwrap()
}

/// The `max_rel` of `line`, which must read `MODEL cuda-reference ok max_rel=R`.
fn ok_within(line: &str, model: &str) -> f64 {
    let rest = line
        .strip_prefix(&format!("{model} cuda-reference ok max_rel="))
        .unwrap_or_else(|| panic!("not an ok line for {model}: {line}"));
    rest.parse().unwrap()
}

#[test]
fn every_sample_model_matches_onnx_runtime() {
    let (output, stdout) = cuda_reference(&support::root().join("config/models"), &[]);
    assert!(output.status.success());
    let lines: Vec<&str> = stdout.lines().collect();
    let models = [
        "alpha_mlp",
        "seq_lstm",
        "seq_lstm_step",
        "seq_lstm_window",
        "tick_000",
        "tick_001",
        "tick_002",
        "tick_003",
        "tick_004",
        "tick_005",
        "tick_006",
        "tick_007",
    ];
    assert_eq!(lines.len(), models.len(), "{stdout}");
    for (line, model) in lines.iter().zip(models) {
        assert!(ok_within(line, model) <= 1e-5, "{line}");
    }
}

#[test]
fn a_refused_model_is_named_and_a_mismatch_fails_the_command() {
    let fixtures = support::fixture_repository();
    let repository = tempfile::tempdir().unwrap();
    for model in ["cuda_sequence_ops", "cuda_bidirectional"] {
        let dir = repository.path().join(model).join("1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixtures.path().join(model).join("1/model.onnx"),
            dir.join("model.onnx"),
        )
        .unwrap();
    }
    let (output, stdout) = cuda_reference(repository.path(), &[]);
    assert!(output.status.success(), "unsupported is not a failure");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "cuda_bidirectional cuda-reference unsupported: op LSTM (node 'h'): direction \
         'bidirectional' (only forward is supported)"
    );
    assert!(ok_within(lines[1], "cuda_sequence_ops") <= 1e-5);

    // No tolerance at all: float rounding alone is a mismatch, and the
    // command fails, saying where the largest difference was.
    let (output, stdout) = cuda_reference(repository.path(), &["--tolerance", "0"]);
    assert!(!output.status.success());
    assert!(
        stdout.contains("cuda_sequence_ops cuda-reference mismatch max_rel="),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cuda_sequence_ops: the largest difference: "),
        "{stderr}"
    );
}

#[test]
fn exported_models_from_pytorch_and_tf2onnx_match_onnx_runtime() {
    let corpus = support::root().join("crates/tickserve-engine-cuda/tests/exported");
    let (output, stdout) = cuda_reference(&corpus, &[]);
    assert!(output.status.success());
    let lines: Vec<&str> = stdout.lines().collect();
    let imported = [
        "pt2_gru2",
        "pt2_lstm1",
        "pt2_mlp",
        "pt2_mlp_norm",
        "pt_gru1",
        "pt_gru2",
        "pt_lstm1",
        "pt_lstm2",
        "pt_lstm_multi",
        "pt_lstm_state",
        "pt_mlp",
        "pt_mlp_norm",
        "tf_gru1",
        "tf_gru2",
        "tf_lstm1",
        "tf_lstm2",
        "tf_lstm_multi",
        "tf_mlp",
    ];
    // tf2onnx writes a Keras GRU with reset_after=False as a Loop of its
    // own, and a Keras LayerNormalization as a reshape around a
    // BatchNormalization.
    let refused = [("tf_gru_v1", "op Less"), ("tf_mlp_norm", "op ReduceProd")];
    assert_eq!(lines.len(), imported.len() + refused.len(), "{stdout}");
    for line in lines {
        let model = line.split(' ').next().unwrap_or_default();
        match refused.iter().find(|(name, _)| *name == model) {
            Some((_, op)) => assert!(
                line.starts_with(&format!("{model} cuda-reference unsupported: {op}")),
                "{line}"
            ),
            None => {
                assert!(imported.contains(&model), "{line}");
                assert!(ok_within(line, model) <= 1e-5, "{line}");
            }
        }
    }
}

/// `tickserve check` names each model's engine and, under a model the
/// compiled CPU engine does not take, why.
#[test]
fn check_names_each_models_engine_and_why_one_is_not_compiled() {
    let fixtures = support::fixture_repository();
    let repository = tempfile::tempdir().unwrap();
    for model in ["cuda_sequence_ops", "typed_io", "tree_gbt"] {
        let dir = repository.path().join(model).join("1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixtures.path().join(model).join("1/model.onnx"),
            dir.join("model.onnx"),
        )
        .unwrap();
    }
    let output = check(repository.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let engine = |model: &str| {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{model} ")))
            .unwrap_or_else(|| panic!("no line for {model}: {stdout}"));
        line.split_whitespace().nth(4).unwrap().to_string()
    };
    assert_eq!(engine("cuda_sequence_ops"), "tickserve_cpu", "{stdout}");
    assert_eq!(engine("tree_gbt"), "tickserve_cpu", "{stdout}");
    assert_eq!(engine("typed_io"), "onnxruntime", "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("typed_io "))
        .unwrap();
    assert!(
        lines[at + 1].contains("not on the compiled CPU engine: it cannot import it")
            && lines[at + 1].contains("INT64"),
        "{stdout}"
    );
}

/// `tickserve check` says, under each model whose `gpu_mode` asks for the
/// resident kernel, whether its ticks run resident on a GPU (here, with no
/// GPU: would run) and, where they would not, why; a model left on
/// `graphs` gets no such line.
#[test]
fn check_says_which_models_run_resident_and_why_the_others_do_not() {
    let samples = support::root().join("config/models");
    // Models of the samples, each with `gpu_mode` set as given: `tickserve
    // check`'s output on a repository of them.
    let check_of = |models: &[(&str, Option<&str>)]| {
        let repository = tempfile::tempdir().unwrap();
        for &(model, mode) in models {
            let dir = repository.path().join(model);
            std::fs::create_dir_all(dir.join("1")).unwrap();
            std::fs::copy(
                samples.join(model).join("1/model.onnx"),
                dir.join("1/model.onnx"),
            )
            .unwrap();
            let mut toml =
                std::fs::read_to_string(samples.join(model).join("model.toml")).unwrap_or_default();
            if let Some(mode) = mode {
                toml = format!("gpu_mode = \"{mode}\"\n{toml}");
            }
            std::fs::write(dir.join("model.toml"), toml).unwrap();
        }
        let output = check(repository.path());
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "{stdout}");
        stdout
    };
    // The line under a model's, if it is a gpu_mode line.
    let note = |stdout: &str, model: &str| {
        let lines: Vec<&str> = stdout.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("{model} ")))
            .unwrap_or_else(|| panic!("no line for {model}: {stdout}"));
        lines
            .get(at + 1)
            .filter(|l| l.trim_start().starts_with("gpu_mode: "))
            .map(|l| l.trim().to_string())
    };
    let stdout = check_of(&[
        ("seq_lstm_step", Some("auto")),
        ("seq_lstm", Some("auto")),
        ("alpha_mlp", Some("auto")),
        ("tick_000", None),
    ]);
    assert_eq!(
        note(&stdout, "seq_lstm_step").as_deref(),
        Some("gpu_mode: on a GPU its ticks would run resident"),
        "{stdout}"
    );
    let window = note(&stdout, "seq_lstm").unwrap_or_default();
    assert!(
        window.contains("would run on CUDA graphs, not resident")
            && window.contains("a window of 30 steps"),
        "{stdout}"
    );
    // A softmax is in the kernel's set.
    assert_eq!(
        note(&stdout, "alpha_mlp").as_deref(),
        Some("gpu_mode: on a GPU its ticks would run resident"),
        "{stdout}"
    );
    assert_eq!(note(&stdout, "tick_000"), None, "{stdout}");
    // Resident required of a model the kernel cannot run: the load would fail.
    let stdout = check_of(&[("seq_lstm", Some("resident"))]);
    let required = note(&stdout, "seq_lstm").unwrap_or_default();
    assert!(
        required.contains("would fail to load") && required.contains("a window of 30 steps"),
        "{stdout}"
    );
}
