//! Generates the gRPC servers and clients from `proto/`, once for the whole
//! workspace: the v2 inference protocol, the sequence-state and risk services, and TF
//! Serving's PredictionService and ModelService.

/// TF Serving's protos (wire-compatible subsets), relative to `proto/`.
const TF_SERVING: &[&str] = &[
    "tensorflow/core/framework/types.proto",
    "tensorflow/core/framework/tensor_shape.proto",
    "tensorflow/core/framework/tensor.proto",
    "tensorflow/core/protobuf/meta_graph.proto",
    "tensorflow/core/protobuf/error_codes.proto",
    "tensorflow_serving/util/status.proto",
    "tensorflow_serving/apis/model.proto",
    "tensorflow_serving/apis/predict.proto",
    "tensorflow_serving/apis/get_model_metadata.proto",
    "tensorflow_serving/apis/get_model_status.proto",
    "tensorflow_serving/apis/prediction_service.proto",
    "tensorflow_serving/apis/model_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../../proto";
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    // Raw tensor bytes as `bytes::Bytes`: decoded without a copy out of the
    // gRPC frame buffer, then copied once into the bucket buffer.
    config.bytes([
        ".inference.ModelInferRequest.raw_input_contents",
        ".inference.ModelInferResponse.raw_output_contents",
        ".tensorflow.TensorProto.tensor_content",
        ".tickserve.StateTensor.contents",
    ]);
    let include = protoc_bin_vendored::include_path()?;
    let mut protos = vec![
        format!("{proto_dir}/grpc_service.proto"),
        format!("{proto_dir}/tickserve_sequence.proto"),
        format!("{proto_dir}/tickserve_risk.proto"),
    ];
    protos.extend(TF_SERVING.iter().map(|p| format!("{proto_dir}/{p}")));
    tonic_prost_build::configure()
        // prost's codec behind a check of repeated-field entry counts.
        .codec_path("crate::bounded::BoundedCodec")
        .build_client(true)
        .build_server(true)
        .compile_with_config(
            config,
            &protos,
            &[proto_dir.to_string(), include.display().to_string()],
        )?;
    println!("cargo:rerun-if-changed={proto_dir}");
    Ok(())
}
