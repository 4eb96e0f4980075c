#![no_main]
//! See nodeward::fuzzing::quantity for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward::fuzzing::quantity(data));
