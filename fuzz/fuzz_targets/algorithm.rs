#![no_main]
//! See `sluice::fuzzing::algorithm`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::algorithm(data));
