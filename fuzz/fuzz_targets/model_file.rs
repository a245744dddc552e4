//! Fuzzes `tickserve_server::fuzzing::model_file`: a model file read and imported by the
//! CUDA engine's importer must never panic it, and a plan holds no more than the file.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_server::fuzzing::model_file(data);
});
