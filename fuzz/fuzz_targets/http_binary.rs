//! Fuzzes `tickserve_server::fuzzing::http_binary`: arbitrary bytes must never panic it,
//! and whatever the hand reader of the JSON header reads, serde_json must read alike.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::http_binary(data);
});
