#![no_main]
//! See `sluice::fuzzing::config_text`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::config_text(data));
