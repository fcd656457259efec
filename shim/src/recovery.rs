//! Recovery (`CLOISTER_RECOVERY=replay`, the default): the application's objects and memory contents are
//! rebuilt in the replacement of a worker that died, under the same handles and the same ids,
//! and the commands the dead worker may have lost are run again, so an application that never
//! recreates its context carries on (DESIGN.md, Faults).
//!
//! What is kept, per worker (`Journal`, in the connection):
//! - a recipe per object the shim can rebuild (the creating request, the program's build, a
//!   context's `pfn_notify`, a user event's status); the shim allocates object ids, so the
//!   same requests create the same ids in the replacement, and only device and platform ids
//!   (the worker's own) are translated;
//! - per buffer, its contents at the last checkpoint (`Base`), and the commands enqueued since
//!   (`Cmd`): writes with their data, kernels with all their arguments, copies, fills, markers.
//!
//! A checkpoint makes every buffer's contents known at one point, so the journal before it can
//! go: taken when it costs nothing (the application's blocking read of a whole buffer, when
//! nothing else was written since), or when the journal grows long (the shim reads back what
//! commands wrote, at a blocking read or `clFinish`). Everything is bounded by
//! `CLOISTER_RECOVERY_BUDGET_MB`: a buffer whose contents do not fit is lost (it answers
//! `CL_DEVICE_NOT_AVAILABLE` after a crash, as today) until a checkpoint reads it back.
//!
//! Replay restores every buffer to its checkpoint before any command runs again, so a kernel
//! that ran partly before the crash is rerun on its inputs, never on half-updated memory.
//! A step that crashes the replacement worker too is tried `RETRIES` more times at most, then
//! dropped: its event fails, what it writes is lost, and the context's `pfn_notify` says so.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use cloister_ipc::cl::*;
use cloister_ipc::*;

use cloister_ipc::image::Strided;

use crate::conn::{Callback, Conn, ContextNotifyFn, EventNotifyFn};
use crate::handle::{Kind, SharedView};
use crate::pending::Mirror;

/// How many times a step that crashed the driver is run again before it is dropped.
pub const RETRIES: u32 = 2;

/// A journal this long is checkpointed at the next blocking read or `clFinish` even when that
/// costs a read-back.
const LONG_JOURNAL: usize = 64;

/// Most commands the journal holds: an application that never waits (so never gives a
/// checkpoint) makes what its commands wrote lost instead of growing the journal without end.
const MAX_JOURNAL: usize = 16384;

/// `CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE`.
const OUT_OF_ORDER: u64 = 1;

/// Whether replay mode is on (read once).
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cloister_ipc::settings::recovery() == "replay")
}

fn budget() -> u64 {
    static B: OnceLock<u64> = OnceLock::new();
    *B.get_or_init(|| cloister_ipc::settings::recovery_budget_mb().saturating_mul(1 << 20))
}

/// A buffer's contents at the last checkpoint.
#[derive(Clone)]
enum Base {
    /// Never written: any contents will do (OpenCL leaves them undefined).
    Undefined,
    Known(Arc<Vec<u8>>),
    /// Not known (over budget, or written where the shim cannot see): the buffer cannot be
    /// restored until a checkpoint reads it back.
    Lost,
}

impl Base {
    /// Makes `data` the known contents, overwriting the last copy when it is as large (no new
    /// pages to fault in: a whole read or write of a large buffer costs one memory copy more).
    fn set(&mut self, data: &[u8]) {
        let in_place = match self {
            Base::Known(old) => Arc::get_mut(old).filter(|v| v.len() == data.len()),
            _ => None,
        };
        match in_place {
            Some(v) => v.copy_from_slice(data),
            None => *self = Base::Known(Arc::new(data.to_vec())),
        }
    }
}

/// What rebuilds one object.
struct Recipe {
    req: Request,
    /// The application released it; still rebuilt while the journal may use it.
    released: bool,
    /// A context's `pfn_notify` (function, user data, token).
    notify: Option<(ContextNotifyFn, usize, u64)>,
    /// A program's build.
    build: Option<BuildProgram>,
    /// A program's compilation (`clCompileProgram`, with its header programs).
    compile: Option<CompileProgram>,
    /// A buffer's contents.
    base: Base,
    /// A zero-copy buffer (its memory is a segment shared with the worker).
    zero_copy: bool,
    /// A user event's status, once set.
    status: Option<i32>,
}

impl Recipe {
    fn new(req: Request) -> Self {
        Recipe {
            req,
            released: false,
            notify: None,
            build: None,
            compile: None,
            base: Base::Undefined,
            zero_copy: false,
            status: None,
        }
    }

    /// The bytes of a buffer, or of an image packed without padding.
    fn buffer_size(&self) -> Option<u64> {
        match &self.req {
            Request::CreateBuffer(b) => Some(b.size),
            Request::CreateImage(i) => {
                let [w, h, d] = image_box(&i.desc);
                let elem = cloister_ipc::image::element_size(i.format.0, i.format.1)?;
                w.checked_mul(elem)?.checked_mul(h)?.checked_mul(d)
            }
            _ => None,
        }
    }

    /// The objects it needs made before it (`depends_on`), and a compilation's headers.
    fn needs(&self) -> Vec<ObjectId> {
        let mut v = depends_on(&self.req);
        v.extend(self.compile.iter().flat_map(|c| c.headers.iter().map(|(h, _)| *h)));
        v
    }

    fn base_bytes(&self) -> u64 {
        match &self.base {
            Base::Known(b) => b.len() as u64,
            _ => 0,
        }
    }
}

/// A command enqueued since the last checkpoint.
enum Cmd {
    Write {
        queue: ObjectId,
        mem: ObjectId,
        offset: u64,
        data: Vec<u8>,
        sync: EnqueueSync,
    },
    /// An NDRange (with every argument), a copy, a fill, a marker or a barrier.
    Enqueue(Request),
    /// A rectangular or image write (`req.data` is replaced by `data`, packed).
    Region {
        req: EnqueueRegionTransfer,
        data: Vec<u8>,
    },
    /// A non-blocking read (`EnqueueReadBuffer` or a region read) into the application's
    /// `dst` (rows `shape`, and `mirror` for a `CL_MEM_USE_HOST_PTR` object): read again if the
    /// worker died before its data landed (`State::unfinished` has its `event`).
    Read {
        req: Request,
        event: ObjectId,
        dst: usize,
        shape: Strided,
        mirror: Option<Mirror>,
    },
}

impl Cmd {
    /// A non-blocking read's queue and memory object.
    fn read_target(req: &Request) -> (ObjectId, ObjectId) {
        match req {
            Request::EnqueueReadBuffer(r) => (r.queue, r.mem),
            Request::EnqueueRegionTransfer(r) => (r.queue, r.mem),
            _ => (0, 0),
        }
    }

    fn queue(&self) -> ObjectId {
        match self {
            Cmd::Write { queue, .. } => *queue,
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => r.queue,
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => r.queue,
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => r.queue,
            Cmd::Enqueue(Request::EnqueueMarkerOrBarrier(r)) => r.queue,
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => r.queue,
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => r.queue,
            Cmd::Region { req, .. } => req.queue,
            Cmd::Read { req, .. } => Cmd::read_target(req).0,
            Cmd::Enqueue(_) => 0,
        }
    }

    fn sync(&self) -> Option<&EnqueueSync> {
        match self {
            Cmd::Write { sync, .. } => Some(sync),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => Some(&r.sync),
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => Some(&r.sync),
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => Some(&r.sync),
            Cmd::Enqueue(Request::EnqueueMarkerOrBarrier(r)) => Some(&r.sync),
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => Some(&r.sync),
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => Some(&r.sync),
            Cmd::Region { req, .. } => Some(&req.sync),
            Cmd::Read { req: Request::EnqueueReadBuffer(r), .. } => Some(&r.sync),
            Cmd::Read { req: Request::EnqueueRegionTransfer(r), .. } => Some(&r.sync),
            Cmd::Read { .. } | Cmd::Enqueue(_) => None,
        }
    }

    fn sync_mut(&mut self) -> Option<&mut EnqueueSync> {
        match self {
            Cmd::Write { sync, .. } => Some(sync),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => Some(&mut r.sync),
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => Some(&mut r.sync),
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => Some(&mut r.sync),
            Cmd::Enqueue(Request::EnqueueMarkerOrBarrier(r)) => Some(&mut r.sync),
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => Some(&mut r.sync),
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => Some(&mut r.sync),
            Cmd::Region { req, .. } => Some(&mut req.sync),
            Cmd::Read { req: Request::EnqueueReadBuffer(r), .. } => Some(&mut r.sync),
            Cmd::Read { req: Request::EnqueueRegionTransfer(r), .. } => Some(&mut r.sync),
            Cmd::Read { .. } | Cmd::Enqueue(_) => None,
        }
    }

    /// Every object it uses (queue, kernel, memory objects and samplers in its arguments).
    fn uses(&self) -> Vec<ObjectId> {
        let mut v = vec![self.queue()];
        match self {
            Cmd::Write { mem, .. } => v.push(*mem),
            Cmd::Region { req, .. } => v.push(req.mem),
            Cmd::Read { req, .. } => v.push(Cmd::read_target(req).1),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => {
                v.push(r.kernel);
                v.extend(r.args.iter().filter_map(|(_, a)| match a {
                    ArgValue::Object(id) => Some(*id),
                    _ => None,
                }));
            }
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => v.extend([r.src, r.dst]),
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => v.push(r.mem),
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => v.extend([r.src, r.dst]),
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => v.push(r.mem),
            _ => {}
        }
        v
    }

    /// What the application would call it (for `pfn_notify`).
    fn describe(&self, recipes: &BTreeMap<ObjectId, Recipe>) -> String {
        match self {
            Cmd::Write { mem, .. } => format!("clEnqueueWriteBuffer of buffer #{mem}"),
            Cmd::Region { req, .. } => format!("a rectangular or image write of #{}", req.mem),
            Cmd::Read { req, .. } => format!("a non-blocking read of #{}", Cmd::read_target(req).1),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => {
                let name = match recipes.get(&r.kernel).map(|k| &k.req) {
                    Some(Request::CreateKernel(k)) => String::from_utf8_lossy(&k.name).into_owned(),
                    _ => format!("#{}", r.kernel),
                };
                format!("clEnqueueNDRangeKernel of kernel '{name}'")
            }
            Cmd::Enqueue(Request::EnqueueCopyBuffer(_)) => "clEnqueueCopyBuffer".into(),
            Cmd::Enqueue(Request::EnqueueFillBuffer(_)) => "clEnqueueFillBuffer".into(),
            Cmd::Enqueue(Request::EnqueueCopyRegion(_)) => "a rectangular or image copy".into(),
            Cmd::Enqueue(Request::EnqueueFillImage(_)) => "clEnqueueFillImage".into(),
            Cmd::Enqueue(_) => "clEnqueueMarker/Barrier".into(),
        }
    }
}

/// A step of a rebuild: an object's recipe, or a command of the journal.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Step {
    Recipe(ObjectId),
    Cmd(usize),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Recipe(id) => write!(f, "making object #{id}"),
            Step::Cmd(i) => write!(f, "running command {} of the journal", i + 1),
        }
    }
}

#[derive(Default)]
pub struct State {
    recipes: BTreeMap<ObjectId, Recipe>,
    cmds: Vec<Cmd>,
    /// Bytes of known contents and of write data the journal holds.
    bytes: u64,
    /// How many replacement workers each step has crashed.
    attempts: HashMap<Step, u32>,
    /// Events of non-blocking reads and maps the worker's death cut short (their data never
    /// reached the application): they fail in the replacement.
    unfinished: HashSet<ObjectId>,
    /// Mappings the application holds, by memory object and pointer: (offset, size) of a
    /// buffer's, `None` for an image's. An object mapped when its worker dies is not carried
    /// over (the application's pointer and its unmap belong to the dead worker's mapping): it
    /// answers `CL_DEVICE_NOT_AVAILABLE`.
    open_maps: HashMap<(ObjectId, usize), Vec<Option<MapRange>>>,
}

/// A buffer mapping's (offset, size).
type MapRange = (u64, u64);

/// The recovery record of one worker's objects (empty unless replay mode is on).
#[derive(Default)]
pub struct Journal {
    state: Mutex<State>,
}

impl Journal {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the record out, for a rebuild.
    pub fn take(&self) -> State {
        self.with(std::mem::take)
    }

    /// Puts a record in (the rebuilt worker's).
    pub fn put(&self, st: State) {
        self.with(|s| *s = st);
    }

    /// An object was created by `req` (which holds its id).
    pub fn created(&self, req: Request) {
        let Some(id) = created_id(&req) else { return };
        self.with(|s| s.recipes.insert(id, Recipe::new(req)));
    }

    /// A context was created with a `pfn_notify`.
    pub fn context_notify(&self, context: ObjectId, pfn: ContextNotifyFn, user_data: usize, token: u64) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&context) {
                r.notify = Some((pfn, user_data, token));
            }
        });
    }

    /// A buffer was created; `initial` is its `CL_MEM_COPY_HOST_PTR`/`USE_HOST_PTR` data.
    pub fn buffer(&self, req: CreateBuffer, initial: Option<&[u8]>, zero_copy: bool) {
        self.memory(Request::CreateBuffer(req), initial, zero_copy);
    }

    /// An image was created (`req.desc` without pitches); `initial` is its host data, packed.
    /// Images made from a buffer are not recorded (replay does not cover them).
    pub fn image(&self, req: CreateImage, initial: Option<&[u8]>) {
        if req.desc.buffer.is_none() {
            self.memory(Request::CreateImage(req), initial, false);
        }
    }

    fn memory(&self, req: Request, initial: Option<&[u8]>, zero_copy: bool) {
        let Some(id) = created_id(&req) else { return };
        self.with(|s| {
            let mut r = Recipe::new(req);
            r.zero_copy = zero_copy;
            r.base = match initial {
                None => Base::Undefined,
                Some(d) if s.bytes + d.len() as u64 <= budget() => {
                    s.bytes += d.len() as u64;
                    Base::Known(Arc::new(d.to_vec()))
                }
                Some(_) => Base::Lost,
            };
            s.recipes.insert(id, r);
        });
    }

    /// A program was compiled (successfully or not: the replacement compiles it the same way).
    pub fn compiled(&self, req: CompileProgram) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&req.program) {
                r.compile = Some(CompileProgram { notify: None, ..req });
            }
        });
    }

    /// Kernel `id` is a clone of `source`: recorded as made the way `source` was, by name.
    pub fn cloned(&self, id: ObjectId, source: ObjectId) {
        self.with(|s| {
            if let Some(Request::CreateKernel(k)) = s.recipes.get(&source).map(|r| &r.req) {
                let req = Request::CreateKernel(CreateKernel { id, ..k.clone() });
                s.recipes.insert(id, Recipe::new(req));
            }
        });
    }

    /// A program was built (successfully or not: the replacement builds it the same way).
    pub fn built(&self, req: BuildProgram) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&req.program) {
                r.build = Some(BuildProgram { notify: None, ..req });
            }
        });
    }

    pub fn user_status(&self, event: ObjectId, status: i32) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&event) {
                r.status = Some(status);
            }
        });
    }

    /// The application's last reference to `id` is gone.
    pub fn released(&self, id: ObjectId) {
        self.with(|s| {
            // The journal's commands may use it, and objects made from it (a program's kernels,
            // a link's inputs, a compilation's headers) need it made again first.
            let in_use = s.cmds.iter().any(|c| c.uses().contains(&id))
                || s.recipes.iter().any(|(&other, r)| other != id && r.needs().contains(&id));
            match s.recipes.get(&id) {
                Some(r)
                    if !in_use && !matches!(r.req, Request::CreateContext(_) | Request::CreateContextFromType(_)) =>
                {
                    s.bytes = s.bytes.saturating_sub(r.base_bytes());
                    s.recipes.remove(&id);
                }
                Some(_) => {
                    if let Some(r) = s.recipes.get_mut(&id) {
                        r.released = true;
                        // Its `pfn_notify`'s user data may be freed: a released context never
                        // hears of a carry-over.
                        r.notify = None;
                    }
                }
                None => {}
            }
        });
    }

    /// A non-blocking read went to the worker (see `Cmd::Read`).
    pub fn reading(&self, req: Request, event: ObjectId, dst: usize, shape: Strided, mirror: Option<Mirror>) {
        self.with(|s| {
            if s.cmds.len() >= MAX_JOURNAL {
                s.give_up_journal();
            }
            s.cmds.push(Cmd::Read { req, event, dst, shape, mirror });
        });
    }

    /// The non-blocking read or map of `event` ended without its data (see `State::unfinished`).
    pub fn unfinished(&self, event: ObjectId) {
        self.with(|s| s.unfinished.insert(event));
    }

    /// `mem` was mapped at `ptr`; `range` is a buffer's (offset, size), `None` for an image.
    pub fn mapped(&self, mem: ObjectId, ptr: usize, range: Option<MapRange>) {
        self.with(|s| s.open_maps.entry((mem, ptr)).or_default().push(range));
    }

    /// The application unmaps `mem`'s mapping at `ptr` (before the unmap goes to the worker).
    /// A writing map of a buffer becomes a journaled write of what the mapping holds now (what
    /// the buffer holds after the unmap); an image written through a map is lost until a
    /// checkpoint.
    ///
    /// # Safety
    /// `ptr` is the application's live mapping of `mem` recorded by `mapped`, valid until
    /// this unmap.
    pub unsafe fn unmapping(&self, queue: ObjectId, mem: ObjectId, ptr: usize, write: bool, sync: &EnqueueSync) {
        self.with(|s| {
            let Some(list) = s.open_maps.get_mut(&(mem, ptr)) else { return };
            let range = list.pop().flatten();
            if list.is_empty() {
                s.open_maps.remove(&(mem, ptr));
            }
            match (write, range) {
                (false, _) => {}
                (true, Some((offset, size))) => {
                    // SAFETY: per the caller, `ptr` is the live mapping of `size` bytes made by
                    // the map that recorded this range.
                    let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, size as usize) };
                    s.write(queue, mem, offset, data, sync.clone());
                }
                (true, None) => s.lose(mem),
            }
        });
    }

    /// A buffer was written with `data` at `offset`.
    pub fn wrote(&self, queue: ObjectId, mem: ObjectId, offset: u64, data: &[u8], sync: EnqueueSync) {
        self.with(|s| s.write(queue, mem, offset, data, sync));
    }

    /// A rectangular or image write went to the worker with `data`, packed.
    pub fn wrote_region(&self, req: EnqueueRegionTransfer, data: Vec<u8>) {
        self.with(|s| s.push_write(req.mem, data.len(), || Cmd::Region { req, data }));
    }

    /// An enqueue went to the worker: recorded if replay knows it, else what it may write is
    /// lost until the next checkpoint.
    pub fn enqueued(&self, req: Request) {
        self.with(|s| match req {
            Request::EnqueueNdRange(_)
            | Request::EnqueueCopyBuffer(_)
            | Request::EnqueueFillBuffer(_)
            | Request::EnqueueMarkerOrBarrier(_)
            | Request::EnqueueCopyRegion(_)
            | Request::EnqueueFillImage(_) => {
                if s.cmds.len() >= MAX_JOURNAL {
                    s.give_up_journal();
                }
                s.cmds.push(Cmd::Enqueue(req))
            }
            Request::EnqueueMapBuffer(r) if r.flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0 => {
                s.lose(r.mem)
            }
            Request::EnqueueCommandBuffer(_) => {
                let ids: Vec<ObjectId> = s.recipes.keys().copied().collect();
                ids.into_iter().for_each(|id| s.lose(id));
            }
            _ => {}
        });
    }

    /// After the application's blocking read of `data` from `mem` at `offset`: a checkpoint if
    /// it is cheap (see the module's doc).
    pub fn read(&self, conn: &Conn, queue: ObjectId, mem: ObjectId, offset: u64, data: &[u8]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let whole = offset == 0 && s.recipes.get(&mem).and_then(Recipe::buffer_size) == Some(data.len() as u64);
        let dirty = s.dirty();
        let free = whole && dirty.iter().all(|&m| m == mem) && s.cmds.iter().all(|c| s.in_order(c.queue(), queue));
        if free {
            s.checkpoint(conn, queue, whole.then_some((mem, data)), false);
        } else if s.cmds.len() >= LONG_JOURNAL || s.bytes > budget() / 2 {
            s.checkpoint(conn, queue, whole.then_some((mem, data)), true);
        }
    }

    /// After `clFinish` of `queue`: a checkpoint once the journal is long (its read-back then
    /// costs the application one round trip per `LONG_JOURNAL` commands, not per `clFinish`).
    pub fn finished(&self, conn: &Conn, queue: ObjectId) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.cmds.len() >= LONG_JOURNAL || s.bytes > budget() / 2 {
            s.checkpoint(conn, queue, None, true);
        }
    }
}

impl State {
    /// Journals a write of `data` into buffer `mem` at `offset` (or makes it the checkpoint's
    /// contents, `superseded_by`).
    fn write(&mut self, queue: ObjectId, mem: ObjectId, offset: u64, data: &[u8], sync: EnqueueSync) {
        if !self.superseded_by(mem, offset, data) {
            self.push_write(mem, data.len(), || Cmd::Write { queue, mem, offset, data: data.to_vec(), sync })
        }
    }

    /// A write of all of buffer `mem` that nothing in the journal needs the old contents of
    /// (the journal only writes it, with writes and fills): its data becomes the checkpoint's
    /// contents of `mem` (the last copy reused when it is as large: no allocation), and the
    /// earlier writes of `mem` go. Returns whether it did.
    fn superseded_by(&mut self, mem: ObjectId, offset: u64, data: &[u8]) -> bool {
        let whole = offset == 0
            && self.storage(mem) == mem
            && self.recipes.get(&mem).and_then(Recipe::buffer_size) == Some(data.len() as u64);
        let only_written = |c: &Cmd| match c {
            Cmd::Write { mem: m, .. } => self.storage(*m) == mem,
            Cmd::Enqueue(Request::EnqueueFillBuffer(f)) => self.storage(f.mem) == mem,
            _ => false,
        };
        let untouched = |c: &Cmd| c.uses().iter().all(|u| self.storage(*u) != mem);
        if !whole || !self.cmds.iter().all(|c| only_written(c) || untouched(c)) {
            return false;
        }
        let kept_bytes = |c: &Cmd| match c {
            Cmd::Write { data, .. } | Cmd::Region { data, .. } => data.len() as u64,
            Cmd::Read { .. } | Cmd::Enqueue(_) => 0,
        };
        let before = self.recipes.get(&mem).map_or(0, Recipe::base_bytes);
        let freed: u64 = self.cmds.iter().filter(|c| only_written(c)).map(kept_bytes).sum();
        let after = self.bytes.saturating_sub(before + freed) + data.len() as u64;
        if after > budget() {
            return false;
        }
        let gone: Vec<bool> = self.cmds.iter().map(only_written).collect();
        let mut i = 0;
        self.cmds.retain(|_| {
            i += 1;
            !gone[i - 1]
        });
        let Some(r) = self.recipes.get_mut(&mem) else { return false };
        r.base.set(data);
        self.bytes = after;
        true
    }

    /// Journals a write of `len` bytes of data into `mem`, or loses `mem` if the data does not
    /// fit the budget.
    fn push_write(&mut self, mem: ObjectId, len: usize, cmd: impl FnOnce() -> Cmd) {
        if !self.recipes.contains_key(&mem) {
            return;
        }
        if self.bytes + len as u64 > budget() {
            self.lose(mem);
            return;
        }
        if self.cmds.len() >= MAX_JOURNAL {
            self.give_up_journal();
        }
        self.bytes += len as u64;
        self.cmds.push(cmd());
    }

    /// Drops the journal: what its commands wrote is lost until the next checkpoint.
    fn give_up_journal(&mut self) {
        for m in self.dirty() {
            self.lose(m);
        }
        self.cmds.clear();
        self.bytes = self.recipes.values().map(Recipe::base_bytes).sum();
    }

    /// The recipes a rebuild needs once the journal is empty: the objects the application has
    /// not released, every context, and what those need, transitively.
    fn needed(&self) -> HashSet<ObjectId> {
        let is_context = |r: &Recipe| matches!(r.req, Request::CreateContext(_) | Request::CreateContextFromType(_));
        let mut keep: HashSet<ObjectId> =
            self.recipes.iter().filter(|(_, r)| !r.released || is_context(r)).map(|(id, _)| *id).collect();
        let mut todo: Vec<ObjectId> = keep.iter().copied().collect();
        while let Some(id) = todo.pop() {
            for n in self.recipes.get(&id).map(Recipe::needs).unwrap_or_default() {
                if self.recipes.contains_key(&n) && keep.insert(n) {
                    todo.push(n);
                }
            }
        }
        keep
    }

    /// The replacement worker died running `step`.
    pub fn count_attempt(&mut self, step: Step) {
        *self.attempts.entry(step).or_insert(0) += 1;
    }

    /// `mem`'s contents are unknown from now until a checkpoint reads it back.
    fn lose(&mut self, mem: ObjectId) {
        let mem = self.storage(mem);
        if let Some(r) = self.recipes.get_mut(&mem) {
            if r.buffer_size().is_some() {
                self.bytes = self.bytes.saturating_sub(r.base_bytes());
                r.base = Base::Lost;
            }
        }
    }

    /// Whether a command on `cmd_queue` is complete once a blocking call on `queue` returned.
    fn in_order(&self, cmd_queue: ObjectId, queue: ObjectId) -> bool {
        cmd_queue == queue && !self.out_of_order(queue)
    }

    fn out_of_order(&self, queue: ObjectId) -> bool {
        match self.recipes.get(&queue).map(|r| &r.req) {
            Some(Request::CreateCommandQueue(q)) => q.properties & OUT_OF_ORDER != 0,
            Some(Request::CreateCommandQueueWithProperties(q)) => q
                .properties
                .as_deref()
                .unwrap_or(&[])
                .chunks(2)
                .any(|kv| kv.len() == 2 && kv[0] == u64::from(CL_QUEUE_PROPERTIES) && kv[1] & OUT_OF_ORDER != 0),
            _ => true,
        }
    }

    /// Buffers the journal's commands may write, and those whose contents are lost.
    fn dirty(&self) -> BTreeSet<ObjectId> {
        let mut out: BTreeSet<ObjectId> = self.cmds.iter().flat_map(|c| self.writes(c)).collect();
        out.extend(self.recipes.iter().filter(|(_, r)| matches!(r.base, Base::Lost)).map(|(id, _)| *id));
        out
    }

    /// The buffer whose memory `mem` is: a sub-buffer's parent, else itself.
    fn storage(&self, mem: ObjectId) -> ObjectId {
        match self.recipes.get(&mem).map(|r| &r.req) {
            Some(Request::CreateSubBuffer(s)) => s.buffer,
            _ => mem,
        }
    }

    /// The buffers whose contents a command may change (a kernel: every buffer argument not
    /// read-only; a sub-buffer's writes change its parent).
    fn writes(&self, cmd: &Cmd) -> Vec<ObjectId> {
        let writable = |id: &ObjectId| match self.recipes.get(id).map(|r| &r.req) {
            Some(Request::CreateBuffer(b)) => b.flags & CL_MEM_READ_ONLY == 0,
            Some(Request::CreateSubBuffer(s)) => s.flags & CL_MEM_READ_ONLY == 0,
            Some(Request::CreateImage(i)) => i.flags & CL_MEM_READ_ONLY == 0,
            _ => false,
        };
        let written = match cmd {
            Cmd::Write { mem, .. } => vec![*mem],
            Cmd::Region { req, .. } => vec![req.mem],
            Cmd::Read { .. } => Vec::new(),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => r
                .args
                .iter()
                .filter_map(|(_, a)| match a {
                    ArgValue::Object(id) if writable(id) => Some(*id),
                    _ => None,
                })
                .collect(),
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => vec![r.dst],
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => vec![r.mem],
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => vec![r.dst],
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => vec![r.mem],
            Cmd::Enqueue(_) => Vec::new(),
        };
        written.into_iter().map(|m| self.storage(m)).collect()
    }

    /// Makes the contents of every buffer known now and drops the journal: `have` is a whole
    /// buffer the application just read; with `read_back`, the other written ones are read
    /// from the worker (after every queue the journal used is finished). Nothing changes if
    /// that fails or does not fit the budget.
    fn checkpoint(&mut self, conn: &Conn, queue: ObjectId, have: Option<(ObjectId, &[u8])>, read_back: bool) {
        let is_have = |id: ObjectId| have.is_some_and(|(h, _)| h == id);
        let missing: Vec<ObjectId> = self
            .dirty()
            .into_iter()
            .filter(|m| !is_have(*m) && self.recipes.get(m).is_some_and(|r| !r.released))
            .collect();
        if !missing.is_empty() && !read_back {
            return;
        }
        let kept: u64 = self
            .recipes
            .iter()
            .filter(|(id, r)| !missing.contains(id) && !is_have(**id) && !r.released)
            .map(|(_, r)| r.base_bytes())
            .sum();
        let new: u64 = missing.iter().filter_map(|m| self.recipes.get(m)?.buffer_size()).sum::<u64>()
            + have.map_or(0, |(_, d)| d.len() as u64);
        if kept + new > budget() {
            return;
        }
        let mut fresh: Vec<(ObjectId, Vec<u8>)> = Vec::new();
        if read_back {
            let queues: BTreeSet<ObjectId> = self.cmds.iter().map(Cmd::queue).chain([queue]).collect();
            for q in queues {
                if !matches!(conn.call(FlushOrFinish { queue: q, finish: true }), Ok(CL_SUCCESS)) {
                    return;
                }
            }
            for m in &missing {
                let Some(r) = self.recipes.get(m) else { continue };
                let Some(size) = r.buffer_size() else { continue };
                let image = match &r.req {
                    Request::CreateImage(i) => Some(image_box(&i.desc)),
                    _ => None,
                };
                match read_memory(conn, queue, *m, size as usize, image) {
                    Some(d) => fresh.push((*m, d)),
                    None => return,
                }
            }
        }
        self.cmds.clear();
        self.attempts.clear();
        let keep = self.needed();
        self.recipes.retain(|id, _| keep.contains(id));
        for (m, d) in fresh {
            if let Some(r) = self.recipes.get_mut(&m) {
                r.base = Base::Known(Arc::new(d));
            }
        }
        if let Some(r) = have.and_then(|(m, _)| self.recipes.get_mut(&m)) {
            r.base.set(have.map_or(&[][..], |(_, d)| d));
        }
        self.bytes = self.recipes.values().map(Recipe::base_bytes).sum();
    }
}

/// An image's size in pixels, rows and slices (an array's layers count as rows or slices).
pub fn image_box(d: &ImageDesc) -> [u64; 3] {
    let at_least_1 = |v: u64| v.max(1);
    match d.image_type {
        CL_MEM_OBJECT_IMAGE2D => [d.width, at_least_1(d.height), 1],
        CL_MEM_OBJECT_IMAGE3D => [d.width, at_least_1(d.height), at_least_1(d.depth)],
        CL_MEM_OBJECT_IMAGE1D_ARRAY => [d.width, at_least_1(d.array_size), 1],
        CL_MEM_OBJECT_IMAGE2D_ARRAY => [d.width, at_least_1(d.height), at_least_1(d.array_size)],
        _ => [d.width, 1, 1],
    }
}

/// The id a creating request gives its object.
fn created_id(req: &Request) -> Option<ObjectId> {
    Some(match req {
        Request::CreateContext(r) => r.id,
        Request::CreateContextFromType(r) => r.id,
        Request::CreateCommandQueue(r) => r.id,
        Request::CreateCommandQueueWithProperties(r) => r.id,
        Request::CreateBuffer(r) => r.id,
        Request::CreateProgramWithSource(r) => r.id,
        Request::CreateProgramWithBinary(r) => r.id,
        Request::CreateKernel(r) => r.id,
        Request::CreateUserEvent(r) => r.id,
        Request::CreateSampler(r) => r.id,
        Request::CreateSubBuffer(r) => r.id,
        Request::CreateImage(r) => r.id,
        Request::LinkProgram(r) => r.id,
        _ => return None,
    })
}

/// The shim's objects a creating request needs.
fn depends_on(req: &Request) -> Vec<ObjectId> {
    match req {
        Request::CreateCommandQueue(r) => vec![r.context],
        Request::CreateCommandQueueWithProperties(r) => vec![r.context],
        Request::CreateBuffer(r) => vec![r.context],
        Request::CreateProgramWithSource(r) => vec![r.context],
        Request::CreateProgramWithBinary(r) => vec![r.context],
        Request::CreateKernel(r) => vec![r.program],
        Request::CreateUserEvent(r) => vec![r.context],
        Request::CreateSampler(r) => vec![r.context],
        Request::CreateSubBuffer(r) => vec![r.buffer],
        Request::CreateImage(r) => vec![r.context],
        Request::LinkProgram(r) => [r.context].into_iter().chain(r.inputs.iter().copied()).collect(),
        _ => Vec::new(),
    }
}

/// Reads the `size` bytes of buffer `mem`, or of image `mem` of `image` pixels, rows and slices
/// (packed), through a segment (blocking).
fn read_memory(conn: &Conn, queue: ObjectId, mem: ObjectId, size: usize, image: Option<[u64; 3]>) -> Option<Vec<u8>> {
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
        // SAFETY: the segment holds at least `size` bytes (acquire_segment).
        Ok(CL_SUCCESS) => Some(unsafe { std::slice::from_raw_parts(seg.region.as_ptr(), size) }.to_vec()),
        _ => None,
    };
    conn.release_segment(seg);
    out
}

/// Runs a non-blocking read again, blocking, in `conn`, and puts its data where the
/// application asked (it keeps that memory valid until the read's event completes, which it has
/// not: the worker died first).
fn read_again(conn: &Conn, req: &Request, dst: usize, shape: Strided, mirror: Option<Mirror>) -> Result<i32, i32> {
    let len = shape.packed_len();
    let seg = conn.acquire_segment(len)?;
    let into = DataRef::Segment { id: seg.id, offset: 0, len: len as u64 };
    let rc = match req {
        Request::EnqueueReadBuffer(r) => conn.call(EnqueueReadBuffer { blocking: true, into, ..r.clone() }),
        Request::EnqueueRegionTransfer(r) => {
            conn.call(EnqueueRegionTransfer { blocking: true, data: into, ..r.clone() })
        }
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

/// Runs `make(data)` with `bytes` in a fresh segment the worker knows.
fn with_segment<C: Call<Reply = i32>>(conn: &Conn, bytes: &[u8], make: impl FnOnce(DataRef) -> C) -> Result<i32, i32> {
    let seg = conn.acquire_segment(bytes.len())?;
    // SAFETY: the segment holds at least `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), seg.region.as_ptr(), bytes.len()) };
    let rc = conn.call(make(DataRef::Segment { id: seg.id, offset: 0, len: bytes.len() as u64 }));
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
        // An image mapped now cannot be carried over (its mapping's rows would be written
        // back as a region); a mapped buffer is, its mapping kept (`MapRecord::carried`).
        let mapped = st.open_maps.iter().any(|((m, _), ranges)| *m == id && ranges.iter().any(Option::is_none));
        if mapped || matches!(r.base, Base::Lost) || depends_on(&r.req).iter().any(|d| !out.created.contains(d)) {
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
            Request::CreateProgramWithSource(p) => new.call(p.clone()).and_then(|rc| match (&r.build, rc) {
                (Some(b), CL_SUCCESS) => {
                    let devices = b.devices.as_ref().map(|d| d.iter().map(|&d| translate(d)).collect());
                    new.call(BuildProgram { devices, ..b.clone() }).map(|_| CL_SUCCESS)
                }
                _ => Ok(rc),
            }),
            Request::CreateProgramWithBinary(p) => {
                let req =
                    CreateProgramWithBinary { devices: p.devices.iter().map(|&d| translate(d)).collect(), ..p.clone() };
                new.call(req).and_then(|reply| match (&r.build, reply.status) {
                    (Some(b), CL_SUCCESS) => {
                        let devices = b.devices.as_ref().map(|d| d.iter().map(|&d| translate(d)).collect());
                        new.call(BuildProgram { devices, ..b.clone() }).map(|_| CL_SUCCESS)
                    }
                    (_, s) => Ok(s),
                })
            }
            Request::CreateKernel(k) => new.call(k.clone()).map(|reply| reply.status),
            Request::CreateSampler(s) => new.call(s.clone()),
            Request::CreateImage(i) => {
                let flags = i.flags & !(CL_MEM_COPY_HOST_PTR | CL_MEM_USE_HOST_PTR);
                match &r.base {
                    Base::Known(d) => with_segment(new, d, |data| CreateImage {
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
    // Commands, in the order they were enqueued, each finished before the next: a crash is
    // then the command's own.
    let mut failed_events: Vec<ObjectId> = Vec::new();
    // Reads cut short by the death (kept in `st` until a rebuild succeeds).
    let mut unfinished = st.unfinished.clone();
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
        let rc = match &st.cmds[i] {
            Cmd::Write { queue, mem, offset, data, sync } => with_segment(new, data, |data| EnqueueWriteBuffer {
                queue: *queue,
                mem: *mem,
                blocking: true,
                offset: *offset,
                data,
                sync: sync.clone(),
            }),
            Cmd::Enqueue(req) => new.call_request(req),
            Cmd::Region { req, data } => with_segment(new, data, |data| EnqueueRegionTransfer { data, ..req.clone() }),
            Cmd::Read { req, event, dst, shape, mirror } => {
                let rc = read_again(new, req, *dst, *shape, *mirror);
                if rc == Ok(CL_SUCCESS) {
                    unfinished.remove(event);
                }
                rc
            }
        };
        let rc = rc.and_then(|rc| new.call(FlushOrFinish { queue, finish: true }).map(|_| rc));
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
    // A sub-buffer of a lost buffer is lost with it.
    for (id, r) in &st.recipes {
        if let Request::CreateSubBuffer(s) = &r.req {
            if lost.contains(&s.buffer) {
                lost.insert(*id);
            }
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
fn compile_ready(
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

/// Creates buffer `b` in `conn` with its checkpointed contents.
fn rebuild_buffer(
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
    if r.zero_copy {
        let size = b.size as usize;
        let region =
            cloister_ipc::shm::SharedRegion::create("cloister-buffer", size).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        if let Some(d) = &data {
            // SAFETY: the region holds `size` bytes; the checkpoint is the buffer's size.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), region.as_ptr(), d.len().min(size)) };
        }
        let segment = conn.share_region(&region)?;
        let view = SharedView { memory: Arc::new(region.into_mapping()), offset: 0, len: size };
        let rc = conn.call(CreateBuffer { flags, host_data: None, memory: Some(segment), ..b.clone() })?;
        if rc == CL_SUCCESS {
            views.insert(b.id, view);
        }
        return Ok(rc);
    }
    match data {
        Some(d) => with_segment(conn, &d, |data| CreateBuffer {
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
struct KeptCallback {
    pfn: EventNotifyFn,
    user_data: usize,
    /// The application's event handle (its reference, taken at registration, is held).
    event: usize,
}

fn kept_callbacks() -> &'static Mutex<HashMap<u64, Vec<KeptCallback>>> {
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
fn adopt_kept_callbacks(serial: u64, new: &Arc<Conn>) {
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

/// Dead workers whose deaths the shim has dealt with, by serial: whether their objects were
/// carried over to a replacement.
#[derive(Default)]
struct Concluded {
    deaths: Mutex<HashMap<u64, bool>>,
    changed: std::sync::Condvar,
}

fn concluded() -> &'static Concluded {
    static C: OnceLock<Concluded> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The death of worker `serial` has been dealt with (its objects carried over or not): calls
/// that met it (`retrying`) stop waiting.
pub fn conclude(serial: u64) {
    let c = concluded();
    c.deaths.lock().unwrap_or_else(|e| e.into_inner()).entry(serial).or_insert(false);
    c.changed.notify_all();
}

/// Waits (boundedly) until the death of worker `serial` has been dealt with; returns whether
/// its objects were carried over. A call can meet a death before the shim has noticed it (a
/// send on the worker's closed socket), so the restart may not have begun yet.
fn carried_over(serial: u64) -> bool {
    let c = concluded();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut deaths = c.deaths.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(&carried) = deaths.get(&serial) {
            return carried;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        deaths = c.changed.wait_timeout(deaths, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// After a successful rebuild: the application's handles point at the replacement, contexts
/// hear what happened, and calls that met the death may run again.
pub fn carry_over(old: &Arc<Conn>, new: &Arc<Conn>, rebuilt: Rebuilt, st: State) {
    for (id, pfn, user_data, token) in &rebuilt.notify {
        let _ = id;
        new.register_callback_as(*token, Callback::Context { pfn: *pfn, user_data: *user_data });
    }
    let mut moved = 0;
    for (h, obj) in crate::handle::objects_of(old) {
        if matches!(obj.kind, Kind::Platform | Kind::Device) || !rebuilt.created.contains(&obj.id) {
            continue;
        }
        // A kernel whose arguments name an object that was not rebuilt stays lost with it.
        if let crate::handle::ObjData::Kernel { args, .. } = &obj.data {
            let a = args.lock().unwrap_or_else(|e| e.into_inner());
            let missing =
                a.values.iter().flatten().any(|v| matches!(v, ArgValue::Object(id) if !rebuilt.created.contains(id)));
            if missing {
                continue;
            }
        }
        crate::handle::move_to(h, new, rebuilt.views.get(&obj.id).cloned());
        moved += 1;
    }
    new.journal.put(st);
    let mut message = format!(
        "CLOISTER_RECOVERY=replay: the application was carried over to a new worker for driver {}: \
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
    crate::runtime::warn(&message);
    // The broker adds it to the crash reports of the deaths (`cloister crashes` shows it).
    crate::runtime::tell_broker(&BrokerRequest::CarriedOver(CarriedOver {
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

thread_local! {
    /// The serial of a dead worker this thread's current call met (see `retrying`).
    static MET_DEATH: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// A call on this thread failed because worker `serial` is dead.
pub fn met_death(serial: u64) {
    let _ = MET_DEATH.try_with(|m| m.set(Some(serial)));
}

/// Runs an entry point; in replay mode, one that failed because its worker died runs again
/// once the objects are carried over (at most `RETRIES` + 1 times in all).
pub fn retrying<R>(failed: impl Fn(&R) -> bool, f: impl Fn() -> R) -> R {
    if !on() {
        return f();
    }
    let outer = MET_DEATH.try_with(|m| m.take()).ok().flatten();
    let mut tries = 0;
    let r = loop {
        let r = f();
        let met = MET_DEATH.try_with(|m| m.take()).ok().flatten();
        match met {
            Some(serial) if failed(&r) && tries < RETRIES => {
                if !carried_over(serial) {
                    break r;
                }
                tries += 1;
            }
            _ => break r,
        }
    };
    if let Some(o) = outer {
        met_death(o);
    }
    r
}

/// Makes a creating call, and records it if it succeeded in replay mode (nothing is copied
/// otherwise).
pub fn recorded<C: Call<Reply = i32> + Clone>(conn: &Conn, req: C) -> Result<i32, i32> {
    let copy = on().then(|| req.clone());
    let rc = conn.call(req);
    if let (Some(c), Ok(CL_SUCCESS)) = (copy, &rc) {
        conn.journal.created(c.into_request());
    }
    rc
}

/// Records a successful creating call made otherwise (replay mode only).
pub fn note<C: Call + Clone>(conn: &Conn, req: &C) {
    if on() {
        conn.journal.created(req.clone().into_request());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(id: ObjectId, size: u64, flags: u64) -> Request {
        Request::CreateBuffer(CreateBuffer {
            id,
            context: 1,
            properties: None,
            flags,
            size,
            host_data: None,
            memory: None,
        })
    }

    fn kernel_on(args: &[ObjectId]) -> Cmd {
        Cmd::Enqueue(Request::EnqueueNdRange(EnqueueNdRange {
            queue: 2,
            kernel: 9,
            args: args.iter().enumerate().map(|(i, &a)| (i as u32, ArgValue::Object(a))).collect(),
            work_dim: 1,
            offset: None,
            global: Some(vec![1]),
            local: None,
            sync: EnqueueSync::default(),
        }))
    }

    fn write(mem: ObjectId, offset: u64, data: &[u8]) -> Cmd {
        Cmd::Write { queue: 2, mem, offset, data: data.to_vec(), sync: EnqueueSync::default() }
    }

    fn state() -> State {
        let mut st = State::default();
        st.recipes.insert(10, Recipe::new(buffer(10, 4, CL_MEM_READ_ONLY)));
        st.recipes.insert(11, Recipe::new(buffer(11, 4, 0)));
        let sub = CreateSubBuffer { id: 12, buffer: 11, flags: 0, origin: 0, size: 2 };
        st.recipes.insert(12, Recipe::new(Request::CreateSubBuffer(sub)));
        st
    }

    #[test]
    fn kernels_dirty_their_writable_arguments_and_sub_buffers_their_parents() {
        let mut st = state();
        st.cmds.push(kernel_on(&[10, 12]));
        assert_eq!(st.dirty().into_iter().collect::<Vec<_>>(), vec![11]);
        st.cmds.push(write(10, 0, b"ab"));
        assert_eq!(st.dirty().into_iter().collect::<Vec<_>>(), vec![10, 11]);
    }

    #[test]
    fn a_whole_write_supersedes_only_what_never_reads_the_old_contents() {
        let mut st = state();
        st.cmds.push(write(11, 0, b"xy"));
        assert!(st.superseded_by(11, 0, b"1234"), "earlier writes of the buffer alone go");
        assert!(st.cmds.is_empty());
        assert!(matches!(&st.recipes[&11].base, Base::Known(d) if d.as_slice() == b"1234"));
        // A partial write is journaled; a kernel reading the buffer keeps the journal.
        assert!(!st.superseded_by(11, 1, b"12"));
        st.cmds.push(kernel_on(&[11]));
        assert!(!st.superseded_by(11, 0, b"5678"), "the kernel needs the old contents");
        // A buffer the journal does not touch is superseded at once.
        assert!(st.superseded_by(10, 0, b"abcd"));
        assert_eq!(st.cmds.len(), 1);
    }

    #[test]
    fn losing_a_sub_buffer_loses_its_parent() {
        let mut st = state();
        st.lose(12);
        assert!(matches!(st.recipes[&11].base, Base::Lost));
        assert!(matches!(st.recipes[&12].base, Base::Undefined));
    }
}
