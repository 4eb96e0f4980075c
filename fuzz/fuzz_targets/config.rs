#![no_main]
//! See nodeward::fuzzing::config for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::config(data));
