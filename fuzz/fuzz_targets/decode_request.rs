//! cargo-fuzz target `decode_request`: see `cloister_ipc::fuzzing::request`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister_ipc::fuzzing::request(data));
