//! Shared by the server's integration tests: paths, a real server on loopback
//! port 0, the fixture repository, requests and metrics read back.
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use tickserve_core::config::ServerConfig;
use tickserve_server::Server;

/// The repository root, canonical.
pub fn root() -> PathBuf {
    tickserve_testing::root().canonicalize().unwrap()
}

pub use tickserve_testing::{alone, peak_resident, python, reset_peak_resident};

/// How long a Python check may run: each test file that runs one took at most
/// 15 s in all on the 2-core development machine (`cargo test`, 2026-11-27).
const PYTHON_CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `crates/tickserve-server/tests/python/{script}` with the project's Python against `server` (its
/// `--http` and `--grpc` addresses first, then `args`), prints what it
/// printed, and asserts it succeeded and printed `done`.
pub async fn run_python_check(
    server: &Server,
    script: &str,
    args: &[&std::ffi::OsStr],
    done: &str,
) {
    let (http, grpc) = (server.http_addr.to_string(), server.grpc_addr.to_string());
    let check = tokio::process::Command::new(python())
        .arg(
            root()
                .join("crates/tickserve-server/tests/python")
                .join(script),
        )
        .args(["--http", &http, "--grpc", &grpc])
        .args(args)
        .kill_on_drop(true)
        .output();
    // A check that stops answering (a client thread left waiting on a stream
    // keeps Python from exiting) fails the test rather than holding it.
    let output = tokio::time::timeout(PYTHON_CHECK_LIMIT, check)
        .await
        .unwrap_or_else(|_| panic!("{script} still running after {PYTHON_CHECK_LIMIT:?}"))
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(output.status.success(), "{script} failed:\n{text}");
    assert!(text.contains(done), "{script} did not finish:\n{text}");
}

/// Sample model `from` (its version 1 in config/models) as version `version`
/// of `name` in `repository` (deployed as [`deploy_version`] does), with `toml`
/// as its `model.toml` where given.
pub fn sample(repository: &Path, from: &str, name: &str, version: u64, toml: Option<&str>) {
    deploy_version(repository, name, version, from);
    if let Some(toml) = toml {
        std::fs::write(repository.join(name).join("model.toml"), toml).unwrap();
    }
}

/// Sample model `name`'s own `model.toml` (config/models), if it has one.
pub fn sample_toml(name: &str) -> Option<String> {
    std::fs::read_to_string(root().join("config/models").join(name).join("model.toml")).ok()
}

/// Copies sample model `from`'s version 1 file (config/models) into
/// `model/version` of `repository` the way a deployment should: written
/// under `.version` (the repository poll ignores it), then renamed.
pub fn deploy_version(repository: &Path, model: &str, version: u64, from: &str) {
    let hidden = repository.join(model).join(format!(".{version}"));
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::copy(
        root().join("config/models").join(from).join("1/model.onnx"),
        hidden.join("model.onnx"),
    )
    .unwrap();
    std::fs::rename(&hidden, repository.join(model).join(version.to_string())).unwrap();
}

/// A server configuration on loopback, ports picked by the OS.
pub fn config(repository: &Path) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.server.host = "127.0.0.1".into();
    config.server.http_port = 0;
    config.server.grpc_port = 0;
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = tickserve_testing::onnxruntime_library();
    // Tests share a working directory: each keeps halts only where it says.
    config.risk.halts_file = None;
    config
}

/// Starts a real server on `config`.
pub async fn start(config: &ServerConfig) -> Server {
    Server::start(config)
        .await
        .expect("server starts (run scripts/setup.sh first)")
}

/// A gRPC channel to `server`'s gRPC port.
pub async fn grpc_channel(server: &Server) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A v2 gRPC client connected to `server`.
pub async fn grpc_client(
    server: &Server,
) -> tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient<
    tonic::transport::Channel,
> {
    tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        format!("http://{}", server.grpc_addr),
    )
    .await
    .unwrap()
}

/// A repository of the test fixtures (scripts/dev/make_models.py --fixtures) plus
/// the sample `alpha_mlp`.
pub fn fixture_repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(python())
        .arg(root().join("scripts/dev/make_models.py"))
        .arg("--fixtures")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "make_models.py --fixtures failed");
    let alpha = dir.path().join("alpha_mlp/1");
    std::fs::create_dir_all(&alpha).unwrap();
    std::fs::copy(
        root().join("config/models/alpha_mlp/1/model.onnx"),
        alpha.join("model.onnx"),
    )
    .unwrap();
    dir
}

/// The sum of a counter over all its label sets in Prometheus text.
pub fn counter_total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A binary-extension request body for `rows` rows of `seq_lstm`, and the
/// length of its JSON header (the `Inference-Header-Content-Length`).
pub fn seq_lstm_body(rows: usize) -> (Vec<u8>, usize) {
    let header = serde_json::json!({"inputs": [{"name": "window", "datatype": "FP32",
        "shape": [rows, 30, 8], "parameters": {"binary_data_size": rows * 30 * 8 * 4}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend((0..rows * 30 * 8).flat_map(|i| ((i % 13) as f32 / 13.0).to_le_bytes()));
    (body, json_len)
}

/// What a server answered: status, `Retry-After`, body.
pub type Answer = (u16, Option<String>, String);

/// Sends `count` copies of a binary-extension `body` to `url` at once; each
/// task yields the answer, or the client's error.
pub fn flood(
    url: &str,
    body: &[u8],
    json_len: usize,
    count: usize,
) -> Vec<tokio::task::JoinHandle<Result<Answer, reqwest::Error>>> {
    let client = reqwest::Client::new();
    (0..count)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_string(), body.to_vec());
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("Inference-Header-Content-Length", json_len)
                    .body(body)
                    .send()
                    .await?;
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                Ok((r.status().as_u16(), retry_after, r.text().await?))
            })
        })
        .collect()
}

/// The JSON a GET of `url` answers.
pub async fn get_json(url: &str) -> serde_json::Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// POSTs `body` as JSON to `url`: the status and the JSON answer.
pub async fn post_json(url: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    send_json(reqwest::Client::new().post(url).json(body)).await
}

/// POSTs `body` as JSON to `url` with `key` as a Bearer token.
pub async fn post_json_as(
    key: &str,
    url: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    send_json(reqwest::Client::new().post(url).bearer_auth(key).json(body)).await
}

async fn send_json(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// The Prometheus text of the server at `base` (`http://host:port`).
pub async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A one-row `alpha_mlp` request over gRPC (50 features of 0.5, typed contents).
pub fn grpc_alpha_row() -> tickserve_proto::inference::ModelInferRequest {
    grpc_row("alpha_mlp", 50, 0.5)
}

/// A one-row request to `model` over gRPC: input `features`, `width` FP32
/// values of `value` (typed contents).
pub fn grpc_row(
    model: &str,
    width: usize,
    value: f32,
) -> tickserve_proto::inference::ModelInferRequest {
    use tickserve_proto::inference as pb;
    pb::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![1, width as i64],
            contents: Some(pb::InferTensorContents {
                fp32_contents: vec![value; width],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// POSTs `body` to `url` (a v2 infer endpoint), which must answer 200: the
/// version that answered.
pub async fn answered_version(url: &str, body: &serde_json::Value) -> String {
    let (status, answer) = post_json(url, body).await;
    assert_eq!(status, 200, "{answer} for {body}");
    answer["model_version"].as_str().unwrap().to_string()
}

/// Puts every endpoint group of `config` behind one key, given as Triton
/// writes it (`env:NAME`, `file:PATH` or the key itself) and sent in
/// `header`, on each of `front_ends`.
pub fn restrict_every_group(
    config: &mut ServerConfig,
    header: &str,
    key: &str,
    front_ends: &[tickserve_core::config::FrontEnd],
) {
    use tickserve_core::config::{EndpointGroup, Restriction};
    let groups = EndpointGroup::ALL.map(EndpointGroup::as_str).join(",");
    config.security.restricted = front_ends
        .iter()
        .map(|&front_end| {
            Restriction::parse_triton(&format!("{groups}:{header}={key}"), front_end).unwrap()
        })
        .collect();
}

/// The unary inference method's path, for [`RawCodec`] calls.
pub const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// Sends `message`, already encoded, as a unary ModelInfer call on `raw`.
pub async fn raw_model_infer(
    raw: &mut tonic::client::Grpc<tonic::transport::Channel>,
    message: Vec<u8>,
) -> Result<tonic::Response<tickserve_proto::inference::ModelInferResponse>, tonic::Status> {
    raw.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(MODEL_INFER);
    raw.unary(
        tonic::Request::new(bytes::Bytes::from(message)),
        path,
        RawCodec,
    )
    .await
}

/// Writes already-encoded messages as they are; reads answers with prost.
pub struct RawCodec;

pub struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = bytes::Bytes;
    type Decode = tickserve_proto::inference::ModelInferResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<tickserve_proto::inference::ModelInferResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic::codec::Codec::decoder(&mut tonic_prost::ProstCodec::<
            tickserve_proto::inference::ModelInferRequest,
            tickserve_proto::inference::ModelInferResponse,
        >::default())
    }
}

/// The longest a condition awaited with [`until`] may take to come true.
pub const BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// [`config`] in `poll` mode, reading the repository every `interval`.
pub fn poll_config(repository: &Path, interval: std::time::Duration) -> ServerConfig {
    let mut config = config(repository);
    config.security.model_control_mode = tickserve_core::config::ModelControlMode::Poll;
    config.repository.poll_interval = interval;
    config
}

/// Waits until `check` gives `Some`, at most [`BOUND`]; fails naming `what`.
pub async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < BOUND, "{what}: not within {BOUND:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The repository index of the server at `base`: (name, version, state,
/// reason) for each entry.
pub async fn repository_index(base: &str) -> Vec<(String, String, String, String)> {
    let (_, answer) = post_json(
        &format!("{base}/v2/repository/index"),
        &serde_json::json!({}),
    )
    .await;
    answer
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = |k: &str| {
                m.get(k)
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            (text("name"), text("version"), text("state"), text("reason"))
        })
        .collect()
}

/// Sends `request` as the one message of a `ModelStreamInfer` stream to
/// `server`: the stream's answer (an error is its `error_message`).
pub async fn stream_once(
    server: &Server,
    request: tickserve_proto::inference::ModelInferRequest,
) -> tickserve_proto::inference::ModelStreamInferResponse {
    use tokio_stream::StreamExt;
    let mut client = grpc_client(server).await;
    let mut answers = client
        .model_stream_infer(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(std::time::Duration::from_secs(10), answers.next())
        .await
        .expect("an answer within 10 s")
        .expect("the stream answered")
        .unwrap()
}

/// A TF Serving `PredictRequest` for `model`: one row of `values` under the
/// input `features`.
pub fn tf_predict(
    model: &str,
    values: &[f32],
) -> tickserve_proto::tensorflow::serving::PredictRequest {
    use tickserve_proto::tensorflow as tf;
    tf::serving::PredictRequest {
        model_spec: Some(tf::serving::ModelSpec {
            name: model.into(),
            ..Default::default()
        }),
        inputs: [(
            "features".to_string(),
            tf::TensorProto {
                dtype: tf::DataType::DtFloat as i32,
                tensor_shape: Some(tf::TensorShapeProto {
                    dim: [1, values.len() as i64]
                        .iter()
                        .map(|&size| tf::tensor_shape_proto::Dim {
                            size,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                float_val: values.to_vec(),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        output_filter: Vec::new(),
    }
}

/// The real server in a process of its own on `config_file`, in working
/// directory `cwd` (killed with SIGKILL when dropped); its HTTP address.
pub struct Process {
    /// The child process.
    pub child: std::process::Child,
    /// Its HTTP address, `host:port`.
    pub http: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tickserve serve` on `config_file` (ports 0) in `cwd`; returns
/// once it says it is ready (panics, with its log, if it stops before).
pub fn spawn_server(config_file: &Path, cwd: &Path) -> Process {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tickserve"))
        .args(["serve", "--http-port", "0", "--grpc-port", "0", "--config"])
        .arg(config_file)
        .current_dir(cwd)
        .env(
            "TICKSERVE_ONNXRUNTIME_LIBRARY",
            root().join(".local/lib/libonnxruntime.so.1.31.1"),
        )
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut lines = Vec::new();
    for line in stderr.by_ref() {
        let line = line.unwrap();
        if let Some(at) = line.find(" ready http=") {
            let http = line[at + " ready http=".len()..]
                .split_whitespace()
                .next()
                .unwrap()
                .to_string();
            // Its log is read on (and dropped), so that a full pipe never
            // stops the process.
            std::thread::spawn(move || stderr.for_each(drop));
            return Process { child, http };
        }
        lines.push(line);
    }
    let _ = child.wait();
    panic!("the server stopped before it was ready: {lines:#?}");
}
