#![no_main]
//! See nodeward::fuzzing::exec_output for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::exec_output(data));
