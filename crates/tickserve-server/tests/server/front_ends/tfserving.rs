//! TF Serving's API against a real server on loopback: golden request and
//! response pairs from TF Serving's REST documentation (api_rest.md) and its
//! handler tests (http_rest_api_handler_test.cc, model half_plus_two at
//! version 123), the same requests over its gRPC API, the errors, and the
//! restricted-API groups. The fixtures `half_plus_two` and `tf_two_inputs`
//! come from scripts/dev/make_models.py --fixtures.

use crate::support;

use prost::Message;
use serde_json::{Value, json};
use tickserve_core::config::{EndpointGroup, FrontEnd, Restriction};
use tickserve_proto::tensorflow as pb;
use tickserve_proto::tensorflow::serving::model_service_client::ModelServiceClient;
use tickserve_proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use tickserve_proto::tensorflow::serving::{
    GetModelMetadataRequest, GetModelStatusRequest, ModelSpec, PredictRequest, SignatureDefMap,
    model_spec::VersionChoice,
};
use tonic::Code;

async fn post(base: &str, path: &str, body: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, parse(&text))
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, parse(&text))
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The golden pairs of TF Serving's documentation and handler tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_golden_pairs() {
    if support::alone(module_path!(), "rest_golden_pairs") {
        return;
    }
    let repository = support::fixture_repository();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let predict = "/v1/models/half_plus_two:predict";
    let v123 = "/v1/models/half_plus_two/versions/123:predict";
    for (path, body, expected) in [
        // api_rest.md, "Example".
        (
            predict,
            r#"{"instances": [1.0,2.0,5.0]}"#,
            json!({"predictions": [2.5, 3.0, 4.5]}),
        ),
        // http_rest_api_handler_test.cc, Predict.
        (
            v123,
            r#"{"instances": [1.0, 2.0]}"#,
            json!({"predictions": [2.5, 3.0]}),
        ),
        (
            v123,
            r#"{"signature_name": "serving_default", "instances": [3.0, 4.0]}"#,
            json!({"predictions": [3.5, 4.0]}),
        ),
        (
            v123,
            r#"{"signature_name": "serving_default", "inputs": [3.0, 4.0]}"#,
            json!({"outputs": [3.5, 4.0]}),
        ),
        // Named rows of one input, and the tf2onnx name.
        (
            predict,
            r#"{"instances": [{"x": 1.0}, {"x:0": 5.0}]}"#,
            json!({"predictions": [2.5, 4.5]}),
        ),
        // api_rest.md's several-input example (without its string input "tag").
        (
            "/v1/models/tf_two_inputs:predict",
            r#"{"instances": [
                {"signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
                {"signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]}]}"#,
            json!({"predictions": [
                {"total": 25.0, "doubled": [[2, 4], [6, 8]]},
                {"total": 38.0, "doubled": [[8, 10], [12, 16]]}]}),
        ),
        (
            "/v1/models/tf_two_inputs:predict",
            r#"{"inputs": {"signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
                           "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]]}}"#,
            json!({"outputs": {"total": [25.0, 38.0], "doubled": [[[2, 4], [6, 8]], [[8, 10], [12, 16]]]}}),
        ),
    ] {
        let (status, answer) = post(&base, path, body).await;
        assert_eq!((status, &answer), (200, &expected), "{path} {body}");
    }
    // api_rest.md, "JSON conformance": NaN and Infinity as bare tokens, both ways.
    let response = reqwest::Client::new()
        .post(format!("{base}{predict}"))
        .body(r#"{"instances": [NaN, Infinity, -Infinity, 0.1]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"predictions":[NaN,Infinity,-Infinity,2.05]}"#
    );
    // Model status, for the model and for its version (handler test, GetStatus).
    let status = json!({"model_version_status": [{"version": "123", "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]});
    for path in [
        "/v1/models/half_plus_two",
        "/v1/models/half_plus_two/versions/123",
    ] {
        assert_eq!(get(&base, path).await, (200, status.clone()), "{path}");
    }
    // Metadata: the one signature, TF dtypes, sizes as strings, ONNX names.
    let (code, metadata) = get(&base, "/v1/models/tf_two_inputs/metadata").await;
    assert_eq!(code, 200);
    let signature = &metadata["metadata"]["signature_def"]["signature_def"]["serving_default"];
    assert_eq!(
        metadata["model_spec"],
        json!({"name": "tf_two_inputs", "signature_name": "", "version": "1"})
    );
    assert_eq!(signature["method_name"], "tensorflow/serving/predict");
    assert_eq!(
        signature["inputs"]["signal"],
        json!({"dtype": "DT_FLOAT", "name": "signal:0", "tensor_shape": {"dim": [
            {"size": "-1", "name": ""}, {"size": "5", "name": ""}], "unknown_rank": false}})
    );
    assert_eq!(signature["inputs"]["sensor"]["dtype"], "DT_INT64");
    assert_eq!(signature["outputs"]["doubled"]["dtype"], "DT_INT64");
    // Answers go through the same metrics, under their own protocol label.
    let metrics = support::metrics_text(&base).await;
    assert!(metrics.contains(r#"protocol="tfs_rest""#), "{metrics}");
}

/// Every bad request is a 4xx with `{"error": "..."}` naming what was wrong,
/// and a good request is served right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_errors_are_named() {
    let repository = support::fixture_repository();
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let predict = "/v1/models/half_plus_two:predict";
    for (path, body, code, words) in [
        // api_rest.md: "Servable not found" is a 404.
        (
            "/v1/models/half:predict",
            r#"{"instances": [1.0,5.0]}"#,
            404,
            "half",
        ),
        (
            "/v1/models/foo/versions/50:predict",
            r#"{"instances": [1]}"#,
            404,
            "foo",
        ),
        (
            "/v1/models/half_plus_two/versions/99:predict",
            r#"{"instances": [1]}"#,
            404,
            "99",
        ),
        (
            "/v1/models/half_plus_two/labels/stable:predict",
            r#"{"instances": [1]}"#,
            404,
            "version stable",
        ),
        ("/v1/models/foo/version/50:predict", "", 400, "malformed"),
        (
            "/v1/models/foo/versions/HELLO:regress",
            "",
            400,
            "failed to convert",
        ),
        (
            "/v1/models/half_plus_two:regress",
            r#"{"examples": []}"#,
            400,
            ":regress",
        ),
        (predict, "", 400, "JSON parse error"),
        (predict, "instances = [1, 2]", 400, "JSON parse error"),
        (predict, r#"{"instances": [1], "inputs": [1]}"#, 400, "both"),
        (predict, r#"{"instances": [[1.0], 2.0]}"#, 400, "ragged"),
        (predict, r#"{"instances": [[1.0, 2.0]]}"#, 400, "x"),
        (predict, r#"{"instances": ["a"]}"#, 400, "\"a\""),
        (
            predict,
            r#"{"instances": [{"b64": "aGVsbG8="}]}"#,
            400,
            "DT_STRING",
        ),
        (
            predict,
            r#"{"signature_name": "classify", "instances": [1]}"#,
            400,
            "classify",
        ),
        (
            "/v1/models/tf_two_inputs:predict",
            r#"{"instances": [1, 2]}"#,
            400,
            "name them",
        ),
        (
            "/v1/models/tf_two_inputs:predict",
            r#"{"inputs": {"signal": [[1, 2, 3, 4, 5]], "sensor": [[[1.5, 2], [3, 4]]]}}"#,
            400,
            "1.5",
        ),
        (
            "/v1/models/tf_two_inputs:predict",
            r#"{"inputs": {"signal": [[1, 2, 3, 4, 5]]}}"#,
            400,
            "sensor",
        ),
    ] {
        let (status, answer) = post(&base, path, body).await;
        let message = answer["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, code, "{path} {body}: {answer}");
        assert!(message.contains(words), "{path} {body}: {message}");
        let (status, answer) = post(&base, predict, r#"{"instances": [1.0]}"#).await;
        assert_eq!((status, answer), (200, json!({"predictions": [2.5]})));
    }
    let (status, answer) = get(&base, "/v1/models/half_plus_two:predict").await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = get(&base, "/v1/models/nope").await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("nope"));
}

fn spec(name: &str) -> Option<ModelSpec> {
    Some(ModelSpec {
        name: name.into(),
        ..Default::default()
    })
}

fn float_tensor(shape: &[i64], values: &[f32]) -> pb::TensorProto {
    pb::TensorProto {
        dtype: pb::DataType::DtFloat as i32,
        tensor_shape: Some(tensor_shape(shape)),
        float_val: values.to_vec(),
        ..Default::default()
    }
}

/// The same model over TF Serving's gRPC API: typed values and tensor_content,
/// metadata, status, and the errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_predict_metadata_and_status() {
    if support::alone(module_path!(), "grpc_predict_metadata_and_status") {
        return;
    }
    let repository = support::fixture_repository();
    let server = support::start(&support::config(repository.path())).await;
    let address = format!("http://{}", server.grpc_addr);
    let mut predictions = PredictionServiceClient::connect(address.clone())
        .await
        .unwrap();
    let mut models = ModelServiceClient::connect(address).await.unwrap();

    let request = |tensor: pb::TensorProto| PredictRequest {
        model_spec: spec("half_plus_two"),
        inputs: [("x".to_string(), tensor)].into_iter().collect(),
        output_filter: Vec::new(),
    };
    let answer = predictions
        .predict(request(float_tensor(&[3], &[1.0, 2.0, 5.0])))
        .await
        .unwrap()
        .into_inner();
    let y = &answer.outputs["y"];
    assert_eq!(y.float_val, vec![2.5, 3.0, 4.5]);
    assert_eq!(y.dtype, pb::DataType::DtFloat as i32);
    let spec_back = answer.model_spec.unwrap();
    assert_eq!(spec_back.signature_name, "serving_default");
    assert!(matches!(
        spec_back.version_choice,
        Some(VersionChoice::Version(123))
    ));
    // tensor_content, and TensorFlow's one-value fill.
    let mut raw = float_tensor(&[2], &[]);
    raw.tensor_content = [1f32, 5.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>()
        .into();
    let answer = predictions
        .predict(request(raw))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outputs["y"].float_val, vec![2.5, 4.5]);
    let answer = predictions
        .predict(request(float_tensor(&[4], &[2.0])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outputs["y"].float_val, vec![3.0; 4]);

    // Several inputs of two dtypes, and an output filter.
    let sensor = pb::TensorProto {
        dtype: pb::DataType::DtInt64 as i32,
        tensor_shape: Some(tensor_shape(&[1, 2, 2])),
        int64_val: vec![1, 2, 3, 4],
        ..Default::default()
    };
    let answer = predictions
        .predict(PredictRequest {
            model_spec: spec("tf_two_inputs"),
            inputs: [
                (
                    "signal:0".to_string(),
                    float_tensor(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]),
                ),
                ("sensor".to_string(), sensor),
            ]
            .into_iter()
            .collect(),
            output_filter: vec!["doubled".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outputs.keys().collect::<Vec<_>>(), vec!["doubled"]);
    assert_eq!(answer.outputs["doubled"].int64_val, vec![2, 4, 6, 8]);

    // Metadata: a SignatureDefMap in an Any.
    let metadata = predictions
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("tf_two_inputs"),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let any = &metadata.metadata["signature_def"];
    assert_eq!(
        any.type_url,
        "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    );
    let map = SignatureDefMap::decode(any.value.as_slice()).unwrap();
    let signature = &map.signature_def["serving_default"];
    assert_eq!(
        signature.inputs["signal"].dtype,
        pb::DataType::DtFloat as i32
    );
    assert_eq!(
        signature.inputs["sensor"].dtype,
        pb::DataType::DtInt64 as i32
    );
    assert_eq!(
        signature.inputs["signal"]
            .tensor_shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| d.size)
            .collect::<Vec<_>>(),
        vec![-1, 5]
    );

    // Status.
    let status = models
        .get_model_status(GetModelStatusRequest {
            model_spec: spec("half_plus_two"),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.model_version_status.len(), 1);
    assert_eq!(status.model_version_status[0].version, 123);
    assert_eq!(
        status.model_version_status[0].state,
        pb::serving::model_version_status::State::Available as i32
    );

    // Errors, each followed by a good request.
    let mut labelled = request(float_tensor(&[1], &[1.0]));
    labelled.model_spec = Some(ModelSpec {
        name: "half_plus_two".into(),
        version_choice: Some(VersionChoice::VersionLabel("stable".into())),
        signature_name: String::new(),
    });
    let mut unknown = request(float_tensor(&[1], &[1.0]));
    unknown.model_spec = spec("nope");
    let mut wrong_dtype = float_tensor(&[1], &[]);
    wrong_dtype.dtype = pb::DataType::DtString as i32;
    wrong_dtype.string_val = vec![b"a".to_vec()];
    let mut wrong_field = float_tensor(&[2], &[]);
    wrong_field.int_val = vec![1, 2];
    let empty_entries = PredictRequest {
        model_spec: spec("half_plus_two"),
        inputs: (0..5000)
            .map(|i| (format!("{i}"), pb::TensorProto::default()))
            .collect(),
        output_filter: Vec::new(),
    };
    let mut filtered = request(float_tensor(&[1], &[1.0]));
    filtered.output_filter = vec!["z".into()];
    for (bad, code, words) in [
        (labelled, Code::NotFound, "version stable"),
        (unknown, Code::NotFound, "nope"),
        (request(wrong_dtype), Code::InvalidArgument, "DT_STRING"),
        (request(wrong_field), Code::InvalidArgument, "int_val"),
        (
            request(float_tensor(&[2], &[1.0, 2.0, 3.0])),
            Code::InvalidArgument,
            "float_val",
        ),
        (empty_entries, Code::InvalidArgument, "inputs"),
        (filtered, Code::InvalidArgument, "no output 'z'"),
        (
            PredictRequest {
                model_spec: None,
                ..Default::default()
            },
            Code::InvalidArgument,
            "model_spec",
        ),
    ] {
        let status = predictions.predict(bad).await.unwrap_err();
        assert_eq!(status.code(), code, "{}", status.message());
        assert!(status.message().contains(words), "{}", status.message());
        let fine = predictions
            .predict(request(float_tensor(&[1], &[1.0])))
            .await
            .unwrap();
        assert_eq!(fine.into_inner().outputs["y"].float_val, vec![2.5]);
    }
    let refused = predictions
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("half_plus_two"),
            metadata_field: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let metrics = support::metrics_text(&format!("http://{}", server.http_addr)).await;
    assert!(metrics.contains(r#"protocol="tfs_grpc""#));
}

/// The restricted-API groups hold for TF Serving's API too: `:predict` and
/// Predict are inference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_inference_covers_tf_serving() {
    let repository = support::fixture_repository();
    let mut config = support::config(repository.path());
    let group = EndpointGroup::Inference.as_str();
    config.security.restricted = vec![
        Restriction::parse_triton(&format!("{group}:admin-key=tf-secret"), FrontEnd::Http).unwrap(),
        Restriction::parse_triton(&format!("{group}:admin-key=tf-secret"), FrontEnd::Grpc).unwrap(),
    ];
    config.validate().unwrap();
    let server = support::start(&config).await;
    let url = format!(
        "http://{}/v1/models/half_plus_two:predict",
        server.http_addr
    );
    let client = reqwest::Client::new();
    let body = r#"{"instances": [1.0]}"#;
    let refused = client.post(&url).body(body).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let served = client
        .post(&url)
        .header("admin-key", "tf-secret")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status().as_u16(), 200);
    // Status stays open (health is not restricted).
    let status = client
        .get(format!(
            "http://{}/v1/models/half_plus_two",
            server.http_addr
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status().as_u16(), 200);
    let mut predictions = PredictionServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let refused = predictions
        .predict(PredictRequest {
            model_spec: spec("half_plus_two"),
            inputs: [("x".to_string(), float_tensor(&[1], &[1.0]))]
                .into_iter()
                .collect(),
            output_filter: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
}

/// A TF Serving client in Python (stubs generated from the project's
/// wire-compatible protos, REST through urllib) against every model with
/// numeric inputs: answers equal onnxruntime's within 1e-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tf_serving_python_client_matches_onnxruntime() {
    let repository = support::fixture_repository();
    let server = support::start(&support::config(repository.path())).await;
    support::run_python_check(
        &server,
        "tfserving_check.py",
        &[
            std::ffi::OsStr::new("--repository"),
            repository.path().as_os_str(),
        ],
        "done",
    )
    .await;
}

/// A `TensorShapeProto` of `dims`.
fn tensor_shape(dims: &[i64]) -> pb::TensorShapeProto {
    pb::TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| pb::tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    }
}

/// One typed value may fill a large shape: the filled size counts in
/// `server.max_inflight_bytes` (not the message's few bytes), and a shape the
/// model refuses is refused before anything is filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_tensor_counts_its_filled_bytes_in_the_inflight_budget() {
    let repository = support::fixture_repository();
    let mut config = support::config(repository.path());
    config.server.max_inflight_bytes = 1 << 20;
    config.server.max_request_bytes = 1 << 20;
    let server = support::start(&config).await;
    let mut predictions = PredictionServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let request = |rows: i64| PredictRequest {
        model_spec: spec("half_plus_two"),
        inputs: [("x".to_string(), float_tensor(&[rows], &[1.0]))]
            .into_iter()
            .collect(),
        output_filter: Vec::new(),
    };
    // 1000 rows of FP32 fill 4000 bytes from a message of a few dozen.
    let answer = predictions.predict(request(1000)).await.unwrap();
    assert_eq!(answer.into_inner().outputs["y"].float_val.len(), 1000);
    // Hold all but 2000 bytes of the budget: the same request no longer fits.
    let held = server.edge().admit_bytes((1 << 20) - 2000).unwrap();
    let refused = predictions.predict(request(1000)).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::ResourceExhausted,
        "{}",
        refused.message()
    );
    let small = predictions.predict(request(10)).await.unwrap();
    assert_eq!(small.into_inner().outputs["y"].float_val.len(), 10);
    drop(held);
    // More rows than max_request_rows: refused by its shape, before the fill.
    let refused = predictions.predict(request(1025)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("1025"), "{}", refused.message());
    let answer = predictions.predict(request(1000)).await.unwrap();
    assert_eq!(answer.into_inner().outputs["y"].float_val.len(), 1000);
    server.shutdown().await.unwrap();
}
