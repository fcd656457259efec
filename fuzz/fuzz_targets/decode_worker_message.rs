//! Socket messages and replies as the shim reads them from a (possibly hostile) worker.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cloister_ipc::decode_worker_message(data);
    let _ = cloister_ipc::decode_reply::<cloister_ipc::GetInfo>(data);
    let _ = cloister_ipc::decode_reply::<cloister_ipc::CreateKernelsInProgram>(data);
    let _ = cloister_ipc::decode_reply::<cloister_ipc::EnqueueNdRange>(data);
});
