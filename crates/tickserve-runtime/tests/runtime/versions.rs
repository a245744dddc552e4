//! A model of several versions, as loaded: a shadow is kept only on a ready
//! version whose inputs and outputs are its own, and only a lookup that names
//! no version may move a sequence's tick to the version it lives on.

use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

use tickserve_testing::sample_version;

use crate::support::library;

#[test]
fn a_shadow_whose_inputs_differ_from_its_primarys_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    sample_version(dir.path(), "tick_000", "mixed", 1);
    sample_version(dir.path(), "alpha_mlp", "mixed", 2);
    sample_version(dir.path(), "tick_001", "mixed", 3);
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
    sample_version(dir.path(), "alpha_mlp", "several", 1);
    sample_version(dir.path(), "alpha_mlp", "several", 2);
    std::fs::write(
        dir.path().join("several/model.toml"),
        "version_policy = \"all\"\n",
    )
    .unwrap();
    sample_version(dir.path(), "alpha_mlp", "single", 1);
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
