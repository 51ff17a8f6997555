#![no_main]
//! See `sluice::fuzzing::check_request`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::check_request(data));
