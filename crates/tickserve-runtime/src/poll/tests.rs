use std::path::Path;

use super::{MAX_DEPTH, MAX_FILES, print};

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_top_model_file_is_version_1_unless_a_version_directory_is() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path();
    write(&model.join("model.onnx"), b"one");
    let before = print(model);
    assert!(before.versions.contains_key(&1), "{before:?}");
    write(&model.join("model.onnx"), b"changed");
    assert_ne!(
        print(model),
        before,
        "a changed top model.onnx is a changed version 1"
    );

    // With a `1/` directory beside it, version 1 is the directory.
    write(&model.join("1/model.onnx"), b"one");
    let before = print(model);
    write(&model.join("1/model.onnx"), b"changed");
    assert_ne!(
        print(model),
        before,
        "a changed 1/model.onnx is a changed version 1"
    );
    let before = print(model);
    write(&model.join("model.onnx"), b"changed again");
    assert_eq!(
        print(model).versions,
        before.versions,
        "the top file is not version 1 then"
    );
}

#[test]
fn a_version_directory_is_read_four_levels_deep_and_no_deeper() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path();
    // Levels 0 (the version directory) to MAX_DEPTH + 1, a file in each.
    let mut level = model.join("1");
    let mut levels = Vec::new();
    for depth in 0..=MAX_DEPTH + 1 {
        write(&level.join("x"), b"x");
        levels.push(level.clone());
        level = level.join(format!("d{depth}"));
    }
    let before = print(model);
    write(&levels[MAX_DEPTH].join("x"), b"changed");
    let after = print(model);
    assert_ne!(after, before, "a file {MAX_DEPTH} levels down counts");
    write(&levels[MAX_DEPTH + 1].join("x"), b"changed");
    assert_eq!(
        print(model),
        after,
        "a file {} levels down does not",
        MAX_DEPTH + 1
    );
}

#[test]
fn a_version_directory_is_read_up_to_its_file_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path();
    let version = model.join("1");
    std::fs::create_dir_all(&version).unwrap();
    // Names sort in the order they are read: f00000 ... f10000.
    for i in 0..=MAX_FILES {
        std::fs::write(version.join(format!("f{i:05}")), b"x").unwrap();
    }
    let before = print(model);
    std::fs::write(version.join(format!("f{:05}", MAX_FILES - 1)), b"changed").unwrap();
    let after = print(model);
    assert_ne!(after, before, "the last file within the budget counts");
    std::fs::write(version.join(format!("f{MAX_FILES:05}")), b"changed").unwrap();
    assert_eq!(print(model), after, "a file past the budget does not");
}
