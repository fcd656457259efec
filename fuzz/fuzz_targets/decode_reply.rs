//! cargo-fuzz target `decode_reply`: see `cloister_ipc::fuzzing::reply`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister_ipc::fuzzing::reply(data));
