//! Fuzzes `tickserve_server::fuzzing::http_binary`: arbitrary bytes must never panic it,
//! whatever the hand reader of the JSON header reads, serde_json must read alike, and
//! whatever answer header the hand writer writes, serde_json must write alike.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::http_binary(data);
});
