//! cloister's IPC layer: wire types, the postcard codec, socket framing with fd passing, the
//! shared-memory lanes and the version handshake. No OpenCL calls and no processes here.

pub mod advertised;
pub mod api_table;
pub mod bulk;
pub mod channel;
pub mod cl;
pub mod config;
pub mod copy;
pub mod deadlines;
pub mod dispatch;
pub mod extension_table;
pub mod fast_hash;
pub mod fuzzing;
pub mod handshake;
pub mod image;
pub mod inline;
pub mod lane;
pub mod log;
pub mod private;
pub mod recorder;
pub mod settings;
pub mod shm;
pub mod spill;
pub mod wire;

pub use wire::*;

#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("{0} failed: {1}")]
    Os(&'static str, std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("encoding failed: {0}")]
    Encode(postcard::Error),
    #[error("malformed message: {0}")]
    Decode(postcard::Error),
    #[error("the peer closed the channel")]
    PeerGone,
}

impl IpcError {
    pub fn os(what: &'static str) -> Self {
        IpcError::Os(what, std::io::Error::last_os_error())
    }
}

/// Room a message's encoding starts with: more than most requests and replies take.
const ENCODE_START: usize = 256;

/// Encodes a message into a vector that has room for it from the start: `to_allocvec` grows
/// its vector from empty a byte at a time, three or four reallocations for a small request.
pub fn encode<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_extend(value, Vec::with_capacity(ENCODE_START))
}

/// Appends `value`'s encoding to `out`, leaving what `out` held before in place (the worker
/// encodes a reply after the room it keeps for the reply's frame header). On an error `out`
/// may hold part of the encoding after that.
pub fn encode_into<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
    /// `Vec<u8>` is `Extend<u8>` only by value; this lends it.
    struct AppendTo<'a>(&'a mut Vec<u8>);
    impl Extend<u8> for AppendTo<'_> {
        fn extend<I: IntoIterator<Item = u8>>(&mut self, bytes: I) {
            self.0.extend(bytes)
        }
    }
    postcard::to_extend(value, AppendTo(out)).map(drop)
}

/// Encodes a lane call.
pub fn encode_request<C: Call>(call: C) -> Result<Vec<u8>, IpcError> {
    encode(&call.into_request()).map_err(IpcError::Encode)
}

/// Encodes `req` into `buf`, cleared first: a caller that keeps `buf` encodes without
/// allocating once it has grown (the shim's posted enqueues).
pub fn encode_request_into(req: &Request, buf: &mut Vec<u8>) -> Result<(), IpcError> {
    buf.clear();
    encode_into(req, buf).map_err(IpcError::Encode)
}

/// Decodes a request as the worker reads it.
pub fn decode_request(bytes: &[u8]) -> Result<Request, IpcError> {
    postcard::from_bytes(bytes).map_err(IpcError::Decode)
}

/// Encodes an already-built request.
pub fn encode_request_value(req: &Request) -> Result<Vec<u8>, IpcError> {
    encode(req).map_err(IpcError::Encode)
}

/// Decodes a socket message from the worker as the shim reads it.
pub fn decode_worker_message(bytes: &[u8]) -> Result<WorkerMessage, IpcError> {
    postcard::from_bytes(bytes).map_err(IpcError::Decode)
}

/// Decodes a reply as the shim reads it: trailing garbage is an error too.
pub fn decode_reply<C: Call>(bytes: &[u8]) -> Result<C::Reply, IpcError> {
    decode_whole_reply(bytes)
}

/// Decodes the reply of a call whose reply is a bare status (every request that may be posted,
/// `Request::posted`).
pub fn decode_status(bytes: &[u8]) -> Result<i32, IpcError> {
    decode_whole_reply(bytes)
}

/// A reply from the worker that must fill `bytes` exactly: a valid value followed by anything
/// is a protocol error.
fn decode_whole_reply<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, IpcError> {
    let (reply, rest) = postcard::take_from_bytes(bytes).map_err(IpcError::Decode)?;
    if !rest.is_empty() {
        return Err(IpcError::Protocol("trailing bytes after reply"));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status reply is exactly one status: trailing bytes from a hostile worker are a
    /// protocol error, as for every other reply (`decode_reply`).
    #[test]
    fn a_status_reply_with_trailing_bytes_is_refused() {
        let mut bytes = postcard::to_allocvec(&-5i32).unwrap();
        assert_eq!(decode_status(&bytes).unwrap(), -5);
        bytes.push(0);
        assert!(matches!(decode_status(&bytes), Err(IpcError::Protocol(_))));
        assert!(decode_status(&[]).is_err());
    }

    /// A small deterministic generator, so the test needs no extra crates and is repeatable.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn decoders_survive_random_and_mutated_input() {
        let seeds: Vec<Vec<u8>> = vec![
            encode_request(GetInfo { target: InfoTarget::Device, object: 7, aux: 0, param: 0x102B }).unwrap(),
            encode_request(EnqueueNdRange {
                queue: 1,
                kernel: 2,
                args: vec![
                    (0, ArgValue::Object(3)),
                    (1, ArgValue::Bytes(ArgBytes::from(&[1, 2, 3, 4][..]))),
                    (2, ArgValue::Local(64)),
                ],
                work_dim: 1,
                offset: None,
                global: Dims::new([1024]),
                local: None,
                sync: EnqueueSync { wait: vec![5], event: Some(6) },
            })
            .unwrap(),
            postcard::to_allocvec(&InfoReply { status: 0, value_status: 0, value: vec![1; 16] }).unwrap(),
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..20_000 {
            let mut bytes = seeds[round % seeds.len()].clone();
            let edits = 1 + (xorshift(&mut state) % 4) as usize;
            for _ in 0..edits {
                match xorshift(&mut state) % 3 {
                    0 if !bytes.is_empty() => {
                        let i = (xorshift(&mut state) as usize) % bytes.len();
                        bytes[i] = xorshift(&mut state) as u8;
                    }
                    1 => bytes.truncate((xorshift(&mut state) as usize) % (bytes.len() + 1)),
                    _ => bytes.push(xorshift(&mut state) as u8),
                }
            }
            let _ = decode_request(&bytes);
            let _ = decode_worker_message(&bytes);
            let _ = spill::decode(&bytes);
            let _ = decode_reply::<GetInfo>(&bytes);
            let _ = decode_reply::<CreateKernelsInProgram>(&bytes);
        }
    }

    #[test]
    fn reply_with_trailing_garbage_is_rejected() {
        let mut bytes = postcard::to_allocvec(&0i32).unwrap();
        assert_eq!(decode_reply::<FlushOrFinish>(&bytes).unwrap(), 0);
        bytes.push(0);
        assert!(matches!(decode_reply::<FlushOrFinish>(&bytes), Err(IpcError::Protocol(_))));
    }

    #[test]
    fn handshake_refuses_other_versions_with_a_clear_message() {
        let mut hello = handshake::Hello::new();
        assert!(hello.check().is_ok());
        hello.version += 1;
        let err = hello.check().unwrap_err();
        assert!(err.contains("protocol version mismatch"), "{err}");
        hello.magic = *b"notcloi!";
        assert!(hello.check().unwrap_err().contains("magic"));
    }
}
