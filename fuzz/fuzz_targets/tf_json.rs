//! Fuzzes `tickserve_server::fuzzing::tf_json`: arbitrary bytes must never panic it, and
//! whatever the one-pass reading of a `:predict` body reads, the general reading must
//! read alike.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::tf_json(data);
});
