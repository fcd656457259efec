//! cargo-fuzz target `decode_handshake`: see `cloister_ipc::fuzzing::handshake`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister_ipc::fuzzing::handshake(data));
