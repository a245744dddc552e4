//! Generates the gRPC client of the v2 inference protocol from `proto/`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../../proto";
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    let include = protoc_bin_vendored::include_path()?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_with_config(
            config,
            &[format!("{proto_dir}/grpc_service.proto")],
            &[proto_dir.to_string(), include.display().to_string()],
        )?;
    println!("cargo:rerun-if-changed={proto_dir}/grpc_service.proto");
    println!("cargo:rerun-if-changed={proto_dir}/model_config.proto");
    Ok(())
}
