//! Every kind of bad input, over HTTP and gRPC, against a real server: each gets
//! a 4xx / INVALID_ARGUMENT or NOT_FOUND whose message names the model, the
//! input and the problem, and the server answers a good request right after.

use crate::support;

use serde_json::{Value, json};
use tickserve_core::MAX_RANK;
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;

const LIMIT: usize = 64 * 1024;

fn alpha(shape: Value, data: Value) -> Value {
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": shape, "data": data}]})
}

fn row(n: usize) -> Value {
    json!(vec![0.5f32; n])
}

/// A binary-extension body: the JSON header, then `binary`.
fn binary_body(header: &Value, binary: &[u8]) -> (Vec<u8>, usize) {
    let mut body = serde_json::to_vec(header).unwrap();
    let n = body.len();
    body.extend_from_slice(binary);
    (body, n)
}

fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    async fn post(&self, path: &str, body: Vec<u8>, header_length: Option<usize>) -> (u16, String) {
        let mut request = self.client.post(format!("{}{path}", self.base)).body(body);
        if let Some(n) = header_length {
            request = request.header("Inference-Header-Content-Length", n);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn post_with_header(
        &self,
        path: &str,
        body: Vec<u8>,
        name: &str,
        value: &str,
    ) -> (u16, String) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header(name, value)
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn good(&self) {
        let body = serde_json::to_vec(&alpha(json!([1, 50]), row(50))).unwrap();
        let (status, text) = self.post("/v2/models/alpha_mlp/infer", body, None).await;
        assert_eq!(status, 200, "good request after a bad one: {text}");
    }

    async fn refused(
        &self,
        path: &str,
        body: Vec<u8>,
        header_length: Option<usize>,
        status: u16,
        needles: &[&str],
    ) {
        let (got, text) = self.post(path, body, header_length).await;
        assert_eq!(got, status, "{path}: {text}");
        let message = serde_json::from_str::<Value>(&text).unwrap()["error"]
            .as_str()
            .unwrap()
            .to_string();
        for needle in needles {
            assert!(message.contains(needle), "'{message}' lacks '{needle}'");
        }
        self.good().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bad_input_is_refused_clearly() {
    let repository = support::fixture_repository();
    let mut config = support::config(repository.path());
    config.server.max_request_bytes = LIMIT;
    let server = support::start(&config).await;
    let http = Http {
        client: reqwest::Client::new(),
        base: format!("http://{}", server.http_addr),
    };
    let json = |v: Value| serde_json::to_vec(&v).unwrap();
    let infer = "/v2/models/alpha_mlp/infer";
    http.good().await;

    http.refused(
        "/v2/models/nope/infer",
        json(alpha(json!([1, 50]), row(50))),
        None,
        404,
        &["model 'nope'", "not found"],
    )
    .await;
    http.refused(
        "/v2/models/versioned/versions/9/infer",
        json(alpha(json!([1, 4]), row(4))),
        None,
        404,
        &["model 'versioned' version 9", "versions: 1, 2"],
    )
    .await;
    http.refused(
        "/v2/models/broken/infer",
        json(alpha(json!([1, 50]), row(50))),
        None,
        503,
        &["model 'broken'", "not ready", "not a valid ONNX model"],
    )
    .await;
    http.refused(
        "/v2/models/dyn_seq/infer",
        json(alpha(json!([1, 50]), row(50))),
        None,
        503,
        &["dimension 1 ('seq') is dynamic", "[dimensions]"],
    )
    .await;
    let unknown = json!({"inputs": [{"name": "feature", "datatype": "FP32", "shape": [1, 50], "data": row(50)}]});
    http.refused(
        infer,
        json(unknown),
        None,
        400,
        &["model 'alpha_mlp', input 'feature'", "'features'"],
    )
    .await;
    // The rank limit: one dimension past it is refused by the reader, JSON
    // and binary alike; at it, the shape reaches the model's own check.
    let deep = |rank: usize| alpha(json!(vec![1; rank]), row(1));
    let past = format!("more than {MAX_RANK} dimensions in a shape");
    http.refused(infer, json(deep(MAX_RANK + 1)), None, 400, &[&past])
        .await;
    let (body, n) = binary_body(&deep(MAX_RANK + 1), &floats(&[0.5]));
    http.refused(infer, body, Some(n), 400, &[&past]).await;
    http.refused(
        infer,
        json(deep(MAX_RANK)),
        None,
        400,
        &[
            "model 'alpha_mlp', input 'features'",
            &format!("(rank {MAX_RANK})"),
        ],
    )
    .await;
    let missing = json!({"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "mask", "datatype": "BOOL", "shape": [1, 3], "data": [true, false, true]}]});
    http.refused(
        "/v2/models/typed_io/infer",
        json(missing),
        None,
        400,
        &["model 'typed_io', input 'scale'", "no such input"],
    )
    .await;
    let twice = json!({"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 50], "data": row(50)},
        {"name": "features", "datatype": "FP32", "shape": [1, 50], "data": row(50)}]});
    http.refused(
        infer,
        json(twice),
        None,
        400,
        &["input 'features'", "more than once"],
    )
    .await;
    let fp64 = json!({"inputs": [{"name": "features", "datatype": "FP64", "shape": [1, 50], "data": row(50)}]});
    http.refused(
        infer,
        json(fp64),
        None,
        400,
        &["input 'features'", "expected datatype FP32, got FP64"],
    )
    .await;
    let fp16 = json!({"inputs": [{"name": "features", "datatype": "FP16", "shape": [1, 50], "data": row(50)}]});
    http.refused(
        infer,
        json(fp16),
        None,
        400,
        &["input 'features'", "expected datatype FP32, got FP16"],
    )
    .await;
    http.refused(
        infer,
        json(alpha(json!([1, 50, 1]), row(50))),
        None,
        400,
        &["(rank 2)", "[1, 50, 1] (rank 3)"],
    )
    .await;
    http.refused(
        infer,
        json(alpha(json!([1, 49]), row(49))),
        None,
        400,
        &[
            "input 'features'",
            "expected shape [batch, 50], got shape [1, 49]",
        ],
    )
    .await;
    http.refused(
        infer,
        json(alpha(json!([2, 50]), row(99))),
        None,
        400,
        &["100 elements (400 bytes)", "got 396 bytes"],
    )
    .await;
    http.refused(
        infer,
        json(alpha(json!([0, 50]), row(0))),
        None,
        400,
        &["every dimension positive", "[0, 50]"],
    )
    .await;
    http.refused(
        infer,
        json(alpha(json!([-1, 50]), row(50))),
        None,
        400,
        &["every dimension positive", "[-1, 50]"],
    )
    .await;
    let nine = json!({"inputs": [{"name": "window", "datatype": "FP32", "shape": [9, 10, 4], "data": row(360)}]});
    http.refused(
        "/v2/models/dyn_seq_fixed/infer",
        json(nine),
        None,
        400,
        &["model 'dyn_seq_fixed'", "9 rows", "limit of 8"],
    )
    .await;
    http.refused(
        infer,
        vec![b' '; LIMIT + 1],
        None,
        413,
        &["over the limit of 65536 bytes"],
    )
    .await;
    // The other side of the limit: a body of exactly max_request_bytes is
    // read whole (the JSON at its end, after leading whitespace).
    let body = json(alpha(json!([1, 50]), row(50)));
    let mut exact = vec![b' '; LIMIT - body.len()];
    exact.extend_from_slice(&body);
    let (status, text) = http.post(infer, exact, None).await;
    assert_eq!(status, 200, "a body of exactly max_request_bytes: {text}");
    http.refused(
        infer,
        b"{\"inputs\": [".to_vec(),
        None,
        400,
        &["model 'alpha_mlp'", "malformed JSON"],
    )
    .await;
    let header = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50],
        "parameters": {"binary_data_size": 200}}]});
    let (body, n) = binary_body(&header, &floats(&[0.5; 25]));
    http.refused(
        infer,
        body,
        Some(n),
        400,
        &[
            "input 'features'",
            "200 bytes of binary data",
            "got 100 bytes",
        ],
    )
    .await;
    let (body, n) = binary_body(&header, &floats(&[0.5; 51]));
    http.refused(
        infer,
        body,
        Some(n),
        400,
        &["4 bytes of binary data that no input"],
    )
    .await;
    let short = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50],
        "parameters": {"binary_data_size": 196}}]});
    let (body, n) = binary_body(&short, &floats(&[0.5; 49]));
    http.refused(
        infer,
        body,
        Some(n),
        400,
        &["input 'features'", "got 196 bytes"],
    )
    .await;
    let mut values = [0.5f32; 50];
    values[7] = f32::NAN;
    let (body, n) = binary_body(&header, &floats(&values));
    http.refused(
        infer,
        body,
        Some(n),
        400,
        &["input 'features'", "NaN at element 7", "nan_policy"],
    )
    .await;
    values[7] = f32::INFINITY;
    let (body, n) = binary_body(&header, &floats(&values));
    http.refused(infer, body, Some(n), 400, &["inf at element 7"])
        .await;
    let wrong_output = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 50], "data": row(50)}],
        "outputs": [{"name": "nope"}]});
    http.refused(
        infer,
        json(wrong_output),
        None,
        400,
        &["unknown output 'nope'", "'probabilities'"],
    )
    .await;
    let bad_bool = json!({"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "mask", "datatype": "BOOL", "shape": [1, 3], "data": [1, 0, 1]},
        {"name": "scale", "datatype": "FP64", "shape": [1, 3], "data": [1, 1, 1]}]});
    http.refused(
        "/v2/models/typed_io/infer",
        json(bad_bool),
        None,
        400,
        &["input 'mask'", "expected BOOL values, got 1"],
    )
    .await;

    // Deadlines: a bad header is refused; one that has passed before the run
    // is answered 504 and the request is never computed.
    let runs = |s: &tickserve_server::Server| {
        s.edge()
            .runtime
            .model("alpha_mlp", None)
            .unwrap()
            .stats
            .snapshot()
            .execution_count
    };
    let body = json(alpha(json!([1, 50]), row(50)));
    let (status, text) = http
        .post_with_header(infer, body.clone(), "tickserve-timeout", "soon")
        .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("tickserve-timeout header must be a duration"),
        "{text}"
    );
    let before = runs(&server);
    let (status, text) = http
        .post_with_header(infer, body.clone(), "tickserve-timeout", "1ns")
        .await;
    assert_eq!(status, 504, "{text}");
    assert!(
        text.contains("deadline exceeded") && text.contains("not computed"),
        "{text}"
    );
    assert_eq!(
        runs(&server),
        before,
        "an expired request never reaches the engine"
    );
    let (status, _) = http
        .post_with_header(infer, body, "tickserve-timeout", "1s")
        .await;
    assert_eq!(status, 200);

    // Tree ensembles read NaN as a missing value: allowed by default.
    let (body, n) = binary_body(
        &json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}),
        &floats(&[f32::NAN, 1.0]),
    );
    let (status, text) = http.post("/v2/models/tree_gbt/infer", body, Some(n)).await;
    assert_eq!(status, 200, "{text}");
    let score = serde_json::from_str::<Value>(&text).unwrap()["outputs"][0]["data"][0]
        .as_f64()
        .unwrap();
    assert_eq!(score, -1.0, "NaN follows the missing-value branch");

    // Several datatypes in one request, in JSON.
    let typed = json!({"inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "mask", "datatype": "BOOL", "shape": [1, 3], "data": [true, false, true]},
        {"name": "scale", "datatype": "FP64", "shape": [1, 3], "data": [0.5, 0.5, 0.5]}]});
    let (status, text) = http
        .post("/v2/models/typed_io/infer", json(typed), None)
        .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["outputs"][0]["data"], json!([1.5, 0.5, 3.5]));
    assert_eq!(v["outputs"][1]["datatype"], "INT32");
    assert_eq!(v["outputs"][1]["data"], json!([1, 0, 3]));
    server.shutdown().await.unwrap();
}

fn grpc_request(
    shape: Vec<i64>,
    raw: Option<Vec<u8>>,
    fp32: Option<Vec<f32>>,
) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "alpha_mlp".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape,
            parameters: Default::default(),
            contents: fp32.map(|v| pb::InferTensorContents {
                fp32_contents: v,
                ..Default::default()
            }),
        }],
        raw_input_contents: raw.map(|r| vec![r.into()]).unwrap_or_default(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_bad_input_is_refused_clearly() {
    let repository = support::fixture_repository();
    let mut config = support::config(repository.path());
    config.server.max_request_bytes = LIMIT;
    let server = support::start(&config).await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap()
        .max_encoding_message_size(usize::MAX);
    let good = grpc_request(vec![1, 50], Some(floats(&[0.5; 50])), None);
    let answer = client.model_infer(good.clone()).await.unwrap().into_inner();
    assert_eq!(answer.raw_output_contents[0].len(), 12, "raw in, raw out");
    let typed = client
        .model_infer(grpc_request(vec![1, 50], None, Some(vec![0.5; 50])))
        .await
        .unwrap()
        .into_inner();
    assert!(typed.raw_output_contents.is_empty(), "typed in, typed out");
    assert_eq!(
        typed.outputs[0]
            .contents
            .as_ref()
            .unwrap()
            .fp32_contents
            .len(),
        3
    );

    let mut cases: Vec<(pb::ModelInferRequest, Code, Vec<&str>)> = Vec::new();
    let mut unknown_model = good.clone();
    unknown_model.model_name = "nope".into();
    cases.push((
        unknown_model,
        Code::NotFound,
        vec!["model 'nope'", "not found"],
    ));
    let mut unknown_version = good.clone();
    unknown_version.model_version = "7".into();
    cases.push((
        unknown_version,
        Code::NotFound,
        vec!["version 7", "versions: 1"],
    ));
    // The rank limit: one dimension past it is refused by the reader; at
    // it, the shape reaches the model's own check.
    cases.push((
        grpc_request(vec![1; MAX_RANK + 1], Some(floats(&[0.5])), None),
        Code::InvalidArgument,
        vec!["shape holds more than 16 entries"],
    ));
    cases.push((
        grpc_request(vec![1; MAX_RANK], Some(floats(&[0.5])), None),
        Code::InvalidArgument,
        vec!["input 'features'", "(rank 16)"],
    ));
    let mut unknown_input = good.clone();
    unknown_input.inputs[0].name = "feature".into();
    cases.push((
        unknown_input,
        Code::InvalidArgument,
        vec!["input 'feature'", "'features'"],
    ));
    let mut wrong_type = good.clone();
    wrong_type.inputs[0].datatype = "FP64".into();
    cases.push((
        wrong_type,
        Code::InvalidArgument,
        vec!["expected datatype FP32, got FP64"],
    ));
    cases.push((
        grpc_request(vec![1, 49], Some(floats(&[0.5; 49])), None),
        Code::InvalidArgument,
        vec!["expected shape [batch, 50], got shape [1, 49]"],
    ));
    cases.push((
        grpc_request(vec![1, 50], Some(floats(&[0.5; 49])), None),
        Code::InvalidArgument,
        vec!["input 'features'", "got 196 bytes"],
    ));
    cases.push((
        grpc_request(vec![1, 50], Some(floats(&[0.5; 51])), None),
        Code::InvalidArgument,
        vec!["input 'features'", "got 204 bytes"],
    ));
    cases.push((
        grpc_request(vec![0, 50], Some(vec![]), None),
        Code::InvalidArgument,
        vec!["every dimension positive"],
    ));
    cases.push((
        grpc_request(vec![1025, 50], Some(floats(&[0.5; 50])), None),
        Code::InvalidArgument,
        vec!["1025 rows", "limit of 1024"],
    ));
    let mut nan = vec![0.5f32; 50];
    nan[3] = f32::NAN;
    cases.push((
        grpc_request(vec![1, 50], None, Some(nan)),
        Code::InvalidArgument,
        vec!["NaN at element 3"],
    ));
    let mut two_raw = good.clone();
    two_raw.raw_input_contents.push(floats(&[0.5; 50]).into());
    cases.push((
        two_raw,
        Code::InvalidArgument,
        vec!["one entry per input: expected 1, got 2"],
    ));
    let mut wrong_field = grpc_request(vec![1, 50], None, None);
    wrong_field.inputs[0].contents = Some(pb::InferTensorContents {
        int_contents: vec![1; 50],
        ..Default::default()
    });
    cases.push((
        wrong_field,
        Code::InvalidArgument,
        vec!["expected FP32 data in contents.fp32_contents"],
    ));
    cases.push((
        grpc_request(vec![400, 50], Some(floats(&vec![0.5; 400 * 50])), None),
        Code::InvalidArgument,
        vec!["too large", "65536"],
    ));

    // A deadline that passed before the request ran: DEADLINE_EXCEEDED, never computed.
    let runs = || {
        server
            .edge()
            .runtime
            .model("alpha_mlp", None)
            .unwrap()
            .stats
            .snapshot()
            .execution_count
    };
    let before = runs();
    // tonic's client enforces grpc-timeout too (its timer has millisecond
    // resolution): when it fires first it answers CANCELLED "Timeout expired"
    // itself, and the server's answer is never seen. Retry until the server's
    // answer comes back; every attempt must fail, none may be computed.
    let mut server_answered = None;
    for _ in 0..50 {
        let mut expired = tonic::Request::new(good.clone());
        expired
            .metadata_mut()
            .insert("grpc-timeout", "1n".parse().unwrap());
        let status = client.model_infer(expired).await.unwrap_err();
        if status.code() == Code::Cancelled && status.message() == "Timeout expired" {
            continue;
        }
        server_answered = Some(status);
        break;
    }
    let status = server_answered.expect("in 50 tries the client's own timer always fired first");
    assert_eq!(
        status.code(),
        Code::DeadlineExceeded,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("not computed"),
        "{}",
        status.message()
    );
    assert_eq!(
        runs(),
        before,
        "an expired request never reaches the engine"
    );

    for (request, code, needles) in cases {
        let status = client.model_infer(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{}", status.message());
        for needle in needles {
            assert!(
                status.message().contains(needle),
                "'{}' lacks '{needle}'",
                status.message()
            );
        }
        client
            .model_infer(good.clone())
            .await
            .expect("good request after a bad one");
    }
    server.shutdown().await.unwrap();
}

/// A message that is not valid protobuf is the client's error: INVALID_ARGUMENT
/// saying so, whichever way the server reads it, and the next request is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_malformed_messages_are_invalid_argument() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let channel = support::grpc_channel(&server).await;
    let mut raw = tonic::client::Grpc::new(channel.clone());
    let mut client = GrpcInferenceServiceClient::new(channel);
    let good = prost::Message::encode_to_vec(&support::grpc_alpha_row());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a name longer than the message", {
            let mut m = vec![0x0a, 0x40];
            m.extend_from_slice(b"alpha_mlp");
            m
        }),
        ("wire type 7", vec![0x0f, 0x00]),
        (
            "a model name that is not UTF-8",
            vec![0x0a, 0x02, 0xff, 0xfe],
        ),
        ("field number 0", vec![0x02, 0x00]),
        ("a varint of eleven bytes", {
            let mut m = vec![0x38];
            m.extend([0xff; 10]);
            m.push(0x01);
            m
        }),
        ("a good request cut short", good[..good.len() - 3].to_vec()),
    ];
    for (name, message) in cases {
        let status = support::raw_model_infer(&mut raw, message)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(
            status.message().contains("not valid protobuf"),
            "{name}: {}",
            status.message()
        );
        let answer = client.model_infer(support::grpc_alpha_row()).await.unwrap();
        assert_eq!(answer.into_inner().outputs.len(), 1, "{name}");
    }
    server.shutdown().await.unwrap();
}
