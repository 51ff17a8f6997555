#![no_main]
//! See `sluice::fuzzing::rules_text`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::rules_text(data));
