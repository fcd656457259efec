//! Shared memory: anonymous memfd regions mapped into both the application and the worker.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::IpcError;

/// The seals that fix a region's size: with them (and `F_SEAL_SEAL`), a mapping of the whole
/// file can never reach past its end.
const SIZE_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

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
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(IpcError::os("memfd_create"));
        }
        // SAFETY: raw is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(IpcError::os("ftruncate"));
        }
        // Sealed before the peer ever sees it: neither side can shrink the file under the
        // other's mapping (a SIGBUS on the next touch) or grow it, and nobody can change the
        // seals afterwards.
        // SAFETY: F_ADD_SEALS on our own memfd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SIZE_SEALS | libc::F_SEAL_SEAL) } != 0 {
            return Err(IpcError::os("F_ADD_SEALS"));
        }
        Self::map(fd, len)
    }

    /// Maps a region received from the peer. The mapping length is taken from the fd itself, and
    /// must be at least `min_len`, so a lying peer cannot make us read past the end. The fd must
    /// be a memfd whose size is sealed for good: otherwise the peer could truncate it under our
    /// mapping later, and our next access would die of SIGBUS.
    pub fn from_fd(fd: OwnedFd, min_len: usize) -> Result<Self, IpcError> {
        // SAFETY: F_GET_SEALS on any fd only reads its seals (EINVAL for non-memfds).
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(IpcError::Protocol("shared region is not a sealable memfd"));
        }
        if seals & (SIZE_SEALS | libc::F_SEAL_SEAL) != SIZE_SEALS | libc::F_SEAL_SEAL {
            return Err(IpcError::Protocol("shared region's size is not sealed"));
        }
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
        Mapped::slice_ptr(self, offset, len)
    }
}

/// Shared memory mapped in this process, with or without its fd: a region or a mapping.
pub trait Mapped {
    /// The mapping's start and length.
    fn mapped(&self) -> (NonNull<u8>, usize);

    /// `[offset, offset + len)` as a raw pointer, if it lies inside the mapping.
    fn slice_ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let (base, map_len) = self.mapped();
        let end = offset.checked_add(len)?;
        if end > map_len as u64 {
            return None;
        }
        // SAFETY: offset is within the mapping, checked above.
        Some(unsafe { base.as_ptr().add(offset as usize) })
    }
}

impl Mapped for SharedRegion {
    fn mapped(&self) -> (NonNull<u8>, usize) {
        (self.base, self.len)
    }
}

impl Mapped for SharedMapping {
    fn mapped(&self) -> (NonNull<u8>, usize) {
        (self.base, self.len)
    }
}

impl SharedRegion {
    /// Keeps the mapping and closes the fd: a region both sides have mapped needs no fd any
    /// more, and an application with thousands of buffers must not run out of descriptors.
    pub fn into_mapping(self) -> SharedMapping {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so its fd is read out exactly once (and closed when
        // the read copy drops); the mapping passes to the SharedMapping, which unmaps it.
        drop(unsafe { std::ptr::read(&this.fd) });
        SharedMapping { base: this.base, len: this.len }
    }
}

/// A shared mapping whose fd is closed (see `SharedRegion::into_mapping`). Unmapped on drop.
pub struct SharedMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory, accessed through raw pointers only, as for SharedRegion.
unsafe impl Send for SharedMapping {}
// SAFETY: as above.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns `[offset, offset+len)` as a raw pointer if it lies inside the mapping.
    pub fn slice_ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        Mapped::slice_ptr(self, offset, len)
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping taken over from a SharedRegion; nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len.max(1)) };
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len.max(1)) };
    }
}

/// Bytes of a shared region kept after the transfer that staged them (replay's journal keeps a
/// write's data so instead of copying it): the region stays mapped while they live. The peer
/// maps the region too and may still write it, so they are read only through raw pointers.
pub struct KeptBytes {
    region: std::sync::Arc<SharedRegion>,
    at: usize,
    len: usize,
}

impl KeptBytes {
    /// `[at, at + len)` of `region`, if it lies inside it.
    pub fn new(region: std::sync::Arc<SharedRegion>, at: usize, len: usize) -> Option<Self> {
        region.slice_ptr(at as u64, len as u64)?;
        Some(Self { region, at, len })
    }

    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `at + len` lies inside the mapping (checked by `new`), which lives as long.
        unsafe { self.region.as_ptr().add(self.at) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory they hold: the whole region (a pooled segment may be up to twice the
    /// transfer it staged).
    pub fn footprint(&self) -> usize {
        self.region.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_regions_cannot_be_resized_or_unsealed() {
        let r = SharedRegion::create("test", 8192).unwrap();
        let fd = r.fd().as_raw_fd();
        // SAFETY: resizing and resealing our own memfd; each must be refused.
        unsafe {
            assert_eq!(libc::ftruncate(fd, 0), -1);
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
            assert_eq!(libc::ftruncate(fd, 1 << 20), -1);
            assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE), -1);
        }
        let peer = SharedRegion::from_fd(r.fd().try_clone().unwrap(), 8192).unwrap();
        assert_eq!(peer.len(), 8192);
    }

    #[test]
    fn a_region_kept_without_its_fd_stays_shared() {
        let r = SharedRegion::create("test", 8192).unwrap();
        let peer = SharedRegion::from_fd(r.fd().try_clone().unwrap(), 8192).unwrap();
        let m = r.into_mapping();
        assert_eq!(m.len(), 8192);
        // SAFETY: both mappings are 8192 bytes of the same memfd.
        unsafe {
            *m.as_ptr().add(8191) = 7;
            assert_eq!(*peer.as_ptr().add(8191), 7);
        }
    }

    #[test]
    fn unsealed_fds_are_refused() {
        // SAFETY: a plain memfd, as a hostile peer would send.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        // SAFETY: raw is a fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our memfd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 8192) }, 0);
        assert!(SharedRegion::from_fd(fd.try_clone().unwrap(), 1).is_err());
        // Sealed against shrinking only, it could still grow or gain seals: refused too.
        // SAFETY: adding a partial seal set.
        assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) }, 0);
        assert!(SharedRegion::from_fd(fd, 1).is_err());
        // Not a memfd at all.
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(SharedRegion::from_fd(file.into(), 1).is_err());
    }
}
