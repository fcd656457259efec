//! Leaf: what direct transfers (`direct`) need to know of a command queue, kept in the handle
//! table's queue objects (`handle::ObjData::Queue`). Imports nothing of the crate.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use cloister_ipc::ObjectId;

/// A command queue's state, as far as direct transfers need it.
pub struct QueueState {
    /// The queue's context (a direct transfer's buffer must belong to it).
    pub context: ObjectId,
    /// Its device: the driver accepts a kernel's launch shapes per device (`launch_shapes`).
    device: ObjectId,
    /// In order, on a context of CPU devices with host-unified memory.
    capable: bool,
    /// In order (commands complete in the order they reach the driver).
    in_order: bool,
    /// The thread that enqueued first (its `thread_token`), 0 before any enqueue.
    owner: AtomicUsize,
    /// Set once a second thread used the queue (`used_by_this_thread`): "idle" is then never
    /// trusted again.
    shared: AtomicBool,
    /// Commands enqueued through the worker so far (on an in-order queue).
    enqueued: AtomicU64,
    /// Of those, how many are known complete (all of the first `settled`).
    settled: AtomicU64,
    /// Direct copies under way: an enqueue from another thread waits for them.
    copying: AtomicU32,
    /// Its commands' events carry timestamps (`CL_QUEUE_PROFILING_ENABLE`).
    profiling: bool,
}

impl QueueState {
    pub fn new(context: ObjectId, device: ObjectId, in_order: bool, capable: bool) -> Self {
        Self {
            context,
            device,
            capable,
            in_order,
            owner: AtomicUsize::new(0),
            shared: AtomicBool::new(false),
            enqueued: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            copying: AtomicU32::new(0),
            profiling: false,
        }
    }

    /// The queue's device.
    pub fn device(&self) -> ObjectId {
        self.device
    }

    /// In order, on a context of CPU devices with host-unified memory.
    pub fn capable(&self) -> bool {
        self.capable
    }

    /// The same, its commands' events carrying timestamps or not.
    pub fn with_profiling(self, profiling: bool) -> Self {
        Self { profiling, ..self }
    }

    /// Its commands' events carry timestamps (a pipelined transfer's event then starts with its
    /// first chunk: `api::enqueue::pipelined_in`).
    pub fn profiling(&self) -> bool {
        self.profiling
    }

    /// The state of a queue rebuilt in a replacement worker (`recovery`): nothing is known to be
    /// complete until its next blocking call.
    pub fn rebuilt(&self) -> Self {
        let s = Self::new(self.context, self.device, self.in_order, self.capable).with_profiling(self.profiling);
        s.enqueued.store(1, SeqCst);
        s.shared.store(self.shared.load(SeqCst), SeqCst);
        s
    }

    /// In order: commands complete in the order they reach the driver (`api::enqueue`'s
    /// `eventless_write` needs that).
    pub fn in_order(&self) -> bool {
        self.in_order
    }

    /// Notes that the calling thread uses the queue: the first thread to do so owns it, any
    /// other marks it shared for good.
    fn used_by_this_thread(&self) {
        let me = thread_token();
        if self.owner.load(SeqCst) == me {
            return;
        }
        match self.owner.compare_exchange(0, me, SeqCst, SeqCst) {
            Ok(_) => {}
            Err(owner) if owner == me => {}
            Err(_) => self.shared.store(true, SeqCst),
        }
    }

    /// Whether a second thread has used the queue (then "idle" is never trusted again, and a
    /// transfer made of several commands cannot keep other threads' commands out from between
    /// them).
    pub fn shared(&self) -> bool {
        self.shared.load(SeqCst)
    }

    /// Called before every command enqueued on the queue through the worker.
    pub fn enqueuing(&self) {
        if !self.in_order {
            return;
        }
        self.used_by_this_thread();
        self.enqueued.fetch_add(1, SeqCst);
        // A copy (or `exclusive` transfer) that began before this command existed finishes
        // first, as if it had been enqueued (and completed) before it. A copy takes
        // microseconds; a transfer may take a while: past the first thousand turns the wait
        // sleeps between looks, leaving the core to the threads the transfer waits for.
        let mut turns = 0u32;
        while self.copying.load(SeqCst) != 0 {
            match turns < 1000 {
                true => std::thread::yield_now(),
                false => std::thread::sleep(std::time::Duration::from_micros(50)),
            }
            turns = turns.saturating_add(1);
        }
    }

    /// Called when a blocking call on the queue (`clFinish`, a blocking transfer or map) has
    /// returned successfully: every command enqueued before it has completed. A thread other
    /// than the one that enqueued marks the queue shared: the commands the owner enqueued while
    /// this call was under way are counted but need not be complete (a thread that only read
    /// and called `clFinish` while another enqueued fills got torn reads).
    pub fn blocking_call_returned(&self) {
        if self.in_order {
            self.used_by_this_thread();
            self.settled.fetch_max(self.enqueued.load(SeqCst), SeqCst);
        }
    }

    /// Whether every command counted on the queue but (at most) the one being made is known
    /// complete, one thread alone having used it: a transfer made now waits for nothing but
    /// itself (`exclusive`).
    pub fn idle_but_one(&self) -> bool {
        !self.shared.load(SeqCst)
            && !UNTRACKED_QUEUES.load(SeqCst)
            && self.enqueued.load(SeqCst).saturating_sub(self.settled.load(SeqCst)) <= 1
    }

    /// Runs `transfer`, a transfer made of several commands (the driver's map, the shim's copy,
    /// the unmap; pipelined chunks), with every other thread's next enqueue on the queue held
    /// back until it is done, so none lands between its commands, as none can within the
    /// driver's one command. Only while `idle_but_one` (checked again under the hold): the
    /// transfer must wait for nothing another thread could bring about after its next enqueue
    /// (an earlier command waiting on a user event that thread sets then would wait for ever),
    /// so the caller gives it no wait list. `None` if not. An out-of-order queue orders
    /// nothing: `transfer` just runs.
    pub fn exclusive<R>(&self, transfer: impl FnOnce() -> R) -> Option<R> {
        if !self.in_order {
            return Some(transfer());
        }
        self.copying.fetch_add(1, SeqCst);
        let r = self.idle_but_one().then(transfer);
        self.copying.fetch_sub(1, SeqCst);
        r
    }

    /// One thread alone has used the queue, and every command counted on it is known complete.
    fn idle(&self) -> bool {
        !self.shared.load(SeqCst)
            && !UNTRACKED_QUEUES.load(SeqCst)
            && self.enqueued.load(SeqCst) == self.settled.load(SeqCst)
    }

    /// Runs `copy` now if the queue is idle and only one thread uses it; `None` if not.
    pub fn while_idle<R>(&self, copy: impl FnOnce() -> R) -> Option<R> {
        self.copying.fetch_add(1, SeqCst);
        let r = self.idle().then(copy);
        self.copying.fetch_sub(1, SeqCst);
        r
    }
}

/// Set once a command buffer ran on the queues it was recorded for: the shim does not know
/// which those are, so no queue is trusted to be idle again.
static UNTRACKED_QUEUES: AtomicBool = AtomicBool::new(false);

/// A command buffer runs on queues the shim does not know (`UNTRACKED_QUEUES`).
pub fn no_queue_idle_again() {
    UNTRACKED_QUEUES.store(true, SeqCst);
}

/// A number that tells this thread from every other live one: the address of a thread-local.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}
