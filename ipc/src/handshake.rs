//! The version handshake, the first message on every channel.

use serde::{Deserialize, Serialize};

/// Bumped whenever any wire type changes shape.
pub const PROTOCOL_VERSION: u32 = 16;
pub const MAGIC: [u8; 8] = *b"cloister";

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub magic: [u8; 8],
    pub version: u32,
    pub pid: u32,
}

impl Hello {
    pub fn new() -> Self {
        Self { magic: MAGIC, version: PROTOCOL_VERSION, pid: std::process::id() }
    }

    /// Checks a peer's hello; the error says what to do about a mismatch.
    pub fn check(&self) -> Result<(), String> {
        if self.magic != MAGIC {
            return Err("peer is not a cloister component (bad magic)".into());
        }
        if self.version != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version mismatch: this side speaks v{PROTOCOL_VERSION}, the peer v{}; \
                 the shim, worker and cloister binary must come from the same build",
                self.version
            ));
        }
        Ok(())
    }
}

impl Default for Hello {
    fn default() -> Self {
        Self::new()
    }
}
