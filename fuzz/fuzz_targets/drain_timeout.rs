#![no_main]
//! See nodeward::fuzzing::drain_timeout for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::drain_timeout(data));
