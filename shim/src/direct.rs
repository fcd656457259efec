//! Transfers the shim makes itself, with no trip to the worker: reads and writes of a zero-copy
//! buffer on an in-order queue of a CPU device, while every command enqueued on that queue is
//! known to have completed.
//!
//! A zero-copy buffer's memory is a shared segment the driver uses as the buffer's own storage
//! (`CL_MEM_USE_HOST_PTR` in the worker). On a CPU device that storage is all there is: no device
//! copy to keep coherent, no cache to flush, so map and unmap only order the access against the
//! queue's other commands. When the shim knows the queue is idle (its last blocking call, or
//! `clFinish`, returned after the last enqueue), a blocking transfer has nothing to wait for and
//! a copy here is exactly what the driver would do, minus two process wake-ups and the driver's
//! own thread hand-off. A busy queue gets one `clFinish` round trip, then the copy.
//!
//! What the shim cannot know it does not assume. The direct path is taken only when:
//! - the queue is in order, and only one thread has ever enqueued on it (with several, "idle"
//!   would race their enqueues: the queue then keeps the worker's path for good);
//! - every device of the queue's context is a CPU device with host-unified memory;
//! - the buffer is a zero-copy buffer of the queue's own context, the transfer lies within it,
//!   is not empty, and the buffer's host-access flags allow it;
//! - there is no wait list and no event (an event would need the driver's object).
//!
//! Everything else, a failing case included, takes the worker's path, which reports the
//! driver's own error. `CLOISTER_ZERO_COPY=0` turns zero-copy buffers, and so this, off.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use cloister_ipc::ObjectId;

use crate::handle::{Object, SharedView};

/// A command queue's state, as far as direct transfers need it.
pub struct QueueState {
    /// The queue's context (a direct transfer's buffer must belong to it).
    pub context: ObjectId,
    /// In order, on a context of CPU devices with host-unified memory.
    capable: bool,
    /// The thread that enqueued first (its `thread_token`), 0 before any enqueue.
    owner: AtomicUsize,
    /// Set once a second thread enqueued: "idle" is then never trusted again.
    shared: AtomicBool,
    /// Commands enqueued through the worker so far.
    enqueued: AtomicU64,
    /// Of those, how many are known complete (all of the first `settled`).
    settled: AtomicU64,
    /// Direct copies under way: an enqueue from another thread waits for them.
    copying: AtomicU32,
}

impl QueueState {
    pub fn new(context: ObjectId, capable: bool) -> Self {
        Self {
            context,
            capable,
            owner: AtomicUsize::new(0),
            shared: AtomicBool::new(false),
            enqueued: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            copying: AtomicU32::new(0),
        }
    }

    /// The state of a queue rebuilt in a replacement worker (`recovery`): nothing is known to be
    /// complete until its next blocking call.
    pub fn rebuilt(&self) -> Self {
        let s = Self::new(self.context, self.capable);
        s.enqueued.store(1, SeqCst);
        s.shared.store(self.shared.load(SeqCst), SeqCst);
        s
    }

    /// Called before every command enqueued on the queue through the worker.
    pub fn enqueuing(&self) {
        if !self.capable {
            return;
        }
        let me = thread_token();
        match self.owner.compare_exchange(0, me, SeqCst, SeqCst) {
            Ok(_) => {}
            Err(owner) if owner == me => {}
            Err(_) => self.shared.store(true, SeqCst),
        }
        self.enqueued.fetch_add(1, SeqCst);
        // A copy that began before this command existed finishes first, as if it had been
        // enqueued (and completed) before it.
        while self.copying.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    }

    /// Called when a blocking call on the queue (`clFinish`, a blocking transfer or map) has
    /// returned successfully: every command enqueued before it has completed.
    pub fn blocking_call_returned(&self) {
        if self.capable {
            self.settled.fetch_max(self.enqueued.load(SeqCst), SeqCst);
        }
    }

    /// Runs `copy` now if the queue is idle and only one thread uses it; `None` if not.
    fn while_idle<R>(&self, copy: impl FnOnce() -> R) -> Option<R> {
        self.copying.fetch_add(1, SeqCst);
        let idle = !self.shared.load(SeqCst)
            && !UNTRACKED_QUEUES.load(SeqCst)
            && self.enqueued.load(SeqCst) == self.settled.load(SeqCst);
        let r = idle.then(copy);
        self.copying.fetch_sub(1, SeqCst);
        r
    }
}

/// Set once a command buffer ran on the queues it was recorded for: the shim does not know
/// which those are, so no queue is trusted to be idle again.
static UNTRACKED_QUEUES: AtomicBool = AtomicBool::new(false);

/// Called before a command buffer is enqueued on `queues` (empty: the queues it was recorded
/// for).
pub fn command_buffer_enqueued(queues: &[cloister_ipc::cl::cl_command_queue]) {
    if queues.is_empty() {
        UNTRACKED_QUEUES.store(true, SeqCst);
    }
    for &q in queues {
        if let Ok(q) = crate::handle::lookup(q, crate::handle::Kind::Queue) {
            if let Some(state) = q.data.queue_state() {
                state.enqueuing();
            }
        }
    }
}

/// A number that tells this thread from every other live one: the address of a thread-local.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
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
        if !state.capable || !m.data.host_transfer_allowed(state.context, write, offset, size) {
            return None;
        }
        let at = view.at(offset, size)?;
        Some(Direct { at, app, size, write })
    }

    /// Copies now if the queue is idle: `false` if it is not (nothing was copied).
    ///
    /// # Safety
    /// The application's memory holds `size` bytes (readable for a write, writable for a read).
    pub unsafe fn copy_if_idle(&self, q: &Object) -> bool {
        let Some(state) = q.data.queue_state() else { return false };
        state
            .while_idle(|| {
                // SAFETY: `at` is `size` bytes of the buffer's shared memory (checked by
                // `SharedView::at`); `app` holds `size` bytes per the caller. The worker may write
                // the shared memory meanwhile: that changes the data, never where it goes.
                unsafe {
                    match self.write {
                        true => cloister_ipc::copy::copy(self.at, self.app.cast_const(), self.size),
                        false => cloister_ipc::copy::copy(self.app, self.at.cast_const(), self.size),
                    }
                }
            })
            .inspect(|_| {
                cloister_ipc::log::in_shim(|| tracing::trace!(write = self.write, size = self.size, "direct transfer"));
            })
            .is_some()
    }
}
