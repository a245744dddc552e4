//! Fuzzes `tickserve_engine_cpu::fuzzing::forest`: the compiled CPU engine's tree walk
//! against the plain walk, on forests and rows built from the bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tickserve_engine_cpu::fuzzing::forest(data);
});
