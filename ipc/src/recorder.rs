//! The flight recorder's shared layout: a small memfd the broker creates for each worker and
//! reads after the worker is gone, so a report can say what the worker was doing when it died
//! even if it died by a signal with no chance to say anything.

use std::sync::atomic::{AtomicI64, AtomicU64};

use crate::shm::SharedRegion;
use crate::IpcError;

pub const RECORDER_BYTES: usize = 4096;
pub const RECORDER_MAGIC: u64 = u64::from_le_bytes(*b"cloFR001");

/// The fd number the worker finds its recorder at.
pub const RECORDER_FD: i32 = 4;

#[repr(C)]
pub struct RecorderHeader {
    pub magic: AtomicU64,
    /// The system call seccomp trapped, or -1.
    pub trapped_syscall: AtomicI64,
}

/// One side's mapping of a recorder.
pub struct FlightRecorder {
    region: SharedRegion,
}

impl FlightRecorder {
    pub fn create() -> Result<Self, IpcError> {
        let region = SharedRegion::create("cloister-recorder", RECORDER_BYTES)?;
        let r = Self { region };
        r.header().magic.store(RECORDER_MAGIC, std::sync::atomic::Ordering::Release);
        r.header().trapped_syscall.store(-1, std::sync::atomic::Ordering::Release);
        Ok(r)
    }

    pub fn from_region(region: SharedRegion) -> Result<Self, IpcError> {
        if region.len() < RECORDER_BYTES {
            return Err(IpcError::Protocol("recorder region too small"));
        }
        Ok(Self { region })
    }

    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    pub fn header(&self) -> &RecorderHeader {
        // SAFETY: the region is page aligned and at least RECORDER_BYTES long; the header is
        // atomics only, valid for any bit pattern (a hostile worker can write anything).
        unsafe { &*(self.region.as_ptr() as *const RecorderHeader) }
    }

    /// Leaks the mapping so signal handlers can point into it for the life of the process.
    pub fn leak(self) -> &'static RecorderHeader {
        let r: &'static FlightRecorder = Box::leak(Box::new(self));
        r.header()
    }
}
