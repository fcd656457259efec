//! Transfers and maps the shim makes itself, with no trip to the worker: reads, writes and maps
//! of a zero-copy buffer on an in-order queue of a CPU device, while every command enqueued on
//! that queue is known to have completed; and `clFinish` on such a queue, which has nothing to
//! wait for then.
//!
//! A zero-copy buffer's memory is a shared segment the driver uses as the buffer's own storage
//! (`CL_MEM_USE_HOST_PTR` in the worker). On a CPU device that storage is all there is: no device
//! copy to keep coherent, no cache to flush, so map and unmap only order the access against the
//! queue's other commands. When the shim knows the queue is idle (its last blocking call, or
//! `clFinish`, returned after the last enqueue), a blocking transfer has nothing to wait for and
//! a copy here is exactly what the driver would do, minus two process wake-ups and the driver's
//! own thread hand-off. A busy queue gets one `clFinish` round trip, then the copy. A map on an
//! idle queue is the shim's view of the memory, and its unmap orders nothing the driver needs to
//! know of (the bytes are in place, and every later command reaches the worker after it): a
//! loop of map, touch, unmap and `clFinish` makes no round trip at all.
//!
//! What the shim cannot know it does not assume. The direct path is taken only when:
//! - the queue is in order, and only one thread has ever used it (enqueued on it, or returned
//!   from a blocking call on it: with several, "idle" would race their enqueues, and a thread's
//!   `clFinish` would count another's commands sent meanwhile as complete; the queue then keeps
//!   the worker's path for good);
//! - every device of the queue's context is a CPU device with host-unified memory;
//! - the buffer is a zero-copy buffer of the queue's own context, the transfer lies within it,
//!   is not empty, and the buffer's host-access flags allow it;
//! - there is no wait list; an event the application asks for is a user event the worker makes
//!   complete and lets stand in for the transfer on its queue (`EnqueueDone`: its command type
//!   and queue are the transfer's), which has no timestamps, so not on a profiling queue;
//! - for a map: the buffer is not `CL_MEM_USE_HOST_PTR` (its map hands out the application's
//!   own memory, filled from the buffer's), and the flags are one of `CL_MAP_READ`,
//!   `CL_MAP_WRITE`, both, or `CL_MAP_WRITE_INVALIDATE_REGION`. A map's event, and the event
//!   of such a mapping's unmap on a queue still idle, are made as a transfer's are. The unmap
//!   with a wait list, or with an event on a busy queue, has the worker map and unmap the range
//!   in one go, so the event is a real unmap's; the map count (`CL_MEM_MAP_COUNT`) is the
//!   shim's.
//!
//! The worker is asked once per buffer, at its first direct transfer or map, whether the buffer
//! exists: its creation may have been posted, and failed in the driver.
//!
//! Everything else, a failing case included, takes the worker's path, which reports the
//! driver's own error. `CLOISTER_ZERO_COPY=0` turns zero-copy buffers, and so this, off.

use cloister_ipc::cl::*;

use crate::conn::SharedView;
use crate::handle::{ObjData, Object};

/// Called before a command buffer is enqueued on `queues` (empty: the queues it was recorded
/// for).
pub fn command_buffer_enqueued(queues: &[cloister_ipc::cl::cl_command_queue]) {
    if queues.is_empty() {
        crate::queue_state::no_queue_idle_again();
    }
    for &q in queues {
        if let Ok(q) = crate::handle::lookup(q, crate::handle::Kind::Queue) {
            if let Some(state) = q.data.queue_state() {
                state.enqueuing();
            }
        }
    }
}

/// Whether `clFinish` on `q` has nothing to wait for: an in-order queue of CPU devices that one
/// thread alone enqueues on, idle (every command the worker was sent on it is known complete, its
/// last blocking call having returned after the last of them). The driver's answer would be
/// `CL_SUCCESS`: a late error of a posted command on the queue is returned by the first blocking
/// call after it, which then does not mark the queue idle. So a loop of direct transfers and
/// `clFinish` pays no round trip (2 pocl cores: 6-38 us a `clFinish`, more when a core halted).
pub fn finish_is_idle(q: &Object) -> bool {
    // A dead worker's queue goes the worker's way: its first call after the death says so.
    let idle = !q.conn.is_dead()
        && q.data.queue_state().is_some_and(|state| state.capable() && state.while_idle(|| ()).is_some());
    if idle {
        cloister_ipc::log::in_shim(|| tracing::trace!("direct finish of an idle queue"));
    }
    idle
}

/// A transfer the direct path may make: the bytes of the buffer, and the application's.
pub struct Direct {
    at: *mut u8,
    app: *mut u8,
    size: usize,
    write: bool,
}

impl Direct {
    /// The direct form of a read (`write == false`) or write of `[offset, offset + size)` of
    /// `m` on `q`, if every condition in the module's documentation holds but idleness.
    pub fn check(q: &Object, m: &Object, write: bool, offset: usize, size: usize, app: *mut u8) -> Option<Direct> {
        let state = q.data.queue_state()?;
        let view: &SharedView = m.data.shared_view()?;
        if !state.capable() || state.shared() || !m.data.host_transfer_allowed(state.context, write, offset, size) {
            return None;
        }
        let at = view.at(offset, size)?;
        Some(Direct { at, app, size, write })
    }

    /// Copies now if the queue `q` is idle and the worker has said the buffer `m` exists (asked
    /// once, where the copy would otherwise be made): `Some(CL_SUCCESS)` when it copied, the
    /// worker's code when the buffer does not exist, `None` if the queue is busy (nothing was
    /// copied).
    ///
    /// # Safety
    /// The application's memory holds `size` bytes (readable for a write, writable for a read).
    pub unsafe fn copy_if_idle(&self, q: &Object, m: &Object) -> Option<cl_int> {
        let state = q.data.queue_state()?;
        if !m.data.known_made() {
            state.while_idle(|| ())?;
            if let Err(code) = exists_in_worker(m) {
                return Some(code);
            }
        }
        state.while_idle(|| {
            // SAFETY: `at` is `size` bytes of the buffer's shared memory (checked by
            // `SharedView::at`); `app` holds `size` bytes per the caller. The worker may write
            // the shared memory meanwhile: that changes the data, never where it goes.
            unsafe {
                match self.write {
                    true => cloister_ipc::copy::copy(self.at, self.app.cast_const(), self.size),
                    false => cloister_ipc::copy::copy(self.app, self.at.cast_const(), self.size),
                }
            }
            cloister_ipc::log::in_shim(|| tracing::trace!(write = self.write, size = self.size, "direct transfer"));
            CL_SUCCESS
        })
    }
}

/// A map the direct path may make: where the buffer's bytes are in this process.
pub struct DirectMap {
    at: *mut u8,
}

impl DirectMap {
    /// The direct form of a map with `flags` of `[offset, offset + size)` of `m` on `q`, if every
    /// condition in the module's documentation holds but idleness.
    pub fn check(q: &Object, m: &Object, flags: u64, offset: usize, size: usize) -> Option<DirectMap> {
        let state = q.data.queue_state()?;
        let view: &SharedView = m.data.shared_view()?;
        let ObjData::Mem { flags: mem_flags, .. } = &m.data else { return None };
        let (read, write) = match flags {
            CL_MAP_READ => (true, false),
            CL_MAP_WRITE => (false, true),
            f if f == CL_MAP_READ | CL_MAP_WRITE => (true, true),
            CL_MAP_WRITE_INVALIDATE_REGION => (false, true),
            _ => return None,
        };
        let allowed = |w: bool| m.data.host_transfer_allowed(state.context, w, offset, size);
        if !state.capable()
            || state.shared()
            || mem_flags & CL_MEM_USE_HOST_PTR != 0
            || (read && !allowed(false))
            || (write && !allowed(true))
        {
            return None;
        }
        Some(DirectMap { at: view.at(offset, size)? })
    }

    /// The mapping of `m` if the queue `q` is idle now and the worker has said the buffer exists
    /// (asked only here, where the map would otherwise be made), or the worker's code if it does
    /// not exist: `None` if the queue is busy.
    pub fn if_idle(&self, q: &Object, m: &Object) -> Option<Result<*mut u8, cl_int>> {
        let at = q.data.queue_state()?.while_idle(|| self.at)?;
        if let Err(code) = exists_in_worker(m) {
            return Some(Err(code));
        }
        cloister_ipc::log::in_shim(|| tracing::trace!("direct map"));
        Some(Ok(at))
    }
}

/// Whether `m` exists in the worker, asked once per buffer that does (`ObjData::known_made`): a
/// posted creation may have failed in the driver, and every later transfer or map of the buffer
/// must then return the driver's code, as it does through the worker (not land in memory no
/// buffer owns). One round trip at a buffer's first direct transfer or map (the queue stays
/// idle: an info query is no command). A failure is not remembered: it is asked again (a dead
/// worker's code is not the buffer's for good).
fn exists_in_worker(m: &Object) -> Result<(), cl_int> {
    if m.data.known_made() {
        return Ok(());
    }
    crate::info::query(m, cloister_ipc::InfoTarget::MemObject, 0, CL_MEM_SIZE)?;
    m.data.mark_made();
    Ok(())
}
