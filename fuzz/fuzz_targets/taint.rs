#![no_main]
//! See nodeward::fuzzing::taint for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::taint(data));
