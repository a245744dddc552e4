//! What KServe gives a serving runtime, against the `tickserve` binary: a
//! single-model repository (`model.onnx` at the top, or version directories)
//! named by `STORAGE_URI` and served under `--model-name`; logs a collector
//! can read (`--log-format json`, and no colour codes when standard error is
//! not a terminal).

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A `tickserve serve` started with `STORAGE_URI = storage` and `args`; its
/// HTTP address once it logs `ready`, and every line it logged until then.
struct Started {
    child: Child,
    http: String,
    lines: Vec<String>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(storage: &str, args: &[&str]) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickserve"))
        .arg("serve")
        .args(["--config", "config/tickserve.toml"])
        .args(["--http-port", "0", "--grpc-port", "0"])
        .args(args)
        .current_dir(support::root())
        .env("STORAGE_URI", storage)
        .env(
            "TICKSERVE_ONNXRUNTIME_LIBRARY",
            support::root().join(".local/lib/libonnxruntime.so.1.31.1"),
        )
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    // From here on, dropping `started` (a failed assert too) stops the server.
    let mut started = Started {
        child,
        http: String::new(),
        lines: Vec::new(),
    };
    for line in stderr.lines() {
        let line = line.unwrap();
        started.lines.push(line.clone());
        if line.contains(r#""message":"ready""#) || line.contains(" ready http=") {
            started.http = line
                .split(|c: char| c.is_whitespace() || c == '"' || c == ',')
                .find_map(|word| {
                    word.strip_prefix("http=")
                        .or_else(|| (word.starts_with("127.0.0.1:")).then_some(word))
                })
                .unwrap()
                .to_string();
            return started;
        }
        assert!(
            !line.contains("ERROR"),
            "the server failed: {:#?}",
            started.lines
        );
    }
    panic!(
        "the server stopped before it was ready: {:#?}",
        started.lines
    );
}

fn copy_model(to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(
        support::root().join("config/models/alpha_mlp/1/model.onnx"),
        to,
    )
    .unwrap();
}

/// A GET over a fresh connection (the standard library only: this test has
/// no async runtime): status and body.
fn get(url: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn a_single_model_from_storage_uri_is_served_under_its_name_with_json_logs() {
    let storage = tempfile::tempdir().unwrap();
    copy_model(&storage.path().join("model.onnx"));
    let uri = format!("file://{}", storage.path().display());
    let server = start(
        &uri,
        &["--model-name", "desk_signal", "--log-format", "json"],
    );
    for line in &server.lines {
        let parsed: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
        assert!(parsed.get("level").is_some(), "{line}");
    }
    assert!(
        server
            .lines
            .iter()
            .any(|l| l.contains("model repository from STORAGE_URI")),
        "{:#?}",
        server.lines
    );
    let base = format!("http://{}", server.http);
    assert_eq!(get(&format!("{base}/v2/models/desk_signal/ready")).0, 200);
    let (status, metadata) = get(&format!("{base}/v2/models/desk_signal"));
    assert_eq!(status, 200, "{metadata}");
    assert!(metadata.contains(r#""versions":["1"]"#), "{metadata}");
    assert_eq!(get(&format!("{base}/v2/models/alpha_mlp/ready")).0, 404);
}

#[test]
fn version_directories_alone_are_one_model_and_text_logs_have_no_colour_codes() {
    let storage = tempfile::tempdir().unwrap();
    copy_model(&storage.path().join("1/model.onnx"));
    copy_model(&storage.path().join("2/model.onnx"));
    let server = start(
        &storage.path().display().to_string(),
        &["--model-name", "desk_signal"],
    );
    assert!(
        server.lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a log that is not a terminal: {:#?}",
        server.lines
    );
    let base = format!("http://{}", server.http);
    // The default version policy serves the highest version only.
    assert_eq!(
        get(&format!("{base}/v2/models/desk_signal/versions/1/ready")).0,
        404
    );
    assert_eq!(
        get(&format!("{base}/v2/models/desk_signal/versions/2/ready")).0,
        200
    );
}

#[test]
fn a_remote_storage_uri_means_kserve_fetched_it_into_mnt_models() {
    use tickserve_server::cli::storage_uri_path;
    assert_eq!(
        storage_uri_path("gs://bucket/models"),
        Path::new("/mnt/models")
    );
    assert_eq!(
        storage_uri_path("pvc://models/desk"),
        Path::new("/mnt/models")
    );
    assert_eq!(
        storage_uri_path("file:///srv/models"),
        Path::new("/srv/models")
    );
    assert_eq!(storage_uri_path("/srv/models"), Path::new("/srv/models"));
}
