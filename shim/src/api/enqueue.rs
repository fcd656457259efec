//! Enqueues. A blocking read or write is one command, as the driver's: below `PIPE_MIN` it goes
//! whole through the calling thread's lane (one copy here, the driver's own copy there, run
//! blocking in the worker, as the lane's bulk area is reused by the next call), from `PIPE_MIN`
//! on it is `pipelined` through pooled segments, and a zero-copy buffer's may be the shim's own
//! copy (`direct`, `in_place`). Either way the data is in place when the call returns, before
//! any event or wait can report it done. Small non-blocking transfers are posted
//! (`enqueue_pending`).

use std::ffi::c_void;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::image::Strided;
use cloister_ipc::lane::BULK_CAP;
use cloister_ipc::shm::KeptBytes;
use cloister_ipc::*;

use super::kernel::{all_args, all_args_set, each_object_arg, restore_dirty_args, take_dirty_args};
use super::{enqueue_posted, enqueue_sync, finish_enqueue, slice};
use crate::conn::Segment;
use crate::handle::{lookup, Kind, MapArea, MapRecord, ObjData, Object};
use crate::launch_shapes::{Launch, LaunchShapes};
use crate::mirror::Mirror;
use crate::pending::{settle, PendingOp, Transfer};
use crate::queue_state::QueueState;
use crate::recovery::{Unmapping, WriteDone};

pub(super) fn queue_and_mem(queue: cl_command_queue, mem: cl_mem) -> Result<(Arc<Object>, Arc<Object>), cl_int> {
    let q = lookup(queue, Kind::Queue)?;
    let m = lookup(mem, Kind::Mem)?;
    if !Arc::ptr_eq(&q.conn, &m.conn) {
        // One of them lost with a dead worker (not carried over by recovery) is that fault.
        return Err(crate::conn::mismatch(&q.conn, &m.conn, CL_INVALID_CONTEXT));
    }
    Ok((q, m))
}

/// Settles the finished non-blocking transfers when a blocking call on a queue returns: every
/// queue's, as the call may have waited for another queue's (`pending::settle`).
pub(super) struct SettleAfter<'a> {
    queue: &'a Object,
    /// `pending::mark` before the call.
    mark: u64,
    /// The call said its command completed.
    completed: std::cell::Cell<bool>,
}

impl<'a> SettleAfter<'a> {
    pub(super) fn new(queue: &'a Object) -> Self {
        let mark = crate::pending::of(&queue.conn).mark();
        Self { queue, mark, completed: std::cell::Cell::new(false) }
    }

    /// The blocking command completed: on an in-order queue, so did everything enqueued
    /// before the call started (`pending::settle_finished`).
    pub(super) fn completed(&self) {
        self.completed.set(true);
    }
}

impl Drop for SettleAfter<'_> {
    fn drop(&mut self) {
        let q = self.queue;
        match self.completed.get() {
            true => crate::pending::settle_finished(&q.conn, q.id, self.mark),
            false => settle(&q.conn),
        }
    }
}

/// Runs a blocking transfer through the lane, `call(sync)` making the worker's call: one command,
/// as the driver's, the lane's bulk area holding all of it (larger transfers are `pipelined`).
/// The queue's finished non-blocking transfers settle afterwards.
///
/// # Safety
/// `event` is NULL or valid for a write.
unsafe fn through_lane(
    q: &Object,
    sync: &EnqueueSync,
    event: *mut cl_event,
    call: impl FnOnce(EnqueueSync) -> Result<cl_int, cl_int>,
) -> Result<cl_int, cl_int> {
    let settled = SettleAfter::new(q);
    let rc = call(sync.clone())?;
    if rc == CL_SUCCESS {
        if let Some(state) = q.data.queue_state() {
            state.blocking_call_returned();
        }
        settled.completed();
    }
    // SAFETY: forwarded.
    Ok(unsafe { finish_enqueue(q, sync, event, Ok(rc)) })
}

/// An enqueue the shim must finish itself when it completes always gets an event (the
/// application's, or the shim's own): returns the sync to send and that event's id.
pub(super) fn with_own_event(q: &Object, sync: &EnqueueSync) -> (EnqueueSync, ObjectId) {
    let mut own = sync.clone();
    let id = *own.event.get_or_insert_with(|| q.conn.alloc_id());
    (own, id)
}

/// Whether a write through a segment may go without an event of the shim's own, which saves
/// the driver an event and the worker its bookkeeping (an event costs NVIDIA's driver
/// 0.3-0.45 us per 4 KiB write: `tools/measure/nbw.c`). Its segment is then released when a
/// later command of the same lane on the same queue completes, or when a `clFinish` or blocking
/// transfer on the queue started after it returns (`pending::settle_finished`); that needs an
/// in-order queue and, so that no other thread's post overtakes it in the worker, a connection
/// this thread alone has posted to. Once `EVENTLESS_MAX` such writes are pending, the next ones
/// take an event again, so a thread that never waits gets its segments back (and the pending
/// transfers settle every `SETTLE_EVERY`). The application asked for no event.
fn eventless_write(q: &Object, event: *mut cl_event) -> bool {
    event.is_null()
        && q.data.queue_state().is_some_and(|s| s.in_order())
        && crate::pending::of(&q.conn).eventless_pending() < EVENTLESS_MAX
        && q.conn.posts_alone()
}

/// The most eventless writes pending on a connection (see `eventless_write`): below
/// `SETTLE_EVERY`, so a stream of writes between two waits of up to this many needs no event
/// and no status query at all.
const EVENTLESS_MAX: usize = SETTLE_EVERY - 1;

/// After a successful enqueue the shim finishes later: hands the application its event and
/// records the operation as pending (see `pending`); `event_id` is the event that says when it
/// completes (`None`: an eventless write, see `eventless_write`).
///
/// # Safety
/// `event` is NULL or valid for a write.
pub(super) unsafe fn track(
    q: &Object,
    sync: &EnqueueSync,
    event: *mut cl_event,
    event_id: Option<ObjectId>,
    segment: Option<Segment>,
    transfer: Transfer,
) -> cl_int {
    // SAFETY: forwarded.
    let rc = unsafe { finish_enqueue(q, sync, event, Ok(CL_SUCCESS)) };
    let app_event = (!event.is_null()).then(|| {
        // SAFETY: finish_enqueue stored a fresh handle there.
        let h = unsafe { *event };
        crate::handle::retain(h, Kind::Event);
        h as usize
    });
    let pending = crate::pending::of(&q.conn);
    let (seq, lane) = (pending.stamp(), q.conn.lane_token());
    pending.push_new(PendingOp { queue: q.id, event: event_id, app_event, segment, transfer, seq, lane });
    // An application that never waits still gets its segments back: every so many pending
    // transfers, the finished ones settle (one call).
    if crate::pending::of(&q.conn).len() >= SETTLE_EVERY {
        settle(&q.conn);
    }
    rc
}

/// How many pending transfers make the next one settle the finished ones (each holds a shared
/// segment, and with it a descriptor).
const SETTLE_EVERY: usize = 64;

/// After a successful map of mapping `id`, seen here at `view`: a blocking one fills the
/// application's memory of a `CL_MEM_USE_HOST_PTR` object now, a non-blocking one is recorded
/// to be filled when done.
///
/// # Safety
/// `event` is NULL or valid for a write; `mirror` is within the object's host memory; `view`
/// holds the mapped rows, packed.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn map_done(
    q: &Object,
    sync: &EnqueueSync,
    event: *mut cl_event,
    event_id: ObjectId,
    blocking: bool,
    (id, view): (u64, *mut u8),
    flags: u64,
    mirror: Option<Mirror>,
) {
    let mirror = mirror.filter(|_| map_fills(flags));
    if blocking {
        if let Some(m) = mirror {
            // SAFETY: the view holds the mapped rows, packed.
            unsafe { m.fill_from(view) };
        }
        // SAFETY: forwarded.
        unsafe { finish_enqueue(q, sync, event, Ok(CL_SUCCESS)) };
    } else {
        let transfer = Transfer::Map { segment: id, region: view as usize, mirror };
        // SAFETY: forwarded.
        unsafe { track(q, sync, event, Some(event_id), None, transfer) };
    }
}

/// In replay mode, journals a non-blocking map as a read of what it maps (`read`, of event
/// `event_id`) into the mapping's memory `view` (rows `shape`, and `mirror`, a
/// `CL_MEM_USE_HOST_PTR` object's memory, unless the map invalidates): if the worker dies before
/// the map is complete, the replacement reads it again there before its event completes.
pub(super) fn journal_map_in_flight(
    q: &Object,
    read: Request,
    event_id: ObjectId,
    view: *mut u8,
    shape: Strided,
    flags: u64,
    mirror: Option<Mirror>,
) {
    let mirror = mirror.filter(|_| map_fills(flags));
    crate::recovery::journal_of(&q.conn).reading(read, event_id, view as usize, shape, mirror);
}

/// Enqueues a transfer through `segment` without waiting for it, and records it as pending.
/// `may_go_eventless`: a write that may go without an event of the shim's own when
/// `eventless_write` allows.
///
/// # Safety
/// `event` is NULL or valid for a write.
pub(super) unsafe fn enqueue_pending<C: Call<Reply = i32> + Clone>(
    q: &Object,
    sync: &EnqueueSync,
    event: *mut cl_event,
    segment: Segment,
    transfer: Transfer,
    may_go_eventless: bool,
    make: impl FnOnce(u64, EnqueueSync) -> C,
) -> Result<cl_int, cl_int> {
    let (own, event_id) = match may_go_eventless && matches!(transfer, Transfer::Write) && eventless_write(q, event) {
        true => (sync.clone(), None),
        false => {
            let (own, id) = with_own_event(q, sync);
            (own, Some(id))
        }
    };
    // A write's data is in the segment already, and a read is copied out of it only once its
    // event says complete (a read the driver refuses gets a failed event, and its error comes
    // late): both can be posted (`Conn::post` decides which requests may). A map's fill is a
    // call of its own.
    let req = make(segment.id, own);
    // Replay reads it again if the worker dies before its data landed.
    let replay = match (&transfer, q.conn.replays(), event_id) {
        (Transfer::Read { dst, shape, mirror }, true, Some(id)) => {
            Some((req.clone().into_request(), id, *dst, *shape, *mirror))
        }
        _ => None,
    };
    let rc = match transfer {
        Transfer::Write | Transfer::Read { .. } => q.conn.post(req),
        Transfer::Map { .. } => q.conn.call(req),
    };
    if rc != Ok(CL_SUCCESS) {
        q.conn.release_segment(segment);
        return rc;
    }
    if let Some((req, id, dst, shape, mirror)) = replay {
        crate::recovery::journal_of(&q.conn).reading(req, id, dst, shape, mirror);
    }
    // SAFETY: forwarded.
    Ok(unsafe { track(q, sync, event, event_id, Some(segment), transfer) })
}

/// For a `CL_MEM_USE_HOST_PTR` buffer: the application's bytes `[offset, offset + size)` of
/// it, which the shim keeps in step; `CL_INVALID_VALUE` if they are not all within the buffer
/// (the shim copies them itself, so no driver's say-so lets it write past the buffer).
fn use_host_ptr(m: &Object, offset: usize, size: usize) -> Result<Option<Mirror>, cl_int> {
    match m.data {
        ObjData::Mem { host_ptr, host_len, image: None, .. } if host_ptr != 0 => {
            let at = host_ptr.checked_add(offset).ok_or(CL_INVALID_VALUE)?;
            Mirror::within(at, Strided::linear(size), host_ptr, host_len).map(Some)
        }
        _ => Ok(None),
    }
}

pub unsafe fn clEnqueueReadBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking_read: cl_uint,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    let r = (|| {
        let (q, m) = queue_and_mem(queue, buffer)?;
        if ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: ptr holds `size` writable bytes per the API contract.
        if let Some(rc) =
            unsafe { direct(&q, &m, false, blocking_read != CL_FALSE, offset, size, ptr.cast(), (n, list), event) }
        {
            return Ok(rc);
        }
        // SAFETY: API contract for the wait list and event.
        let sync = unsafe { enqueue_sync(&q, n, list, event)? };
        let mirror = use_host_ptr(&m, offset, size)?;
        if blocking_read == CL_FALSE && posted_non_blocking(&q, &m, false, offset, size, &sync) {
            let shape = Strided::linear(size);
            let transfer = Transfer::Read { dst: ptr as usize, shape, mirror };
            let segment = q.conn.acquire_segment(size)?;
            let make = |segment, sync| EnqueueReadBuffer {
                queue: q.id,
                mem: m.id,
                blocking: false,
                offset: offset as u64,
                into: DataRef::Segment { id: segment, offset: 0, len: size as u64 },
                sync,
            };
            // SAFETY: event per API contract.
            return unsafe { enqueue_pending(&q, &sync, event, segment, transfer, false, make) };
        }
        // SAFETY: ptr holds `size` writable bytes per the API contract.
        if let Some(rc) = unsafe { in_place(&q, &m, false, offset, size, ptr.cast(), &sync, event) } {
            return rc;
        }
        if size >= PIPE_MIN {
            // SAFETY: as above; event per API contract.
            return unsafe { pipelined(&q, &m, false, offset, size, (ptr.cast(), mirror), &sync, event) };
        }
        let call = |sync| {
            let req = EnqueueReadBuffer {
                queue: q.id,
                mem: m.id,
                blocking: true,
                offset: offset as u64,
                into: DataRef::Lane { offset: 0, len: size as u64 },
                sync,
            };
            q.conn.call_with(
                req,
                |_| Ok(()),
                |rc, bulk| {
                    if *rc == CL_SUCCESS {
                        // SAFETY: the application's ptr holds `size` bytes, the bulk area as many
                        // (`size < PIPE_MIN <= BULK_CAP`).
                        unsafe { cloister_ipc::copy::copy(ptr.cast(), bulk, size) };
                        if let Some(host) = mirror {
                            // CL_MEM_USE_HOST_PTR: the application's memory holds device results.
                            // SAFETY: the mirror's `size` bytes lie within the buffer's memory
                            // (checked by use_host_ptr).
                            unsafe { std::ptr::copy(bulk, host.at as *mut u8, size) };
                        }
                    }
                },
            )
        };
        // SAFETY: event per API contract.
        unsafe { through_lane(&q, &sync, event, call) }
    })();
    let rc = r.unwrap_or_else(|e| e);
    if rc == CL_SUCCESS && blocking_read != CL_FALSE && crate::recovery::on() {
        if let Some((q, m)) = queue_and_mem(queue, buffer).ok().filter(|(q, _)| q.conn.replays()) {
            // SAFETY: the blocking read filled `size` bytes at `ptr`.
            let data = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) };
            crate::recovery::journal_of(&q.conn).read(&q.conn, q.id, m.id, offset as u64, data);
        }
    }
    rc
}

pub unsafe fn clEnqueueWriteBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking_write: cl_uint,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // Whether the data is in a zero-copy buffer's memory when the call returns (the shim
    // copied it there itself), and where it was staged for the worker (replay keeps that).
    let mut landed = false;
    let mut staged = None;
    let r = (|| {
        let (q, m) = queue_and_mem(queue, buffer)?;
        if ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        if q.conn.replays() {
            crate::recovery::journal_of(&q.conn).changing(m.id, true);
        }
        let app = ptr.cast_mut().cast();
        if blocking_write != CL_FALSE {
            land_reads_into(&q, ptr.cast(), size);
        }
        // SAFETY: ptr holds `size` bytes per the API contract (only read, for a write).
        if let Some(rc) =
            unsafe { direct(&q, &m, true, blocking_write != CL_FALSE, offset, size, app, (n, list), event) }
        {
            landed = true;
            return Ok(rc);
        }
        // SAFETY: API contract for the wait list and event.
        let sync = unsafe { enqueue_sync(&q, n, list, event)? };
        let posted = match blocking_write {
            CL_FALSE => posted_non_blocking(&q, &m, true, offset, size, &sync),
            _ => n == 0 && event.is_null() && size < PIPE_MIN && vouched_write(&q, &m, offset, size),
        };
        if posted {
            let segment = q.conn.acquire_segment(size)?;
            let mut sync = sync;
            let src = ptr as usize;
            // The application may reuse its memory once the call returns only after the event
            // completes, but copying now costs the same and frees it at once.
            // SAFETY: the source holds `size` bytes the application leaves alone until the write
            // completes (or the call returns, blocking); the segment holds as many.
            let fill = move |seg: *mut u8| unsafe { cloister_ipc::copy::copy(seg, src as *const u8, size) };
            let blocking = blocking_write != CL_FALSE;
            // SAFETY: as for `fill`.
            let gate = match unsafe { write_after_reads(&q, (ptr.cast(), size), blocking, &segment, fill) } {
                Ok(gate) => gate,
                Err(e) => {
                    q.conn.release_segment(segment);
                    return Err(e);
                }
            };
            if let Some(gate) = &gate {
                sync.wait.push(gate.id);
            }
            staged = keep_written(&q, &segment, size, gate.is_some());
            let make = |segment, sync| EnqueueWriteBuffer {
                queue: q.id,
                mem: m.id,
                blocking: false,
                offset: offset as u64,
                data: DataRef::Segment { id: segment, offset: 0, len: size as u64 },
                sync,
            };
            // SAFETY: event per API contract.
            let rc = unsafe { enqueue_pending(&q, &sync, event, segment, Transfer::Write, true, make) };
            if let Some(gate) = gate {
                // The write holds it now.
                gate.let_go(&q.conn);
            }
            return rc;
        }
        // SAFETY: ptr holds `size` bytes per the API contract (only read).
        if let Some(rc) = unsafe { in_place(&q, &m, true, offset, size, ptr.cast_mut().cast(), &sync, event) } {
            landed = true;
            return rc;
        }
        if size >= PIPE_MIN {
            // SAFETY: as above (a write only reads `ptr`); event per API contract.
            return unsafe { pipelined(&q, &m, true, offset, size, (ptr.cast_mut().cast(), None), &sync, event) };
        }
        let call = |sync| {
            let req = EnqueueWriteBuffer {
                queue: q.id,
                mem: m.id,
                blocking: true,
                offset: offset as u64,
                data: DataRef::Lane { offset: 0, len: size as u64 },
                sync,
            };
            let fill = |bulk: *mut u8| {
                // SAFETY: ptr holds `size` bytes, the bulk area as many (`size < PIPE_MIN <=
                // BULK_CAP`).
                unsafe { cloister_ipc::copy::copy(bulk, ptr.cast(), size) };
                Ok(())
            };
            q.conn.call_with(req, fill, |_, _| ())
        };
        // SAFETY: event per API contract.
        unsafe { through_lane(&q, &sync, event, call) }
    })();
    let rc = r.unwrap_or_else(|e| e);
    if rc == CL_SUCCESS && crate::recovery::on() {
        // SAFETY: as for the write itself (`ptr` holds `size` bytes; the list and event per
        // the API contract, the event written by the successful call).
        unsafe { record_write(queue, buffer, offset, size, ptr, n, list, event, landed, staged) };
    }
    rc
}

/// A user event of the worker's that a posted write waits for (`write_after_reads`): released
/// once both have let go of it, the write's enqueue and the notifier that sets it (the worker
/// forgets a released id, so neither may release it before the other is done with it).
#[derive(Clone)]
pub(super) struct Gate {
    pub(super) id: ObjectId,
    holders: Arc<std::sync::atomic::AtomicUsize>,
}

impl Gate {
    pub(super) fn let_go(&self, conn: &crate::conn::Conn) {
        if self.holders.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            let _ = conn.post(Release { object: self.id });
        }
    }
}

/// The events of the reads under way that still land in `[src, src + size)` after a settle.
fn reads_landing_in(q: &Object, src: *const u8, size: usize) -> Vec<ObjectId> {
    let pending = crate::pending::of(&q.conn);
    let reads = || pending.reads_into(src as usize, size, |reads| reads);
    if reads().is_empty() {
        return Vec::new();
    }
    settle(&q.conn);
    reads()
}

/// Before a blocking write takes its bytes from `[src, src + size)` (the call takes them, and the
/// driver would make the write after what was enqueued before it): waits for the reads under way
/// that land there, and lands them (before, the write took the old bytes).
pub(super) fn land_reads_into(q: &Object, src: *const u8, size: usize) {
    let reads = reads_landing_in(q, src, size);
    if reads.is_empty() {
        return;
    }
    // Their failure is theirs: the write then takes the memory as it is.
    let _ = q.conn.call(WaitForEvents { events: reads });
    settle(&q.conn);
}

/// A posted write's source may be where reads enqueued before it, still under way, land (the shim
/// copies a read's bytes into the application's memory when it settles it), while the driver
/// would read the source when the write runs, after them (before, the write took the source's
/// old bytes). `fill` copies the source into `segment` (given the segment's memory): now, with
/// `Ok(None)`, when no such read is (or all have landed after a settle), and for a blocking write
/// (`land_reads_into` has landed them). A non-blocking one returns at once with
/// `Ok(Some(gate))`: a user event of the worker's for the write to wait for, set by the notifier
/// once every such read has landed and `fill` has run, so nothing waits for what the application
/// does after the call; the caller lets go of it once the write is enqueued.
///
/// # Safety
/// `[src, src + size)` is the write's source, which the application leaves alone until the write
/// completes; `fill` copies it into the segment.
pub(super) unsafe fn write_after_reads(
    q: &Object,
    (src, size): (*const u8, usize),
    blocking: bool,
    segment: &Segment,
    fill: impl Fn(*mut u8) + Send + Sync + 'static,
) -> Result<Option<Gate>, cl_int> {
    let pending = crate::pending::of(&q.conn);
    if blocking || reads_landing_in(q, src, size).is_empty() {
        fill(segment.region.as_ptr());
        return Ok(None);
    }
    let context = q.data.queue_state().map(|state| state.context).ok_or(CL_INVALID_COMMAND_QUEUE)?;
    let gate = Gate { id: q.conn.alloc_id(), holders: Arc::new(std::sync::atomic::AtomicUsize::new(2)) };
    match q.conn.call(CreateUserEvent { id: gate.id, context })? {
        CL_SUCCESS => {}
        e => return Err(e),
    }
    // Registered while the reads are still under way (no settle can land them meanwhile): the
    // worker hears of each callback before any call that could release the shim's own events.
    let (region, setter) = (segment.region.clone(), gate.clone());
    pending.reads_into(src as usize, size, move |reads| {
        let gate = setter;
        // Landed meanwhile (another thread's settle): one count for the copy made here.
        let left = Arc::new(std::sync::atomic::AtomicUsize::new(reads.len().max(1)));
        // The segment is the driver's to read only once the gate is set, after this.
        let fill_then_open = move |conn: &crate::conn::Conn, status: cl_int| {
            if left.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) != 1 {
                return;
            }
            if status != crate::conn::FAULT {
                fill(region.as_ptr());
            }
            let _ = conn.call(SetUserEventStatus { event: gate.id, status: CL_COMPLETE });
            gate.let_go(conn);
        };
        if reads.is_empty() {
            fill_then_open(&q.conn, CL_COMPLETE);
            return;
        }
        let fill_then_open = Arc::new(fill_then_open);
        for read in reads {
            let fill_then_open = fill_then_open.clone();
            let run: crate::conn::ShimCallback = Box::new(move |conn, status| fill_then_open(conn, status));
            let token = q.conn.register_callback(crate::conn::Callback::Shim(run));
            // Posted: a refusal in the worker runs the callback at once with its code.
            let _ = q.conn.post(SetEventCallback { event: read, callback_type: CL_COMPLETE, token });
        }
    });
    Ok(Some(gate))
}

/// Whether a blocking write may be posted like a non-blocking one: OpenCL lets a blocking write
/// return once the application's memory may be reused ("the OpenCL implementation copies the
/// data referred to by ptr and enqueues the write operation"), which the copy into a segment
/// achieves. Only a write whose every refusal the shim can make itself: a buffer of the queue's
/// context (not an image, a pipe, or the application's own memory), a range within it and not
/// empty, host access allowed; without a wait list (a failed event in it must fail this call)
/// or an event (drivers complete a blocking write's event before returning, and an application
/// may count on it).
/// The driver's remaining refusals (allocation failures) come late, as a posted enqueue's do.
fn vouched_write(q: &Object, m: &Object, offset: usize, size: usize) -> bool {
    let own_memory = matches!(m.data, ObjData::Mem { host_ptr, .. } if host_ptr != 0);
    !own_memory && transfer_vouched(q, m, true, offset, size)
}

/// Whether a read (`write == false`) or write of `[offset, offset + size)` of `m` on `q` may be
/// posted, its every refusal but the driver's lack of memory made by the shim: a buffer of the
/// queue's context, a range within it and not empty, host access of that kind allowed. Any
/// other goes through a call and returns the driver's own error (a non-blocking write to a
/// `CL_MEM_HOST_READ_ONLY` buffer, or a read past its end, said `CL_SUCCESS` and failed late).
fn transfer_vouched(q: &Object, m: &Object, write: bool, offset: usize, size: usize) -> bool {
    q.data.queue_state().is_some_and(|state| m.data.host_transfer_allowed(state.context, write, offset, size))
}

/// Whether a non-blocking read or write is posted (through a segment, the call returning at
/// once), its every refusal made by the shim (`transfer_vouched`). Past `NON_BLOCKING_MAX` it is
/// made before the call returns (pipelined through two pooled segments), but only where that
/// waits for nothing but the transfer itself (`waits_for_nothing`); elsewhere it is posted
/// through a segment of its own size: an earlier command, or an event of the wait list, may wait
/// for a user event the application sets only after this call returns (a 70 MiB read behind
/// one hung in the call for ever).
fn posted_non_blocking(q: &Object, m: &Object, write: bool, offset: usize, size: usize, sync: &EnqueueSync) -> bool {
    transfer_vouched(q, m, write, offset, size) && (size <= NON_BLOCKING_MAX || !waits_for_nothing(q, sync))
}

/// Whether the command being made on `q` with `sync` (counted on its queue already, by
/// `enqueue_sync`) waits for nothing but itself: no wait list, an in-order queue one thread
/// alone has used, every command enqueued on it before this one known complete. (Asked whether
/// every command counted was complete, this one included, it never was: every non-blocking
/// transfer past 64 MiB went through a segment of its own size, clpeak's at 0.9-2.0 GB/s.)
fn waits_for_nothing(q: &Object, sync: &EnqueueSync) -> bool {
    sync.wait.is_empty() && q.data.queue_state().is_some_and(|state| state.in_order() && state.idle_but_one())
}

/// Below this a write's data is copied into the journal (cheap) rather than keeping its staging
/// segment, which is at least 64 KiB, out of the pool.
const KEEP_STAGED_MIN: usize = 64 << 10;

/// In replay mode, the `len` bytes at `at` of a write's staging `segment`, for the journal to
/// keep instead of copying them (`recovery::journal`).
pub(super) fn keep_staged(q: &Object, segment: &Segment, at: usize, len: usize) -> Option<KeptBytes> {
    (len >= KEEP_STAGED_MIN && q.conn.replays()).then(|| segment.kept(at, len)).flatten()
}

/// `keep_staged` for a posted write staged whole at the start of `segment`; `gated`: behind a
/// `Gate` (`write_after_reads`), its bytes reach the segment only once the reads land, so the
/// journal keeps the segment whatever its size (a copy now would hold the old bytes).
pub(super) fn keep_written(q: &Object, segment: &Segment, len: usize, gated: bool) -> Option<KeptBytes> {
    match gated && q.conn.replays() {
        true => segment.kept(0, len),
        false => keep_staged(q, segment, 0, len),
    }
}

/// After a transfer of several commands whose event is the last one's (`finish_enqueue` made
/// the application's handle, with `rc`): `first`, the first command's event kept on a profiling
/// queue, becomes the start of the application's event (`Object::start_with`), or is let go.
///
/// # Safety
/// `event` is NULL or valid, written by `finish_enqueue` where `rc` is `CL_SUCCESS`.
unsafe fn start_event_with(q: &Object, event: *mut cl_event, rc: cl_int, first: Option<ObjectId>) {
    let Some(first) = first else { return };
    // SAFETY: per the caller.
    let made = (rc == CL_SUCCESS && !event.is_null()).then(|| lookup(unsafe { *event }, Kind::Event).ok()).flatten();
    match made {
        Some(e) => e.start_with(first),
        None => drop(q.conn.post(Release { object: first })),
    }
}

/// In replay mode, records a successful write with its data (`recovery`).
///
/// # Safety
/// As for `clEnqueueWriteBuffer`, after it succeeded.
#[allow(clippy::too_many_arguments)]
unsafe fn record_write(
    queue: cl_command_queue,
    buffer: cl_mem,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    landed: bool,
    staged: Option<KeptBytes>,
) {
    let Some((q, m)) = queue_and_mem(queue, buffer).ok().filter(|(q, _)| q.conn.replays()) else { return };
    // SAFETY: the wait list holds `n` events per the API contract.
    let waits = unsafe { slice(list, n as usize, CL_INVALID_EVENT_WAIT_LIST) }.unwrap_or(&[]);
    let wait = super::ids_of(waits, Kind::Event, CL_INVALID_EVENT_WAIT_LIST).map(|w| w.0).unwrap_or_default();
    // SAFETY: the event per the API contract, written by the successful call.
    let event = unsafe { super::returned_event(event) };
    // SAFETY: ptr holds `size` bytes.
    let data = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) };
    let done = WriteDone { sync: EnqueueSync { wait, event }, landed, staged };
    crate::recovery::journal_of(&q.conn).wrote(q.id, m.id, offset as u64, data, done);
}

pub unsafe fn clEnqueueCopyBuffer(
    queue: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let (q, s) = queue_and_mem(queue, src)?;
    let (_, d) = queue_and_mem(queue, dst)?;
    let make = |sync| EnqueueCopyBuffer {
        queue: q.id,
        src: s.id,
        dst: d.id,
        src_offset: src_offset as u64,
        dst_offset: dst_offset as u64,
        size: size as u64,
        sync,
    };
    // Posted only when the shim can make the driver's refusals itself: both ranges within their
    // buffers of the queue's context, two buffers of different memory (a copy within one, or
    // between a buffer and its sub-buffer or two sub-buffers of one buffer, may overlap:
    // `CL_MEM_COPY_OVERLAP`). Any other copy waits for the driver's answer, so its error is
    // this call's, not a late one.
    let context = q.data.queue_state().map(|state| state.context);
    let vouched = context.is_some_and(|c| {
        s.storage() != d.storage()
            && s.data.buffer_range(c, src_offset, size)
            && d.data.buffer_range(c, dst_offset, size)
    });
    // SAFETY: the wait list and event per API contract.
    unsafe { super::enqueue_posted_if(vouched, &q, n, list, event, make) }
}

pub unsafe fn clEnqueueFillBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let (q, m) = queue_and_mem(queue, buffer)?;
    if pattern.is_null() || pattern_size == 0 || pattern_size > 128 {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: pattern holds pattern_size bytes.
    let pattern = unsafe { slice(pattern.cast::<u8>(), pattern_size, CL_INVALID_VALUE)? }.to_vec();
    let make =
        |sync| EnqueueFillBuffer { queue: q.id, mem: m.id, pattern, offset: offset as u64, size: size as u64, sync };
    // Posted only when the shim can make the driver's refusals itself (a pattern size the
    // specification names, offset and size its multiples, the range within a buffer of the
    // queue's context); any other fill waits for the driver's answer.
    let vouched = pattern_size.is_power_of_two()
        && offset.is_multiple_of(pattern_size)
        && size.is_multiple_of(pattern_size)
        && q.data.queue_state().is_some_and(|state| m.data.buffer_range(state.context, offset, size));
    // SAFETY: the wait list and event per API contract.
    unsafe { super::enqueue_posted_if(vouched, &q, n, list, event, make) }
}

pub unsafe fn clEnqueueMapBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking_map: cl_uint,
    map_flags: cl_bitfield,
    offset: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    let r = (|| {
        let (q, m) = queue_and_mem(queue, buffer)?;
        let blocking = blocking_map != CL_FALSE;
        let quiet = n == 0 && list.is_null() && (event.is_null() || events_stand_in(&q));
        if let Some(r) = quiet.then(|| direct_map(&q, &m, blocking, map_flags, offset, size)).flatten() {
            let ptr = r?;
            // SAFETY: event per API contract.
            return match unsafe { done_event(&q, CL_COMMAND_MAP_BUFFER, CL_SUCCESS, event) } {
                CL_SUCCESS => Ok(ptr.cast()),
                e => {
                    // No event, no mapping: the call failed (and may run again after a
                    // replay's carry-over).
                    forget_direct_map(&q, &m, ptr);
                    Err(e)
                }
            };
        }
        // SAFETY: API contract.
        let sync = unsafe { enqueue_sync(&q, n, list, event)? };
        // A blocking map may have waited for an earlier non-blocking transfer, of this queue or
        // another: landed before the application looks.
        let _settled = blocking.then(|| SettleAfter::new(&q));
        // CL_MEM_USE_HOST_PTR: the spec requires the application's own pointer, holding the
        // device's data once the map is complete.
        let mirror = use_host_ptr(&m, offset, size)?;
        let (wire_sync, event_id) = if blocking { (sync.clone(), 0) } else { with_own_event(&q, &sync) };
        if q.conn.replays() && crate::handle::map_writes(map_flags) {
            crate::recovery::journal_of(&q.conn).changing(m.id, true);
        }
        // A zero-copy buffer maps in place: the application gets this process's view of the
        // buffer's own memory (bounds checked here), and nothing is copied.
        let (segment, id, view) = match m.data.shared_view() {
            Some(v) => (None, q.conn.alloc_id(), v.at(offset, size).ok_or(CL_INVALID_VALUE)?),
            None => {
                let segment = q.conn.acquire_segment(size)?;
                let (id, view) = (segment.id, segment.region.as_ptr());
                (Some(segment), id, view)
            }
        };
        // Replay reads the mapped range again if the worker dies before a non-blocking map is
        // complete.
        let read_again = (!blocking && q.conn.replays()).then(|| {
            let into = DataRef::Lane { offset: 0, len: 0 };
            let (queue, mem, sync) = (q.id, m.id, wire_sync.clone());
            EnqueueReadBuffer { queue, mem, blocking: false, offset: offset as u64, into, sync }.into_request()
        });
        let req = EnqueueMapBuffer {
            queue: q.id,
            mem: m.id,
            blocking,
            flags: map_flags,
            offset: offset as u64,
            size: size as u64,
            segment: id,
            in_place: segment.is_none(),
            sync: wire_sync,
        };
        let rc = q.conn.call(req);
        if rc != Ok(CL_SUCCESS) {
            if let Some(segment) = segment {
                q.conn.release_segment(segment);
            }
            return Err(rc.unwrap_or_else(|e| e));
        }
        // The worker found the buffer: its creation did not fail (`crate::direct` maps then).
        m.data.mark_made();
        // SAFETY: event per API contract; the mirror covers part of the buffer's host memory.
        unsafe { map_done(&q, &sync, event, event_id, blocking, (id, view), map_flags, mirror) };
        if let Some(read) = read_again {
            journal_map_in_flight(&q, read, event_id, view, Strided::linear(size), map_flags, mirror);
        }
        let ptr = mirror.map_or(view as usize, |m| m.at);
        let range = MapArea::Buffer { offset: offset as u64, size: size as u64 };
        remember_map(&q, &m, ptr, MapRecord::new(id, segment, map_flags, mirror, range));
        Ok(ptr as *mut c_void)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { super::creation(r, errcode_ret) }
}

/// A map the shim makes itself (`crate::direct`), of a map without a wait list or an event:
/// `Some` with the mapping, or the error of the `clFinish` a blocking map on a busy queue waited
/// with; `None` when it takes the worker's path.
fn direct_map(
    q: &Object,
    m: &Object,
    blocking: bool,
    flags: u64,
    offset: usize,
    size: usize,
) -> Option<Result<*mut u8, cl_int>> {
    let map = crate::direct::DirectMap::check(q, m, flags, offset, size)?;
    if q.conn.is_dead() {
        return None;
    }
    let mapped = match map.if_idle(q, m) {
        Some(mapped) => mapped,
        None if blocking => match super::queue::flush_or_finish_queue(q, true) {
            CL_SUCCESS => map.if_idle(q, m)?,
            e => Err(e),
        },
        None => return None,
    };
    let ptr = match mapped {
        Ok(ptr) => ptr,
        e => return Some(e),
    };
    if q.conn.replays() && crate::handle::map_writes(flags) {
        crate::recovery::journal_of(&q.conn).changing(m.id, true);
    }
    let range = MapArea::Buffer { offset: offset as u64, size: size as u64 };
    remember_map(q, m, ptr as usize, MapRecord::in_shim(flags, range));
    Some(Ok(ptr))
}

/// Undoes `direct_map`'s mapping at `ptr` of `m` (its call failed after all), as a quiet unmap of
/// it would.
fn forget_direct_map(q: &Object, m: &Object, ptr: *mut u8) {
    let ObjData::Mem { maps, .. } = &m.data else { return };
    if let (Some(record), true) = (take_map_record(maps, ptr as usize), q.conn.replays()) {
        // SAFETY: the record was this mapping's, live until now.
        unsafe { journal_unmap(q, m, ptr.cast(), &record, false, &EnqueueSync::default()) };
    }
}

/// Takes the latest mapping at `ptr` off a memory object's record of `maps`, if it has one there.
fn take_map_record(
    maps: &std::sync::Mutex<std::collections::HashMap<usize, Vec<MapRecord>>>,
    ptr: usize,
) -> Option<MapRecord> {
    let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
    let list = maps.get_mut(&ptr)?;
    let record = list.pop();
    if list.is_empty() {
        maps.remove(&ptr);
    }
    record
}

/// Keeps a mapping the application now holds at `ptr` with its memory object (and in replay's
/// journal), for the unmap to find.
pub(super) fn remember_map(q: &Object, m: &Object, ptr: usize, record: MapRecord) {
    if q.conn.replays() {
        crate::recovery::journal_of(&q.conn).mapped(m.id, ptr, record.range);
    }
    if let ObjData::Mem { maps, .. } = &m.data {
        maps.lock().unwrap_or_else(|e| e.into_inner()).entry(ptr).or_default().push(record);
    }
}

pub unsafe fn clEnqueueUnmapMemObject(
    queue: cl_command_queue,
    memobj: cl_mem,
    mapped_ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let rc = (|| {
        let (q, m) = queue_and_mem(queue, memobj)?;
        let ObjData::Mem { maps, context, .. } = &m.data else {
            return Err(CL_INVALID_MEM_OBJECT);
        };
        // Refused before the mapping is taken off the record (the application's right unmap
        // afterwards must still find it), as the driver refuses it (a quiet unmap of a mapping the
        // shim made itself would otherwise have succeeded).
        if q.data.queue_state().is_some_and(|state| state.context != *context) {
            return Err(CL_INVALID_CONTEXT);
        }
        let record = take_map_record(maps, mapped_ptr as usize).ok_or(CL_INVALID_VALUE)?;
        // With an event, only on an idle queue: the unmap's event must complete after the
        // queue's earlier commands.
        let idle = || q.data.queue_state().is_some_and(|state| state.while_idle(|| ()).is_some());
        let quiet = n == 0 && list.is_null() && (event.is_null() || (events_stand_in(&q) && idle()));
        if record.in_shim && !record.carried && quiet && !q.conn.is_dead() {
            // The worker never had the mapping, and nothing is to wait for: the bytes are in
            // place, and the queue stays as idle as it was. An event is made complete.
            // SAFETY: event per API contract.
            let rc = unsafe { done_event(&q, CL_COMMAND_UNMAP_MEM_OBJECT, CL_SUCCESS, event) };
            if rc != CL_SUCCESS {
                // The mapping stays the application's.
                maps.lock().unwrap_or_else(|e| e.into_inner()).entry(mapped_ptr as usize).or_default().push(record);
                return Err(rc);
            }
            if q.conn.replays() {
                // SAFETY: the record was this mapping's, live until now.
                unsafe { journal_unmap(&q, &m, mapped_ptr, &record, false, &EnqueueSync::default()) };
            }
            return Ok(CL_SUCCESS);
        }
        // SAFETY: API contract.
        let sync = match unsafe { enqueue_sync(&q, n, list, event) } {
            Ok(sync) => sync,
            Err(e) => {
                // The mapping stays the application's.
                maps.lock().unwrap_or_else(|e| e.into_inner()).entry(mapped_ptr as usize).or_default().push(record);
                return Err(e);
            }
        };
        if record.carried {
            // SAFETY: the record is the application's mapping at `mapped_ptr`, whose memory it
            // holds; event per API contract.
            return unsafe { unmap_carried(&q, &m, mapped_ptr, record, &sync, event) };
        }
        if record.in_shim {
            // SAFETY: the record is the application's mapping at `mapped_ptr`; event per API
            // contract.
            return unsafe { unmap_in_shim(&q, &m, mapped_ptr, record, &sync, event) };
        }
        // A non-blocking map not yet seen complete needs no filling any more.
        let unsettled_map = crate::pending::of(&q.conn).forget_map(&q.conn, record.id);
        let write_back = record.writes_back();
        pack_mirror(&record);
        if q.conn.replays() {
            // SAFETY: the record was this mapping's, live until the unmap below.
            unsafe { journal_unmap(&q, &m, mapped_ptr, &record, false, &sync) };
        }
        let segment = match record.segment {
            Some(segment) if write_back || unsettled_map => {
                // The driver may still copy out of the segment (a write-back by DMA on a
                // discrete device) or into it (a map not yet complete) after the call returns:
                // the segment goes back to the pool once the unmap's event is complete.
                let make = |_, sync| EnqueueUnmapMemObject {
                    queue: q.id,
                    mem: m.id,
                    segment: record.id,
                    write_back,
                    stands_for: 0,
                    sync,
                };
                // SAFETY: event per API contract.
                return unsafe { enqueue_pending(&q, &sync, event, segment, Transfer::Write, false, make) };
            }
            other => other,
        };
        let rc = unmap(&q, &m, record.id, write_back, sync.clone());
        // The worker keeps the segment mapped: it goes back to the pool for the next map.
        if let Some(segment) = segment {
            q.conn.release_segment(segment);
        }
        // SAFETY: event per API contract.
        Ok(unsafe { finish_enqueue(&q, &sync, event, rc) })
    })();
    // An object the application released while mapped goes with its last mapping.
    crate::handle::retire_if_unmapped(memobj);
    rc
}

/// Unmaps a mapping the shim made itself (`direct_map`) where the application gave a wait list
/// or wants an event (or the worker died): the worker, which never had the mapping, maps the
/// range and unmaps it in one go, so the unmap waits for the list and its event is a real
/// unmap's. The bytes are in place already.
///
/// # Safety
/// `record` is the application's mapping at `mapped_ptr`, valid until now; `event` is NULL or
/// valid for a write.
unsafe fn unmap_in_shim(
    q: &Object,
    m: &Object,
    mapped_ptr: *mut c_void,
    record: MapRecord,
    sync: &EnqueueSync,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    if q.conn.replays() {
        // SAFETY: as the caller says.
        unsafe { journal_unmap(q, m, mapped_ptr, &record, false, sync) };
    }
    let MapArea::Buffer { offset, size } = record.range else {
        return Err(CL_INVALID_VALUE); // not reached: only buffers are mapped by the shim
    };
    // A non-blocking map has an event of the shim's (the worker keeps it with the mapping),
    // released once the unmap behind it is sent.
    let (map_sync, map_event) = with_own_event(q, &EnqueueSync::default());
    let id = q.conn.alloc_id();
    let map = EnqueueMapBuffer {
        queue: q.id,
        mem: m.id,
        blocking: false,
        flags: record.flags,
        offset,
        size,
        segment: id,
        in_place: true,
        sync: map_sync,
    };
    let rc = match q.conn.call(map) {
        Ok(CL_SUCCESS) => {
            let rc = unmap(q, m, id, record.writes_back(), sync.clone());
            let _ = q.conn.post(Release { object: map_event });
            rc
        }
        other => other,
    };
    // SAFETY: event per the caller.
    Ok(unsafe { finish_enqueue(q, sync, event, rc) })
}

/// Unmaps a mapping made in a worker that died since (replay mode carried `m` over while the
/// application held it): the replacement has no such mapping, so what a writing map holds is
/// written to the buffer (and journaled), and a reading one needs only its event. The mapping's
/// memory goes with the record.
///
/// # Safety
/// `record` is the application's mapping at `mapped_ptr`, valid until now; `event` is NULL or
/// valid for a write.
unsafe fn unmap_carried(
    q: &Object,
    m: &Object,
    mapped_ptr: *mut c_void,
    record: MapRecord,
    sync: &EnqueueSync,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let write_back = record.writes_back();
    pack_mirror(&record);
    if q.conn.replays() {
        // SAFETY: as the caller says.
        unsafe { journal_unmap(q, m, mapped_ptr, &record, true, sync) };
    }
    let rc = match (write_back, record.range) {
        (true, MapArea::Buffer { offset, size }) => {
            // SAFETY: the mapping covers `size` bytes at `mapped_ptr`, its memory held by the
            // record (a segment, the dead worker's zero-copy memory, or the application's own).
            let data = unsafe { std::slice::from_raw_parts(mapped_ptr as *const u8, size as usize) };
            crate::recovery::write_buffer(&q.conn, q.id, m.id, offset, data, sync.clone())
        }
        (true, MapArea::Image { origin, region }) => match image_rows(m, &record) {
            Some((segment, len)) => {
                // SAFETY: the segment (held by the record) holds the box's rows packed, `len`
                // bytes, within its length (checked by `image_rows`).
                let data = unsafe { std::slice::from_raw_parts(segment.region.as_ptr().cast_const(), len) };
                crate::recovery::write_image(&q.conn, q.id, m.id, origin, region, data, sync.clone())
            }
            None => Err(CL_DEVICE_NOT_AVAILABLE),
        },
        (false, _) => q.conn.call(EnqueueMarkerOrBarrier { queue: q.id, barrier: false, sync: sync.clone() }),
    };
    drop(record);
    // SAFETY: event per the caller.
    Ok(unsafe { finish_enqueue(q, sync, event, rc) })
}

/// Before a writing map's unmap: a `CL_MEM_USE_HOST_PTR` object's rows, which the application
/// wrote in its own memory, packed into the mapping's segment (which the write-back reads).
fn pack_mirror(record: &MapRecord) {
    if let (true, Some(m), Some(segment)) = (record.writes_back(), record.mirror, &record.segment) {
        // SAFETY: the mirror is the application's memory the mapping pointed at; the segment
        // (held by the record) holds the packed rows.
        unsafe { m.pack_into(segment.region.as_ptr()) };
    }
}

/// An image mapping's segment and the length of the box's rows packed in it (as the map
/// packed them: the image's element size times the box), if they fit the segment.
fn image_rows<'r>(m: &Object, record: &'r MapRecord) -> Option<(&'r Segment, usize)> {
    let (ObjData::Mem { image: Some(meta), .. }, MapArea::Image { region, .. }) = (&m.data, record.range) else {
        return None;
    };
    let segment = record.segment.as_ref()?;
    let len = region.iter().try_fold(meta.elem as u64, |n, &r| n.checked_mul(r))?;
    usize::try_from(len).ok().filter(|&len| len <= segment.region.len()).map(|len| (segment, len))
}

/// In replay mode, tells the journal of the unmap of `record`, the application's mapping of
/// `m` at `mapped_ptr` (`carried`: made in a worker that died since). A writing map's bytes are
/// journaled as a write: from the mapping for a buffer, from the segment's packed rows for an
/// image (a `CL_MEM_USE_HOST_PTR` object's rows packed into it already); a staged buffer
/// mapping's are kept in its segment rather than copied.
///
/// # Safety
/// `record` is the application's live mapping at `mapped_ptr`.
unsafe fn journal_unmap(
    q: &Object,
    m: &Object,
    mapped_ptr: *mut c_void,
    record: &MapRecord,
    carried: bool,
    sync: &EnqueueSync,
) {
    // A zero-copy buffer's mapping is its memory (a mirror is the application's own).
    let in_place = !carried && record.segment.is_none() && record.mirror.is_none();
    let (packed, len, staged) = match record.range {
        MapArea::Image { .. } => match image_rows(m, record) {
            Some((segment, len)) => (segment.region.as_ptr() as usize, Some(len), keep_staged(q, segment, 0, len)),
            None => (0, None, None),
        },
        MapArea::Buffer { size, .. } => {
            let at = |s: &Segment| (mapped_ptr as usize).wrapping_sub(s.region.as_ptr() as usize);
            let staged = match (&record.segment, record.mirror, carried) {
                (Some(s), None, false) => keep_staged(q, s, at(s), size as usize),
                _ => None,
            };
            (mapped_ptr as usize, Some(size as usize), staged)
        }
    };
    let write = record.writes_back();
    let unmap = Unmapping { queue: q.id, mem: m.id, ptr: mapped_ptr as usize, write, in_place, packed, len, staged };
    // SAFETY: the mapping is live (the caller); `packed` holds `len` bytes of it.
    unsafe { crate::recovery::journal_of(&q.conn).unmapping(unmap, sync) };
}

/// Has the worker unmap mapping `id` of `m` (copying its view back first if `write_back` and
/// the view is not the driver's own mapping). Posted: the view is a zero-copy buffer's own
/// memory, which is never pooled, and anything a later call does with it comes after the unmap
/// in the worker (the same lane, or `Conn::after_other_lanes`). A segment's unmap goes through
/// `enqueue_pending` instead, which keeps the segment until the unmap is complete.
fn unmap(q: &Object, m: &Object, id: u64, write_back: bool, sync: EnqueueSync) -> Result<cl_int, cl_int> {
    unmap_standing_for(q, m, id, write_back, sync, 0)
}

/// `unmap`, its event answering `CL_EVENT_COMMAND_TYPE` with `stands_for` (0: an unmap's).
fn unmap_standing_for(
    q: &Object,
    m: &Object,
    id: u64,
    write_back: bool,
    sync: EnqueueSync,
    stands_for: u32,
) -> Result<cl_int, cl_int> {
    q.conn.post(EnqueueUnmapMemObject { queue: q.id, mem: m.id, segment: id, write_back, stands_for, sync })
}

/// Non-blocking transfers larger than this run as blocking ones (pipelined), which OpenCL
/// allows (the call may complete the transfer before it returns): each would need a shared
/// segment of its own size, too big to keep in the pool, so every call would create and fault in
/// a fresh one (clpeak's 2 GiB non-blocking writes on an H100: 2 GB/s that way, against about
/// 20 pipelined through two pooled chunks).
const NON_BLOCKING_MAX: usize = 64 << 20;

/// Blocking transfers from this size on are pipelined (`pipelined`), in chunks of
/// `PIPE_CHUNK_MIN..=PIPE_CHUNK_MAX`, about an eighth of the transfer each.
const PIPE_MIN: usize = 4 << 20;
// Every smaller transfer fits the lane's bulk area whole (`through_lane`).
const _: () = assert!(PIPE_MIN <= BULK_CAP);
const PIPE_CHUNK_MIN: usize = 1 << 20;
const PIPE_CHUNK_MAX: usize = 8 << 20;

/// The most a pipelined write whose chunks are posted (`posts_chunks`) stages at once: up to
/// this, every chunk has a segment of its own and the shim copies one after another without
/// waiting for the worker, then waits once. On the H200 a 16 MiB blocking write with an event
/// (pyopencl's) took 1.43-1.72 ms caged with each chunk a call and a wait, 1.27-1.45 so (six
/// runs each; directly 0.98-1.41); staging 64 MiB at once did no better. (Smaller writes with
/// an event stay one copy and one DMA through the lane: cut into 256 KiB chunks posted this
/// way, a MiB took 145-152 us against 123-136.)
const WRITE_STAGING: usize = 16 << 20;

/// Whether a blocking write of `[offset, offset + size)` of `m` on `q` posts its chunks (and
/// waits once, at the end): every refusal but the driver's lack of memory made by the shim
/// (`transfer_vouched`), on an in-order queue this thread alone has used, with no wait list (so
/// `exclusive_transfer` keeps the chunks together).
fn posts_chunks(q: &Object, m: &Object, offset: usize, size: usize, sync: &EnqueueSync) -> bool {
    sync.wait.is_empty()
        && q.data.queue_state().is_some_and(|state| state.in_order() && !state.shared())
        && transfer_vouched(q, m, true, offset, size)
}

/// A large blocking read or write through pooled staging segments that take turns, so the
/// shim's copy of one chunk overlaps the driver's copy of another: each chunk is enqueued
/// without blocking, and a segment is reused only once the worker says its last chunk is done.
/// A read has two; a write whose every refusal the shim makes (`posts_chunks`) posts its chunks
/// and has up to `WRITE_STAGING` of them, waiting for them all at the end in one `clFinish`
/// (which also returns the code of a chunk the driver refused).
/// Every chunk carries the wait list (an out-of-order queue may run them in any order); the
/// application's event is the last chunk's, and the call returns only when all are done.
///
/// On an in-order queue no other thread's command may run between the chunks, where the driver
/// runs one command whole (a fill between the chunks of a read tore it): the chunks go
/// `exclusive_transfer`ly where they can (other threads' next enqueues wait for them); where
/// they cannot, the transfer is one command, through one segment of its size.
///
/// A read's `CL_MEM_USE_HOST_PTR` mirror (`app.1`) is filled from each chunk too.
///
/// # Safety
/// `app.0` holds `size` bytes, readable for a write, writable for a read; `event` is NULL or
/// valid for a write.
#[allow(clippy::too_many_arguments)]
unsafe fn pipelined(
    q: &Object,
    m: &Object,
    write: bool,
    offset: usize,
    size: usize,
    app: (*mut u8, Option<Mirror>),
    sync: &EnqueueSync,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let chunk = (size / 8).clamp(PIPE_CHUNK_MIN, PIPE_CHUNK_MAX);
    // SAFETY: forwarded from the caller.
    let in_chunks = |chunk| unsafe { pipelined_in(q, m, write, offset, size, app, sync, event, chunk) };
    exclusive_transfer(q, sync, || in_chunks(chunk)).unwrap_or_else(|| in_chunks(size))
}

/// `QueueState::exclusive` for a blocking transfer of several commands: `None` where it cannot
/// be kept together without risking a wait for ever (another thread has used the queue, or the
/// transfer has a wait list: its events may be another thread's to complete after its next
/// enqueue). Earlier commands of this thread still running are waited for first with
/// `clFinish` (as the transfer would wait for them), while other threads may still enqueue; an
/// error of that `clFinish` (a late one) is the transfer's. While other threads' enqueues are
/// held back, the transfer's waits do not wait for the notifier to run the application's
/// callbacks (a callback may be one of those held back: each wait would have given it 10 s),
/// and they are awaited once after.
fn exclusive_transfer(
    q: &Object,
    sync: &EnqueueSync,
    transfer: impl FnOnce() -> Result<cl_int, cl_int>,
) -> Option<Result<cl_int, cl_int>> {
    let state = q.data.queue_state()?;
    if !state.in_order() {
        return Some(transfer());
    }
    if !sync.wait.is_empty() || state.shared() {
        return None;
    }
    let late = match state.idle_but_one() {
        true => None,
        false => match super::queue::finish_before_transfer(q) {
            Ok(late) => late,
            Err(e) => return Some(Ok(e)),
        },
    };
    let r = state.exclusive(|| {
        let _held = crate::conn::HoldsNotifierLock::enter();
        transfer()
    });
    let Some(r) = r else {
        // Not kept together after all (another thread came): the caller's other way, which
        // would not return the late error the `clFinish` took.
        return late.map(Ok);
    };
    q.conn.await_completed_callbacks();
    if r == Ok(CL_SUCCESS) {
        state.blocking_call_returned();
    }
    Some(r.map(|rc| super::queue::after_late(rc, late)))
}

/// `pipelined` in chunks of `chunk` bytes.
///
/// # Safety
/// As for `pipelined`.
#[allow(clippy::too_many_arguments)]
unsafe fn pipelined_in(
    q: &Object,
    m: &Object,
    write: bool,
    offset: usize,
    size: usize,
    (app, mirror): (*mut u8, Option<Mirror>),
    sync: &EnqueueSync,
    event: *mut cl_event,
    chunk: usize,
) -> Result<cl_int, cl_int> {
    let _settled = SettleAfter::new(q);
    let n = size.div_ceil(chunk);
    // A write whose chunks are posted stages up to `WRITE_STAGING` at once and waits for them
    // all in one call at the end; each chunk otherwise is a call, and its slot is reused once
    // the worker says it is done.
    let posted = write && posts_chunks(q, m, offset, size, sync);
    let slot_count = if posted { (WRITE_STAGING / chunk).max(2) } else { 2 };
    let slots = (0..n.min(slot_count)).map(|_| q.conn.acquire_segment(chunk)).collect::<Result<Vec<_>, _>>()?;
    // Per slot: the chunk in flight in it (its event, where it goes in `app`, its length).
    let mut in_flight: Vec<Option<(ObjectId, usize, usize)>> = vec![None; slots.len()];
    // On a profiling queue the application's event (the last chunk's) starts with the first
    // chunk: that one's event is kept for its timestamps (`Object::start_with`).
    let profiled = sync.event.is_some() && n > 1 && q.data.queue_state().is_some_and(QueueState::profiling);
    let mut first = None;
    // Waits for a chunk's event, then lets go of it unless it is the application's or the one
    // that starts it (posted: nothing waits for the worker's release).
    let wait_chunk = |ev: ObjectId, first: Option<ObjectId>| {
        let rc = q.conn.call(WaitForEvents { events: vec![ev] });
        if Some(ev) != sync.event && Some(ev) != first {
            let _ = q.conn.post(Release { object: ev });
        }
        rc
    };
    // Waits for a slot's chunk; a read's bytes then go to the application.
    let land = |slot: usize, flight: (ObjectId, usize, usize), first: Option<ObjectId>| -> Result<cl_int, cl_int> {
        let (ev, start, len) = flight;
        let rc = wait_chunk(ev, first);
        if rc == Ok(CL_SUCCESS) && !write {
            let from = slots[slot].region.as_ptr();
            // SAFETY: the slot holds `len` bytes the driver read (it is at least `chunk` long);
            // `start + len <= size` bytes of `app` per the caller.
            unsafe { cloister_ipc::copy::copy(app.add(start), from, len) };
            if let Some(host) = mirror {
                // CL_MEM_USE_HOST_PTR: the application's memory holds device results.
                // SAFETY: the mirror's `size` bytes lie within the buffer's memory (checked by
                // `use_host_ptr`), and `start + len <= size`; it may be `app` itself, never the slot.
                unsafe { std::ptr::copy(from, (host.at as *mut u8).add(start), len) };
            }
        }
        rc
    };
    // A posted chunk the driver refused failed its event and left the worker a late error for
    // the queue: a `clFinish` (the queue is this transfer's alone, `exclusive_transfer`) waits for
    // every chunk and returns that error, the driver's own code, once, as the call would have.
    let finish_posted = |rc: cl_int| -> Result<cl_int, cl_int> {
        let late = q.conn.call(FlushOrFinish { queue: q.id, finish: true })?;
        Ok(if late != CL_SUCCESS { late } else { rc })
    };
    let mut run = || -> Result<cl_int, cl_int> {
        for i in 0..n {
            let slot = i % slots.len();
            if let Some(flight) = in_flight[slot].take() {
                match land(slot, flight, first)? {
                    CL_SUCCESS => {}
                    rc if posted => return finish_posted(rc),
                    rc => return Ok(rc),
                }
            }
            let (start, last) = (i * chunk, i + 1 == n);
            let len = chunk.min(size - start);
            let seg = &slots[slot];
            if write {
                // SAFETY: as in `land`, the other way; the driver is done with the slot.
                unsafe { cloister_ipc::copy::copy(seg.region.as_ptr(), app.add(start).cast_const(), len) };
            }
            let ev = match (last, sync.event) {
                (true, Some(app_event)) => app_event,
                _ => q.conn.alloc_id(),
            };
            if profiled && i == 0 {
                first = Some(ev);
            }
            let chunk_sync = EnqueueSync { wait: sync.wait.clone(), event: Some(ev) };
            let data = DataRef::Segment { id: seg.id, offset: 0, len: len as u64 };
            let at = (offset + start) as u64;
            let rc = match write {
                true => {
                    let req = EnqueueWriteBuffer {
                        queue: q.id,
                        mem: m.id,
                        blocking: false,
                        offset: at,
                        data,
                        sync: chunk_sync,
                    };
                    // Posted: a refusal the shim did not foresee fails the chunk's event, which
                    // the wait below returns.
                    if posted {
                        q.conn.post(req)?
                    } else {
                        q.conn.call(req)?
                    }
                }
                false => q.conn.call(EnqueueReadBuffer {
                    queue: q.id,
                    mem: m.id,
                    blocking: false,
                    offset: at,
                    into: data,
                    sync: chunk_sync,
                })?,
            };
            if rc != CL_SUCCESS {
                return Ok(rc);
            }
            in_flight[slot] = Some((ev, start, len));
        }
        if posted {
            // Nothing to copy back: one wait for every chunk still in flight.
            let rc = finish_posted(CL_SUCCESS)?;
            for (ev, _, _) in in_flight.iter_mut().filter_map(Option::take) {
                if Some(ev) != sync.event && Some(ev) != first {
                    let _ = q.conn.post(Release { object: ev });
                }
            }
            return Ok(rc);
        }
        for j in n..n + slots.len() {
            let slot = j % slots.len();
            if let Some(flight) = in_flight[slot].take() {
                match land(slot, flight, first)? {
                    CL_SUCCESS => {}
                    rc => return Ok(rc),
                }
            }
        }
        Ok(CL_SUCCESS)
    };
    let rc = run();
    // After a failure, chunks still in flight must be done before their segments are reused.
    let clean = in_flight.iter().flatten().all(|&(ev, _, _)| wait_chunk(ev, first).is_ok());
    if clean {
        for seg in slots {
            q.conn.release_segment(seg);
        }
    }
    // SAFETY: event per the caller.
    let rc = unsafe { finish_enqueue(q, sync, event, rc) };
    // SAFETY: as finish_enqueue left it.
    unsafe { start_event_with(q, event, rc, first) };
    Ok(rc)
}

/// Smallest blocking transfer that goes through a zero-copy buffer's own memory: below it, one
/// round trip through the lane (and a second copy) beats a map and an unmap (two round trips):
/// a round trip costs about what copying a few hundred KiB does.
const IN_PLACE_MIN: usize = 256 << 10;

/// A read or write the shim makes itself (`crate::direct`): `Some(code)` when it did. On an
/// idle queue that is a copy; a blocking transfer on a busy queue first waits for the queue's
/// earlier commands with `clFinish`, as the driver would have waited for them.
///
/// # Safety
/// `app` holds `size` bytes, readable for a write, writable for a read.
#[allow(clippy::too_many_arguments)]
unsafe fn direct(
    q: &Object,
    m: &Object,
    write: bool,
    blocking: bool,
    offset: usize,
    size: usize,
    app: *mut u8,
    (n, list): (cl_uint, *const cl_event),
    event: *mut cl_event,
) -> Option<cl_int> {
    // A list given with no events is refused on the worker's path (`enqueue_sync`).
    if n != 0 || !list.is_null() || (!event.is_null() && !events_stand_in(q)) {
        return None;
    }
    let command_type = if write { CL_COMMAND_WRITE_BUFFER } else { CL_COMMAND_READ_BUFFER };
    let transfer = crate::direct::Direct::check(q, m, write, offset, size, app)?;
    // SAFETY: forwarded from the caller.
    if let Some(rc) = unsafe { transfer.copy_if_idle(q, m) } {
        // SAFETY: forwarded from the caller.
        return Some(unsafe { done_event(q, command_type, rc, event) });
    }
    if !blocking {
        return None;
    }
    match super::queue::finish_before_transfer(q) {
        // SAFETY: forwarded from the caller.
        Ok(late) => match unsafe { transfer.copy_if_idle(q, m) } {
            // SAFETY: forwarded from the caller.
            Some(rc) => Some(unsafe { done_event(q, command_type, super::queue::after_late(rc, late), event) }),
            // Another thread came meanwhile: the worker's way, unless that would lose the late
            // error the `clFinish` took.
            None => late,
        },
        Err(e) => Some(e),
    }
}

/// After a transfer or map the shim made itself with status `rc`: the event the application
/// asked for (`event` not NULL), if it succeeded. The worker makes it, complete, standing in for
/// a command of `command_type` on `q` (`EnqueueDone`, posted: no round trip, and no command
/// reaches the queue, which stays idle for the next direct transfer). Only where
/// `events_stand_in` says so. pyopencl asks an event of every transfer and map: before, each
/// such blocking transfer over 256 KiB went the worker's way (a map and an unmap, two round
/// trips) and one under it through the lane; 1 MiB took 65 us caged against 35 directly on 2
/// pocl cores (`tools/measure/evx.c`).
///
/// # Safety
/// `event` is NULL or valid for a write.
unsafe fn done_event(q: &Object, command_type: cl_uint, rc: cl_int, event: *mut cl_event) -> cl_int {
    if rc != CL_SUCCESS || event.is_null() {
        return rc;
    }
    let sync = EnqueueSync { wait: Vec::new(), event: Some(q.conn.alloc_id()) };
    // It waits for nothing (an earlier enqueue of this thread may have said otherwise).
    crate::conn::waits_across_contexts(false);
    let posted = q.conn.post(EnqueueDone { queue: q.id, command_type, sync: sync.clone() });
    cloister_ipc::log::in_shim(|| tracing::trace!(target: "cloister::direct", command_type, "direct command's event"));
    match (posted, sync.event) {
        (Ok(CL_SUCCESS), Some(id)) => {
            let data = ObjData::Event { context: q.data.context().unwrap_or(0), done: true };
            // SAFETY: non-NULL (checked above) and writable per the caller.
            unsafe { *event = crate::handle::new_handle_holding(Kind::Event, id, &q.conn, data, q) };
            CL_SUCCESS
        }
        (Ok(rc), _) | (Err(rc), _) => rc,
    }
}

/// Whether a command the shim makes itself on `q` may have the event the application asks for
/// made as `done_event` makes it: a user event, which has no timestamps, so not on a profiling
/// queue.
fn events_stand_in(q: &Object) -> bool {
    q.data.queue_state().is_some_and(|state| !state.profiling())
}

/// A blocking read or write of a zero-copy buffer, with one copy as directly: the worker maps
/// the range (so the driver's ordering and coherence hold), the shim copies between the
/// application's memory and its view of the buffer, and the worker unmaps. `None` when the
/// transfer takes the lane instead (small). The application's event is the unmap's, which
/// answers the transfer's command type, is complete when the call returns (one more round trip
/// waits for it), and on a profiling queue starts with the map (`Object::start_with`). Before,
/// a transfer with an event (pyopencl asks for one every time) went the worker's pipelined way:
/// 16 MiB read in 5-7 ms on 2 pocl cores, against 1.0 without an event and directly.
///
/// # Safety
/// `app` holds `size` bytes, readable for a write, writable for a read.
#[allow(clippy::too_many_arguments)]
unsafe fn in_place(
    q: &Object,
    m: &Object,
    write: bool,
    offset: usize,
    size: usize,
    app: *mut u8,
    sync: &EnqueueSync,
    event: *mut cl_event,
) -> Option<Result<cl_int, cl_int>> {
    let view = m.data.shared_view()?;
    if size < IN_PLACE_MIN {
        return None;
    }
    let profiled = sync.event.is_some() && q.data.queue_state().is_some_and(QueueState::profiling);
    let first = profiled.then(|| q.conn.alloc_id());
    // Three commands where the driver would run one: no other thread's may come between them.
    let r = exclusive_transfer(q, sync, || {
        let at = view.at(offset, size).ok_or(CL_INVALID_VALUE)?;
        let _settled = SettleAfter::new(q);
        let id = q.conn.alloc_id();
        let req = EnqueueMapBuffer {
            queue: q.id,
            mem: m.id,
            blocking: true,
            flags: if write { CL_MAP_WRITE_INVALIDATE_REGION } else { CL_MAP_READ },
            offset: offset as u64,
            size: size as u64,
            segment: id,
            in_place: true,
            sync: EnqueueSync { wait: sync.wait.clone(), event: first },
        };
        let rc = q.conn.call(req)?;
        if rc != CL_SUCCESS {
            return Ok(rc);
        }
        // SAFETY: `at` is `size` bytes of the buffer's memory (checked by `at`), mapped by the
        // driver for this transfer; `app` holds `size` bytes per the caller. The worker may write
        // the view meanwhile: that only changes the data read, never where it goes.
        unsafe {
            match write {
                true => cloister_ipc::copy::copy(at, app.cast_const(), size),
                false => cloister_ipc::copy::copy(app, at.cast_const(), size),
            }
        }
        let stands_for = if write { CL_COMMAND_WRITE_BUFFER } else { CL_COMMAND_READ_BUFFER };
        let unmap_sync = EnqueueSync { wait: Vec::new(), event: sync.event };
        match (unmap_standing_for(q, m, id, write, unmap_sync, stands_for)?, sync.event) {
            // A blocking transfer's event is complete when the call returns.
            (CL_SUCCESS, Some(ev)) => q.conn.call(WaitForEvents { events: vec![ev] }),
            (rc, _) => Ok(rc),
        }
    })?;
    if event.is_null() {
        return Some(r);
    }
    // SAFETY: event per the caller.
    let rc = unsafe { finish_enqueue(q, sync, event, r) };
    // SAFETY: as finish_enqueue left it.
    unsafe { start_event_with(q, event, rc, first) };
    Some(Ok(rc))
}

pub unsafe fn clEnqueueNDRangeKernel(
    queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    global_work_offset: *const usize,
    global_work_size: *const usize,
    local_work_size: *const usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    // The queue and the kernel are lent (`with_object`): no reference count is touched, four
    // locked instructions fewer on an application's hottest call.
    crate::handle::with_object(queue, Kind::Queue, |q| {
        crate::handle::with_object(kernel, Kind::Kernel, |k| -> Result<cl_int, cl_int> {
            if !Arc::ptr_eq(&q.conn, &k.conn) {
                return Err(crate::conn::mismatch(&q.conn, &k.conn, CL_INVALID_CONTEXT));
            }
            if !(1..=3).contains(&work_dim) {
                return Err(CL_INVALID_WORK_DIMENSION);
            }
            // SAFETY (dims): non-NULL size arrays hold work_dim entries per the API contract.
            let dims = |p: *const usize| unsafe { work_size(p, work_dim) };
            // SAFETY: API contract.
            let sync = unsafe { enqueue_sync(q, n, list, event)? };
            let (global, local) = (dims(global_work_size), dims(local_work_size));
            // What the shim can vouch for is posted: a kernel of the queue's context (else the
            // driver's refusal is this call's: pocl's CL_INVALID_CONTEXT, NVIDIA's
            // CL_INVALID_KERNEL_ARGS), every argument set (with a shape the driver accepted),
            // sizes given and non-zero, in a launch shape the driver has accepted for this
            // kernel on this device (`launch_shapes`: the first NDRange of each shape is a call,
            // so a work-group size the driver refuses is refused at the call, as directly).
            let nonzero = |v: &Option<Dims>| v.as_ref().is_some_and(|v| v.iter().all(|&x| x > 0));
            let launch = match &global {
                Some(g)
                    if k.data.context() == q.data.context()
                        && all_args_set(&k.data)
                        && nonzero(&global)
                        && (local.is_none() || nonzero(&local)) =>
                {
                    launch_shape(q, k, work_dim, g, local.as_ref())
                }
                _ => None,
            };
            let vouched = launch.as_ref().is_some_and(|(shapes, launch)| shapes.accepted(launch));
            // What the kernel may write is noted before it can run; replay runs it again with every
            // argument (those of earlier enqueues too), gathered once it is posted (the worker runs it
            // meanwhile).
            let replays = q.conn.replays();
            if replays {
                crate::recovery::journal_of(&q.conn).enqueuing_kernel(|f| each_object_arg(&k.data, f));
            }
            let req = Request::EnqueueNdRange(EnqueueNdRange {
                queue: q.id,
                kernel: k.id,
                args: take_dirty_args(&k.data),
                work_dim,
                offset: dims(global_work_offset),
                global,
                local,
                sync: sync.clone(),
            });
            let rc = if vouched { q.conn.post_request(&req) } else { q.conn.call_status(&req) };
            // The request sent is kept, not copied: its arguments go back to the kernel as unsent
            // after a failure, or it goes to the journal with every argument.
            let Request::EnqueueNdRange(mut sent) = req else { unreachable!("built as an NDRange above") };
            if rc != Ok(CL_SUCCESS) {
                restore_dirty_args(&k.data, &sent.args);
            } else {
                if let (false, Some((shapes, launch))) = (vouched, launch) {
                    // It ran as a call: the driver accepted its shape.
                    shapes.accept(launch);
                }
                if replays {
                    sent.args = all_args(&k.data);
                    crate::recovery::journal_of(&q.conn).enqueued(Request::EnqueueNdRange(sent));
                }
            }
            // SAFETY: event per API contract.
            Ok(unsafe { finish_enqueue(q, &sync, event, rc) })
        })
    })??
}

/// The launch shape of an NDRange of kernel `k` on queue `q` (`launch_shapes`), with the
/// kernel's shapes. With no local size, the worker is asked once per device for the kernel's
/// required work-group size; a driver that does not answer is taken to require none (its
/// NDRanges without a local size are then one shape). `None` (the NDRange then goes as a
/// call): not a kernel on a queue.
fn launch_shape<'k>(
    q: &Object,
    k: &'k Object,
    work_dim: u32,
    global: &Dims,
    local: Option<&Dims>,
) -> Option<(&'k LaunchShapes, Launch)> {
    let ObjData::Kernel { launches, .. } = &k.data else { return None };
    let device = q.data.queue_state()?.device();
    let shape = || launches.shape(device, work_dim, global, local);
    if let Some(launch) = shape() {
        return Some((launches, launch));
    }
    let param = CL_KERNEL_COMPILE_WORK_GROUP_SIZE;
    let reply = k.conn.call(GetInfo { target: InfoTarget::KernelWorkGroup, object: k.id, aux: device, param });
    // Three size_t: anything else is no answer. Any values will do: they only decide which
    // shape an NDRange is, and the driver still says whether it takes it.
    let sizes = reply
        .ok()
        .filter(|r| r.status == CL_SUCCESS && r.value_status == CL_SUCCESS)
        .and_then(|r| <[u8; 24]>::try_from(r.value.as_slice()).ok());
    let required = sizes.map_or([0; 3], |b| {
        let size = |i: usize| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 of 24 bytes"));
        [size(0), size(1), size(2)]
    });
    launches.note_required(device, required);
    Some((launches, shape()?))
}

/// A work size as `clEnqueueNDRangeKernel` takes it (offset, global or local): `None` for NULL.
///
/// # Safety
/// `p` is NULL or holds `work_dim` values, and `work_dim` is 1 to 3 (checked before).
pub(super) unsafe fn work_size(p: *const usize, work_dim: u32) -> Option<Dims> {
    if p.is_null() {
        return None;
    }
    // SAFETY: p holds work_dim values per the API contract.
    let values = unsafe { std::slice::from_raw_parts(p, work_dim as usize) };
    Dims::new(values.iter().map(|&v| v as u64))
}

pub unsafe fn clEnqueueTask(
    queue: cl_command_queue,
    kernel: cl_kernel,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let one = [1usize];
    // SAFETY: a task is a one-work-item NDRange.
    unsafe { clEnqueueNDRangeKernel(queue, kernel, 1, std::ptr::null(), one.as_ptr(), one.as_ptr(), n, list, event) }
}

fn marker_or_barrier(
    queue: cl_command_queue,
    barrier: bool,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    let r = (|| {
        let q = lookup(queue, Kind::Queue)?;
        // SAFETY: the wait list and event per API contract.
        unsafe { enqueue_posted(&q, n, list, event, |sync| EnqueueMarkerOrBarrier { queue: q.id, barrier, sync }) }
    })();
    r.unwrap_or_else(|e| e)
}

pub unsafe fn clEnqueueMarkerWithWaitList(
    queue: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    marker_or_barrier(queue, false, n, list, event)
}

pub unsafe fn clEnqueueBarrierWithWaitList(
    queue: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    marker_or_barrier(queue, true, n, list, event)
}

/// OpenCL 1.1's marker: a marker with an empty wait list.
pub unsafe fn clEnqueueMarker(queue: cl_command_queue, event: *mut cl_event) -> cl_int {
    if event.is_null() {
        return CL_INVALID_VALUE;
    }
    marker_or_barrier(queue, false, 0, std::ptr::null(), event)
}

/// OpenCL 1.1's barrier: a barrier with an empty wait list and no event.
pub unsafe fn clEnqueueBarrier(queue: cl_command_queue) -> cl_int {
    marker_or_barrier(queue, true, 0, std::ptr::null(), std::ptr::null_mut())
}

/// OpenCL 1.1's wait: later commands wait for these events, as a barrier with them would.
pub unsafe fn clEnqueueWaitForEvents(
    queue: cl_command_queue,
    num_events: cl_uint,
    event_list: *const cl_event,
) -> cl_int {
    if num_events == 0 || event_list.is_null() {
        return CL_INVALID_VALUE;
    }
    marker_or_barrier(queue, true, num_events, event_list, std::ptr::null_mut())
}
