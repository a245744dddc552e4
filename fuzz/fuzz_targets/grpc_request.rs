//! Fuzzes `tickserve_server::fuzzing::grpc_request`: arbitrary bytes must never panic it,
//! and whatever the in-place reading of a `ModelInferRequest` reads, prost must decode
//! alike, every field.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::grpc_request(data);
});
