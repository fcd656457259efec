//! Requests as the worker reads them from a lane: any bytes must decode or fail, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = cloister_ipc::decode_request(data) {
        // Whatever decodes must re-encode to something that decodes to the same request.
        let bytes = postcard_roundtrip(&req);
        assert_eq!(cloister_ipc::decode_request(&bytes).ok().as_ref(), Some(&req));
    }
});

fn postcard_roundtrip(req: &cloister_ipc::Request) -> Vec<u8> {
    cloister_ipc::encode_request_value(req).expect("a decoded request re-encodes")
}
