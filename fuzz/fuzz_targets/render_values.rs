#![no_main]
//! See nodeward::fuzzing::render_values for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::render_values(data));
