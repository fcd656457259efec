//! What replay mode keeps per worker (see the parent module): a recipe per object, buffer
//! contents at the last checkpoint, and the journal of commands since; checkpoints.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloister_ipc::cl::*;
use cloister_ipc::fast_hash::FastSet;
use cloister_ipc::image::Strided;
use cloister_ipc::shm::KeptBytes;
use cloister_ipc::*;

use super::budget;
use super::rebuild::{read_back_items, ReadBackItem};
use crate::conn::{Conn, ContextNotifyFn, SharedView};
use crate::handle::MapArea;
use crate::mirror::Mirror;

/// A journal this long (or one command per `RECIPES_PER_CHECKPOINT_COMMAND` recipes, if that
/// is more and no contents are lost) is checkpointed at the next blocking read or `clFinish`
/// even when that costs a read-back.
const LONG_JOURNAL: usize = 64;

/// A checkpoint that reads nothing back waits until the journal holds this many commands. It
/// costs microseconds of bookkeeping, and the next kernel that writes a zero-copy buffer copies
/// it out first: a loop of a short kernel and `clFinish` paid both every iteration (on 2 pocl
/// cores 3 000 of the shim's 7 500 instructions per iteration: callgrind on `tools/measure/rt2.c`).
const FREE_CHECKPOINT_MIN: usize = 16;

/// A checkpoint walks every recipe, so it also waits for one journaled command per this many
/// recipes: an application with 3 000 buffers paid that walk (about 100 000 instructions, and
/// more with a read-back) every 16 commands (64 for one that reads back), now at most a few
/// recipes' worth per command.
const RECIPES_PER_CHECKPOINT_COMMAND: usize = 4;

/// Most commands the journal holds: an application that never waits (so never gives a
/// checkpoint) makes what its commands wrote lost instead of growing the journal without end.
const MAX_JOURNAL: usize = 16384;

/// A checkpoint that reads contents back waits until the time since the last one is this many
/// times what that one took: read-backs cost the application about 5% of its time at most,
/// however large its working set (a discrete device's buffers come back over the bus).
const READ_BACK_SPACING: u32 = 19;

/// `CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE`.
const OUT_OF_ORDER: u64 = 1;

/// A copy of `data`, made on several threads when it is large (`cloister_ipc::copy`): the
/// journal copies what the application writes, on the application's time.
fn copy_of(data: &[u8]) -> Vec<u8> {
    // SAFETY: a slice is valid for its length.
    unsafe { copy_from(data.as_ptr(), data.len()) }
}

/// `copy_of` for `len` bytes at `src`.
///
/// # Safety
/// `src` is valid for `len` bytes of reads during the call.
unsafe fn copy_from(src: *const u8, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `v` has room for `len` bytes, all written by the copy before `set_len`; `src` per
    // the caller, distinct from `v`.
    unsafe {
        cloister_ipc::copy::copy(v.as_mut_ptr(), src, len);
        v.set_len(len);
    }
    v
}

/// Data the journal keeps: its own copy, or a write's bytes left where the write staged them
/// (a segment the pool does not hand out again while they are kept, `Segment::kept`), which
/// saves a copy per write on a discrete device.
pub(super) enum Bytes {
    Copy(Vec<u8>),
    /// The worker maps the segment too: a driver that writes into it before dying (a wild
    /// pointer) changes what replay writes into the rebuilt buffer, never how much.
    Staged(KeptBytes),
}

impl Bytes {
    /// The `staged` bytes of a write of `data` if they are as many (the same bytes, where the
    /// shim copied them for the worker): what `of` may keep.
    pub(super) fn matching(data: &[u8], staged: Option<KeptBytes>) -> Option<KeptBytes> {
        staged.filter(|k| k.len() == data.len())
    }

    /// What to keep of a write of `data`: its `staged` bytes (`matching`) when it has them,
    /// else a copy.
    pub(super) fn of(data: &[u8], staged: Option<KeptBytes>) -> Self {
        match staged {
            Some(k) => Bytes::Staged(k),
            None => Bytes::Copy(copy_of(data)),
        }
    }

    pub(super) fn as_ptr(&self) -> *const u8 {
        match self {
            Bytes::Copy(v) => v.as_ptr(),
            Bytes::Staged(k) => k.as_ptr(),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Bytes::Copy(v) => v.len(),
            Bytes::Staged(k) => k.len(),
        }
    }

    /// The memory they hold, which the budget counts: a kept segment whole.
    pub(super) fn footprint(&self) -> usize {
        match self {
            Bytes::Copy(v) => v.len(),
            Bytes::Staged(k) => k.footprint(),
        }
    }

    /// What `Bytes::of(data, staged)` will hold, for the budget.
    pub(super) fn footprint_of(data: &[u8], staged: &Option<KeptBytes>) -> usize {
        staged.as_ref().map_or(data.len(), KeptBytes::footprint)
    }

    /// The journal's own copy (tests).
    #[cfg(test)]
    pub(super) fn copied(&self) -> Option<&[u8]> {
        match self {
            Bytes::Copy(v) => Some(v),
            Bytes::Staged(_) => None,
        }
    }
}

/// An unmap the journal hears of (`Journal::unmapping`): the mapping of `mem` at `ptr`, whether
/// it was for writing, whether it is a zero-copy buffer's own memory (`in_place`), and where its
/// bytes are, packed: `len` bytes at `packed` (`None`: not known, the object is lost), or kept
/// where they were staged (`staged`).
pub struct Unmapping {
    pub queue: ObjectId,
    pub mem: ObjectId,
    pub ptr: usize,
    pub write: bool,
    pub in_place: bool,
    pub packed: usize,
    pub len: Option<usize>,
    pub staged: Option<KeptBytes>,
}

/// How a journaled write went: its wait list and event, whether its data is in a zero-copy
/// buffer's memory already (`landed`: the shim copied it there itself), and its data where the
/// shim staged it for the worker (`staged`, kept instead of a copy).
pub struct WriteDone {
    pub sync: EnqueueSync,
    pub landed: bool,
    pub staged: Option<KeptBytes>,
}

/// A buffer's contents at the last checkpoint.
#[derive(Clone)]
pub(super) enum Base {
    /// Never written: any contents will do (OpenCL leaves them undefined).
    Undefined,
    Known(Arc<Bytes>),
    /// A zero-copy buffer's own memory holds them (`Recipe::view`): no journaled command
    /// uses the buffer, or only commands that write it idempotently (writes, fills, copies
    /// into it), so its memory as the dead worker left it, with those commands run again,
    /// is what it held. Before anything changes it while the journal uses it, or before a
    /// kernel may write it, its contents are copied out (`State::snapshot`).
    InPlace,
    /// Not known (over budget, or written where the shim cannot see): the buffer cannot be
    /// restored until a checkpoint reads it back.
    Lost,
}

impl Base {
    /// Makes `data` the known contents: its `staged` bytes if it has them, else a copy that
    /// overwrites the last one when that is as large (no new pages to fault in: a whole read
    /// or write of a large buffer costs one memory copy more).
    pub(super) fn set(&mut self, data: &[u8], staged: Option<KeptBytes>) {
        if staged.is_some() {
            *self = Base::Known(Arc::new(Bytes::of(data, staged)));
            return;
        }
        let in_place = match self {
            Base::Known(old) => match Arc::get_mut(old) {
                Some(Bytes::Copy(v)) if v.len() == data.len() => Some(v),
                _ => None,
            },
            _ => None,
        };
        match in_place {
            // SAFETY: `v` holds as many bytes as `data` (checked above); two distinct buffers.
            Some(v) => unsafe { cloister_ipc::copy::copy(v.as_mut_ptr(), data.as_ptr(), data.len()) },
            None => *self = Base::Known(Arc::new(Bytes::Copy(copy_of(data)))),
        }
    }
}

/// What rebuilds one object.
pub(super) struct Recipe {
    pub(super) req: Request,
    /// The application released it; still rebuilt while the journal may use it.
    pub(super) released: bool,
    /// A context's `pfn_notify` (function, user data, token).
    pub(super) notify: Option<(ContextNotifyFn, usize, u64)>,
    /// A program's build.
    pub(super) build: Option<BuildProgram>,
    /// A program's compilation (`clCompileProgram`, with its header programs).
    pub(super) compile: Option<CompileProgram>,
    /// A command buffer's recorded commands (every kernel argument with each NDRange), and
    /// whether it was finalized.
    pub(super) recorded: Vec<RecordCommand>,
    pub(super) finalized: bool,
    /// A buffer's contents.
    pub(super) base: Base,
    /// A zero-copy buffer's memory (a segment shared with the worker, which outlives it).
    pub(super) view: Option<SharedView>,
    /// A user event's status, once set.
    pub(super) status: Option<i32>,
}

impl Recipe {
    pub(super) fn new(req: Request) -> Self {
        Recipe {
            req,
            released: false,
            notify: None,
            build: None,
            compile: None,
            recorded: Vec::new(),
            finalized: false,
            base: Base::Undefined,
            view: None,
            status: None,
        }
    }

    /// The bytes of a buffer, or of an image packed without padding.
    pub(super) fn buffer_size(&self) -> Option<u64> {
        match &self.req {
            Request::CreateBuffer(b) => Some(b.size),
            Request::CreateImage(i) if i.desc.buffer.is_none() => {
                let [w, h, d] = image_box(&i.desc);
                let elem = cloister_ipc::image::element_size(i.format.0, i.format.1)?;
                w.checked_mul(elem)?.checked_mul(h)?.checked_mul(d)
            }
            _ => None,
        }
    }

    /// Kept once released: a context (what was made in it may live on), and a partition into
    /// sub-devices (named by its first one: the others may live on).
    pub(super) fn kept_released(&self) -> bool {
        matches!(self.req, Request::CreateContext(_) | Request::CreateContextFromType(_) | Request::CreateSubDevices(_))
    }

    /// The objects it needs made before it (`depends_on`), and a compilation's headers.
    pub(super) fn needs(&self) -> Vec<ObjectId> {
        let mut v = depends_on(&self.req);
        v.extend(self.compile.iter().flat_map(|c| c.headers.iter().map(|(h, _)| *h)));
        v.extend(self.recorded.iter().flat_map(recorded_uses));
        v
    }

    /// Whether it is a user event the application has not set (commands waiting on it wait
    /// until the application's next calls).
    pub(super) fn is_unset_user_event(&self) -> bool {
        matches!(self.req, Request::CreateUserEvent(_)) && self.status.is_none()
    }

    /// Whether it `needs` `id` (without collecting them).
    pub(super) fn needs_contains(&self, id: ObjectId) -> bool {
        any_dependency(&self.req, |d| d == id)
            || self.compile.iter().any(|c| c.headers.iter().any(|(h, _)| *h == id))
            || self.recorded.iter().any(|r| recorded_uses(r).contains(&id))
    }

    pub(super) fn base_bytes(&self) -> u64 {
        match &self.base {
            Base::Known(b) => b.footprint() as u64,
            _ => 0,
        }
    }
}

/// A command enqueued since the last checkpoint.
pub(super) enum Cmd {
    Write {
        queue: ObjectId,
        mem: ObjectId,
        offset: u64,
        data: Bytes,
        sync: EnqueueSync,
    },
    /// An NDRange (with every argument), a copy, a fill, a marker or a barrier.
    Enqueue(Request),
    /// A rectangular or image write (`req.data` is replaced by `data`, packed).
    Region {
        req: EnqueueRegionTransfer,
        data: Bytes,
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
    /// A command buffer run (its queues named, never empty), with the objects its recorded
    /// commands use and the memory objects they may write, as recorded.
    Batch {
        req: EnqueueCommandBuffer,
        uses: Vec<ObjectId>,
        writes: Vec<ObjectId>,
    },
}

impl Cmd {
    /// A non-blocking read's queue and memory object.
    pub(super) fn read_target(req: &Request) -> (ObjectId, ObjectId) {
        match req {
            Request::EnqueueReadBuffer(r) => (r.queue, r.mem),
            Request::EnqueueRegionTransfer(r) => (r.queue, r.mem),
            _ => (0, 0),
        }
    }

    pub(super) fn queue(&self) -> ObjectId {
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
            Cmd::Batch { req, .. } => req.queues.first().copied().unwrap_or(0),
            Cmd::Enqueue(_) => 0,
        }
    }

    pub(super) fn sync(&self) -> Option<&EnqueueSync> {
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
            Cmd::Batch { req, .. } => Some(&req.sync),
            Cmd::Read { .. } | Cmd::Enqueue(_) => None,
        }
    }

    pub(super) fn sync_mut(&mut self) -> Option<&mut EnqueueSync> {
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
            Cmd::Batch { req, .. } => Some(&mut req.sync),
            Cmd::Read { .. } | Cmd::Enqueue(_) => None,
        }
    }

    /// Every object it uses (queue, kernel, memory objects and samplers in its arguments).
    pub(super) fn uses(&self) -> Vec<ObjectId> {
        let mut v = Vec::new();
        self.any_use(|u| {
            v.push(u);
            false
        });
        v
    }

    /// Whether it uses an object `hit` picks (`uses`, without collecting them: the journal asks
    /// it of every command at each release and change).
    pub(super) fn any_use(&self, mut hit: impl FnMut(ObjectId) -> bool) -> bool {
        if hit(self.queue()) {
            return true;
        }
        match self {
            Cmd::Write { mem, .. } => hit(*mem),
            Cmd::Region { req, .. } => hit(req.mem),
            Cmd::Read { req, .. } => hit(Cmd::read_target(req).1),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => {
                hit(r.kernel) || r.args.iter().any(|(_, a)| matches!(a, ArgValue::Object(id) if hit(*id)))
            }
            Cmd::Enqueue(Request::EnqueueCopyBuffer(r)) => hit(r.src) || hit(r.dst),
            Cmd::Enqueue(Request::EnqueueFillBuffer(r)) => hit(r.mem),
            Cmd::Enqueue(Request::EnqueueCopyRegion(r)) => hit(r.src) || hit(r.dst),
            Cmd::Enqueue(Request::EnqueueFillImage(r)) => hit(r.mem),
            Cmd::Batch { req, uses, .. } => {
                req.queues.iter().any(|&q| hit(q)) || hit(req.buffer) || uses.iter().any(|&u| hit(u))
            }
            _ => false,
        }
    }

    /// What the application would call it (for `pfn_notify`).
    pub(super) fn describe(&self, recipes: &BTreeMap<ObjectId, Box<Recipe>>) -> String {
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
            Cmd::Batch { req, .. } => format!("clEnqueueCommandBufferKHR of command buffer #{}", req.buffer),
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
    /// A recipe's `base` changes to or from `Base::Lost` only through `insert_recipe`,
    /// `remove_recipe`, `set_base`, `superseded_by` and `checkpoint`, which keep `lost` in step.
    pub(super) recipes: BTreeMap<ObjectId, Box<Recipe>>,
    /// The recipes whose contents are lost (`Base::Lost`), kept beside `recipes` so that what
    /// `clFinish` and every blocking read ask (`settled`, `dirty_in_place_or`) does not walk
    /// every recipe: with 3 000 buffers that walk was about 90 000 instructions per `clFinish`.
    lost: BTreeSet<ObjectId>,
    /// Every object some recipe needs (`Recipe::needs`), so that a release asks the recipes
    /// only about those: with 20 000 buffers each release walked them all (67 us each). A
    /// superset: a removed recipe's needs stay until a checkpoint that drops released recipes
    /// gathers them again. Grows in `insert_recipe`, `compiled` and `command_recorded`.
    needed: FastSet<ObjectId>,
    pub(super) cmds: Vec<Cmd>,
    /// Memory the journal holds for known contents and write data (a kept segment counts whole),
    /// bounded by the budget.
    pub(super) bytes: u64,
    /// How many replacement workers each step has crashed.
    pub(super) attempts: HashMap<Step, u32>,
    /// Events of non-blocking reads and maps the worker's death cut short (their data never
    /// reached the application): they fail in the replacement.
    pub(super) unfinished: HashSet<ObjectId>,
    /// Mappings the application holds, by memory object and pointer, with what each covers.
    /// An object mapped when its worker dies is carried over with its mappings: their memory
    /// stays the application's until the unmap, which writes a writing map's bytes to the
    /// rebuilt object (`api::enqueue`).
    pub(super) open_maps: HashMap<(ObjectId, usize), Vec<MapArea>>,
    /// When the last checkpoint that read contents back ended, and how long it took.
    pub(super) last_read_back: Option<(Instant, Duration)>,
    /// Released objects kept since the last checkpoint (a checkpoint drops those no longer
    /// needed): while there are none, a checkpoint of a settled journal has nothing to do.
    pub(super) released_kept: usize,
    /// How long the copies of zero-copy buffers made since the last checkpoint took
    /// (`snapshot`), and when that checkpoint was: see `free_checkpoint_due`.
    pub(super) snapshots_took: Duration,
    pub(super) checkpointed_at: Option<Instant>,
    /// What a blocking call's checkpoint asks of the journal's commands, gathered as they come.
    pub(super) summary: Summary,
}

/// What `checkpoint_if_due` asks of every journaled command, gathered once per command: a
/// `clFinish` after each of N kernels asked it of all N again, quadratic in a long journal (a
/// 64 MiB zero-copy buffer's copy spaces free checkpoints by 0.2 s, thousands of kernels).
#[derive(Default)]
pub(super) struct Summary {
    /// How many of the journal's first commands it covers (`State::summarize`).
    upto: usize,
    /// The queues those commands were on.
    queues: QueueUse,
    /// What they may write that is not zero-copy (`State::in_place`).
    staged_writes: BTreeSet<ObjectId>,
    /// How many of the journal's first commands `used` covers: gathered only when asked (a
    /// release, a change of a zero-copy buffer, `State::uses`), not at every `clFinish`.
    uses_upto: usize,
    /// The objects those commands use, and the memory (`State::storage`) of each.
    used: FastSet<ObjectId>,
}

#[derive(Default, PartialEq, Eq, Clone, Copy)]
enum QueueUse {
    #[default]
    None,
    One(ObjectId),
    Many,
}

/// The recovery record of one worker's objects (empty unless replay mode is on).
#[derive(Default)]
pub struct Journal {
    state: Mutex<State>,
}

impl Journal {
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
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
        self.with(|s| s.insert_recipe(id, Recipe::new(req)));
    }

    /// A context was created with a `pfn_notify`.
    pub fn context_notify(&self, context: ObjectId, pfn: ContextNotifyFn, user_data: usize, token: u64) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&context) {
                r.notify = Some((pfn, user_data, token));
            }
        });
    }

    /// A buffer was created; `initial` is its `CL_MEM_COPY_HOST_PTR`/`USE_HOST_PTR` data,
    /// `view` a zero-copy buffer's memory (which holds that data already: nothing is copied).
    pub fn buffer(&self, req: CreateBuffer, initial: Option<&[u8]>, view: Option<SharedView>) {
        self.memory(Request::CreateBuffer(req), initial, view);
    }

    /// An image was created (`req.desc` without pitches, unless it is made from a buffer);
    /// `initial` is its host data, packed. An image made from a buffer has no contents of its
    /// own: they are its buffer's (`State::storage`).
    pub fn image(&self, req: CreateImage, initial: Option<&[u8]>) {
        self.memory(Request::CreateImage(req), initial, None);
    }

    pub(super) fn memory(&self, req: Request, initial: Option<&[u8]>, view: Option<SharedView>) {
        let Some(id) = created_id(&req) else { return };
        self.with(|s| {
            let mut r = Recipe::new(req);
            r.base = match initial {
                // Its memory holds the initial data already. Without any, its contents stay
                // undefined (no copy-out before a kernel writes it) until a change lands there
                // or a checkpoint.
                Some(_) if view.is_some() => Base::InPlace,
                None => Base::Undefined,
                Some(d) if s.bytes + d.len() as u64 <= budget() => {
                    s.bytes += d.len() as u64;
                    Base::Known(Arc::new(Bytes::Copy(copy_of(d))))
                }
                Some(_) => Base::Lost,
            };
            r.view = view;
            s.insert_recipe(id, r);
        });
    }

    /// The application (`idempotent`: a write, a fill, a copy into it, a map for writing) or
    /// a kernel or command buffer is about to change `mem`'s memory: a zero-copy buffer whose
    /// contents are in place is copied out first if the journal needs what it holds now (see
    /// `Base::InPlace`).
    pub fn changing(&self, mem: ObjectId, idempotent: bool) {
        self.with(|s| s.changing(mem, idempotent));
    }

    /// As `changing`, for every memory object `req` (an enqueue going to the worker) may write.
    pub fn enqueuing(&self, req: &Request) {
        self.with(|s| {
            let idempotent = !matches!(req, Request::EnqueueNdRange(_) | Request::EnqueueCommandBuffer(_));
            let writes = match req {
                Request::EnqueueCommandBuffer(b) => s.batch_writes(b.buffer),
                _ => s.request_writes(req),
            };
            for m in writes {
                s.changing(m, idempotent);
            }
        });
    }

    /// As `enqueuing`, for a kernel whose arguments name the objects `each_object` visits:
    /// every memory object it may write. Before the enqueue is posted, so nothing here is
    /// allocated, and an object's recipe is looked up once (`changing_if_written`; a sub-buffer's
    /// parent once more, and memory in place once more where it is copied out).
    pub fn enqueuing_kernel(&self, each_object: impl FnOnce(&mut dyn FnMut(ObjectId))) {
        self.with(|s| each_object(&mut |id| s.changing_if_written(id)));
    }

    /// A program was compiled (successfully or not: the replacement compiles it the same way).
    pub fn compiled(&self, req: CompileProgram) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&req.program) {
                s.needed.extend(req.headers.iter().map(|(h, _)| *h));
                r.compile = Some(CompileProgram { notify: None, ..req });
            }
        });
    }

    /// A command was recorded into a command buffer (`req.command`'s NDRange with all of the
    /// kernel's arguments).
    pub fn command_recorded(&self, req: RecordCommand) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&req.buffer) {
                s.needed.extend(recorded_uses(&req));
                r.recorded.push(req);
            }
        });
    }

    /// A command buffer was finalized.
    pub fn command_buffer_finalized(&self, buffer: ObjectId) {
        self.with(|s| {
            if let Some(r) = s.recipes.get_mut(&buffer) {
                r.finalized = true;
            }
        });
    }

    /// Kernel `id` is a clone of `source`: recorded as made the way `source` was, by name.
    pub fn cloned(&self, id: ObjectId, source: ObjectId) {
        self.with(|s| {
            if let Some(Request::CreateKernel(k)) = s.recipes.get(&source).map(|r| &r.req) {
                let req = Request::CreateKernel(CreateKernel { id, ..k.clone() });
                s.insert_recipe(id, Recipe::new(req));
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
            debug_assert!(s.needed_in_step(), "State::needed misses a recipe's need");
            let in_use = s.uses(id)
                || (s.needed.contains(&id) && s.recipes.iter().any(|(&other, r)| other != id && r.needs_contains(id)));
            match s.recipes.get(&id) {
                Some(r) if !in_use && !r.kept_released() => {
                    s.bytes = s.bytes.saturating_sub(r.base_bytes());
                    s.remove_recipe(id);
                }
                Some(_) => {
                    if let Some(r) = s.recipes.get_mut(&id) {
                        s.released_kept += usize::from(!r.released);
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

    /// `mem` was mapped at `ptr`, covering `area`.
    pub fn mapped(&self, mem: ObjectId, ptr: usize, area: MapArea) {
        self.with(|s| s.open_maps.entry((mem, ptr)).or_default().push(area));
    }

    /// The application unmaps a mapping (before the unmap goes to the worker). A writing map
    /// becomes a journaled write of what the mapping holds now (what the object holds after
    /// the unmap): a buffer's bytes, an image's box as a region write of its packed rows.
    ///
    /// # Safety
    /// `unmap.packed` holds `unmap.len` bytes of the application's live mapping recorded by
    /// `mapped`, valid until this unmap.
    pub unsafe fn unmapping(&self, unmap: Unmapping, sync: &EnqueueSync) {
        let Unmapping { queue, mem, ptr, write, in_place, packed, len, staged } = unmap;
        self.with(|s| {
            let Some(list) = s.open_maps.get_mut(&(mem, ptr)) else { return };
            let Some(area) = list.pop() else { return };
            if list.is_empty() {
                s.open_maps.remove(&(mem, ptr));
            }
            if !write {
                return;
            }
            // A zero-copy buffer's mapping is its memory: what the application wrote there is
            // in place.
            if in_place && matches!(area, MapArea::Buffer { .. }) && s.lands_in_place(mem) {
                return;
            }
            let Some(len) = len else { return s.lose(mem) };
            s.changing(mem, true);
            // SAFETY: per the caller, `packed` holds `len` bytes of the live mapping.
            let data = unsafe { std::slice::from_raw_parts(packed as *const u8, len) };
            let staged = Bytes::matching(data, staged);
            match area {
                MapArea::Buffer { offset, .. } => s.write(queue, mem, offset, data, staged, sync.clone()),
                MapArea::Image { origin, region } => {
                    let req = EnqueueRegionTransfer {
                        queue,
                        mem,
                        write: true,
                        blocking: true,
                        target: RegionTarget::Image { origin },
                        region,
                        data: DataRef::Lane { offset: 0, len: 0 },
                        sync: sync.clone(),
                    };
                    let cost = Bytes::footprint_of(data, &staged);
                    s.push_write(mem, cost, || Cmd::Region { req, data: Bytes::of(data, staged) });
                }
            }
        });
    }

    /// A buffer was written with `data` at `offset` (`WriteDone` says how).
    pub fn wrote(&self, queue: ObjectId, mem: ObjectId, offset: u64, data: &[u8], write: WriteDone) {
        self.with(|s| {
            if !(write.landed && s.lands_in_place(mem)) {
                s.write(queue, mem, offset, data, write.staged, write.sync)
            }
        });
    }

    /// A rectangular or image write went to the worker, packed: where the shim staged it
    /// (`staged`, kept instead of copied, and the only place holding the bytes of reads under way
    /// at the call that fill its rows), else `packed()`'s copy of the application's rows.
    pub fn wrote_region(
        &self,
        req: EnqueueRegionTransfer,
        staged: Option<KeptBytes>,
        packed: impl FnOnce() -> Vec<u8>,
    ) {
        let data = match staged {
            Some(k) => Bytes::Staged(k),
            None => Bytes::Copy(packed()),
        };
        self.with(|s| s.push_write(req.mem, data.footprint(), || Cmd::Region { req, data }));
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
            Request::EnqueueMapBuffer(r) if crate::handle::map_writes(r.flags) => s.lose(r.mem),
            Request::EnqueueCommandBuffer(req) => s.batch(req),
            _ => {}
        });
    }

    /// After the application's blocking read of `data` from `mem` at `offset`: a checkpoint if
    /// it is cheap (see the module's doc).
    pub fn read(&self, conn: &Conn, queue: ObjectId, mem: ObjectId, offset: u64, data: &[u8]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let whole = offset == 0 && s.recipes.get(&mem).and_then(|r| r.buffer_size()) == Some(data.len() as u64);
        // Nothing to learn from a read of contents the journal holds already (in place, or
        // known with nothing journaled since), nor, with nothing journaled and nothing to drop,
        // from a read of part of a buffer: no checkpoint's bookkeeping on every read.
        if s.settled() && (s.in_place_unused(mem) || s.known(mem) || (!whole && s.released_kept == 0)) {
            return;
        }
        s.checkpoint_if_due(conn, queue, whole.then_some((mem, data)));
    }

    /// Before `clFinish`'s call goes to the worker: the summary `finished` asks is brought up to
    /// date while the worker still runs the commands, not after its reply.
    pub fn finishing(&self) {
        self.with(|s| {
            if !s.settled() {
                s.summarize();
            }
        });
    }

    /// After `clFinish` of `queue`: a checkpoint once the journal is long (its read-back then
    /// costs the application one round trip per `LONG_JOURNAL` commands at most, not per
    /// `clFinish`; see `State::read_back_due`).
    pub fn finished(&self, conn: &Conn, queue: ObjectId) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.settled() {
            return;
        }
        s.checkpoint_if_due(conn, queue, None);
    }
}

impl State {
    /// After a blocking call on `queue` returned (a blocking read, which gave `have` when it
    /// read a whole buffer, or `clFinish`): a checkpoint that reads nothing back where every
    /// command is complete and what they wrote is known (`have`) or in place, if one is due;
    /// else one that reads back, if that is due.
    fn checkpoint_if_due(&mut self, conn: &Conn, queue: ObjectId, have: Option<(ObjectId, &[u8])>) {
        self.summarize();
        if self.complete(queue) && self.dirty_in_place_or(have.map(|(h, _)| h)) {
            if self.free_checkpoint_due() {
                self.checkpoint(conn, queue, have, false);
            }
        } else if self.read_back_due() {
            self.checkpoint(conn, queue, have, true);
        }
    }

    /// Journals a run of a command buffer: with what its commands use and may write, or, for a
    /// buffer replay does not know, by losing every buffer's contents until a checkpoint.
    fn batch(&mut self, mut req: EnqueueCommandBuffer) {
        let Some(r) = self.recipes.get(&req.buffer) else {
            let ids: Vec<ObjectId> = self.recipes.keys().copied().collect();
            ids.into_iter().for_each(|id| self.lose(id));
            return;
        };
        if req.queues.is_empty() {
            // Its own queues: named, so the run is on the same ones.
            if let Request::CreateCommandBuffer(c) = &r.req {
                req.queues = c.queues.clone();
            }
        }
        let uses: Vec<ObjectId> = r.recorded.iter().flat_map(recorded_uses).collect();
        let writes = self.batch_writes(req.buffer);
        if self.cmds.len() >= MAX_JOURNAL {
            self.give_up_journal();
        }
        self.cmds.push(Cmd::Batch { req, uses, writes });
    }

    /// The memory objects command buffer `buffer`'s recorded commands may write.
    fn batch_writes(&self, buffer: ObjectId) -> Vec<ObjectId> {
        let Some(r) = self.recipes.get(&buffer) else { return Vec::new() };
        r.recorded
            .iter()
            .flat_map(|c| match &c.command {
                RecordedCommand::CopyBuffer { dst, .. } | RecordedCommand::CopyRegion { dst, .. } => vec![*dst],
                RecordedCommand::FillBuffer { mem, .. } | RecordedCommand::FillImage { mem, .. } => vec![*mem],
                RecordedCommand::NdRange { args, .. } => self.args_written(args),
                RecordedCommand::Barrier => Vec::new(),
            })
            .collect()
    }

    /// Whether a journaled command uses `id`, or memory whose storage is `id`. Asks the
    /// summary's index of uses, brought up to the journal's end first: a release or a change
    /// asked every command before, quadratic in releases after a long stream of commands.
    pub(super) fn uses(&mut self, id: ObjectId) -> bool {
        if self.summary.upto > self.cmds.len() || self.summary.uses_upto > self.cmds.len() {
            self.commands_dropped();
        }
        let mut used = std::mem::take(&mut self.summary.used);
        for c in &self.cmds[self.summary.uses_upto..] {
            c.any_use(|u| {
                used.insert(u);
                used.insert(self.storage(u));
                false
            });
        }
        self.summary.used = used;
        self.summary.uses_upto = self.cmds.len();
        let used = self.summary.used.contains(&id);
        debug_assert_eq!(
            used,
            self.cmds.iter().any(|c| c.any_use(|u| u == id || self.storage(u) == id)),
            "the journal's index of uses is out of step for #{id}"
        );
        used
    }

    /// Whether a checkpoint that reads contents back is due at a blocking read or `clFinish`:
    /// the journal is long (`LONG_JOURNAL` commands, or half the budget) and the last read-back
    /// was long enough ago (`READ_BACK_SPACING`), or the journal nears its limits, where it
    /// would be given up or its writes lost; and no command waits on a user event not set.
    pub(super) fn read_back_due(&self) -> bool {
        // Lost contents are read back as soon as before: a crash meanwhile would lose them.
        let per_recipes = if self.lost.is_empty() { self.commands_per_recipe_walk() } else { 0 };
        let long = self.cmds.len() >= LONG_JOURNAL.max(per_recipes) || self.bytes > budget() / 2;
        let spaced = |(end, took): (Instant, Duration)| end.elapsed() >= took * READ_BACK_SPACING;
        long && (self.near_limits() || self.last_read_back.is_none_or(spaced)) && !self.held_by_user_event()
    }

    /// Whether the journal nears its limits, where it would be given up or its writes lost.
    fn near_limits(&self) -> bool {
        self.cmds.len() >= MAX_JOURNAL / 2 || self.bytes > budget() / 4 * 3
    }

    /// Whether a checkpoint that reads nothing back (every buffer written is zero-copy, its
    /// memory holds its contents) is worth taking now. It costs nothing itself, but makes the
    /// next kernel that writes such a buffer copy it out first (`snapshot`): a loop of a kernel
    /// rewriting a 64 MiB buffer and `clFinish` paid a 64 MiB copy per iteration, ten times
    /// the kernel. So these copies are spaced as read-backs are (`READ_BACK_SPACING`: about
    /// 5% of the application's time at most); meanwhile the journal keeps the commands, and a
    /// replay runs them again from the last copy. Near the journal's limits it is taken anyway.
    /// Nor before the journal holds `FREE_CHECKPOINT_MIN` commands, or one per
    /// `RECIPES_PER_CHECKPOINT_COMMAND` recipes.
    pub(super) fn free_checkpoint_due(&self) -> bool {
        let spaced = |at: Instant| at.elapsed() >= self.snapshots_took * READ_BACK_SPACING;
        let long = self.cmds.len() >= FREE_CHECKPOINT_MIN.max(self.commands_per_recipe_walk());
        self.near_limits() || (long && self.checkpointed_at.is_none_or(spaced))
    }

    /// The journaled commands a checkpoint waits for at least, as it walks every recipe
    /// (`RECIPES_PER_CHECKPOINT_COMMAND`).
    fn commands_per_recipe_walk(&self) -> usize {
        self.recipes.len() / RECIPES_PER_CHECKPOINT_COMMAND
    }

    /// Whether a journaled command waits on a user event the application has not set: a
    /// read-back, which finishes the queues, would wait for ever (the application sets it
    /// later on this thread).
    fn held_by_user_event(&self) -> bool {
        let unset = |id: &ObjectId| self.recipes.get(id).is_some_and(|r| r.is_unset_user_event());
        self.cmds.iter().any(|c| c.sync().is_some_and(|s| s.wait.iter().any(unset)))
    }

    /// Whether `mem`'s contents (its storage's) are known (a copy, or staged bytes).
    fn known(&self, mem: ObjectId) -> bool {
        self.recipes.get(&self.storage(mem)).is_some_and(|r| matches!(r.base, Base::Known(_)))
    }

    /// Whether `mem`'s contents are in place and no journaled command uses them: a change that
    /// lands in its memory at once needs no record.
    pub(super) fn in_place_unused(&mut self, mem: ObjectId) -> bool {
        let mem = self.storage(mem);
        self.recipes.get(&mem).is_some_and(|r| matches!(r.base, Base::InPlace)) && !self.uses(mem)
    }

    /// For a change that has landed in `mem`'s memory (the shim copied it there itself):
    /// whether that memory holds its contents from now, with no record needed (a zero-copy
    /// buffer in place or never written, that no journaled command uses). It is in place then.
    pub(super) fn lands_in_place(&mut self, mem: ObjectId) -> bool {
        let mem = self.storage(mem);
        let used = self.uses(mem);
        match self.recipes.get_mut(&mem) {
            Some(r) if r.view.is_some() && !used && matches!(r.base, Base::InPlace | Base::Undefined) => {
                r.base = Base::InPlace;
                true
            }
            _ => false,
        }
    }

    /// See `Journal::changing`.
    fn changing(&mut self, mem: ObjectId, idempotent: bool) {
        let storage = self.recipes.get(&mem).map(|r| self.storage_in_place(mem, r));
        self.snapshot_if_in_place(storage, idempotent);
    }

    /// `changing` (not idempotent) for a kernel argument naming object `id`, if it is a memory
    /// object the kernel may write (`kernel_may_write`): its recipe is looked up once.
    fn changing_if_written(&mut self, id: ObjectId) {
        let storage = self.recipes.get(&id).filter(|r| kernel_may_write(&r.req)).map(|r| self.storage_in_place(id, r));
        self.snapshot_if_in_place(storage, false);
    }

    /// `storage` of `mem`, whose recipe is `r`, found with no second lookup of `r`, and whether
    /// that memory holds its contents in place (`Base::InPlace`).
    fn storage_in_place(&self, mem: ObjectId, r: &Recipe) -> (ObjectId, bool) {
        match storage_of(&r.req) {
            None => (mem, matches!(r.base, Base::InPlace)),
            Some(parent) => (parent, self.recipes.get(&parent).is_some_and(|p| matches!(p.base, Base::InPlace))),
        }
    }

    /// The tail of `changing`: a command about to change in-place memory (`storage_in_place`)
    /// copies it out first, unless it writes idempotently and no journaled command uses it.
    fn snapshot_if_in_place(&mut self, storage: Option<(ObjectId, bool)>, idempotent: bool) {
        if let Some((mem, true)) = storage {
            if !idempotent || self.uses(mem) {
                self.snapshot(mem);
            }
        }
    }

    /// Copies a zero-copy buffer's contents out of its memory: they become the checkpoint's
    /// (or the buffer is lost if they do not fit the budget).
    fn snapshot(&mut self, mem: ObjectId) {
        let budget = budget();
        let Some(r) = self.recipes.get_mut(&mem) else { return };
        let Some(at) = r.view.as_ref().and_then(|v| v.at(0, v.len)) else { return };
        let len = r.view.as_ref().map_or(0, |v| v.len);
        if self.bytes + len as u64 > budget {
            self.set_base(mem, Base::Lost);
            return;
        }
        let started = Instant::now();
        // SAFETY: `at` is the buffer's `len` bytes of shared memory (checked by `at`), mapped
        // while the recipe holds the view. The worker may write them meanwhile (the copy is then
        // of a command's half-done work only where that command writes idempotently, and it
        // runs again).
        let copy = unsafe { copy_from(at.cast_const(), len) };
        self.set_base(mem, Base::Known(Arc::new(Bytes::Copy(copy))));
        self.bytes += len as u64;
        self.snapshots_took += started.elapsed();
    }

    /// Journals a write of `data` into buffer `mem` at `offset` (or makes it the checkpoint's
    /// contents, `superseded_by`).
    pub(super) fn write(
        &mut self,
        queue: ObjectId,
        mem: ObjectId,
        offset: u64,
        data: &[u8],
        staged: Option<KeptBytes>,
        sync: EnqueueSync,
    ) {
        let staged = Bytes::matching(data, staged);
        if let Err(staged) = self.superseded_by(mem, offset, data, staged) {
            let cost = Bytes::footprint_of(data, &staged);
            self.push_write(mem, cost, || Cmd::Write { queue, mem, offset, data: Bytes::of(data, staged), sync })
        }
    }

    /// A write of all of buffer `mem` that nothing in the journal needs the old contents of
    /// (the journal only writes it, with writes and fills): its data becomes the checkpoint's
    /// contents of `mem` (its `staged` bytes, or a copy over the last one when it is as large: no
    /// allocation), and the earlier writes of `mem` go. Gives `staged` back if it did not.
    pub(super) fn superseded_by(
        &mut self,
        mem: ObjectId,
        offset: u64,
        data: &[u8],
        staged: Option<KeptBytes>,
    ) -> Result<(), Option<KeptBytes>> {
        let whole = offset == 0
            && self.storage(mem) == mem
            && self.recipes.get(&mem).and_then(|r| r.buffer_size()) == Some(data.len() as u64);
        let only_written = |c: &Cmd| match c {
            Cmd::Write { mem: m, .. } => self.storage(*m) == mem,
            Cmd::Enqueue(Request::EnqueueFillBuffer(f)) => self.storage(f.mem) == mem,
            _ => false,
        };
        let untouched = |c: &Cmd| !c.any_use(|u| self.storage(u) == mem);
        if !whole || !self.cmds.iter().all(|c| only_written(c) || untouched(c)) {
            return Err(staged);
        }
        let kept_bytes = |c: &Cmd| match c {
            Cmd::Write { data, .. } | Cmd::Region { data, .. } => data.footprint() as u64,
            Cmd::Read { .. } | Cmd::Enqueue(_) | Cmd::Batch { .. } => 0,
        };
        let before = self.recipes.get(&mem).map_or(0, |r| r.base_bytes());
        let freed: u64 = self.cmds.iter().filter(|c| only_written(c)).map(kept_bytes).sum();
        let after = self.bytes.saturating_sub(before + freed) + Bytes::footprint_of(data, &staged) as u64;
        if after > budget() {
            return Err(staged);
        }
        let gone: Vec<bool> = self.cmds.iter().map(only_written).collect();
        let mut i = 0;
        self.cmds.retain(|_| {
            i += 1;
            !gone[i - 1]
        });
        self.commands_dropped();
        let Some(r) = self.recipes.get_mut(&mem) else { return Err(None) };
        r.base.set(data, staged);
        // Known from now, whatever it was.
        self.lost.remove(&mem);
        self.bytes = after;
        Ok(())
    }

    /// Journals a write into `mem` whose data holds `len` bytes of memory, or loses `mem` if
    /// that does not fit the budget.
    pub(super) fn push_write(&mut self, mem: ObjectId, len: usize, cmd: impl FnOnce() -> Cmd) {
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
    pub(super) fn give_up_journal(&mut self) {
        for m in self.dirty() {
            self.lose(m);
        }
        self.cmds.clear();
        self.commands_dropped();
        self.bytes = self.recipes.values().map(|r| r.base_bytes()).sum();
    }

    /// The recipes a rebuild needs once the journal is empty: the objects the application has
    /// not released, every context, and what those need, transitively.
    pub(super) fn needed(&self) -> HashSet<ObjectId> {
        let mut keep: HashSet<ObjectId> =
            self.recipes.iter().filter(|(_, r)| !r.released || r.kept_released()).map(|(id, _)| *id).collect();
        let mut todo: Vec<ObjectId> = keep.iter().copied().collect();
        while let Some(id) = todo.pop() {
            for n in self.recipes.get(&id).map(|r| r.needs()).unwrap_or_default() {
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
    pub(super) fn lose(&mut self, mem: ObjectId) {
        let mem = self.storage(mem);
        if let Some(r) = self.recipes.get(&mem).filter(|r| r.buffer_size().is_some()) {
            self.bytes = self.bytes.saturating_sub(r.base_bytes());
            self.set_base(mem, Base::Lost);
        }
    }

    /// Whether a checkpoint would change nothing: the journal is empty and no contents are
    /// lost (checked without allocating: the application's blocking reads and `clFinish` ask).
    fn settled(&self) -> bool {
        debug_assert!(self.lost_in_step(), "State::lost out of step with the recipes");
        self.cmds.is_empty() && self.lost.is_empty()
    }

    /// Adds (or replaces) the recipe of `id`.
    pub(super) fn insert_recipe(&mut self, id: ObjectId, r: Recipe) {
        self.needed.extend(r.needs());
        match r.base {
            Base::Lost => self.lost.insert(id),
            _ => self.lost.remove(&id),
        };
        self.recipes.insert(id, Box::new(r));
    }

    fn remove_recipe(&mut self, id: ObjectId) {
        self.lost.remove(&id);
        self.recipes.remove(&id);
    }

    /// Sets what `mem`'s contents are, if it has a recipe.
    pub(super) fn set_base(&mut self, mem: ObjectId, base: Base) {
        let Some(r) = self.recipes.get_mut(&mem) else { return };
        match base {
            Base::Lost => self.lost.insert(mem),
            _ => self.lost.remove(&mem),
        };
        r.base = base;
    }

    /// The recipes whose contents are lost, found by walking them all (`lost` indexes them).
    fn walk_lost(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.recipes.iter().filter(|(_, r)| matches!(r.base, Base::Lost)).map(|(&id, _)| id)
    }

    /// `lost` gathered again from the recipes, after a change of many (a checkpoint).
    fn gather_lost(&mut self) {
        self.lost = self.walk_lost().collect();
    }

    /// Whether `needed` holds every recipe's needs (checked in debug builds).
    fn needed_in_step(&self) -> bool {
        self.recipes.values().all(|r| r.needs().iter().all(|n| self.needed.contains(n)))
    }

    /// Whether `lost` names exactly the recipes whose contents are lost (checked in debug
    /// builds: the whole test suite then checks every path that changes a recipe).
    fn lost_in_step(&self) -> bool {
        self.lost.iter().copied().eq(self.walk_lost())
    }

    /// Brings `summary` up to the journal's end. Appending commands needs nothing else; a
    /// change that drops some must call `commands_dropped`.
    pub(super) fn summarize(&mut self) {
        if self.summary.upto > self.cmds.len() {
            self.commands_dropped();
        }
        let mut sum = std::mem::take(&mut self.summary);
        for c in &self.cmds[sum.upto..] {
            sum.queues = match sum.queues {
                QueueUse::None => QueueUse::One(c.queue()),
                QueueUse::One(q) if q == c.queue() => QueueUse::One(q),
                _ => QueueUse::Many,
            };
            let _ = self.each_write(c, &mut |m| {
                if !self.in_place(m) {
                    sum.staged_writes.insert(m);
                }
                ControlFlow::Continue(())
            });
        }
        sum.upto = self.cmds.len();
        self.summary = sum;
    }

    /// The journal lost commands (not only gained some): its summary is gathered again.
    pub(super) fn commands_dropped(&mut self) {
        self.summary = Summary::default();
    }

    /// Whether every journaled command is complete once a blocking call on `queue` returned:
    /// all were on `queue`, an in-order queue. Asks `summary`, brought up to date first.
    fn complete(&self, queue: ObjectId) -> bool {
        self.cmds.is_empty() || (!self.out_of_order(queue) && self.summary.queues == QueueUse::One(queue))
    }

    /// Whether every buffer the journal's commands may write, and every buffer lost, is
    /// zero-copy or `have`: then a checkpoint needs to read nothing back. Asks `summary`,
    /// brought up to date first.
    fn dirty_in_place_or(&self, have: Option<ObjectId>) -> bool {
        debug_assert!(self.lost_in_step(), "State::lost out of step with the recipes");
        self.summary.staged_writes.iter().all(|&m| Some(m) == have)
            && self.lost.iter().all(|&m| Some(m) == have || self.in_place(m))
    }

    /// Whether `mem` is a zero-copy buffer: once every command is complete, its memory holds
    /// its contents (a checkpoint of it costs nothing).
    fn in_place(&self, mem: ObjectId) -> bool {
        self.recipes.get(&mem).is_some_and(|r| r.view.is_some())
    }

    pub(super) fn out_of_order(&self, queue: ObjectId) -> bool {
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

    /// Visits the buffers the journal's commands may write, and those whose contents are lost
    /// (a buffer may come more than once), until `f` breaks. Nothing is allocated: a `clFinish`
    /// or blocking read asks on every call, about every command journaled since the last
    /// checkpoint.
    fn each_dirty(&self, f: &mut impl FnMut(ObjectId) -> ControlFlow<()>) -> ControlFlow<()> {
        for c in &self.cmds {
            self.each_write(c, f)?;
        }
        self.lost.iter().try_for_each(|&id| f(id))
    }

    /// Buffers the journal's commands may write, and those whose contents are lost.
    pub(super) fn dirty(&self) -> BTreeSet<ObjectId> {
        let mut dirty = BTreeSet::new();
        let _ = self.each_dirty(&mut |m| {
            dirty.insert(m);
            ControlFlow::Continue(())
        });
        dirty
    }

    /// The buffer whose memory `mem` is: a sub-buffer's parent, else itself.
    pub(super) fn storage(&self, mem: ObjectId) -> ObjectId {
        self.recipes.get(&mem).and_then(|r| storage_of(&r.req)).unwrap_or(mem)
    }

    /// The buffers whose contents a command may change (a kernel: every buffer argument not
    /// read-only; a sub-buffer's writes change its parent).
    pub(super) fn writes(&self, cmd: &Cmd) -> Vec<ObjectId> {
        let mut writes = Vec::new();
        let _ = self.each_write(cmd, &mut |m| {
            writes.push(m);
            ControlFlow::Continue(())
        });
        writes
    }

    /// Visits what `writes` lists, until `f` breaks, without allocating.
    fn each_write(&self, cmd: &Cmd, f: &mut impl FnMut(ObjectId) -> ControlFlow<()>) -> ControlFlow<()> {
        let mut visit = |m: ObjectId| f(self.storage(m));
        match cmd {
            Cmd::Write { mem, .. } => visit(*mem),
            Cmd::Region { req, .. } => visit(req.mem),
            Cmd::Read { .. } => ControlFlow::Continue(()),
            Cmd::Enqueue(Request::EnqueueNdRange(r)) => {
                r.args.iter().filter_map(|(_, a)| self.written_arg(a)).try_for_each(visit)
            }
            Cmd::Enqueue(req) => self.request_writes(req).into_iter().try_for_each(visit),
            Cmd::Batch { writes, .. } => writes.iter().try_for_each(|m| visit(*m)),
        }
    }

    /// The memory objects an enqueue going to the worker may write (as named, not their
    /// storage).
    fn request_writes(&self, req: &Request) -> Vec<ObjectId> {
        match req {
            Request::EnqueueNdRange(r) => self.args_written(&r.args),
            Request::EnqueueCopyBuffer(r) => vec![r.dst],
            Request::EnqueueFillBuffer(r) => vec![r.mem],
            Request::EnqueueCopyRegion(r) => vec![r.dst],
            Request::EnqueueFillImage(r) => vec![r.mem],
            _ => Vec::new(),
        }
    }

    /// A kernel's memory arguments that are not read-only: every one may be written.
    fn args_written(&self, args: &[(u32, ArgValue)]) -> Vec<ObjectId> {
        args.iter().filter_map(|(_, a)| self.written_arg(a)).collect()
    }

    /// The memory object a kernel argument names, if it is not read-only (so may be written).
    fn written_arg(&self, arg: &ArgValue) -> Option<ObjectId> {
        let ArgValue::Object(id) = arg else { return None };
        self.recipes.get(id).is_some_and(|r| kernel_may_write(&r.req)).then_some(*id)
    }

    /// Makes the contents of every buffer known now and drops the journal: `have` is a whole
    /// buffer the application just read; with `read_back`, the other written ones are read
    /// from the worker (after every queue the journal used is finished). Nothing changes if
    /// that fails or does not fit the budget.
    pub(super) fn checkpoint(
        &mut self,
        conn: &Conn,
        queue: ObjectId,
        have: Option<(ObjectId, &[u8])>,
        read_back: bool,
    ) {
        // What the application read is not copied for a zero-copy buffer (its memory holds its
        // contents once the commands are complete), nor for one whose contents are known and
        // that nothing wrote since (the read gave them again).
        let dirty = self.dirty();
        let have = have.filter(|(h, _)| {
            !self.in_place(*h)
                && (dirty.contains(h) || !self.recipes.get(h).is_some_and(|r| matches!(r.base, Base::Known(_))))
        });
        let is_have = |id: ObjectId| have.is_some_and(|(h, _)| h == id);
        let missing: BTreeSet<ObjectId> = dirty
            .into_iter()
            .filter(|m| !is_have(*m) && !self.in_place(*m) && self.recipes.get(m).is_some_and(|r| !r.released))
            .collect();
        if !missing.is_empty() && !read_back {
            return;
        }
        let kept: u64 = self
            .recipes
            .iter()
            .filter(|(id, r)| !missing.contains(id) && !is_have(**id) && !r.released && r.view.is_none())
            .map(|(_, r)| r.base_bytes())
            .sum();
        let new: u64 = missing.iter().filter_map(|m| self.recipes.get(m)?.buffer_size()).sum::<u64>()
            + have.map_or(0, |(_, d)| d.len() as u64);
        if kept + new > budget() {
            return;
        }
        let mut fresh: Vec<(ObjectId, Bytes)> = Vec::new();
        let started = read_back.then(Instant::now);
        if read_back {
            let queues: BTreeSet<ObjectId> = self.cmds.iter().map(Cmd::queue).chain([queue]).collect();
            for q in queues {
                if !matches!(conn.call(FlushOrFinish { queue: q, finish: true }), Ok(CL_SUCCESS)) {
                    return;
                }
            }
            let items: Vec<ReadBackItem> = missing
                .iter()
                .filter_map(|&mem| {
                    let r = self.recipes.get(&mem)?;
                    let image = match &r.req {
                        Request::CreateImage(i) => Some(image_box(&i.desc)),
                        _ => None,
                    };
                    Some(ReadBackItem { mem, size: r.buffer_size()? as usize, image })
                })
                .collect();
            match read_back_items(conn, queue, &items) {
                Some(read) => fresh = read,
                None => return,
            }
        }
        if let Some(started) = started {
            self.last_read_back = Some((Instant::now(), started.elapsed()));
        }
        self.cmds.clear();
        self.commands_dropped();
        self.attempts.clear();
        self.snapshots_took = Duration::ZERO;
        self.checkpointed_at = Some(Instant::now());
        if self.released_kept > 0 {
            let keep = self.needed();
            self.recipes.retain(|id, _| keep.contains(id));
            self.released_kept = self.recipes.values().filter(|r| r.released).count();
            // Only here can it shrink: the recipes' needs are gathered again (allocating per
            // recipe: not at every checkpoint).
            self.needed = self.recipes.values().flat_map(|r| r.needs()).collect();
        }
        for (m, d) in fresh {
            if let Some(r) = self.recipes.get_mut(&m) {
                r.base = Base::Known(Arc::new(d));
            }
        }
        for r in self.recipes.values_mut().filter(|r| r.view.is_some()) {
            r.base = Base::InPlace;
        }
        if let Some(r) = have.and_then(|(m, _)| self.recipes.get_mut(&m)) {
            r.base.set(have.map_or(&[][..], |(_, d)| d), None);
        }
        self.bytes = self.recipes.values().map(|r| r.base_bytes()).sum();
        self.gather_lost();
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
pub(super) fn created_id(req: &Request) -> Option<ObjectId> {
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
        Request::CreateCommandBuffer(r) => r.id,
        // The first of the sub-devices names the recipe; the rebuild makes them all.
        Request::CreateSubDevices(r) => *r.ids.first()?,
        _ => return None,
    })
}

/// The shim's objects a creating request needs.
pub(super) fn depends_on(req: &Request) -> Vec<ObjectId> {
    let mut v = Vec::new();
    any_dependency(req, |d| {
        v.push(d);
        false
    });
    v
}

/// Whether `req` needs an object `hit` picks (`depends_on`, without collecting: the journal
/// asks it of every recipe at each release).
pub(super) fn any_dependency(req: &Request, mut hit: impl FnMut(ObjectId) -> bool) -> bool {
    // A root device is the worker's own (rebound, not rebuilt); a sub-device is ours.
    let sub = |d: ObjectId| d & WORKER_ID_BIT == 0;
    match req {
        Request::CreateContext(r) => r.devices.iter().any(|&d| sub(d) && hit(d)),
        Request::CreateCommandQueue(r) => hit(r.context) || (sub(r.device) && hit(r.device)),
        Request::CreateCommandQueueWithProperties(r) => hit(r.context) || (sub(r.device) && hit(r.device)),
        Request::CreateBuffer(r) => hit(r.context),
        Request::CreateProgramWithSource(r) => hit(r.context),
        Request::CreateProgramWithBinary(r) => hit(r.context),
        Request::CreateKernel(r) => hit(r.program),
        Request::CreateUserEvent(r) => hit(r.context),
        Request::CreateSampler(r) => hit(r.context),
        Request::CreateSubBuffer(r) => hit(r.buffer),
        Request::CreateImage(r) => hit(r.context) || r.desc.buffer.is_some_and(&mut hit),
        Request::LinkProgram(r) => hit(r.context) || r.inputs.iter().any(|&i| hit(i)),
        Request::CreateSubDevices(r) => sub(r.device) && hit(r.device),
        Request::CreateCommandBuffer(r) => r.queues.iter().any(|&q| hit(q)),
        _ => false,
    }
}

/// The objects a recorded command uses (its queue, kernel, memory objects, samplers).
pub(super) fn recorded_uses(r: &RecordCommand) -> Vec<ObjectId> {
    let mut v: Vec<ObjectId> = r.queue.into_iter().collect();
    match &r.command {
        RecordedCommand::Barrier => {}
        RecordedCommand::CopyBuffer { src, dst, .. } | RecordedCommand::CopyRegion { src, dst, .. } => {
            v.extend([*src, *dst])
        }
        RecordedCommand::FillBuffer { mem, .. } | RecordedCommand::FillImage { mem, .. } => v.push(*mem),
        RecordedCommand::NdRange { kernel, args, .. } => {
            v.push(*kernel);
            v.extend(args.iter().filter_map(|(_, a)| match a {
                ArgValue::Object(id) => Some(*id),
                _ => None,
            }));
        }
    }
    v
}

/// Whether a kernel may write the memory object `req` made: a buffer, sub-buffer or image not
/// created `CL_MEM_READ_ONLY`.
fn kernel_may_write(req: &Request) -> bool {
    match req {
        Request::CreateBuffer(b) => b.flags & CL_MEM_READ_ONLY == 0,
        Request::CreateSubBuffer(s) => s.flags & CL_MEM_READ_ONLY == 0,
        Request::CreateImage(i) => i.flags & CL_MEM_READ_ONLY == 0,
        _ => false,
    }
}

/// The memory object whose storage the one `req` created uses: a sub-buffer's buffer, an
/// image's buffer (`State::storage`); `None`: its own.
fn storage_of(req: &Request) -> Option<ObjectId> {
    match req {
        Request::CreateSubBuffer(s) => Some(s.buffer),
        Request::CreateImage(CreateImage { desc: ImageDesc { buffer: Some(b), .. }, .. }) => Some(*b),
        _ => None,
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
            global: cloister_ipc::Dims::new([1]),
            local: None,
            sync: EnqueueSync::default(),
        }))
    }

    fn write(mem: ObjectId, offset: u64, data: &[u8]) -> Cmd {
        Cmd::Write { queue: 2, mem, offset, data: Bytes::Copy(data.to_vec()), sync: EnqueueSync::default() }
    }

    fn state() -> State {
        let mut st = State::default();
        st.insert_recipe(10, Recipe::new(buffer(10, 4, CL_MEM_READ_ONLY)));
        st.insert_recipe(11, Recipe::new(buffer(11, 4, 0)));
        let sub = CreateSubBuffer { id: 12, buffer: 11, flags: 0, origin: 0, size: 2 };
        st.insert_recipe(12, Recipe::new(Request::CreateSubBuffer(sub)));
        st
    }

    /// `lost` follows every way a buffer's contents are lost and known again, so that
    /// `clFinish` asks it instead of walking every recipe.
    #[test]
    fn lost_contents_are_indexed_as_they_come_and_go() {
        let mut st = state();
        assert!(st.settled());
        st.lose(12);
        assert_eq!(st.lost.iter().copied().collect::<Vec<_>>(), [11], "a sub-buffer's loss is its parent's");
        assert!(!st.settled() && st.dirty().contains(&11));
        assert!(st.superseded_by(11, 0, b"abcd", None).is_ok());
        assert!(st.lost.is_empty() && st.settled(), "a whole write makes the contents known");
        st.lose(11);
        st.lose(10);
        st.remove_recipe(10);
        assert_eq!(st.lost.iter().copied().collect::<Vec<_>>(), [11], "a removed recipe is not lost");
        st.insert_recipe(11, Recipe::new(buffer(11, 4, 0)));
        assert!(st.lost.is_empty() && st.lost_in_step(), "a new recipe starts undefined");
        st.set_base(11, Base::Lost);
        assert!(!st.dirty_in_place_or(None) && st.lost_in_step());
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
        assert!(st.superseded_by(11, 0, b"1234", None).is_ok(), "earlier writes of the buffer alone go");
        assert!(st.cmds.is_empty());
        assert!(matches!(&st.recipes[&11].base, Base::Known(d) if d.copied() == Some(&b"1234"[..])));
        // A partial write is journaled; a kernel reading the buffer keeps the journal.
        assert!(st.superseded_by(11, 1, b"12", None).is_err());
        st.cmds.push(kernel_on(&[11]));
        assert!(st.superseded_by(11, 0, b"5678", None).is_err(), "the kernel needs the old contents");
        // A buffer the journal does not touch is superseded at once.
        assert!(st.superseded_by(10, 0, b"abcd", None).is_ok());
        assert_eq!(st.cmds.len(), 1);
    }

    /// The summary a blocking call asks, gathered as commands come, agrees with `dirty` and
    /// the commands' queues, and is gathered again when commands are dropped.
    #[test]
    fn the_summary_asks_of_what_dirty_names() {
        let mut st = state();
        st.cmds.push(kernel_on(&[10, 12]));
        st.summarize();
        assert!(st.dirty_in_place_or(Some(11)), "the sub-buffer's parent, not the read-only buffer");
        assert!(!st.dirty_in_place_or(Some(10)));
        assert!(!st.complete(2), "on a queue not known to be in order");
        let queue = CreateCommandQueue { id: 2, context: 1, device: 3, properties: 0 };
        st.insert_recipe(2, Recipe::new(Request::CreateCommandQueue(queue)));
        assert!(st.complete(2), "all on one in-order queue");
        assert!(!st.complete(4), "on another queue");
        st.cmds.push(write(10, 0, b"ab"));
        st.summarize();
        assert!(!st.dirty_in_place_or(Some(11)), "an appended command is summarized");
        assert!(st.complete(2));
        if let Cmd::Write { queue, .. } = &mut st.cmds[1] {
            *queue = 4;
        }
        st.commands_dropped();
        st.summarize();
        assert!(!st.complete(2) && !st.complete(4), "on two queues");
        assert_eq!(st.dirty().into_iter().collect::<Vec<_>>(), [10, 11]);
        st.cmds.remove(1);
        st.commands_dropped();
        st.summarize();
        assert!(st.dirty_in_place_or(Some(11)), "a dropped command is not");
        st.cmds.clear();
        st.summarize();
        assert!(st.dirty_in_place_or(None), "nothing journaled, nothing lost");
        st.set_base(10, Base::Lost);
        assert!(!st.dirty_in_place_or(None), "a lost buffer is dirty");
        assert!(st.dirty_in_place_or(Some(10)));
    }

    /// An object released while the journal uses it is counted once, so a checkpoint knows
    /// whether it has anything to drop.
    #[test]
    fn released_objects_the_journal_keeps_are_counted_once() {
        let j = Journal::default();
        j.put(state());
        j.with(|s| s.cmds.push(kernel_on(&[11])));
        j.released(10);
        assert_eq!(j.with(|s| (s.released_kept, s.recipes.contains_key(&10))), (0, false), "unused: dropped at once");
        j.released(11);
        j.released(11);
        assert_eq!(j.with(|s| (s.released_kept, s.recipes[&11].released)), (1, true), "used by the kernel: kept");
    }

    /// A release asks an index of the journal's uses and the set of objects recipes need, not
    /// every command and recipe: both follow commands appended and dropped, and recipes added.
    #[test]
    fn releases_ask_indexes_that_follow_the_journal() {
        let mut st = state();
        st.cmds.push(kernel_on(&[12]));
        assert!(st.uses(12) && st.uses(11), "a sub-buffer's use is one of its parent's memory");
        assert!(!st.uses(10));
        st.cmds.clear();
        st.commands_dropped();
        st.cmds.push(kernel_on(&[10]));
        assert!(st.uses(10) && !st.uses(12), "dropped commands leave the index");
        assert!(st.needed.contains(&11) && !st.needed.contains(&10), "the sub-buffer needs its parent");
        let j = Journal::default();
        j.put(st);
        j.released(11);
        j.released(12);
        assert!(j.with(|s| s.recipes[&11].released && !s.recipes.contains_key(&12)), "a needed parent is kept");
    }

    /// With twice `floor` times `RECIPES_PER_CHECKPOINT_COMMAND` buffers more (ids from 100), a
    /// checkpoint is `due` at one journaled command per that many recipes, not before.
    fn due_at_one_command_per_recipes(st: &mut State, floor: usize, due: fn(&State) -> bool) {
        let many = floor * RECIPES_PER_CHECKPOINT_COMMAND * 2;
        (100..100 + many as ObjectId).for_each(|id| st.insert_recipe(id, Recipe::new(buffer(id, 4, 0))));
        let needed = st.recipes.len() / RECIPES_PER_CHECKPOINT_COMMAND;
        st.cmds.resize_with(needed - 1, || kernel_on(&[11]));
        assert!(!due(st), "not for {} commands and {} recipes", st.cmds.len(), st.recipes.len());
        st.cmds.push(kernel_on(&[11]));
        assert!(due(st), "due at {needed} commands");
    }

    /// Read-backs are spaced by what the last one took, except near the journal's limits.
    #[test]
    fn read_back_checkpoints_are_spaced_by_their_cost() {
        let mut st = state();
        st.cmds.extend((0..LONG_JOURNAL - 1).map(|_| kernel_on(&[11])));
        assert!(!st.read_back_due(), "a short journal waits");
        st.cmds.push(kernel_on(&[11]));
        assert!(st.read_back_due(), "a long one is read back the first time");
        st.last_read_back = Some((Instant::now(), Duration::from_secs(5)));
        assert!(!st.read_back_due(), "not again before 19 times the last read-back's time");
        st.cmds.extend((st.cmds.len()..MAX_JOURNAL / 2).map(|_| kernel_on(&[11])));
        assert!(st.read_back_due(), "but before the journal would be given up");
        st.cmds.truncate(LONG_JOURNAL);
        let long_ago = Instant::now().checked_sub(Duration::from_millis(200)).unwrap();
        st.last_read_back = Some((long_ago, Duration::from_millis(10)));
        assert!(st.read_back_due(), "190 ms after a 10 ms read-back");
        due_at_one_command_per_recipes(&mut st, LONG_JOURNAL, State::read_back_due);
        st.cmds.truncate(LONG_JOURNAL);
        assert!(!st.read_back_due());
        st.lose(100);
        assert!(st.read_back_due(), "lost contents are read back after LONG_JOURNAL commands");
    }

    /// A checkpoint that reads nothing back waits while the copies of zero-copy buffers it
    /// would make necessary again took more than a 19th of the time since the last one.
    #[test]
    fn free_checkpoints_are_spaced_by_the_copies_they_cause() {
        let mut st = state();
        st.cmds.extend((0..FREE_CHECKPOINT_MIN - 1).map(|_| kernel_on(&[11])));
        assert!(!st.free_checkpoint_due(), "not for a short journal");
        st.cmds.push(kernel_on(&[11]));
        assert!(st.free_checkpoint_due(), "the first one is due");
        st.checkpointed_at = Some(Instant::now());
        assert!(st.free_checkpoint_due(), "one that caused no copy is due at once");
        st.snapshots_took = Duration::from_secs(5);
        assert!(!st.free_checkpoint_due(), "not again before 19 times the copies' time");
        st.cmds.extend((st.cmds.len()..MAX_JOURNAL / 2).map(|_| kernel_on(&[11])));
        assert!(st.free_checkpoint_due(), "but before the journal would be given up");
        st.cmds.truncate(FREE_CHECKPOINT_MIN);
        st.checkpointed_at = Instant::now().checked_sub(Duration::from_millis(200));
        st.snapshots_took = Duration::from_millis(10);
        assert!(st.free_checkpoint_due(), "190 ms after 10 ms of copies");
        st.snapshots_took = Duration::from_millis(11);
        assert!(!st.free_checkpoint_due(), "not 200 ms after 11 ms of them");
        st.snapshots_took = Duration::ZERO;
        due_at_one_command_per_recipes(&mut st, FREE_CHECKPOINT_MIN, State::free_checkpoint_due);
    }

    /// A write's staged bytes are kept where they were staged, not copied, and held (so not
    /// reused by the segment pool) only while the journal needs them.
    #[test]
    fn staged_write_data_is_kept_in_its_segment_until_superseded() {
        let mut st = state();
        let segment = Arc::new(cloister_ipc::shm::SharedRegion::create("journal-test", 8).unwrap());
        // SAFETY: the region holds 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping(b"--ab--cd".as_ptr(), segment.as_ptr(), 8) };
        let staged = |at| KeptBytes::new(Arc::clone(&segment), at, 2);
        st.cmds.push(kernel_on(&[11]));
        st.write(2, 11, 1, b"ab", staged(2), EnqueueSync::default());
        let Some(Cmd::Write { data: Bytes::Staged(k), .. }) = st.cmds.last() else { panic!("not kept staged") };
        // SAFETY: the kept bytes are valid for their length.
        assert_eq!(unsafe { std::slice::from_raw_parts(k.as_ptr(), k.len()) }, b"ab");
        assert_eq!(Arc::strong_count(&segment), 2, "the journal holds the segment");
        assert_eq!(st.bytes, 8, "the budget counts the kept segment whole, not the 2 bytes written");
        // Bytes that are not the write's are copied.
        st.write(2, 11, 1, b"xyz", staged(6), EnqueueSync::default());
        assert!(matches!(st.cmds.last(), Some(Cmd::Write { data: Bytes::Copy(v), .. }) if v == b"xyz"));
        assert!(KeptBytes::new(Arc::clone(&segment), 7, 2).is_none(), "past the segment");
        // A whole write of buffer 10 nothing uses becomes its contents, still in the segment.
        st.write(2, 10, 0, b"--ab", KeptBytes::new(Arc::clone(&segment), 0, 4), EnqueueSync::default());
        assert!(matches!(&st.recipes[&10].base, Base::Known(d) if matches!(**d, Bytes::Staged(_))));
        assert_eq!(Arc::strong_count(&segment), 3);
        st.give_up_journal();
        assert_eq!(Arc::strong_count(&segment), 2, "the dropped journal let its write's segment go");
        st.write(2, 10, 0, b"zzzz", None, EnqueueSync::default());
        assert_eq!(Arc::strong_count(&segment), 1, "superseded contents let theirs go");
    }

    /// A zero-copy buffer (id 13, 4 bytes) whose contents are in place, and its memory.
    fn zero_copy(st: &mut State) -> *mut u8 {
        let region = cloister_ipc::shm::SharedRegion::create("journal-test", 4).unwrap();
        let view = SharedView { memory: Arc::new(region.into_mapping()), offset: 0, len: 4, lease: None };
        let at = view.at(0, 4).unwrap();
        let mut r = Recipe::new(buffer(13, 4, 0));
        r.base = Base::InPlace;
        r.view = Some(view);
        st.insert_recipe(13, r);
        at
    }

    #[test]
    fn in_place_contents_are_copied_out_only_before_a_change_the_journal_would_see() {
        let mut st = state();
        let at = zero_copy(&mut st);
        // SAFETY: `at` is the test buffer's 4 bytes, mapped while its recipe holds the view.
        let set = |v: &[u8; 4]| unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), at, 4) };
        set(b"abcd");
        // Unused by the journal: a write that lands needs no record, and no copy is made.
        assert!(st.in_place_unused(13));
        st.changing(13, true);
        assert!(matches!(st.recipes[&13].base, Base::InPlace));
        assert_eq!(st.bytes, 0);
        // A kernel reading it is journaled: the next change copies it out first.
        st.cmds.push(kernel_on(&[10, 13]));
        assert!(!st.in_place_unused(13));
        st.changing(13, true);
        set(b"wxyz");
        assert!(matches!(&st.recipes[&13].base, Base::Known(d) if d.copied() == Some(&b"abcd"[..])));
        assert_eq!(st.bytes, 4);
        // Once copied out, a further change keeps the copy.
        st.changing(13, false);
        assert!(matches!(&st.recipes[&13].base, Base::Known(d) if d.copied() == Some(&b"abcd"[..])));
    }

    #[test]
    fn a_kernel_that_may_write_in_place_contents_copies_them_out_first_even_unused() {
        let mut st = state();
        let at = zero_copy(&mut st);
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(b"1234".as_ptr(), at, 4) };
        st.changing(13, false);
        assert!(matches!(&st.recipes[&13].base, Base::Known(d) if d.copied() == Some(&b"1234"[..])));
        // A sub-buffer of a zero-copy buffer is its parent's memory.
        let sub = CreateSubBuffer { id: 14, buffer: 13, flags: 0, origin: 0, size: 2 };
        st.insert_recipe(14, Recipe::new(Request::CreateSubBuffer(sub)));
        st.recipes.get_mut(&13).unwrap().base = Base::InPlace;
        st.changing(14, false);
        assert!(matches!(&st.recipes[&13].base, Base::Known(_)));
    }

    #[test]
    fn a_zero_copy_buffer_never_written_is_not_copied_out_and_a_landed_change_puts_it_in_place() {
        let mut st = state();
        zero_copy(&mut st);
        st.recipes.get_mut(&13).unwrap().base = Base::Undefined;
        // A kernel writing undefined contents needs nothing kept: replay runs it on any.
        st.changing(13, false);
        assert!(matches!(st.recipes[&13].base, Base::Undefined));
        // The application's own write landed in its memory: in place, no record.
        assert!(st.lands_in_place(13));
        assert!(matches!(st.recipes[&13].base, Base::InPlace));
        // Not while a journaled command uses it, nor for a staged buffer.
        st.cmds.push(kernel_on(&[13]));
        assert!(!st.lands_in_place(13));
        assert!(!st.lands_in_place(11));
    }

    #[test]
    fn in_place_contents_over_the_budget_are_lost_not_copied() {
        let mut st = state();
        zero_copy(&mut st);
        st.bytes = budget();
        st.changing(13, false);
        assert!(matches!(st.recipes[&13].base, Base::Lost));
    }

    #[test]
    fn losing_a_sub_buffer_loses_its_parent() {
        let mut st = state();
        st.lose(12);
        assert!(matches!(st.recipes[&11].base, Base::Lost));
        assert!(matches!(st.recipes[&12].base, Base::Undefined));
    }
}
