//! The repository poll on a real runtime, one read at a time
//! (`Runtime::poll_repository`, which the server calls every
//! `repository.poll_interval`): a change applies once two reads in a row agree
//! on it, a changed `model.toml` reloads the model with its new settings, a
//! version directory changed in place reloads that version, and a new version
//! loads without reloading the ones that serve; a `model.toml` that does not
//! parse is a new model's error and leaves a serving model serving, and so
//! does a version rewritten into a file that does not load.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tickserve_core::config::ServerConfig;
use tickserve_runtime::{ModelHandle, Poller, Runtime, VersionState};

use tickserve_testing::sample_version;

use crate::support::{copy_sample_model, library};

fn runtime(repository: &Path) -> Runtime {
    let mut config = ServerConfig::default();
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = library();
    Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)")
}

/// Version `version` of `model`, which must serve.
fn serving(runtime: &Runtime, model: &str, version: u64) -> Arc<ModelHandle> {
    match runtime.models()[model].versions.get(&version) {
        Some(VersionState::Ready(handle)) => Arc::clone(handle),
        other => panic!("{model} version {version} does not serve: {other:?}"),
    }
}

/// Two reads: the first sees the change (and applies nothing: a file may
/// still be written), the second agrees and applies it. Returns what each
/// read applied.
fn poll_twice(runtime: &Runtime, poller: &mut Poller) -> (usize, usize) {
    (
        runtime.poll_repository(poller),
        runtime.poll_repository(poller),
    )
}

/// Moves `path`'s modification time on by a second, as a rewrite does.
fn touch(path: &Path) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    let modified = file.metadata().unwrap().modified().unwrap();
    file.set_modified(modified + Duration::from_secs(1))
        .unwrap();
}

#[test]
fn a_changed_model_toml_reloads_the_model_with_its_new_settings() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("buckets = [1, 4]\n"));
    let runtime = runtime(dir.path());
    let mut poller = runtime.poller();
    let before = serving(&runtime, "alpha_mlp", 1);
    assert_eq!(before.loaded.settings.buckets.sizes(), [1, 4]);
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 0), "nothing changed");

    std::fs::write(
        dir.path().join("alpha_mlp/model.toml"),
        "buckets = [1, 8]\n",
    )
    .unwrap();
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 1));
    let after = serving(&runtime, "alpha_mlp", 1);
    assert_eq!(after.loaded.settings.buckets.sizes(), [1, 8]);
    assert!(!Arc::ptr_eq(&before, &after), "the version was reloaded");
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 0), "applied once");
}

#[test]
fn a_version_changed_in_place_reloads_and_a_new_one_leaves_the_others_serving() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", Some("version_policy = \"all\"\n"));
    let runtime = runtime(dir.path());
    let mut poller = runtime.poller();
    let first = serving(&runtime, "alpha_mlp", 1);

    // Version 1's file rewritten where it is.
    touch(&dir.path().join("alpha_mlp/1/model.onnx"));
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 1));
    let reloaded = serving(&runtime, "alpha_mlp", 1);
    assert!(
        !Arc::ptr_eq(&first, &reloaded),
        "version 1 was not reloaded"
    );

    // A new version loads; version 1 serves on as it was.
    sample_version(dir.path(), "alpha_mlp", "alpha_mlp", 2);
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 1));
    serving(&runtime, "alpha_mlp", 2);
    assert!(
        Arc::ptr_eq(&reloaded, &serving(&runtime, "alpha_mlp", 1)),
        "version 1 was reloaded for a new version beside it"
    );
}

#[test]
fn a_model_toml_that_does_not_parse_is_the_new_models_error_and_leaves_a_serving_one_serving() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    let runtime = runtime(dir.path());
    let mut poller = runtime.poller();
    let serving_before = serving(&runtime, "alpha_mlp", 1);

    // A new model whose model.toml does not parse: in the index, with why,
    // as a failure of a change while serving (the server stays ready).
    sample_version(dir.path(), "alpha_mlp", "broken_toml", 1);
    std::fs::write(dir.path().join("broken_toml/model.toml"), "buckets = [\n").unwrap();
    // The serving model's model.toml broken the same way.
    std::fs::write(dir.path().join("alpha_mlp/model.toml"), "buckets = [\n").unwrap();
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 2));

    let models = runtime.models();
    let broken = &models["broken_toml"];
    let error = broken.error.as_deref().unwrap_or_default();
    assert!(error.contains("model.toml"), "{broken:?}");
    assert!(broken.late, "{broken:?}");
    assert!(broken.versions.is_empty(), "{broken:?}");
    // What served serves on, unchanged, with no error in its place.
    assert!(Arc::ptr_eq(
        &serving_before,
        &serving(&runtime, "alpha_mlp", 1)
    ));
    assert_eq!(models["alpha_mlp"].error, None);
}

#[test]
fn a_version_whose_rewrite_fails_to_load_serves_on_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    copy_sample_model(dir.path(), "alpha_mlp", None);
    let runtime = runtime(dir.path());
    let mut poller = runtime.poller();
    let before = serving(&runtime, "alpha_mlp", 1);

    std::fs::write(
        dir.path().join("alpha_mlp/1/model.onnx"),
        b"not an onnx model",
    )
    .unwrap();
    assert_eq!(poll_twice(&runtime, &mut poller), (0, 1));
    assert!(
        Arc::ptr_eq(&before, &serving(&runtime, "alpha_mlp", 1)),
        "the version that served was replaced"
    );
    assert!(runtime.models()["alpha_mlp"].late);
}
