//! Fuzzes `tickserve_server::fuzzing::grpc_answer`: for any unary answer drawn from the
//! bytes, the fenced gRPC answer writer writes the bytes prost writes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::grpc_answer(data);
});
