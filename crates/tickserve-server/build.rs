//! Generates the v2 inference protocol's gRPC server and client from `proto/`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../../proto";
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    // Raw tensor bytes as `bytes::Bytes`: decoded without a copy out of the
    // gRPC frame buffer, then copied once into the bucket buffer.
    config.bytes([".inference.ModelInferRequest.raw_input_contents"]);
    tonic_prost_build::configure()
        // prost's codec behind a check of repeated-field entry counts.
        .codec_path("crate::grpc::bounded::BoundedCodec")
        .build_client(true)
        .build_server(true)
        .compile_with_config(
            config,
            &[format!("{proto_dir}/grpc_service.proto")],
            &[proto_dir.to_string()],
        )?;
    println!("cargo:rerun-if-changed={proto_dir}/grpc_service.proto");
    println!("cargo:rerun-if-changed={proto_dir}/model_config.proto");
    Ok(())
}
