//! Non-blocking transfers. The driver reads into (or writes from) a shared segment while the
//! application goes on; the shim copies a read's data into the application's memory before
//! anything can tell the application the read is done: `clFinish`, `clWaitForEvents`, a status
//! query that returns `CL_COMPLETE`, an event callback, or a later blocking call on the queue.
//!
//! Layer: above the handle table. It imports `conn`, `handle` and the leaves (`base`,
//! `mirror`); the transfers of a connection are its state there (`of`), and what recovery must
//! hear of them goes through `conn::Above`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use cloister_ipc::cl::*;
use cloister_ipc::image::Strided;
use cloister_ipc::{FillMapping, ObjectId, Release};

use crate::conn::{Conn, HoldsNotifierLock, Segment};
use crate::handle::{self, Kind};
use crate::mirror::Mirror;

pub enum Transfer {
    /// Unpack the segment's rows into the box `shape` at `dst` (and into `mirror`, the same
    /// rows of a `CL_MEM_USE_HOST_PTR` object's memory).
    Read { dst: usize, shape: Strided, mirror: Option<Mirror> },
    /// The segment only has to outlive the driver's read of it.
    Write,
    /// A non-blocking map: have the worker fill the mapping's `segment` (mapped at `region`),
    /// then unpack it into `mirror`, a `CL_MEM_USE_HOST_PTR` object's memory. The segment
    /// belongs to the mapping, not to this operation.
    Map { segment: u64, region: usize, mirror: Option<Mirror> },
}

pub struct PendingOp {
    pub queue: ObjectId,
    /// The event that says when it completes. `None` for a write posted without one (see
    /// `eventless`): it is complete once a later command of its lane on its in-order queue is,
    /// or once a `clFinish` or blocking call on that queue started after it returns.
    pub event: Option<ObjectId>,
    /// The application's handle for `event`, retained while pending; `None` for an event the
    /// shim made for itself (released on the worker when settled).
    pub app_event: Option<usize>,
    /// The segment the operation owns, released when it completes.
    pub segment: Option<Segment>,
    pub transfer: Transfer,
    /// Where it stands in the connection's order of pending operations (`Pending::stamp`,
    /// taken after the request was posted).
    pub seq: u64,
    /// The lane it was posted on (`Conn::lane_token`), 0 when unknown: an eventless write is
    /// complete when a later command of the same lane and queue is.
    pub lane: usize,
}

/// The transfers under way on a connection, kept there (`Conn::state`).
#[derive(Default)]
pub struct Pending {
    ops: Mutex<Vec<PendingOp>>,
    /// One settler at a time, so no caller returns while another still holds a finished read.
    settling: Mutex<()>,
    /// The next `PendingOp::seq`.
    next_seq: AtomicU64,
    /// How many of `ops` are eventless writes.
    eventless: AtomicUsize,
    /// How many of `ops` land bytes in the application's memory (`lands_in_app`): while none
    /// does, a posted write need not look for them (`reads_into`).
    landing: AtomicUsize,
}

/// Whether `op` lands bytes in the application's memory when it completes.
fn lands_in_app(op: &PendingOp) -> bool {
    matches!(op.transfer, Transfer::Read { .. } | Transfer::Map { mirror: Some(_), .. })
}

impl Pending {
    /// Records a transfer under way: a new one, or one a settle found still running.
    pub fn push(&self, op: PendingOp) {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push(op);
    }

    /// Records a new transfer (see `push`), counting the eventless ones.
    pub fn push_new(&self, op: PendingOp) {
        if op.event.is_none() {
            self.eventless.fetch_add(1, Ordering::AcqRel);
        }
        if lands_in_app(&op) {
            self.landing.fetch_add(1, Ordering::AcqRel);
        }
        self.push(op);
    }

    /// How many eventless writes are pending (`api::enqueue`'s `eventless_write` bounds them).
    pub fn eventless_pending(&self) -> usize {
        self.eventless.load(Ordering::Acquire)
    }

    /// A new operation's place in the order, taken once its request is posted: an operation
    /// stamped below a `mark` read before a call was posted before that call started, so the
    /// call (`Conn::call` waits for every other lane's posts to run first) reached the driver
    /// after it.
    pub fn stamp(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::AcqRel)
    }

    /// The stamp the next operation will get (see `stamp`).
    pub fn mark(&self) -> u64 {
        self.next_seq.load(Ordering::Acquire)
    }

    /// Drops a non-blocking map's pending fill: the application unmapped it (the worker fills
    /// the segment itself before writing it back). Says whether there was one (the map may
    /// still be under way).
    pub fn forget_map(&self, conn: &Conn, segment_id: u64) -> bool {
        let _one = self.settling.lock().unwrap_or_else(|e| e.into_inner());
        let _here = HoldsNotifierLock::enter();
        let taken: Vec<PendingOp> = {
            let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            let (taken, rest) = std::mem::take(&mut *ops)
                .into_iter()
                .partition(|op| matches!(op.transfer, Transfer::Map { segment, .. } if segment == segment_id));
            *ops = rest;
            taken
        };
        let found = !taken.is_empty();
        for op in taken {
            complete(conn, op, CL_QUEUED, false);
        }
        found
    }

    /// The events of the reads (and non-blocking maps' fills) under way whose destination in the
    /// application's memory overlaps `[start, start + len)`: a write from that memory enqueued
    /// after them must take its bytes once they have landed (`api::enqueue`'s
    /// `write_after_reads`), as the driver reads its source when the write runs.
    /// `then` runs with them, before any settle can land them (and release the shim's own
    /// events of those that completed): what it registers on their events is registered while
    /// they are still under way.
    pub fn reads_into<R>(&self, start: usize, len: usize, then: impl FnOnce(Vec<ObjectId>) -> R) -> R {
        if self.landing.load(Ordering::Acquire) == 0 {
            return then(Vec::new());
        }
        // A settle under way holds the operations it took out: wait for it to put them back.
        let _one = self.settling.lock().unwrap_or_else(|e| e.into_inner());
        let _here = HoldsNotifierLock::enter();
        let end = start.saturating_add(len);
        let overlaps = |at: usize, shape: &Strided| {
            shape.extent().is_none_or(|extent| at < end && start < at.saturating_add(extent))
        };
        let reads = {
            let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            ops.iter()
                .filter(|op| match &op.transfer {
                    Transfer::Read { dst, shape, mirror } => {
                        overlaps(*dst, shape) || mirror.is_some_and(|m| overlaps(m.at, &m.shape))
                    }
                    Transfer::Map { mirror: Some(m), .. } => overlaps(m.at, &m.shape),
                    _ => false,
                })
                .filter_map(|op| op.event)
                .collect()
        };
        then(reads)
    }

    /// Whether an eventless write on `queue` is pending.
    pub fn has_eventless(&self, queue: ObjectId) -> bool {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|op| op.queue == queue && op.event.is_none())
    }

    pub fn len(&self) -> usize {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// The transfers under way on `conn`.
pub fn of(conn: &Conn) -> &Pending {
    conn.state()
}

/// Completes every finished transfer, of every queue: a blocking call on one queue may have
/// waited for a transfer on another (a marker waiting on its event, then `clFinish`), and the
/// application may then look at its destination (a non-blocking read on one queue, then a
/// `clFinish` of another that waited for it, left the destination unwritten).
pub fn settle(conn: &Conn) {
    settle_through(conn, None);
}

/// `settle`, after a `clFinish` or a blocking transfer on in-order `queue` returned success: the
/// eventless writes of that queue stamped below `mark` (read before that call started) are
/// complete too.
pub fn settle_finished(conn: &Conn, queue: ObjectId, mark: u64) {
    settle_through(conn, Some((queue, mark)));
}

fn settle_through(conn: &Conn, finished_below: Option<(ObjectId, u64)>) {
    let pending = of(conn);
    // Lock first: another thread may have taken finished operations out of the list and still
    // be copying them; an empty list alone does not mean they have landed.
    let _one = pending.settling.lock().unwrap_or_else(|e| e.into_inner());
    let _here = HoldsNotifierLock::enter();
    if pending.is_empty() {
        return;
    }
    let (mut evented, eventless): (Vec<PendingOp>, Vec<PendingOp>) = {
        let mut ops = pending.ops.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *ops).into_iter().partition(|op| op.event.is_some())
    };
    // Asked newest first: a command seen complete was preceded by everything it waited for,
    // which is then seen complete too (asked later), so no read lands without the reads it was
    // ordered after. They land oldest first (below), in the order the driver ran them: two
    // ordered reads into overlapping memory landed the other way round when a settle on another
    // thread had put the older one back behind the newer one.
    evented.sort_by_key(|op| std::cmp::Reverse(op.seq));
    // Per (queue, lane): the latest stamp of a command seen complete. An in-order queue runs a
    // lane's commands in the order the lane posted them, so what that lane posted before is
    // complete too.
    let mut complete_through: Vec<((ObjectId, usize), u64)> = Vec::new();
    if !evented.is_empty() {
        // The shim's own events the worker releases in the same call once they are settled.
        let own = evented.iter().filter(|op| op.app_event.is_none()).filter_map(|op| op.event).collect();
        let events: Vec<ObjectId> = evented.iter().filter_map(|op| op.event).collect();
        let n = events.len();
        // A worker that cannot answer makes them all fail with its error.
        let statuses = conn.event_statuses(events, own).unwrap_or_else(|e| vec![e; n]);
        let mut finished = Vec::with_capacity(n);
        for (op, status) in evented.into_iter().zip(statuses) {
            if status > CL_COMPLETE && !conn.is_dead() {
                pending.push(op);
                continue;
            }
            if status == CL_COMPLETE && op.lane != 0 {
                let key = (op.queue, op.lane);
                match complete_through.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, through)) => *through = (*through).max(op.seq),
                    None => complete_through.push((key, op.seq)),
                }
            }
            // A status the worker answered (not one the shim made up for a dead worker or a bad
            // answer) says the worker released the shim's own event.
            let released = status == CL_COMPLETE || (status < 0 && status != CL_INVALID_EVENT && !conn.is_dead());
            finished.push((op, status, released));
        }
        for (op, status, released) in finished.into_iter().rev() {
            complete(conn, op, status, released);
        }
    }
    for op in eventless {
        let done = finished_below.is_some_and(|(queue, mark)| op.queue == queue && op.seq < mark)
            || complete_through.iter().any(|&(k, through)| k == (op.queue, op.lane) && op.seq < through);
        let status = match (done, conn.is_dead()) {
            (true, _) => CL_COMPLETE,
            // The worker is gone: its driver reads the segment no more.
            (false, true) => crate::conn::FAULT,
            (false, false) => {
                pending.push(op);
                continue;
            }
        };
        pending.eventless.fetch_sub(1, Ordering::AcqRel);
        complete(conn, op, status, true);
    }
}

/// Completes `op` with `status`; `released`: the worker has released the shim's own event.
fn complete(conn: &Conn, op: PendingOp, status: cl_int, released: bool) {
    if lands_in_app(&op) {
        of(conn).landing.fetch_sub(1, Ordering::AcqRel);
    }
    if let (true, true, Some(event)) = (status < 0, conn.replays(), op.event) {
        if !matches!(op.transfer, Transfer::Write) {
            // A read or map that never landed: recovery must not call its event complete.
            conn.above().unfinished(conn, event);
        }
    }
    match (&op.transfer, &op.segment, status) {
        (Transfer::Read { dst, shape, mirror }, Some(seg), CL_COMPLETE) => {
            // SAFETY: dst is the application's memory covering `shape`, which it must keep valid
            // until the read completes; the segment holds the packed rows.
            unsafe { shape.unpack(seg.region.as_ptr(), *dst as *mut u8) };
            if let Some(m) = mirror {
                // SAFETY: the segment holds the packed rows; the object's memory covers the box.
                unsafe { m.fill_from(seg.region.as_ptr()) };
            }
        }
        (Transfer::Map { segment, region, mirror }, _, CL_COMPLETE) => {
            let filled = conn.call(FillMapping { segment: *segment }) == Ok(CL_SUCCESS);
            if let (true, Some(m)) = (filled, mirror) {
                // SAFETY: the mapping's segment (still mapped: it is unmapped only after this
                // operation is taken out) holds the packed rows; the object's memory covers them.
                unsafe { m.fill_from(*region as *const u8) };
            }
        }
        _ => {}
    }
    if let Some(seg) = op.segment {
        conn.release_segment(seg);
    }
    match op.app_event {
        Some(h) => {
            handle::release(h as *mut _, Kind::Event);
        }
        None if released => {}
        None => {
            if let Some(event) = op.event {
                let _ = conn.call(Release { object: event });
            }
        }
    }
}
