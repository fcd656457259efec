//! Zero-copy buffers' memory: where a buffer lives in memory shared with the worker, and the
//! views of it that buffer objects, sub-buffers and replay's journal keep.

use std::sync::Arc;

use cloister_ipc::shm::SharedMapping;
use cloister_ipc::wire::BufferMemory;

use super::slabs::SlabLease;

/// A zero-copy buffer's memory (`Conn::buffer_memory`): `offset` bytes into `mapping`, which
/// the worker knows as `memory`.
pub struct BufferPlace {
    pub mapping: Arc<SharedMapping>,
    pub offset: usize,
    pub memory: BufferMemory,
    /// Its share of a slab (`SlabLease`), which its views hold.
    pub(super) lease: Option<Arc<SlabLease>>,
}

impl BufferPlace {
    /// The view of the buffer's `len` bytes that its object (and the journal) keep.
    pub fn view(&self, len: usize) -> SharedView {
        SharedView { memory: self.mapping.clone(), offset: self.offset, len, lease: self.lease.clone() }
    }
}

/// A zero-copy buffer's memory as this process sees it: `len` bytes at `offset` of a mapping
/// shared with the worker, where the driver keeps the buffer (`CL_MEM_USE_HOST_PTR` there). A
/// sub-buffer's view is a window of its parent's. The worker may write it at any time: it is
/// data, never a length or pointer the shim trusts.
#[derive(Clone)]
pub struct SharedView {
    pub memory: Arc<SharedMapping>,
    pub offset: usize,
    pub len: usize,
    /// A slab buffer's share of its slab, held while the buffer or a window of it is seen.
    pub lease: Option<Arc<SlabLease>>,
}

impl SharedView {
    /// The address of bytes `[offset, offset + size)` of the buffer, if they lie within it
    /// (checked here, whatever the driver would say: the shim hands out or copies through it).
    pub fn at(&self, offset: usize, size: usize) -> Option<*mut u8> {
        let end = offset.checked_add(size)?;
        if end > self.len || self.offset.checked_add(self.len)? > self.memory.len() {
            return None;
        }
        // SAFETY: offset + self.offset is within the mapping, checked above.
        Some(unsafe { self.memory.as_ptr().add(self.offset + offset) })
    }

    /// The window `[origin, origin + size)` of this view, for a sub-buffer.
    pub fn window(&self, origin: usize, size: usize) -> Option<SharedView> {
        self.at(origin, size)?;
        Some(SharedView {
            memory: self.memory.clone(),
            offset: self.offset + origin,
            len: size,
            lease: self.lease.clone(),
        })
    }
}
