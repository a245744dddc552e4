//! Monte Carlo input noise against a real server: the answer's names and
//! shapes, bit-identical answers for one seed over both protocols, family
//! members, the bad parameters, and (in Python) the statistics against a numpy
//! and onnxruntime reference.

use crate::support;

use serde_json::{Value, json};
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tickserve_proto::inference::infer_parameter::ParameterChoice;

fn body(model_input: &str, width: usize, parameters: Value) -> Value {
    json!({
        "parameters": parameters,
        "inputs": [{"name": model_input, "datatype": "FP32", "shape": [1, width],
                    "data": (0..width).map(|i| i as f32 / width as f32).collect::<Vec<f32>>()}],
    })
}

async fn infer(base: &str, model: &str, body: &Value) -> (u16, Value) {
    support::post_json(&format!("{base}/v2/models/{model}/infer"), body).await
}

fn output<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no output {name} in {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monte_carlo_answers_are_summaries_and_repeat_with_a_seed() {
    let repository = support::fixture_repository();
    // typed_io's only float input opted out: nothing left to perturb.
    std::fs::write(
        repository.path().join("typed_io/model.toml"),
        "[monte_carlo]\nenabled = true\nexclude = [\"scale\"]\n",
    )
    .unwrap();
    // alpha_mlp takes Monte Carlo requests as a model.toml turns them on.
    std::fs::write(
        repository.path().join("alpha_mlp/model.toml"),
        "[monte_carlo]\nenabled = true\n",
    )
    .unwrap();
    // Two members of the tick family, to run Monte Carlo through a shared graph.
    for member in ["tick_000", "tick_001"] {
        let dir = repository.path().join(member).join("1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            support::root()
                .join("config/models")
                .join(member)
                .join("1/model.onnx"),
            dir.join("model.onnx"),
        )
        .unwrap();
        std::fs::write(dir.join("../model.toml"), "[monte_carlo]\nenabled = true\n").unwrap();
    }
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);
    let seeded = json!({"mc_samples": 64, "mc_noise_sigma": 0.1, "mc_seed": 7});

    let (status, first) = infer(&base, "alpha_mlp", &body("features", 50, seeded.clone())).await;
    assert_eq!(status, 200, "{first}");
    let mean = output(&first, "probabilities_mean");
    assert_eq!(mean["shape"], json!([1, 3]));
    assert_eq!(mean["datatype"], "FP32");
    let std = output(&first, "probabilities_std");
    assert!(
        std["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.as_f64().unwrap() > 0.0)
    );
    let total: f64 = mean["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!(
        (total - 1.0).abs() < 1e-5,
        "softmax means sum to 1: {total}"
    );
    // The same seed: the same bytes, again and again.
    for _ in 0..3 {
        let (_, again) = infer(&base, "alpha_mlp", &body("features", 50, seeded.clone())).await;
        assert_eq!(again["outputs"], first["outputs"]);
    }
    // Another seed: another answer.
    let other = json!({"mc_samples": 64, "mc_noise_sigma": 0.1, "mc_seed": 8});
    let (_, different) = infer(&base, "alpha_mlp", &body("features", 50, other)).await;
    assert_ne!(different["outputs"], first["outputs"]);

    // The same over gRPC, Triton's double parameter for sigma: bit-identical.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let mut request = support::grpc_alpha_row();
    for (name, value) in [
        ("mc_samples", ParameterChoice::Int64Param(64)),
        ("mc_noise_sigma", ParameterChoice::DoubleParam(0.1)),
        ("mc_seed", ParameterChoice::Uint64Param(7)),
    ] {
        request.parameters.insert(
            name.into(),
            pb::InferParameter {
                parameter_choice: Some(value),
            },
        );
    }
    let features: Vec<f32> = (0..50).map(|i| i as f32 / 50.0).collect();
    request.inputs[0].contents = None;
    request.raw_input_contents = vec![
        features
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    ];
    let answer = grpc.model_infer(request).await.unwrap().into_inner();
    assert_eq!(answer.outputs[0].name, "probabilities_mean");
    let grpc_mean: Vec<f32> = answer.raw_output_contents[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let http_mean: Vec<f32> = mean["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(grpc_mean, http_mean);

    // More samples than the largest bucket (split over bucket runs), quantiles.
    let (status, quantiles) = infer(
        &base,
        "alpha_mlp",
        &body(
            "features",
            50,
            json!({"mc_samples": 200, "mc_noise_sigma": 0.2, "mc_seed": 1,
                   "mc_output": "quantiles", "mc_quantiles": "0.05,0.5,0.95"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{quantiles}");
    let low = output(&quantiles, "probabilities_q5")["data"]
        .as_array()
        .unwrap()
        .clone();
    let high = output(&quantiles, "probabilities_q95")["data"]
        .as_array()
        .unwrap()
        .clone();
    for (l, h) in low.iter().zip(&high) {
        assert!(l.as_f64().unwrap() <= h.as_f64().unwrap());
    }
    let (_, samples) = infer(
        &base,
        "alpha_mlp",
        &body(
            "features",
            50,
            json!({"mc_samples": 5, "mc_noise_sigma": 0.2, "mc_output": "samples"}),
        ),
    )
    .await;
    assert_eq!(
        output(&samples, "probabilities_samples")["shape"],
        json!([1, 5, 3])
    );

    // A family member: its own weights under the shared graph.
    let (status, member) = infer(
        &base,
        "tick_000",
        &body(
            "features",
            16,
            json!({"mc_samples": 32, "mc_noise_sigma": 0.05}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{member}");
    assert_eq!(output(&member, "signal_mean")["shape"], json!([1, 1]));

    // Bad parameters: a 400 naming the parameter, and the server goes on.
    for (model, input, width, parameters, words) in [
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_samples": 4, "mc_noise_sigma": -0.1}),
            "mc_noise_sigma",
        ),
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_samples": 5000, "mc_noise_sigma": 0.1}),
            "max_samples",
        ),
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_samples": 0}),
            "mc_samples",
        ),
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_samples": 4}),
            "give mc_noise_sigma",
        ),
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_noise_sigma": 0.1}),
            "needs mc_samples",
        ),
        (
            "alpha_mlp",
            "features",
            50,
            json!({"mc_samples": 4, "mc_noise_sigma": 0.1, "mc_output": "all"}),
            "mc_output",
        ),
    ] {
        let (status, answer) = infer(&base, model, &body(input, width, parameters.clone())).await;
        assert_eq!(status, 400, "{parameters}: {answer}");
        let message = answer["error"].as_str().unwrap();
        assert!(message.contains(words), "{parameters}: {message}");
        assert!(message.contains(model), "{message}");
    }
    // A model whose floating-point inputs are all opted out.
    let typed = json!({
        "parameters": {"mc_samples": 4, "mc_noise_sigma": 0.1},
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
            {"name": "mask", "datatype": "BOOL", "shape": [1, 3], "data": [true, false, true]},
            {"name": "scale", "datatype": "FP64", "shape": [1, 3], "data": [0.5, 0.5, 0.5]},
        ],
    });
    let (status, answer) = infer(&base, "typed_io", &typed).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("FP32 and FP64"),
        "{answer}"
    );
    let (status, _) = infer(&base, "alpha_mlp", &body("features", 50, seeded)).await;
    assert_eq!(status, 200);

    // The model configuration says what a Monte Carlo answer holds.
    let config = support::get_json(&format!("{base}/v2/models/alpha_mlp/config")).await;
    assert_eq!(
        config["parameters"]["monte_carlo_inputs"]["string_value"],
        "features"
    );
    assert!(
        config["parameters"]["monte_carlo_outputs"]["string_value"]
            .as_str()
            .unwrap()
            .contains("OUTPUT_mean")
    );
}

/// Mean and standard deviation of 4096 samples against numpy and onnxruntime
/// with their own noise, within the statistical tolerance the script states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monte_carlo_statistics_match_a_numpy_reference() {
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    support::run_python_check(&server, "monte_carlo_check.py", &[], "done").await;
}

/// Monte Carlo is a model's choice; a run holds its noisy copies and their
/// answer in the in-flight budget; the noise is checked against the model's
/// `nan_policy`; binary flags follow each summary output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monte_carlo_is_opt_in_counted_and_checked_after_the_noise() {
    let repository = support::fixture_repository();
    std::fs::write(
        repository.path().join("alpha_mlp/model.toml"),
        "[monte_carlo]\nenabled = true\n",
    )
    .unwrap();
    let mut config = support::config(repository.path());
    config.server.max_inflight_bytes = 1 << 20;
    config.server.max_request_bytes = 64 << 10;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);
    let mc = |samples: usize, sigma: f64| json!({"mc_samples": samples, "mc_noise_sigma": sigma});

    // A model without `enabled = true` takes none.
    let (status, answer) = infer(
        &base,
        "half_plus_two",
        &json!({
        "parameters": mc(4, 0.1),
        "inputs": [{"name": "x:0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("enabled = true"),
        "{answer}"
    );

    // A sigma so large the noisy copies overflow FP32: refused as a NaN
    // input is, not run.
    let (status, answer) = infer(&base, "alpha_mlp", &body("features", 50, mc(8, 1e300))).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("after the Monte Carlo noise"),
        "{answer}"
    );

    // 1024 noisy rows of alpha_mlp hold 1024 × (200 + 12) bytes while they
    // run: with all but 100 kB of the budget held, refused at once.
    let held = server.edge().admit_bytes((1 << 20) - 100_000).unwrap();
    let (status, answer) = infer(&base, "alpha_mlp", &body("features", 50, mc(1024, 0.1))).await;
    assert_eq!(status, 429, "{answer}");
    let (status, answer) = infer(&base, "alpha_mlp", &body("features", 50, mc(64, 0.1))).await;
    assert_eq!(status, 200, "{answer}");
    drop(held);
    let (status, answer) = infer(&base, "alpha_mlp", &body("features", 50, mc(1024, 0.1))).await;
    assert_eq!(status, 200, "{answer}");

    // Binary flags follow each summary of the output asked for binary.
    let mut binary = body("features", 50, mc(16, 0.1));
    binary["outputs"] = json!([{"name": "probabilities", "parameters": {"binary_data": true}}]);
    let response = reqwest::Client::new()
        .post(format!("{base}/v2/models/alpha_mlp/infer"))
        .json(&binary)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let json_len: usize = response.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = response.bytes().await.unwrap();
    let header: Value = serde_json::from_slice(&bytes[..json_len]).unwrap();
    for name in ["probabilities_mean", "probabilities_std"] {
        let o = output(&header, name);
        assert_eq!(o["parameters"]["binary_data_size"], json!(12), "{header}");
        assert!(o.get("data").is_none(), "{header}");
    }
    assert_eq!(bytes.len() - json_len, 24);
    server.shutdown().await.unwrap();
}
