//! Model control (the repository extension) with Triton's official Python
//! clients against a real server on loopback, over a scratch repository: new
//! family members load without compiling, unloading answers what is in
//! flight, a failed load leaves the old version serving (tests/python/repository_check.py).

use crate::support;

use tickserve_core::config::ModelControlMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_with_tritonclient() {
    // Alone: its Python check reads the compilations counter, summed over
    // every model.
    if support::alone(module_path!(), "load_and_unload_with_tritonclient") {
        return;
    }
    let source = support::root().join("config/models");
    let scratch = tempfile::tempdir().unwrap();
    for model in ["alpha_mlp", "tick_000", "tick_001"] {
        copy_dir(&source.join(model), &scratch.path().join(model));
    }
    let mut config = support::config(scratch.path());
    config.security.model_control_mode = ModelControlMode::Explicit;
    let server = support::start(&config).await;
    support::run_python_check(
        &server,
        "repository_check.py",
        &[
            "--repository".as_ref(),
            scratch.path().as_os_str(),
            "--source".as_ref(),
            source.as_os_str(),
        ],
        "repository control ok",
    )
    .await;
    server.shutdown().await.expect("clean shutdown");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
