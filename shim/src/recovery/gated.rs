//! Journaled commands the rebuild cannot finish: those waiting on a user event the application
//! has not set yet, and those behind them. The application sets that event only once the call
//! that met the death returns, so finishing such a command during the rebuild would wait for
//! ever. They are enqueued in the replacement without waiting, in journal order, and the driver
//! holds them until the event is set; their transfers complete later, as the application's
//! non-blocking transfers do (`pending`).

use std::collections::HashSet;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::*;

use super::journal::{Bytes, Cmd, State};
use super::rebuild::read_into;
use crate::conn::{Conn, Segment};
use crate::handle::Kind;
use crate::pending::{PendingOp, Transfer};

/// What holds commands back: user events not set, events of commands held back, and queues
/// with a command held back (a later command there runs after it).
pub(super) struct Gates {
    events: HashSet<ObjectId>,
    queues: HashSet<ObjectId>,
}

impl Gates {
    /// The user events made again without a status (`created`: the objects the rebuild made).
    pub(super) fn new(st: &State, created: &HashSet<ObjectId>) -> Self {
        let unset =
            st.recipes.iter().filter(|(id, r)| r.is_unset_user_event() && created.contains(id)).map(|(id, _)| *id);
        Gates { events: unset.collect(), queues: HashSet::new() }
    }

    /// Whether `cmd` waits, directly or through its queue, on a user event not set yet.
    pub(super) fn hold(&self, cmd: &Cmd) -> bool {
        !self.events.is_empty()
            && (self.queues.contains(&cmd.queue())
                || cmd.sync().is_some_and(|s| s.wait.iter().any(|w| self.events.contains(w))))
    }

    /// Enqueues `cmd` in `new` without waiting for it (it is held back: `hold`); `old` is the
    /// dead worker, whose handles the application's events still are.
    pub(super) fn enqueue(&mut self, cmd: &Cmd, old: &Arc<Conn>, new: &Arc<Conn>) -> Result<i32, i32> {
        let queue = cmd.queue();
        self.queues.insert(queue);
        self.events.extend(cmd.sync().and_then(|s| s.event));
        match cmd {
            Cmd::Enqueue(req) => new.call_request(req),
            Cmd::Batch { req, .. } => new.call(req.clone()),
            Cmd::Write { queue, mem, offset, data, sync } => posted(old, new, *queue, sync, data, |data, sync| {
                EnqueueWriteBuffer { queue: *queue, mem: *mem, blocking: false, offset: *offset, data, sync }
                    .into_request()
            }),
            Cmd::Region { req, data } => posted(old, new, req.queue, &req.sync, data, |data, sync| {
                EnqueueRegionTransfer { blocking: false, data, sync, ..req.clone() }.into_request()
            }),
            Cmd::Read { req, dst, shape, mirror, .. } => {
                let Some(sync) = cmd.sync() else { return Ok(CL_INVALID_OPERATION) };
                let len = shape.packed_len();
                let seg = new.acquire_segment(len)?;
                let into = DataRef::Segment { id: seg.id, offset: 0, len: len as u64 };
                let Some(req) = read_into(req, into, false) else {
                    new.release_segment(seg);
                    return Ok(CL_INVALID_OPERATION);
                };
                let transfer = Transfer::Read { dst: *dst, shape: *shape, mirror: *mirror };
                track(old, new, queue, sync, seg, transfer, req)
            }
        }
    }
}

/// Posts a write of `data` (kept by the journal) through a fresh segment of `new`, kept until
/// the write completes.
fn posted(
    old: &Arc<Conn>,
    new: &Arc<Conn>,
    queue: ObjectId,
    sync: &EnqueueSync,
    data: &Bytes,
    make: impl FnOnce(DataRef, EnqueueSync) -> Request,
) -> Result<i32, i32> {
    let seg = new.acquire_segment(data.len())?;
    // SAFETY: the segment holds at least `data.len()` bytes; the journal's bytes are valid for
    // their length, in another mapping.
    unsafe { cloister_ipc::copy::copy(seg.region.as_ptr(), data.as_ptr(), data.len()) };
    let mut own = sync.clone();
    own.event.get_or_insert_with(|| new.alloc_id());
    let req = make(DataRef::Segment { id: seg.id, offset: 0, len: data.len() as u64 }, own.clone());
    track(old, new, queue, &own, seg, Transfer::Write, req)
}

/// Sends `req` (whose event is `sync`'s, made here when the command had none) and records it as
/// pending on `new` with its segment; the application's handle for the event, if it holds one,
/// is kept until the transfer completes.
fn track(
    old: &Arc<Conn>,
    new: &Arc<Conn>,
    queue: ObjectId,
    sync: &EnqueueSync,
    segment: Segment,
    transfer: Transfer,
    req: Request,
) -> Result<i32, i32> {
    let Some(event) = sync.event else {
        new.release_segment(segment);
        return Ok(CL_INVALID_OPERATION);
    };
    match new.call_request(&req) {
        Ok(CL_SUCCESS) => {}
        other => {
            new.release_segment(segment);
            return other;
        }
    }
    let app_event = crate::handle::objects_of(old)
        .into_iter()
        .find(|(_, o)| o.kind == Kind::Event && o.id == event)
        .map(|(h, _)| {
            crate::handle::retain(h as *const _, Kind::Event);
            h
        });
    let seq = crate::pending::of(new).stamp();
    let op = PendingOp { queue, event: Some(event), app_event, segment: Some(segment), transfer, seq, lane: 0 };
    crate::pending::of(new).push_new(op);
    Ok(CL_SUCCESS)
}
