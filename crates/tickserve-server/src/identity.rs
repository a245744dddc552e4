//! What the server says it is, in the v2 server metadata (HTTP `GET /v2`,
//! gRPC `ServerMetadata`): its name, its version and the protocol
//! extensions it serves.

/// The server's name in metadata responses.
pub const SERVER_NAME: &str = "tickserve";

/// The server's version in metadata responses.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Protocol extensions tickserve serves, as reported by server metadata.
pub const EXTENSIONS: [&str; 7] = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "sequence(string_id)",
    "sequence",
    "statistics",
];
