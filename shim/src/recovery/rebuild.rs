//! Rebuilding a dead worker's objects in its replacement, and carrying the application's
//! handles over to it (see the parent module).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use cloister_ipc::cl::*;
use cloister_ipc::image::Strided;
use cloister_ipc::*;

use super::gated::Gates;
use super::journal::{depends_on, Base, Bytes, Cmd, Recipe, State, Step};
use super::{concluded, on, RETRIES};
use crate::conn::{Callback, Conn, ContextNotifyFn, EventNotifyFn, SharedView};
use crate::handle::Kind;
use crate::mirror::Mirror;

/// Reads the `size` bytes of buffer `mem`, or of image `mem` of `image` pixels, rows and slices
/// (packed), through a segment (blocking). From `KEEP_READ_MIN` bytes they stay where the worker
/// put them (the segment, which the pool does not hand out again while they are held, as a
/// staged write's bytes): a read-back of a large buffer then allocates and copies nothing, and
/// at the next one the segment the last one kept is free again (on 2 pocl cores a 64 MiB
/// read-back took 27 ms with the copy into fresh memory, most of it faulting that memory in).
fn read_memory(conn: &Conn, queue: ObjectId, mem: ObjectId, size: usize, image: Option<[u64; 3]>) -> Option<Bytes> {
    let seg = conn.acquire_segment(size).ok()?;
    let into = DataRef::Segment { id: seg.id, offset: 0, len: size as u64 };
    let sync = EnqueueSync::default();
    let rc = match image {
        None => conn.call(EnqueueReadBuffer { queue, mem, blocking: true, offset: 0, into, sync }),
        Some(region) => conn.call(EnqueueRegionTransfer {
            queue,
            mem,
            write: false,
            blocking: true,
            target: RegionTarget::Image { origin: [0; 3] },
            region,
            data: into,
            sync,
        }),
    };
    let out = match rc {
        Ok(CL_SUCCESS) if size >= KEEP_READ_MIN => seg.kept(0, size).map(Bytes::Staged),
        // SAFETY: the segment holds at least `size` bytes (acquire_segment).
        Ok(CL_SUCCESS) => Some(Bytes::Copy(unsafe { std::slice::from_raw_parts(seg.region.as_ptr(), size) }.to_vec())),
        _ => None,
    };
    conn.release_segment(seg);
    out
}

/// Below this a read-back's bytes are copied out of their segment (cheap), which goes back to
/// the pool at once, rather than keeping a segment of at least 64 KiB out of it.
const KEEP_READ_MIN: usize = 64 << 10;

/// The most bytes one `ReadBack` call reads.
const READ_BACK_BATCH: usize = 4 << 20;

/// What a checkpoint reads back: a buffer or image, its size in bytes, and an image's box.
pub(super) struct ReadBackItem {
    pub mem: ObjectId,
    pub size: usize,
    pub image: Option<[u64; 3]>,
}

/// Reads `items` back: buffers below `KEEP_READ_MIN` bytes together, `READ_BACK_BATCH` bytes a
/// call (`ReadBack`: a checkpoint of thousands of small buffers paid a round trip each), the
/// rest one by one (`read_memory`). `None` if any read failed.
pub(super) fn read_back_items(conn: &Conn, queue: ObjectId, items: &[ReadBackItem]) -> Option<Vec<(ObjectId, Bytes)>> {
    let mut out = Vec::with_capacity(items.len());
    let (small, large): (Vec<&ReadBackItem>, Vec<&ReadBackItem>) =
        items.iter().partition(|i| i.image.is_none() && i.size < KEEP_READ_MIN);
    for i in large {
        out.push((i.mem, read_memory(conn, queue, i.mem, i.size, i.image)?));
    }
    let mut batch: Vec<(ObjectId, u64)> = Vec::new();
    let mut batch_bytes = 0;
    for (n, i) in small.iter().enumerate() {
        batch.push((i.mem, i.size as u64));
        batch_bytes += i.size;
        if batch_bytes >= READ_BACK_BATCH || n + 1 == small.len() {
            out.extend(read_buffers(conn, queue, &batch)?);
            batch.clear();
            batch_bytes = 0;
        }
    }
    Some(out)
}

/// One `ReadBack` call: the bytes of each buffer of `reads` (id and size), copied out of the
/// segment at the offsets this side works out (`read_back_offsets`), as many as it asked for.
fn read_buffers(conn: &Conn, queue: ObjectId, reads: &[(ObjectId, u64)]) -> Option<Vec<(ObjectId, Bytes)>> {
    let (offsets, total) = read_back_offsets(reads.iter().map(|&(_, size)| size))?;
    let seg = conn.acquire_segment(usize::try_from(total).ok()?).ok()?;
    let rc = conn.call(ReadBack { queue, reads: reads.to_vec(), segment: seg.id });
    let out = (rc == Ok(CL_SUCCESS)).then(|| {
        reads
            .iter()
            .zip(offsets)
            .map(|(&(mem, size), at)| {
                // SAFETY: `at + size <= total`, and the segment holds at least `total` bytes
                // (acquire_segment); the worker finished the reads before it replied.
                let bytes = unsafe { std::slice::from_raw_parts(seg.region.as_ptr().add(at as usize), size as usize) };
                (mem, Bytes::Copy(bytes.to_vec()))
            })
            .collect()
    });
    conn.release_segment(seg);
    out
}

/// Runs a non-blocking read again, blocking, in `conn`, and puts its data where the
/// application asked (it keeps that memory valid until the read's event completes, which it has
/// not: the worker died first).
pub(super) fn read_again(
    conn: &Conn,
    req: &Request,
    dst: usize,
    shape: Strided,
    mirror: Option<Mirror>,
) -> Result<i32, i32> {
    let len = shape.packed_len();
    let seg = conn.acquire_segment(len)?;
    let into = DataRef::Segment { id: seg.id, offset: 0, len: len as u64 };
    // Typed calls: a blocking one gives the completed events' callbacks their turn.
    let rc = match read_into(req, into, true) {
        Some(Request::EnqueueReadBuffer(r)) => conn.call(r),
        Some(Request::EnqueueRegionTransfer(r)) => conn.call(r),
        _ => Ok(CL_INVALID_OPERATION),
    };
    if rc == Ok(CL_SUCCESS) {
        // SAFETY: `dst` is the application's memory covering `shape` (checked when the read was
        // enqueued), valid until the read's event completes; the segment holds the packed rows;
        // the mirror lies within the object's host memory.
        unsafe {
            shape.unpack(seg.region.as_ptr(), dst as *mut u8);
            if let Some(m) = mirror {
                m.fill_from(seg.region.as_ptr());
            }
        }
    }
    conn.release_segment(seg);
    rc
}

/// A journaled non-blocking read (`Cmd::Read`'s request) made again into `into`, `blocking` or
/// not; `None` for a request that is not a read.
pub(super) fn read_into(req: &Request, into: DataRef, blocking: bool) -> Option<Request> {
    match req {
        Request::EnqueueReadBuffer(r) => Some(EnqueueReadBuffer { blocking, into, ..r.clone() }.into_request()),
        Request::EnqueueRegionTransfer(r) => {
            Some(EnqueueRegionTransfer { blocking, data: into, ..r.clone() }.into_request())
        }
        _ => None,
    }
}

/// Writes `data` into buffer `mem` at `offset`, blocking (a mapping carried over from a dead
/// worker, unmapped: see `api::enqueue`).
pub fn write_buffer(
    conn: &Conn,
    queue: ObjectId,
    mem: ObjectId,
    offset: u64,
    data: &[u8],
    sync: EnqueueSync,
) -> Result<i32, i32> {
    with_segment(conn, data, |data| EnqueueWriteBuffer { queue, mem, blocking: true, offset, data, sync })
}

/// Writes `data`, the rows of image `mem`'s box `region` at `origin` packed, blocking (an image
/// mapping carried over from a dead worker, unmapped: see `api::enqueue`).
pub fn write_image(
    conn: &Conn,
    queue: ObjectId,
    mem: ObjectId,
    origin: [u64; 3],
    region: [u64; 3],
    data: &[u8],
    sync: EnqueueSync,
) -> Result<i32, i32> {
    let target = RegionTarget::Image { origin };
    with_segment(conn, data, |data| EnqueueRegionTransfer {
        queue,
        mem,
        write: true,
        blocking: true,
        target,
        region,
        data,
        sync,
    })
}

/// Runs `make(data)` with `bytes` in a fresh segment the worker knows.
pub(super) fn with_segment<C: Call<Reply = i32>>(
    conn: &Conn,
    bytes: &[u8],
    make: impl FnOnce(DataRef) -> C,
) -> Result<i32, i32> {
    // SAFETY: a slice is valid for its length.
    unsafe { with_copy_of(conn, bytes.as_ptr(), bytes.len(), make) }
}

/// `with_segment` for what the journal kept.
pub(super) fn with_kept<C: Call<Reply = i32>>(
    conn: &Conn,
    bytes: &Bytes,
    make: impl FnOnce(DataRef) -> C,
) -> Result<i32, i32> {
    // SAFETY: the journal's bytes are valid for their length while it holds them.
    unsafe { with_copy_of(conn, bytes.as_ptr(), bytes.len(), make) }
}

/// Runs `make(data)` with a copy of the `len` bytes at `src` in a fresh segment the worker
/// knows.
///
/// # Safety
/// `src` is valid for `len` bytes of reads during the call.
unsafe fn with_copy_of<C: Call<Reply = i32>>(
    conn: &Conn,
    src: *const u8,
    len: usize,
    make: impl FnOnce(DataRef) -> C,
) -> Result<i32, i32> {
    let seg = conn.acquire_segment(len)?;
    // SAFETY: the segment holds at least `len` bytes; `src` per the caller, another mapping.
    unsafe { cloister_ipc::copy::copy(seg.region.as_ptr(), src, len) };
    let rc = conn.call(make(DataRef::Segment { id: seg.id, offset: 0, len: len as u64 }));
    conn.release_segment(seg);
    rc
}

/// What a rebuild achieved.
pub struct Rebuilt {
    /// Ids that exist in the replacement (objects and events).
    pub created: HashSet<ObjectId>,
    /// New memory of zero-copy buffers.
    pub views: HashMap<ObjectId, SharedView>,
    /// Contexts whose `pfn_notify` the replacement must call (id, function, user data, token).
    pub notify: Vec<(ObjectId, ContextNotifyFn, usize, u64)>,
    /// What was given up, for `pfn_notify`.
    pub dropped: Vec<String>,
    pub replayed: usize,
    pub lost: usize,
}

pub enum Outcome {
    Done(Rebuilt),
    /// The replacement died running this step.
    Crashed(Step),
}

/// Rebuilds `st` in `new`, the replacement of `old` (the worker the record was made in).
pub fn rebuild(st: &mut State, old: &Arc<Conn>, new: &Arc<Conn>) -> Outcome {
    let translate = |id: ObjectId| -> ObjectId {
        if id & WORKER_ID_BIT == 0 {
            return id;
        }
        let h = old.handle_of(id) as usize as *const std::ffi::c_void;
        crate::handle::lookup(h, Kind::Device)
            .or_else(|_| crate::handle::lookup(h, Kind::Platform))
            .map(|o| o.id)
            .unwrap_or(id)
    };
    let translate_props = |p: &Option<Vec<i64>>| {
        p.as_ref().map(|p| {
            let mut p = p.clone();
            let mut i = 0;
            while i + 1 < p.len() {
                if p[i] == CL_CONTEXT_PLATFORM as i64 {
                    p[i + 1] = translate(p[i + 1] as u64) as i64;
                }
                i += 2;
            }
            p
        })
    };
    let crashed = |step| Outcome::Crashed(step);
    let mut out = Rebuilt {
        created: HashSet::new(),
        views: HashMap::new(),
        notify: Vec::new(),
        dropped: Vec::new(),
        replayed: 0,
        lost: 0,
    };
    let mut lost: HashSet<ObjectId> = HashSet::new();
    let mut first_context = None;
    // Programs made and waiting for their compilation: it runs once its header programs
    // (which may have been made after the program) exist.
    let mut to_compile: Vec<ObjectId> = Vec::new();
    let mut batches: Vec<ObjectId> = Vec::new();
    let ids: Vec<ObjectId> = st.recipes.keys().copied().collect();
    for id in ids {
        if let Err(step) = compile_ready(st, new, &out.created, &mut to_compile, &translate) {
            return crashed(step);
        }
        let r = &st.recipes[&id];
        let step = Step::Recipe(id);
        if st.attempts.get(&step).copied().unwrap_or(0) >= RETRIES {
            out.dropped.push(format!("object #{id} crashed the driver each time it was made again"));
            lost.insert(id);
            continue;
        }
        // A command buffer may record objects made after it: made once everything else is.
        if matches!(r.req, Request::CreateCommandBuffer(_)) {
            batches.push(id);
            continue;
        }
        // A mapped object is carried over, its mappings kept until their unmaps
        // (`MapRecord::carried`).
        if matches!(r.base, Base::Lost) || depends_on(&r.req).iter().any(|d| !out.created.contains(d)) {
            lost.insert(id);
            continue;
        }
        let rc = match &r.req {
            Request::CreateContext(c) => new.call(CreateContext {
                properties: translate_props(&c.properties),
                devices: c.devices.iter().map(|&d| translate(d)).collect(),
                ..c.clone()
            }),
            Request::CreateContextFromType(c) => {
                new.call(CreateContextFromType { properties: translate_props(&c.properties), ..c.clone() })
            }
            Request::CreateCommandQueue(q) => new.call(CreateCommandQueue { device: translate(q.device), ..q.clone() }),
            Request::CreateCommandQueueWithProperties(q) => {
                new.call(CreateCommandQueueWithProperties { device: translate(q.device), ..q.clone() })
            }
            Request::CreateBuffer(b) => rebuild_buffer(new, b, r, &mut out.views),
            Request::CreateProgramWithSource(p) => {
                new.call(p.clone()).and_then(|rc| build_again(new, r, rc, &translate))
            }
            Request::CreateProgramWithBinary(p) => {
                let req =
                    CreateProgramWithBinary { devices: p.devices.iter().map(|&d| translate(d)).collect(), ..p.clone() };
                new.call(req).and_then(|reply| build_again(new, r, reply.status, &translate))
            }
            Request::CreateKernel(k) => new.call(k.clone()).map(|reply| reply.status),
            Request::CreateSampler(s) => new.call(s.clone()),
            Request::CreateImage(i) => {
                let flags = i.flags & !(CL_MEM_COPY_HOST_PTR | CL_MEM_USE_HOST_PTR);
                match &r.base {
                    Base::Known(d) => with_kept(new, d, |data| CreateImage {
                        flags: flags | CL_MEM_COPY_HOST_PTR,
                        host_data: Some(data),
                        ..i.clone()
                    }),
                    _ => new.call(CreateImage { flags, host_data: None, ..i.clone() }),
                }
            }
            Request::CreateSubBuffer(b) => {
                let rc = new.call(b.clone());
                // A zero-copy parent's sub-buffer is a window of the parent's new memory.
                if let (Ok(CL_SUCCESS), Some(view)) = (&rc, out.views.get(&b.buffer)) {
                    if let Some(w) = view.window(b.origin as usize, b.size as usize) {
                        out.views.insert(id, w);
                    }
                }
                rc
            }
            Request::CreateUserEvent(e) => new.call(e.clone()).and_then(|rc| match (r.status, rc) {
                (Some(status), CL_SUCCESS) => new.call(SetUserEventStatus { event: id, status }),
                _ => Ok(rc),
            }),
            // The same partition of the same device gives the same sub-devices, under the same
            // ids; all of them exist from now.
            Request::CreateSubDevices(s) => {
                new.call(CreateSubDevices { device: translate(s.device), ..s.clone() }).map(|reply| {
                    if reply.status == CL_SUCCESS {
                        out.created.extend(s.ids.iter().take(reply.count as usize));
                    }
                    reply.status
                })
            }
            // A program that failed to link exists as well (its log says why).
            Request::LinkProgram(l) => {
                let devices = l.devices.as_ref().map(|d| d.iter().map(|&d| translate(d)).collect());
                new.call(LinkProgram { devices, notify: None, ..l.clone() }).map(|reply| match reply.created {
                    true => CL_SUCCESS,
                    false => CL_INVALID_OPERATION,
                })
            }
            _ => Ok(CL_INVALID_OPERATION),
        };
        match rc {
            Ok(CL_SUCCESS) => {
                out.created.insert(id);
                if r.compile.is_some() {
                    to_compile.push(id);
                }
                if matches!(r.req, Request::CreateContext(_) | Request::CreateContextFromType(_)) {
                    first_context.get_or_insert(id);
                    if let Some((pfn, user_data, token)) = r.notify.filter(|_| !r.released) {
                        out.notify.push((id, pfn, user_data, token));
                    }
                }
            }
            Err(_) if new.is_dead() => return crashed(step),
            _ => {
                lost.insert(id);
            }
        }
    }
    if let Err(step) = compile_ready(st, new, &out.created, &mut to_compile, &translate) {
        return crashed(step);
    }
    // Programs whose headers were not made stay uncompiled: the links that use them fail, and
    // what those links make is lost.
    for id in batches {
        let r = &st.recipes[&id];
        let needs = r.needs();
        if needs.iter().any(|d| !out.created.contains(d) || lost.contains(d)) {
            lost.insert(id);
            continue;
        }
        match rebuild_command_buffer(new, r) {
            Ok(CL_SUCCESS) => {
                out.created.insert(id);
            }
            Err(_) if new.is_dead() => return crashed(Step::Recipe(id)),
            _ => {
                lost.insert(id);
            }
        }
    }
    // Commands, in the order they were enqueued, each finished before the next: a crash is
    // then the command's own.
    let mut failed_events: Vec<ObjectId> = Vec::new();
    // Reads cut short by the death (kept in `st` until a rebuild succeeds).
    let mut unfinished = st.unfinished.clone();
    let mut gates = Gates::new(st, &out.created);
    for i in 0..st.cmds.len() {
        let step = Step::Cmd(i);
        if let Cmd::Read { event, .. } = &st.cmds[i] {
            if !unfinished.contains(event) {
                continue; // its data landed before the death: its event completes below
            }
        }
        let writes = st.writes(&st.cmds[i]);
        let event = st.cmds[i].sync().and_then(|s| s.event);
        let gone = st.cmds[i].uses().iter().any(|u| !out.created.contains(u) || lost.contains(u));
        let given_up = st.attempts.get(&step).copied().unwrap_or(0) >= RETRIES;
        if gone || given_up {
            if given_up {
                out.dropped.push(format!(
                    "{} crashed the driver {} more times when run again; it was dropped: its event fails and \
                     the buffers it writes are lost",
                    st.cmds[i].describe(&st.recipes),
                    RETRIES
                ));
            }
            lost.extend(writes);
            failed_events.extend(event);
            continue;
        }
        if let Some(sync) = st.cmds[i].sync_mut() {
            sync.wait.retain(|w| out.created.contains(w));
        }
        let queue = st.cmds[i].queue();
        let rc = if gates.hold(&st.cmds[i]) {
            // Waits on a user event not set yet: enqueued, not finished (`gated`).
            let rc = gates.enqueue(&st.cmds[i], old, new);
            if let (Cmd::Read { event, .. }, Ok(CL_SUCCESS)) = (&st.cmds[i], &rc) {
                unfinished.remove(event);
            }
            rc
        } else {
            let rc = match &st.cmds[i] {
                Cmd::Write { queue, mem, offset, data, sync } => with_kept(new, data, |data| EnqueueWriteBuffer {
                    queue: *queue,
                    mem: *mem,
                    blocking: true,
                    offset: *offset,
                    data,
                    sync: sync.clone(),
                }),
                Cmd::Enqueue(req) => new.call_request(req),
                Cmd::Batch { req, .. } => new.call(req.clone()),
                Cmd::Region { req, data } => with_kept(new, data, |data| EnqueueRegionTransfer { data, ..req.clone() }),
                Cmd::Read { req, event, dst, shape, mirror } => {
                    let rc = read_again(new, req, *dst, *shape, *mirror);
                    if rc == Ok(CL_SUCCESS) {
                        unfinished.remove(event);
                    }
                    rc
                }
            };
            rc.and_then(|rc| new.call(FlushOrFinish { queue, finish: true }).map(|_| rc))
        };
        match rc {
            Err(_) if new.is_dead() => return crashed(step),
            Ok(CL_SUCCESS) => {
                out.replayed += 1;
                out.created.extend(event);
            }
            _ => {
                lost.extend(writes);
                failed_events.extend(event);
            }
        }
    }
    // Reads cut short and not read again (their journal entry is gone) fail.
    failed_events.extend(unfinished.iter().copied());
    // Events the application holds whose commands are past (before the checkpoint) complete;
    // those of dropped commands fail.
    if let Some(ctx) = first_context {
        for (h, obj) in crate::handle::objects_of(old) {
            let _ = h;
            if obj.kind != Kind::Event || out.created.contains(&obj.id) {
                continue;
            }
            let status = if failed_events.contains(&obj.id) { crate::conn::FAULT } else { CL_COMPLETE };
            let made = new.call(CreateUserEvent { id: obj.id, context: ctx });
            let set = made.and_then(|_| new.call(SetUserEventStatus { event: obj.id, status }));
            match set {
                Ok(CL_SUCCESS) => {
                    out.created.insert(obj.id);
                }
                Err(_) if new.is_dead() => return crashed(Step::Recipe(obj.id)),
                _ => {}
            }
        }
    }
    // A sub-buffer, or an image made from a buffer, is lost with its buffer.
    for (id, r) in &st.recipes {
        let parent = match &r.req {
            Request::CreateSubBuffer(s) => Some(s.buffer),
            Request::CreateImage(i) => i.desc.buffer,
            _ => None,
        };
        if parent.is_some_and(|p| lost.contains(&p)) {
            lost.insert(*id);
        }
    }
    // What the application released since is released again, and what was lost on the way
    // (a buffer a dropped command wrote) too: its handle stays with the dead worker.
    for &id in &out.created {
        if old.handle_of(id) == 0 || lost.contains(&id) {
            let _ = new.call(Release { object: id });
        }
    }
    out.created.retain(|id| !lost.contains(id));
    // Dropped steps leave the record; lost buffers keep no contents.
    let dropped: Vec<usize> =
        (0..st.cmds.len()).filter(|i| st.attempts.get(&Step::Cmd(*i)).copied().unwrap_or(0) >= RETRIES).collect();
    for i in dropped.into_iter().rev() {
        st.cmds.remove(i);
    }
    st.commands_dropped();
    st.attempts.clear();
    st.unfinished.clear();
    // The mappings of buffers carried over stay open (their unmaps journal their writes).
    st.open_maps.retain(|(m, _), _| out.created.contains(m) && !lost.contains(m));
    for id in &lost {
        st.lose(*id);
    }
    out.lost = lost.len();
    Outcome::Done(out)
}

/// Compiles, in `new`, the programs of `pending` whose header programs exist there now (as the
/// application compiled them; a failed compilation fails again, as it did); `Err` names the
/// program whose compilation killed the replacement.
pub(super) fn compile_ready(
    st: &State,
    new: &Arc<Conn>,
    created: &HashSet<ObjectId>,
    pending: &mut Vec<ObjectId>,
    translate: &dyn Fn(ObjectId) -> ObjectId,
) -> Result<(), Step> {
    let mut i = 0;
    while i < pending.len() {
        let Some(c) = st.recipes.get(&pending[i]).and_then(|r| r.compile.as_ref()) else {
            pending.remove(i);
            continue;
        };
        if !c.headers.iter().all(|(h, _)| created.contains(h)) {
            i += 1;
            continue;
        }
        let devices = c.devices.as_ref().map(|d| d.iter().map(|&d| translate(d)).collect());
        if new.call(CompileProgram { devices, ..c.clone() }).is_err() && new.is_dead() {
            return Err(Step::Recipe(c.program));
        }
        pending.remove(i);
    }
    Ok(())
}

/// After program `r` was made again in `new` with status `made`: built as the application
/// built it, if it did (a failed build fails again, as it did: the program exists either way).
fn build_again(new: &Conn, r: &Recipe, made: i32, translate: &dyn Fn(ObjectId) -> ObjectId) -> Result<i32, i32> {
    match (&r.build, made) {
        (Some(b), CL_SUCCESS) => {
            let devices = b.devices.as_ref().map(|d| d.iter().map(|&d| translate(d)).collect());
            new.call(BuildProgram { devices, ..b.clone() }).map(|_| CL_SUCCESS)
        }
        _ => Ok(made),
    }
}

/// Makes command buffer `r` in `new` again: created, its commands recorded in order (so with
/// the same sync points), finalized if it was.
fn rebuild_command_buffer(new: &Arc<Conn>, r: &Recipe) -> Result<i32, i32> {
    let Request::CreateCommandBuffer(c) = &r.req else { return Ok(CL_INVALID_OPERATION) };
    let rc = new.call(c.clone())?;
    if rc != CL_SUCCESS {
        return Ok(rc);
    }
    for cmd in &r.recorded {
        let reply = new.call(cmd.clone())?;
        if reply.status != CL_SUCCESS {
            return Ok(reply.status);
        }
    }
    match r.finalized {
        true => new.call(FinalizeCommandBuffer { buffer: c.id }),
        false => Ok(CL_SUCCESS),
    }
}

/// Creates buffer `b` in `conn` with its checkpointed contents.
pub(super) fn rebuild_buffer(
    conn: &Arc<Conn>,
    b: &CreateBuffer,
    r: &Recipe,
    views: &mut HashMap<ObjectId, SharedView>,
) -> Result<i32, i32> {
    let data = match &r.base {
        Base::Known(d) => Some(d.clone()),
        _ => None,
    };
    let flags = b.flags & !(CL_MEM_COPY_HOST_PTR | CL_MEM_USE_HOST_PTR);
    if let Some(old) = &r.view {
        let size = b.size as usize;
        // The old view's offset in its slab says how it was aligned.
        let align = 1usize << old.offset.trailing_zeros().min(12);
        let place = conn.buffer_memory(size, align)?;
        // SAFETY: the placed memory holds `size` bytes at its offset.
        let to = unsafe { place.mapping.as_ptr().add(place.offset) };
        if let Some(d) = &data {
            // SAFETY: the checkpoint's bytes are valid for their length, in another mapping.
            unsafe { cloister_ipc::copy::copy(to, d.as_ptr(), d.len().min(size)) };
        } else if let (Base::InPlace, Some(at)) = (&r.base, old.at(0, old.len.min(size))) {
            // SAFETY: `at` is the old memory's first `min(len, size)` bytes (checked by `at`),
            // which the dead worker can no longer change.
            unsafe { cloister_ipc::copy::copy(to, at.cast_const(), old.len.min(size)) };
        }
        let view = place.view(size);
        let rc = conn.call(CreateBuffer { flags, host_data: None, memory: Some(place.memory), ..b.clone() });
        conn.buffer_placed(&place, rc == Ok(CL_SUCCESS));
        if rc? == CL_SUCCESS {
            views.insert(b.id, view);
        }
        return rc;
    }
    match data {
        Some(d) => with_kept(conn, &d, |data| CreateBuffer {
            flags: flags | CL_MEM_COPY_HOST_PTR,
            host_data: Some(data),
            memory: None,
            ..b.clone()
        }),
        None => conn.call(CreateBuffer { flags, host_data: None, memory: None, ..b.clone() }),
    }
}

/// An application's event callback that was waiting when its worker died (replay mode): it is
/// registered again on the rebuilt event, or fires failed if there is none.
pub(super) struct KeptCallback {
    pfn: EventNotifyFn,
    user_data: usize,
    /// The application's event handle (its reference, taken at registration, is held).
    event: usize,
}

pub(super) fn kept_callbacks() -> &'static Mutex<HashMap<u64, Vec<KeptCallback>>> {
    static K: OnceLock<Mutex<HashMap<u64, Vec<KeptCallback>>>> = OnceLock::new();
    K.get_or_init(Default::default)
}

/// In replay mode, keeps an event callback of dead worker `serial` for its rebuilt event;
/// returns false (the caller fires it) otherwise.
pub fn keep_event_callback(serial: u64, pfn: EventNotifyFn, user_data: usize, event: usize) -> bool {
    if !on() {
        return false;
    }
    let mut kept = kept_callbacks().lock().unwrap_or_else(|e| e.into_inner());
    kept.entry(serial).or_default().push(KeptCallback { pfn, user_data, event });
    true
}

/// Fires the callbacks kept for dead worker `serial` that no rebuild took, with the fault.
pub fn fire_kept_callbacks(serial: u64) {
    let kept = kept_callbacks().lock().unwrap_or_else(|e| e.into_inner()).remove(&serial);
    for k in kept.into_iter().flatten() {
        // SAFETY: the application registered pfn with this signature for this event, which
        // the reference taken at registration keeps alive until the release below.
        unsafe { (k.pfn)(k.event as cl_event, crate::conn::FAULT, k.user_data as *mut std::ffi::c_void) };
        crate::handle::release(k.event as *mut std::ffi::c_void, Kind::Event);
    }
}

/// Registers the callbacks kept for dead worker `serial` on their events rebuilt in `new`
/// (as `CL_COMPLETE` callbacks: the driver calls one at once if its event is complete).
pub(super) fn adopt_kept_callbacks(serial: u64, new: &Arc<Conn>) {
    let kept = kept_callbacks().lock().unwrap_or_else(|e| e.into_inner()).remove(&serial);
    let mut left = Vec::new();
    for k in kept.into_iter().flatten() {
        let ev = crate::handle::lookup(k.event as *const std::ffi::c_void, Kind::Event);
        let Some(ev) = ev.ok().filter(|e| Arc::ptr_eq(&e.conn, new)) else {
            left.push(k);
            continue;
        };
        let token = new.register_callback(Callback::Event { pfn: k.pfn, user_data: k.user_data, event: k.event });
        let req = SetEventCallback { event: ev.id, callback_type: CL_COMPLETE, token };
        if new.call(req) != Ok(CL_SUCCESS) && new.unregister_callback(token).is_some() {
            left.push(k);
        }
    }
    if !left.is_empty() {
        kept_callbacks().lock().unwrap_or_else(|e| e.into_inner()).insert(serial, left);
    }
}

/// After a successful rebuild: the application's handles point at the replacement, contexts
/// hear what happened, and calls that met the death may run again. `tell_broker` passes the
/// account to the broker (the runtime's connection, above this layer).
pub fn carry_over(
    old: &Arc<Conn>,
    new: &Arc<Conn>,
    rebuilt: Rebuilt,
    st: State,
    tell_broker: impl FnOnce(&BrokerRequest),
) {
    for (id, pfn, user_data, token) in &rebuilt.notify {
        let _ = id;
        new.register_callback_as(*token, Callback::Context { pfn: *pfn, user_data: *user_data });
    }
    let mut moved = 0;
    for (h, obj) in crate::handle::objects_of(old) {
        // Platforms and root devices are the worker's own, rebound at the respawn; sub-devices
        // were rebuilt.
        let worker_own = matches!(obj.kind, Kind::Platform | Kind::Device) && obj.id & WORKER_ID_BIT != 0;
        if worker_own || !rebuilt.created.contains(&obj.id) {
            continue;
        }
        // A kernel whose arguments name an object that was not rebuilt stays lost with it.
        if let crate::handle::ObjData::Kernel { args, .. } = &obj.data {
            let missing =
                args.all().iter().any(|(_, v)| matches!(v, ArgValue::Object(id) if !rebuilt.created.contains(id)));
            if missing {
                continue;
            }
        }
        crate::handle::move_to(h, new, rebuilt.views.get(&obj.id).cloned());
        moved += 1;
    }
    // A zero-copy buffer's contents in place are in its new memory from now.
    let mut st = st;
    for (id, view) in &rebuilt.views {
        if let Some(r) = st.recipes.get_mut(id).filter(|r| r.view.is_some()) {
            r.view = Some(view.clone());
        }
    }
    super::journal_of(new).put(st);
    let mut message = format!(
        "Recovery by replay: the application was carried over to a new worker for driver {}: \
         {moved} objects rebuilt under the same handles, {} commands run again",
        new.driver, rebuilt.replayed
    );
    if rebuilt.lost > 0 {
        message
            .push_str(&format!("; {} objects could not be restored and answer CL_DEVICE_NOT_AVAILABLE", rebuilt.lost));
    }
    for d in &rebuilt.dropped {
        message.push_str("; ");
        message.push_str(d);
    }
    crate::base::warn(&message);
    // The broker adds it to the crash reports of the deaths (`cloister crashes` shows it).
    tell_broker(&BrokerRequest::CarriedOver(CarriedOver {
        driver: new.driver.clone(),
        objects_rebuilt: moved,
        commands_replayed: rebuilt.replayed as u32,
        objects_lost: rebuilt.lost as u32,
        dropped: rebuilt.dropped.clone(),
    }));
    let msg = std::ffi::CString::new(format!("cloister: {message}").replace('\0', " ")).unwrap_or_default();
    for (_, pfn, user_data, _) in &rebuilt.notify {
        // SAFETY: the application registered pfn with this signature and user_data for a
        // context it has not released (a released one is not rebuilt with its callback).
        unsafe { pfn(msg.as_ptr(), std::ptr::null(), 0, *user_data as *mut std::ffi::c_void) };
    }
    adopt_kept_callbacks(old.serial(), new);
    concluded().deaths.lock().unwrap_or_else(|e| e.into_inner()).insert(old.serial(), true);
}
