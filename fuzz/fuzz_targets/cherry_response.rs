#![no_main]
//! See nodeward::fuzzing::cherry_response for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::cherry_response(data));
