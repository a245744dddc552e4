//! Support shared by the workspace's integration tests: paths into the
//! checkout (its root, the installed ONNX Runtime, Python, the sample models),
//! the process's peak memory, and [`alone`], which runs a test in a process of
//! its own when what it measures belongs to the process.
//!
//! Each crate's integration tests are one binary, so its tests share one
//! process: the metrics recorder, the peak resident memory, the thread list
//! and the environment are the process's, not a test's. A test that reads
//! one of those as its measure (a counter summed over every model, `VmHWM`,
//! the count of threads) starts with
//! `if tickserve_testing::alone(module_path!(), "its_name") { return; }`.
//! Everything else runs side by side as usual.

pub mod etcd;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the copy of the test binary [`alone`] starts: the one test the copy
/// is to run.
const ALONE: &str = "TICKSERVE_TEST_ALONE";

/// The repository root: `TICKSERVE_ROOT` where set (`scripts/gpu_check.sh`
/// runs test executables beside another checkout), else this checkout.
pub fn root() -> PathBuf {
    match std::env::var_os("TICKSERVE_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// The ONNX Runtime library `scripts/setup.sh` installs.
pub fn onnxruntime_library() -> PathBuf {
    root().join(".local/lib/libonnxruntime.so.1.31.1")
}

/// Copies sample model `from` (its version 1 in `config/models`) to
/// `repository/name/version/model.onnx`.
pub fn sample_version(repository: &Path, from: &str, name: &str, version: u64) {
    let dir = repository.join(name).join(version.to_string());
    std::fs::create_dir_all(&dir).expect("a version directory");
    std::fs::copy(
        root().join("config/models").join(from).join("1/model.onnx"),
        dir.join("model.onnx"),
    )
    .expect("the sample model (run from a checkout)");
}

/// The project's Python, with onnxruntime, onnx and Triton's clients
/// (`scripts/setup.sh`), or `TICKSERVE_PYTHON` where set (the GPU machine's
/// Python, which has onnx and numpy); panics saying so where it is missing.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("TICKSERVE_PYTHON") {
        return PathBuf::from(python);
    }
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh (or set TICKSERVE_PYTHON)",
        python.display()
    );
    python
}

/// Runs `scripts/dev/make_models.py WHICH DIR` with [`python`]: `--fixtures`
/// (the op-set, exported-layout and hostile fixture models) or `--bench`
/// (the per-tick benchmark's models) into `dir`; panics with the script's
/// output where it fails.
pub fn write_models(which: &str, dir: &Path) {
    let python = python();
    let output = Command::new(&python)
        .arg(root().join("scripts/dev/make_models.py"))
        .arg(which)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{} cannot run: {e}", python.display()));
    assert!(
        output.status.success(),
        "{} scripts/dev/make_models.py {which} failed: {}",
        python.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs test `test` of module `module` (pass `module_path!()`) again, alone
/// in a new process of this test binary, unless this is that process.
///
/// Returns true in the test's own process, once the copy ran the test and it
/// passed: the caller returns at once. Returns false in the copy, where the
/// caller goes on with the test. Panics with the copy's output when the test
/// failed there, or when the copy ran no test of that name (a misspelt name
/// fails rather than passes).
///
/// rusty-fork does this for synchronous test bodies only; the tests here are
/// mostly `async`, and this form keeps their bodies as they are.
pub fn alone(module: &str, test: &str) -> bool {
    // libtest names a test by its path inside the crate: drop the crate's name.
    let path = match module.split_once("::") {
        Some((_, inside)) => format!("{inside}::{test}"),
        None => test.to_string(),
    };
    if std::env::var_os(ALONE).is_some_and(|name| name == path.as_str()) {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(exe)
        .args([path.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .arg("--include-ignored")
        .env(ALONE, &path)
        .output()
        .expect("the test binary starts again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{path}, run alone, failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // What the copy printed, for `--nocapture` readers of this test.
    print!("{stdout}");
    eprint!("{stderr}");
    true
}

/// The process's peak resident memory (`VmHWM`), in bytes (Linux).
pub fn peak_resident() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kib * 1024
}

/// Resets the peak resident memory to the current resident memory (Linux;
/// where the kernel refuses, the peak stays, which only loosens a bound).
pub fn reset_peak_resident() {
    // Writing 5 to clear_refs resets VmHWM (proc(5)).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
