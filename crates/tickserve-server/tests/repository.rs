//! Model control (the repository extension) with Triton's official Python
//! clients against a real server on loopback, over a scratch repository: new
//! family members load without compiling, unloading answers what is in
//! flight, a failed load leaves the old version serving (tests/e2e_repository.py).

#![allow(clippy::unwrap_used)]

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_with_tritonclient() {
    let source = common::root().join("config/models");
    let scratch = tempfile::tempdir().unwrap();
    for model in ["alpha_mlp", "tick_000", "tick_001"] {
        copy_dir(&source.join(model), &scratch.path().join(model));
    }
    let server = common::start(&common::config(scratch.path())).await;
    let (http, grpc) = (server.http_addr.to_string(), server.grpc_addr.to_string());
    let output = tokio::process::Command::new(common::python())
        .arg(common::root().join("tests/e2e_repository.py"))
        .args(["--http", &http, "--grpc", &grpc, "--repository"])
        .arg(scratch.path())
        .arg("--source")
        .arg(&source)
        .output()
        .await
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(output.status.success(), "repository check failed:\n{text}");
    assert!(text.contains("repository control ok"));
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
