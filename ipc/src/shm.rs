//! Shared memory: anonymous memfd regions mapped into both the application and the worker.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::IpcError;

/// A shared mapping of a memfd. Unmapped on drop; the fd is kept so it can be sent to the peer.
pub struct SharedRegion {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the region is plain shared memory; all access goes through raw pointers whose users
// synchronise with atomics in the lane header, so moving the handle across threads is sound.
unsafe impl Send for SharedRegion {}
// SAFETY: as above; `&SharedRegion` only hands out raw pointers.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a new zero-filled region of `len` bytes (sparse: pages cost memory once touched).
    pub fn create(name: &str, len: usize) -> Result<Self, IpcError> {
        let cname = std::ffi::CString::new(name).map_err(|_| IpcError::Protocol("bad memfd name"))?;
        // SAFETY: cname is a valid C string; memfd_create has no other preconditions.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(IpcError::os("memfd_create"));
        }
        // SAFETY: raw is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(IpcError::os("ftruncate"));
        }
        Self::map(fd, len)
    }

    /// Maps a region received from the peer. The mapping length is taken from the fd itself, and
    /// must be at least `min_len`, so a lying peer cannot make us read past the end.
    pub fn from_fd(fd: OwnedFd, min_len: usize) -> Result<Self, IpcError> {
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is valid and st points to writable memory.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(IpcError::os("fstat"));
        }
        let len = st.st_size as usize;
        if len < min_len || len == 0 {
            return Err(IpcError::Protocol("shared region smaller than announced"));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Self, IpcError> {
        // SAFETY: mapping a valid fd with a length it holds; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(IpcError::os("mmap"));
        }
        Ok(Self { base: NonNull::new(p.cast()).ok_or(IpcError::Protocol("mmap null"))?, len, fd })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Returns `[offset, offset+len)` as a raw pointer if it lies inside the region.
    pub fn slice_ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset is within the mapping, checked above.
        Some(unsafe { self.base.as_ptr().add(offset as usize) })
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len.max(1)) };
    }
}
