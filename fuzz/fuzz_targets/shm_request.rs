//! Fuzzes `tickserve_server::fuzzing::shm_request`: arbitrary bytes must never panic it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::shm_request(data);
});
