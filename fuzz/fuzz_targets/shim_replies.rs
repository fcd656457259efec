//! cargo-fuzz target `shim_replies`: the shim's real entry points against a scripted hostile
//! worker in-process; see `cloister::fuzzing::shim_replies`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister::fuzzing::shim_replies(data));
