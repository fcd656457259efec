//! cargo-fuzz target `decode_worker_message`: see `cloister_ipc::fuzzing::worker_message`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cloister_ipc::fuzzing::worker_message(data));
