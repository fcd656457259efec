//! The fuzz targets' bodies, shared by `fuzz/` (cargo-fuzz, nightly) and by the test that
//! replays the seed corpora on stable. Each takes bytes as a hostile peer would send them; none
//! may panic.

use crate::recorder::{FlightRecorder, RECORDER_BYTES};
use crate::*;

/// Requests as the worker reads them from a lane.
pub fn request(data: &[u8]) {
    if let Ok(req) = decode_request(data) {
        // Whatever decodes re-encodes to the same request.
        let bytes = encode_request_value(&req).expect("a decoded request re-encodes");
        assert_eq!(decode_request(&bytes).ok().as_ref(), Some(&req));
        let _ = (req.op_name(), req.op_index());
    }
}

/// Replies as the shim reads them, for every reply type.
pub fn reply(data: &[u8]) {
    let _ = decode_reply::<GetInfo>(data);
    let _ = decode_reply::<GetDeviceIds>(data);
    let _ = decode_reply::<CreateKernel>(data);
    let _ = decode_reply::<CreateKernelsInProgram>(data);
    let _ = decode_reply::<EnqueueNdRange>(data);
}

/// Socket messages from the worker (welcome, notifications) as the shim reads them.
pub fn worker_message(data: &[u8]) {
    let _ = decode_worker_message(data);
}

/// The handshakes: the shim's hello to a worker, and both directions with the broker.
pub fn handshake(data: &[u8]) {
    if let Ok(ShimMessage::Hello(h)) = postcard::from_bytes::<ShimMessage>(data) {
        let _ = h.check();
    }
    if let Ok(BrokerRequest::Hello(h)) = postcard::from_bytes::<BrokerRequest>(data) {
        let _ = h.check();
    }
    let _ = postcard::from_bytes::<BrokerReply>(data);
}

/// A flight recorder as a hostile worker may have scribbled it, read by the broker.
pub fn recorder(data: &[u8]) {
    let Ok(r) = FlightRecorder::create() else { return };
    let n = data.len().min(RECORDER_BYTES);
    // SAFETY: the region is RECORDER_BYTES long and n is at most that.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), r.region().as_ptr(), n) };
    let _ = (r.in_flight(), r.last_calls(usize::MAX), r.hung_op());
}

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target by its corpus name.
pub const TARGETS: &[(&str, Target)] = &[
    ("decode_request", request),
    ("decode_reply", reply),
    ("decode_worker_message", worker_message),
    ("decode_handshake", handshake),
    ("recorder", recorder),
];

/// Seed inputs for each target, written to `fuzz/corpus/TARGET/` by `write_seeds`.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let enc = |v: &dyn erased::Encode| v.encode();
    match target {
        "decode_request" => vec![
            encode_request(GetInfo { target: InfoTarget::Device, object: WORKER_ID_BIT | 1, aux: 0, param: 0x102B })
                .unwrap(),
            encode_request(EnqueueNdRange {
                queue: 3,
                kernel: 4,
                args: vec![
                    (0, ArgValue::Object(5)),
                    (1, ArgValue::Bytes(ArgBytes::from(&[1, 0, 0, 0][..]))),
                    (2, ArgValue::Local(256)),
                ],
                work_dim: 2,
                offset: None,
                global: Dims::new([64, 64]),
                local: Dims::new([8, 8]),
                sync: EnqueueSync { wait: vec![6], event: Some(7) },
            })
            .unwrap(),
            encode_request(EnqueueReadBuffer {
                queue: 3,
                mem: 5,
                blocking: false,
                offset: 16,
                into: DataRef::Segment { id: 9, offset: 0, len: 4096 },
                sync: EnqueueSync::default(),
            })
            .unwrap(),
            encode_request(CreateProgramWithSource {
                id: 8,
                context: 2,
                sources: vec![b"kernel void k() {}".to_vec()],
            })
            .unwrap(),
        ],
        "decode_reply" => vec![
            enc(&InfoReply { status: 0, value_status: 0, value: b"pocl\0".to_vec() }),
            enc(&KernelsReply { status: 0, count: 2, num_args: vec![3, 1] }),
            enc(&0i32),
        ],
        "decode_worker_message" => vec![
            enc(&WorkerMessage::Welcome {
                version: handshake::PROTOCOL_VERSION,
                driver: "pocl".into(),
                profile: "pocl".into(),
                layers: vec!["seccomp: on".into()],
                platforms: vec![WORKER_ID_BIT],
                devices: vec![Enumerated { id: WORKER_ID_BIT | 1, platform: WORKER_ID_BIT }],
            }),
            enc(&WorkerMessage::Notify(Notification::EventStatus { token: 12, status: 0 })),
            enc(&WorkerMessage::Notify(Notification::ContextError {
                token: 1,
                errinfo: "oops".into(),
                private_info: vec![1, 2],
            })),
        ],
        "decode_handshake" => vec![
            enc(&ShimMessage::Hello(handshake::Hello::new())),
            enc(&BrokerRequest::Respawn { driver: "pocl".into() }),
            enc(&BrokerReply::Workers {
                version: 2,
                grants: vec![WorkerGrant { driver: "pocl".into(), library: "libpocl.so.2".into() }],
                errors: vec![],
            }),
        ],
        "recorder" => {
            let r = FlightRecorder::create().unwrap();
            let slot = FlightRecorder::claim_slot(r.header());
            let start = FlightRecorder::begin(r.header(), slot, 1, 2);
            FlightRecorder::end(r.header(), slot, 1, 2, start);
            FlightRecorder::begin(r.header(), slot, 1, 9);
            // SAFETY: the region holds RECORDER_BYTES readable bytes.
            vec![unsafe { std::slice::from_raw_parts(r.region().as_ptr(), RECORDER_BYTES) }.to_vec()]
        }
        _ => Vec::new(),
    }
}

mod erased {
    /// Encodes any serialisable value (the seed list mixes types).
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            postcard::to_allocvec(self).expect("seed encodes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
    }

    /// Regenerates the seed corpora: `cargo test -p cloister-ipc write_seeds -- --ignored`.
    #[test]
    #[ignore]
    fn write_seeds() {
        for (name, _) in TARGETS {
            let dir = corpus_dir().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (i, seed) in seeds(name).iter().enumerate() {
                std::fs::write(dir.join(format!("seed-{i}")), seed).unwrap();
            }
        }
    }

    /// The committed corpora (seeds and anything fuzzing found) go through every target.
    #[test]
    fn replays_the_fuzz_corpora() {
        for (name, target) in TARGETS {
            let dir = corpus_dir().join(name);
            let files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
            assert!(!files.is_empty(), "empty corpus for {name}");
            for f in files {
                let data = std::fs::read(f.unwrap().path()).unwrap();
                target(&data);
                // Truncations and a flipped byte are hostile variants of each seed.
                for cut in 0..data.len().min(64) {
                    target(&data[..cut]);
                }
                let mut flipped = data.clone();
                if let Some(b) = flipped.get_mut(data.len() / 2) {
                    *b ^= 0xA5;
                }
                target(&flipped);
            }
        }
    }
}
