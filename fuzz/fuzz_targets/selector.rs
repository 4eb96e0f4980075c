#![no_main]
//! See nodeward::fuzzing::selector for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::selector(data));
