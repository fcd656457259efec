//! cloister's IPC layer: wire types, the postcard codec, socket framing with fd passing, the
//! shared-memory lanes and the version handshake. No OpenCL calls and no processes here.

pub mod api_table;
pub mod channel;
pub mod cl;
pub mod dispatch;
pub mod handshake;
pub mod lane;
pub mod shm;
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

/// Encodes a lane call.
pub fn encode_request<C: Call>(call: C) -> Result<Vec<u8>, IpcError> {
    postcard::to_allocvec(&call.into_request()).map_err(IpcError::Encode)
}

/// Decodes a request as the worker reads it.
pub fn decode_request(bytes: &[u8]) -> Result<Request, IpcError> {
    postcard::from_bytes(bytes).map_err(IpcError::Decode)
}

/// Decodes a reply as the shim reads it: trailing garbage is an error too.
pub fn decode_reply<C: Call>(bytes: &[u8]) -> Result<C::Reply, IpcError> {
    let (reply, rest) = postcard::take_from_bytes(bytes).map_err(IpcError::Decode)?;
    if !rest.is_empty() {
        return Err(IpcError::Protocol("trailing bytes after reply"));
    }
    Ok(reply)
}
