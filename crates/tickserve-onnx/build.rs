//! Generates the ONNX protobuf types from the vendored `proto/onnx/onnx-ml.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../../proto/onnx";
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    config.compile_protos(&[format!("{proto_dir}/onnx-ml.proto")], &[proto_dir])?;
    println!("cargo:rerun-if-changed={proto_dir}/onnx-ml.proto");
    Ok(())
}
