//! cargo-fuzz target `recorder`: see `cloister_ipc::fuzzing::recorder`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister_ipc::fuzzing::recorder(data));
