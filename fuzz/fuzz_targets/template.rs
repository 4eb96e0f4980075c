#![no_main]
//! See nodeward::fuzzing::template for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::template(data));
