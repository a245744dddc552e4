//! What a model's versions settle into when it loads, and how a request
//! finds one: the shadows its `model.toml` asks for, on the ready versions
//! whose inputs and outputs allow them; which lookups a sequence's tick may
//! move to the version the sequence lives on.

use std::path::Path;

use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

use crate::support::{library, root};

/// Sample model `from`'s file as version `version` of `model` in `repository`.
fn version(repository: &Path, model: &str, version: u64, from: &str) {
    let dir = repository.join(model).join(version.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        root().join("config/models").join(from).join("1/model.onnx"),
        dir.join("model.onnx"),
    )
    .unwrap();
}

#[test]
fn a_shadow_whose_inputs_differ_from_its_primarys_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    version(dir.path(), "mixed", 1, "tick_000");
    version(dir.path(), "mixed", 2, "alpha_mlp");
    version(dir.path(), "mixed", 3, "tick_001");
    std::fs::write(
        dir.path().join("mixed/model.toml"),
        "version_policy = \"all\"\n\n\
         [[shadow]]\nversion = \"2\"\nof = \"1\"\n\n\
         [[shadow]]\nversion = \"3\"\nof = \"1\"\n",
    )
    .unwrap();
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    let runtime = Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");
    let shadows = &runtime.models()["mixed"].shadows;
    // Version 3 (tick_001: tick_000's inputs and outputs) shadows 1;
    // version 2 (alpha_mlp: 50 features, not 16) does not.
    let of_one: Vec<&str> = shadows[&1]
        .iter()
        .map(|plan| plan.shadow.version.as_str())
        .collect();
    assert_eq!(of_one, ["3"], "{shadows:?}");
    assert_eq!(shadows.len(), 1, "{shadows:?}");
}

#[test]
fn only_a_request_that_names_no_version_of_a_model_of_several_is_sticky() {
    let dir = tempfile::tempdir().unwrap();
    version(dir.path(), "several", 1, "alpha_mlp");
    version(dir.path(), "several", 2, "alpha_mlp");
    std::fs::write(
        dir.path().join("several/model.toml"),
        "version_policy = \"all\"\n",
    )
    .unwrap();
    version(dir.path(), "single", 1, "alpha_mlp");
    let mut config = ServerConfig::default();
    config.repository.path = dir.path().to_path_buf();
    config.runtime.onnxruntime_library = library();
    let runtime = Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");
    // Sticky: a sequence's tick then goes to the version the sequence lives on.
    assert!(runtime.route("several", None).unwrap().sticky);
    assert!(runtime.route("several", Some("")).unwrap().sticky);
    // A version named is the version asked for; one version has no choice.
    assert!(!runtime.route("several", Some("1")).unwrap().sticky);
    assert!(!runtime.route("single", None).unwrap().sticky);
}
