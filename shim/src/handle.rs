//! Handles: what the application holds. Each is a cell whose first word is the dispatch table
//! (cl_khr_icd), in one range of address space (`cells`). Handles are validated against a
//! registry before their objects are used, so a garbage, NULL or released handle yields the
//! right `CL_INVALID_*` instead of a crash; the cells mirror the registry for the one loop case
//! that reads them instead (`clSetKernelArg`).
//!
//! Layer: above the transport. It imports `conn` and the leaves (`base`, `mirror`,
//! `queue_state`); what it needs of the layers above (the entry points' dispatch table, a
//! release told in replay mode, a wait for a worker's replacement) goes through `conn::Above`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cloister_ipc::cl::*;
use cloister_ipc::fast_hash::{FastHasher, FastMap};
use cloister_ipc::ObjectId;

use crate::conn::{Conn, SharedView};
use crate::kernel_args::KernelArgs;
use crate::launch_shapes::LaunchShapes;

pub use cloister_ipc::ObjectKind as Kind;

/// How many answers an object's `InfoCache` holds without a lock: more than the parameters of
/// a device, which clinfo asks all of.
const INFO_SLOTS: usize = 256;

/// One answer of an `InfoCache` table: (parameter, auxiliary key) and the value, set once.
type InfoSlot = std::sync::OnceLock<((u32, u64), Box<[u8]>)>;

/// Cached info answers, which never change once cached: each slot of `table` is written once
/// and read by every later query with one load, no lock and no reference count; what does not
/// fit (an application asking for device lists of ever new types) goes to `overflow`.
#[derive(Default)]
pub struct InfoCache {
    table: std::sync::OnceLock<Box<[InfoSlot; INFO_SLOTS]>>,
    overflowed: AtomicBool,
    overflow: RwLock<FastMap<(u32, u64), Vec<u8>>>,
}

impl InfoCache {
    /// The slots to try for `key`, in order (open addressing; nothing is ever removed, so an
    /// empty slot ends the search).
    #[inline]
    fn probe(key: (u32, u64)) -> impl Iterator<Item = usize> {
        let mut h = FastHasher::default();
        std::hash::Hash::hash(&key, &mut h);
        // The high bits: a multiplicative hash mixes the key into them.
        let start = (h.finish() >> 48) as usize;
        (0..INFO_SLOTS).map(move |i| (start + i) % INFO_SLOTS)
    }

    #[inline]
    fn get<R>(&self, key: (u32, u64), f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if let Some(table) = self.table.get() {
            for i in Self::probe(key) {
                match table[i].get() {
                    Some((k, v)) if *k == key => return Some(f(v)),
                    Some(_) => continue,
                    None => break,
                }
            }
        }
        if !self.overflowed.load(Ordering::Acquire) {
            return None;
        }
        self.overflow.read().unwrap_or_else(|e| e.into_inner()).get(&key).map(|v| f(v))
    }

    fn insert(&self, key: (u32, u64), value: Vec<u8>) {
        let table = self.table.get_or_init(|| Box::new(std::array::from_fn(|_| std::sync::OnceLock::new())));
        let mut value = value.into_boxed_slice();
        for i in Self::probe(key) {
            match table[i].set((key, value)) {
                Ok(()) => return,
                Err((_, v)) => value = v,
            }
            if table[i].get().is_some_and(|(k, _)| *k == key) {
                return; // another thread cached the same answer first
            }
        }
        self.overflow.write().unwrap_or_else(|e| e.into_inner()).entry(key).or_insert_with(|| value.into_vec());
        self.overflowed.store(true, Ordering::Release);
    }
}

pub mod cells;

/// What the application holds: a cell whose first word is the dispatch table's address (the
/// ICD loader reads it). The object is found through the registry, keyed by the handle's
/// address; the cell mirrors what the loop case of `clSetKernelArg` needs (`cells`).
pub use cells::Cell as Handle;

/// Retired handles stay allocated (and keep their dispatch pointer) for a while: through the ICD
/// loader, a released handle is still dereferenced by the loader before we can say
/// `CL_INVALID_*`, so freeing it at once would turn a use-after-release into a crash.
const QUARANTINE: usize = 1 << 16;

/// The retired handles still allocated, oldest first, and the kind of object each was.
#[derive(Default)]
struct Quarantine {
    order: std::collections::VecDeque<usize>,
    kinds: HashMap<usize, Kind>,
}

fn quarantined() -> std::sync::MutexGuard<'static, Quarantine> {
    static Q: OnceLock<Mutex<Quarantine>> = OnceLock::new();
    Q.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn quarantine(h: usize, kind: Kind) {
    let mut q = quarantined();
    q.order.push_back(h);
    q.kinds.insert(h, kind);
    if q.order.len() > QUARANTINE {
        if let Some(old) = q.order.pop_front() {
            q.kinds.remove(&old);
            // SAFETY: `old` came from cells::alloc in new_object, was unregistered before it
            // entered the quarantine, and leaves it exactly once.
            unsafe { cells::free(old) };
        }
    }
}

/// The kind of object `h` was, if it is a handle the application released (still in the
/// quarantine): a released buffer passed as a kernel argument is refused as the spec says,
/// where its bytes would reach the driver as a pointer it dereferences.
pub fn retired_kind(h: usize) -> Option<Kind> {
    quarantined().kinds.get(&h).copied()
}

/// A mapping the application holds: where it points, and the segment behind it.
pub struct MapRecord {
    /// The worker's name for the mapping: the segment's id, or a fresh id for a mapping of a
    /// zero-copy buffer's own memory.
    pub id: ObjectId,
    /// The segment the application sees (`None`: the zero-copy buffer's memory itself).
    pub segment: Option<crate::conn::Segment>,
    pub flags: u64,
    /// For a `CL_MEM_USE_HOST_PTR` object: the application's rows the mapping points at, packed
    /// back into the segment when a writing map is unmapped.
    pub mirror: Option<crate::mirror::Mirror>,
    /// What it covers.
    pub range: MapArea,
    /// Made in a worker that died since (replay mode): the replacement has no such mapping, so
    /// the unmap writes what the application wrote into it as a plain write.
    pub carried: bool,
    /// The dead worker's zero-copy memory the mapping points into, kept until the unmap.
    pub keep: Option<Arc<cloister_ipc::shm::SharedMapping>>,
    /// Made by the shim alone (`crate::direct`): a zero-copy buffer's own memory, mapped while
    /// its queue was idle; the worker never had the mapping.
    pub in_shim: bool,
}

impl MapRecord {
    /// A mapping made in the live worker.
    pub fn new(
        id: ObjectId,
        segment: Option<crate::conn::Segment>,
        flags: u64,
        mirror: Option<crate::mirror::Mirror>,
        range: MapArea,
    ) -> Self {
        MapRecord { id, segment, flags, mirror, range, carried: false, keep: None, in_shim: false }
    }

    /// A mapping the shim made itself (`crate::direct`) of a zero-copy buffer's own memory.
    pub fn in_shim(flags: u64, range: MapArea) -> Self {
        MapRecord { id: 0, segment: None, flags, mirror: None, range, carried: false, keep: None, in_shim: true }
    }

    /// Whether the mapping is for writing: its unmap writes it back.
    pub fn writes_back(&self) -> bool {
        map_writes(self.flags)
    }
}

/// Whether a map with `flags` is for writing (`CL_MAP_WRITE` or
/// `CL_MAP_WRITE_INVALIDATE_REGION`).
pub fn map_writes(flags: u64) -> bool {
    flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0
}

/// What a mapping covers: a buffer's bytes, or an image's box (`origin` and `region` in
/// pixels; the mapping holds its rows packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapArea {
    Buffer { offset: u64, size: u64 },
    Image { origin: [u64; 3], region: [u64; 3] },
}

/// What the shim needs to pack an image's rows: the pixel size and the image type, and for a
/// `CL_MEM_USE_HOST_PTR` image the application's memory and its pitches.
#[derive(Clone, Copy, Debug)]
pub struct ImageMeta {
    pub elem: usize,
    pub image_type: u32,
    pub host: Option<HostImage>,
    /// The image's size in pixels along the three coordinates of an origin or region (width;
    /// height, or a 1D array's images; depth, or a 2D array's images; 1 where it has none).
    pub pixels: [usize; 3],
}

#[derive(Clone, Copy, Debug)]
pub struct HostImage {
    pub ptr: usize,
    /// The bytes the application's image memory spans (from its descriptor).
    pub len: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

pub enum ObjData {
    Platform,
    Device,
    Context,
    /// What direct transfers need to know of a queue (`direct`).
    Queue(crate::queue_state::QueueState),
    /// `host_ptr` is the application's memory of a `CL_MEM_USE_HOST_PTR` buffer (0 otherwise),
    /// kept in step with the device on blocking reads and maps; `image` is set for images.
    Mem {
        /// The object's context (an enqueue the shim vouches for checks its queue's against it).
        context: ObjectId,
        flags: u64,
        host_ptr: usize,
        /// A buffer's size (for a `CL_MEM_USE_HOST_PTR` one, the bytes of the application's
        /// memory at `host_ptr`, outside which the shim never copies); for an image, the bytes
        /// its host memory spans (0 without); 0 for a pipe.
        host_len: usize,
        image: Option<ImageMeta>,
        maps: Mutex<HashMap<usize, Vec<MapRecord>>>,
        /// A zero-copy buffer's memory, shared with the worker (see `SharedView`).
        shared: Option<SharedView>,
        /// The worker has said the object exists (its creation, which may have been posted, did
        /// not fail): `crate::direct` maps only such a buffer itself.
        made: AtomicBool,
        /// A sub-buffer's parent (`Object::storage`): two objects of one storage may overlap.
        parent: Option<ObjectId>,
    },
    /// `app_source` is the application's own text when the driver was given a rewritten one
    /// (absolute `#include` names made relative to the staged headers' root).
    Program {
        /// The program's context: its kernels' (`ObjData::context`).
        context: ObjectId,
        app_source: Option<Vec<u8>>,
        /// The `CL_PROGRAM_BINARY_SIZES` the application was last told: it sized its
        /// `CL_PROGRAM_BINARIES` buffers from them, so no binary may be longer.
        binary_sizes: Mutex<Option<Vec<usize>>>,
        /// The options of its last build or compile as the application gave them, where the
        /// driver got others (the application's headers staged, `-I` pointing at them): what
        /// `CL_PROGRAM_BUILD_OPTIONS` answers.
        build_options: Mutex<Option<Vec<u8>>>,
    },
    Kernel {
        /// Its program's context: an NDRange the shim posts names a queue of the same one.
        context: ObjectId,
        num_args: u32,
        /// Shared with the handle's cell, which the loop case of `clSetKernelArg` reads
        /// (`cells`).
        args: Arc<KernelArgs>,
        /// The NDRange shapes its driver has accepted: those are posted.
        launches: Arc<LaunchShapes>,
    },
    /// `done`: made complete, standing in for a command the shim made itself (`EnqueueDone`): a
    /// callback registered on it runs at once, as a driver runs one on an event already past
    /// the callback's status.
    Event {
        /// Its context: an enqueue's wait list names events of the queue's own
        /// (`api::enqueue_sync`).
        context: ObjectId,
        done: bool,
    },
    Sampler,
    CommandBuffer,
}

impl ObjData {
    /// A program of `context` whose source, if any, the driver has as the application wrote it.
    pub fn program(context: ObjectId) -> Self {
        Self::program_with(context, None)
    }

    /// A program of `context` whose source the driver has rewritten; `app_source` is the
    /// application's.
    pub fn program_with(context: ObjectId, app_source: Option<Vec<u8>>) -> Self {
        ObjData::Program { context, app_source, binary_sizes: Mutex::new(None), build_options: Mutex::new(None) }
    }

    /// The context of a queue, memory object, program, kernel or event. The shim posts an
    /// enqueue only when every object it names is of the queue's context (the driver's
    /// `CL_INVALID_CONTEXT` would otherwise come late).
    pub fn context(&self) -> Option<ObjectId> {
        match self {
            ObjData::Queue(state) => Some(state.context),
            ObjData::Mem { context, .. }
            | ObjData::Program { context, .. }
            | ObjData::Kernel { context, .. }
            | ObjData::Event { context, .. } => Some(*context),
            _ => None,
        }
    }

    pub fn mem(context: ObjectId, flags: u64, host_ptr: usize, host_len: usize, image: Option<ImageMeta>) -> Self {
        ObjData::Mem {
            context,
            flags,
            host_ptr,
            host_len,
            image,
            maps: Mutex::new(HashMap::new()),
            shared: None,
            made: AtomicBool::new(false),
            parent: None,
        }
    }

    /// A zero-copy buffer (or sub-buffer) whose memory is `view`.
    pub fn shared_mem(context: ObjectId, flags: u64, view: SharedView) -> Self {
        ObjData::Mem {
            context,
            flags,
            host_ptr: 0,
            host_len: view.len,
            image: None,
            maps: Mutex::new(HashMap::new()),
            shared: Some(view),
            made: AtomicBool::new(false),
            parent: None,
        }
    }

    /// The same memory object's data, for a sub-buffer of `parent`.
    pub fn sub_buffer_of(mut self, parent: ObjectId) -> Self {
        if let ObjData::Mem { parent: p, .. } = &mut self {
            *p = Some(parent);
        }
        self
    }

    /// A queue's state for direct transfers, if this is a queue.
    pub fn queue_state(&self) -> Option<&crate::queue_state::QueueState> {
        match self {
            ObjData::Queue(state) => Some(state),
            _ => None,
        }
    }

    /// Whether the shim itself may make a host read (`write == false`) or write of bytes
    /// `[offset, offset + size)` of this buffer for a queue of `context`, refusing nothing the
    /// driver would accept and accepting nothing it would refuse: a buffer (not an image or
    /// pipe) of that context, a non-empty range within it, host access of that kind allowed.
    pub fn host_transfer_allowed(&self, context: ObjectId, write: bool, offset: usize, size: usize) -> bool {
        let ObjData::Mem { flags, .. } = self else { return false };
        let forbidden = match write {
            true => CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS,
            false => CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS,
        };
        self.buffer_range(context, offset, size) && flags & forbidden == 0
    }

    /// Whether this is a buffer (not an image or pipe) of `context` holding the non-empty range
    /// `[offset, offset + size)`: what a copy or fill the shim posts must name.
    pub fn buffer_range(&self, context: ObjectId, offset: usize, size: usize) -> bool {
        let ObjData::Mem { context: own, host_len, image: None, .. } = self else { return false };
        *own == context && size > 0 && offset.checked_add(size).is_some_and(|end| end <= *host_len)
    }

    /// Whether the worker has said this memory object exists (`made`).
    pub fn known_made(&self) -> bool {
        matches!(self, ObjData::Mem { made, .. } if made.load(Ordering::Acquire))
    }

    /// The worker has said this memory object exists.
    pub fn mark_made(&self) {
        if let ObjData::Mem { made, .. } = self {
            made.store(true, Ordering::Release);
        }
    }

    /// A zero-copy buffer's memory, if this is one.
    pub fn shared_view(&self) -> Option<&SharedView> {
        match self {
            ObjData::Mem { shared, .. } => shared.as_ref(),
            _ => None,
        }
    }
}

/// A destructor callback (`clSetMemObjectDestructorCallback`, `clSetContextDestructorCallback`,
/// `clSetProgramReleaseCallback`): all three take the handle and the user data.
pub type DestructorFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

pub struct Object {
    pub kind: Kind,
    pub id: ObjectId,
    pub conn: Arc<Conn>,
    /// The application's references: one at creation, `clRetain*` and `clRelease*`.
    refs: AtomicU32,
    /// How many objects keep this one alive (`hold`): a program's kernels, a context's buffers.
    /// The object goes when both counts are down to zero.
    held: AtomicU32,
    /// Platform and device info never changes: cached after the first query (`cached_info`).
    info_cache: InfoCache,
    pub data: ObjData,
    /// Set once no handle leads here any more: the application released the object, or the
    /// handle was rebound to a successor, or its worker forgotten. A thread's `RECENT` entry
    /// for it is then stale.
    released: AtomicBool,
    /// Run, last registered first, when the application's last reference goes.
    destructors: Mutex<Vec<(DestructorFn, usize)>>,
    /// Callback tokens that die with this object (a context's `pfn_notify`): unregistered at
    /// its release, so no later notification or worker death calls the application with
    /// `user_data` it has freed since.
    owned_callbacks: Mutex<Vec<u64>>,
    /// The object this one keeps alive, as the driver does (`hold`): released with it.
    holds: OnceLock<(usize, Kind)>,
    /// An event's first command, where it stands for several (the chunks of a pipelined
    /// transfer): a worker event whose timestamps its queued, submit and start times are, which
    /// the worker keeps until this one's release (`started_by`).
    started_by: OnceLock<ObjectId>,
}

impl Object {
    /// The id of the memory object whose memory this one is: a sub-buffer's parent's, any
    /// other's own. Two memory objects of one storage may overlap (a copy between them may be
    /// refused with `CL_MEM_COPY_OVERLAP`).
    pub fn storage(&self) -> ObjectId {
        match self.data {
            ObjData::Mem { parent: Some(parent), .. } => parent,
            _ => self.id,
        }
    }

    /// The reference count the application is told: its own references and those of the
    /// objects that keep this one alive, as drivers count them.
    pub fn ref_count(&self) -> u32 {
        self.refs.load(Ordering::Acquire).saturating_add(self.held.load(Ordering::Acquire))
    }

    /// The application's own references.
    pub fn app_refs(&self) -> u32 {
        self.refs.load(Ordering::Acquire)
    }

    /// Makes `first`, a worker event of an earlier command of the same transfer, this event's
    /// start (`started_by`); it is released with this one.
    pub fn start_with(&self, first: ObjectId) {
        if self.started_by.set(first).is_err() {
            let _ = self.conn.post(cloister_ipc::Release { object: first });
        }
    }

    /// The worker event whose timestamps this event's queued, submit and start times are.
    pub fn started_by(&self) -> Option<ObjectId> {
        self.started_by.get().copied()
    }

    /// `other`, if it lives in the same worker as `self` (ids mean nothing across workers).
    pub fn same_worker(&self, other: Arc<Object>) -> Result<Arc<Object>, cl_int> {
        match Arc::ptr_eq(&self.conn, &other.conn) {
            true => Ok(other),
            false => Err(crate::conn::mismatch(&self.conn, &other.conn, CL_INVALID_CONTEXT)),
        }
    }

    /// Hands the cached value under `key` to `f` without copying it; `None` if there is none.
    #[inline]
    pub fn cached_info<R>(&self, key: (u32, u64), f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.info_cache.get(key, f)
    }

    /// Caches `value` under `key` (see `info_cache`); a key cached already keeps its value.
    pub fn cache_info(&self, key: (u32, u64), value: Vec<u8>) {
        self.info_cache.insert(key, value);
    }

    /// Ties callback `token` to this object's life (see `owned_callbacks`).
    pub fn own_callback(&self, token: u64) {
        self.owned_callbacks.lock().unwrap_or_else(|e| e.into_inner()).push(token);
    }

    pub fn add_destructor(&self, f: DestructorFn, user_data: usize) {
        self.destructors.lock().unwrap_or_else(|e| e.into_inner()).push((f, user_data));
    }
}

fn registry() -> &'static RwLock<FastMap<usize, Arc<Object>>> {
    static REG: std::sync::OnceLock<RwLock<FastMap<usize, Arc<Object>>>> = std::sync::OnceLock::new();
    REG.get_or_init(Default::default)
}

/// Every live handle the application is responsible for releasing, with its kind (platforms
/// and root devices are not reference counted): for `--leaks` at exit.
pub fn live_handles() -> Vec<(usize, Kind)> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    r.iter()
        .filter(|(_, o)| {
            !(o.kind == Kind::Platform || (o.kind == Kind::Device && o.id & cloister_ipc::WORKER_ID_BIT != 0))
        })
        // Released by the application, kept only by others (`hold`): not its to release.
        .filter(|(_, o)| o.app_refs() > 0)
        .map(|(h, o)| (*h, o.kind))
        .collect()
}

/// Creates a handle for a new object and registers it.
pub fn new_handle(kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) -> *mut c_void {
    new_object(kind, id, conn, data).0
}

/// `new_handle`, with the object registered.
fn new_object(kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) -> (*mut c_void, Arc<Object>) {
    let h = cells::alloc(conn.above().dispatch()) as *mut Handle;
    HANDLES_FROM.fetch_min(h as usize, Ordering::Relaxed);
    HANDLES_TO.fetch_max(h as usize, Ordering::Relaxed);
    (h.cast(), register(h as usize, kind, id, conn, data))
}

/// `new_handle` for an object that keeps `parent`, which the caller has at hand, alive from
/// its start (`hold`): an enqueue's event keeps its queue, as drivers' events do, so
/// `CL_EVENT_COMMAND_QUEUE` still answers the queue after the application released it.
pub fn new_handle_holding(kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData, parent: &Object) -> *mut c_void {
    let (h, obj) = new_object(kind, id, conn, data);
    let parent_handle = parent.conn.handle_of(parent.id) as usize;
    if parent_handle != 0 && !parent.released.load(Ordering::Acquire) {
        keep_alive(&obj, parent_handle, parent);
    }
    h
}

/// Makes `child` keep `parent`, whose handle is `parent_handle`, alive (`hold`), unless it
/// keeps another object already.
fn keep_alive(child: &Object, parent_handle: usize, parent: &Object) {
    if child.holds.set((parent_handle, parent.kind)).is_ok() {
        // SeqCst with `release`'s look at `held`: of a release and a new holder racing, at
        // least one sees the other.
        parent.held.fetch_add(1, Ordering::SeqCst);
    }
}

/// The lowest and highest address any handle ever had: a value outside them (most scalar
/// kernel arguments of a handle's size: a `double`, a `long`) is no handle, known without the
/// registry's lock (`maybe_handle`).
static HANDLES_FROM: AtomicUsize = AtomicUsize::new(usize::MAX);
static HANDLES_TO: AtomicUsize = AtomicUsize::new(0);

/// Whether `h` may be one of our handles: aligned as they are, and within their addresses.
#[inline]
pub fn maybe_handle(h: usize) -> bool {
    h.is_multiple_of(std::mem::align_of::<Handle>())
        && h >= HANDLES_FROM.load(Ordering::Relaxed)
        && h <= HANDLES_TO.load(Ordering::Relaxed)
}

/// Registers the object behind handle `h`. New handles start here; platform and device handles
/// come back here to point at their successor in a new worker, so the application's handles
/// survive a restart (DESIGN.md, Faults).
pub fn rebind(h: usize, kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) {
    register(h, kind, id, conn, data);
}

/// `rebind`, returning the object registered.
fn register(h: usize, kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) -> Arc<Object> {
    let obj = Arc::new(Object {
        kind,
        id,
        conn: conn.clone(),
        refs: AtomicU32::new(1),
        held: AtomicU32::new(0),
        info_cache: InfoCache::default(),
        data,
        released: AtomicBool::new(false),
        destructors: Mutex::new(Vec::new()),
        owned_callbacks: Mutex::new(Vec::new()),
        holds: OnceLock::new(),
        started_by: OnceLock::new(),
    });
    let old = {
        let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
        cells::publish(h, &obj);
        reg.insert(h, obj.clone())
    };
    if let Some(old) = old {
        old.released.store(true, Ordering::Release);
    }
    conn.remember(id, h);
    obj
}

/// Handles for the platforms and devices a new worker announced (`conn::Above::adopt`); those
/// of `reuse`, the worker it replaces, are rebound to it by position (the same driver
/// enumerates in the same order). Returns (platform handle, its device handles), in order.
pub fn adopt(
    conn: &Arc<Conn>,
    platforms: &[ObjectId],
    devices: &[cloister_ipc::Enumerated],
    reuse: Option<&[(usize, Vec<usize>)]>,
) -> Vec<(usize, Vec<usize>)> {
    let mut table = Vec::new();
    let place = |old: Option<usize>, kind: Kind, id: u64, data: ObjData| match old {
        Some(h) => {
            rebind(h, kind, id, conn, data);
            h
        }
        None => new_handle(kind, id, conn, data) as usize,
    };
    for (pi, &pid) in platforms.iter().enumerate() {
        let old = reuse.and_then(|r| r.get(pi));
        let ph = place(old.map(|o| o.0), Kind::Platform, pid, ObjData::Platform);
        let devs = devices
            .iter()
            .filter(|d| d.platform == pid)
            .enumerate()
            .map(|(di, d)| place(old.and_then(|o| o.1.get(di).copied()), Kind::Device, d.id, ObjData::Device))
            .collect();
        table.push((ph, devs));
    }
    table
}

/// Forgets every handle of a worker's objects, so the connection can go (the fuzz harness
/// ends each input with this; the handles' cells are left allocated, as in the quarantine).
pub fn forget_worker(conn: &Arc<Conn>) {
    registry().write().unwrap_or_else(|e| e.into_inner()).retain(|h, o| {
        let keep = !Arc::ptr_eq(&o.conn, conn);
        if !keep {
            cells::unpublish(*h);
            o.released.store(true, Ordering::Release);
        }
        keep
    });
    forget_recent(|o| Arc::ptr_eq(&o.conn, conn));
}

/// Every live handle of a worker's objects, with its object.
pub fn objects_of(conn: &Arc<Conn>) -> Vec<(usize, Arc<Object>)> {
    let reg = registry().read().unwrap_or_else(|e| e.into_inner());
    reg.iter().filter(|(_, o)| Arc::ptr_eq(&o.conn, conn)).map(|(h, o)| (*h, o.clone())).collect()
}

/// Points handle `h` at its object rebuilt under the same id in `conn`, the replacement of its
/// worker (`recovery`): reference count, destructors and owned callbacks go with it; `view` is
/// a zero-copy buffer's new memory. Maps the application held are not carried.
pub fn move_to(h: usize, conn: &Arc<Conn>, view: Option<SharedView>) {
    let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
    let Some(old) = reg.get(&h).cloned() else { return };
    let data = match &old.data {
        ObjData::Mem { context, flags, host_ptr, host_len, image, shared, maps, parent, .. } => {
            // Mappings the application still holds keep their memory (the dead worker's
            // segment or zero-copy memory) until it unmaps them (`MapRecord::carried`).
            let mut held = std::mem::take(&mut *maps.lock().unwrap_or_else(|e| e.into_inner()));
            for r in held.values_mut().flatten() {
                r.carried = true;
                if r.segment.is_none() {
                    r.keep = shared.as_ref().map(|s| s.memory.clone());
                }
            }
            ObjData::Mem {
                context: *context,
                flags: *flags,
                host_ptr: *host_ptr,
                host_len: *host_len,
                image: *image,
                maps: Mutex::new(held),
                shared: view.or_else(|| shared.clone()),
                // Made again in the replacement, which says so in its own time.
                made: AtomicBool::new(false),
                parent: *parent,
            }
        }
        ObjData::Program { context, app_source, binary_sizes, build_options } => ObjData::Program {
            context: *context,
            app_source: app_source.clone(),
            binary_sizes: Mutex::new(binary_sizes.lock().unwrap_or_else(|e| e.into_inner()).clone()),
            build_options: Mutex::new(build_options.lock().unwrap_or_else(|e| e.into_inner()).clone()),
        },
        // Every argument set goes with the next enqueue: the rebuilt kernel has those of the
        // last command replayed, not necessarily the latest.
        ObjData::Kernel { context, num_args, args, launches } => ObjData::Kernel {
            context: *context,
            num_args: *num_args,
            args: Arc::new(args.copy(true)),
            launches: Arc::new(launches.copy()),
        },
        ObjData::Platform => ObjData::Platform,
        ObjData::Device => ObjData::Device,
        ObjData::Context => ObjData::Context,
        ObjData::Queue(state) => ObjData::Queue(state.rebuilt()),
        ObjData::Event { context, done } => ObjData::Event { context: *context, done: *done },
        ObjData::Sampler => ObjData::Sampler,
        ObjData::CommandBuffer => ObjData::CommandBuffer,
    };
    fn take<T>(m: &Mutex<Vec<T>>) -> Vec<T> {
        std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()))
    }
    let obj = Arc::new(Object {
        kind: old.kind,
        id: old.id,
        conn: conn.clone(),
        refs: AtomicU32::new(old.refs.load(Ordering::Acquire)),
        held: AtomicU32::new(old.held.load(Ordering::Acquire)),
        info_cache: InfoCache::default(),
        data,
        released: AtomicBool::new(false),
        destructors: Mutex::new(take(&old.destructors)),
        owned_callbacks: Mutex::new(take(&old.owned_callbacks)),
        holds: old.holds.clone(),
        // The replacement has no such event: the event's own times answer.
        started_by: OnceLock::new(),
    });
    cells::publish(h, &obj);
    reg.insert(h, obj);
    old.released.store(true, Ordering::Release);
    conn.remember(old.id, h);
}

/// How many objects each thread keeps at hand (`RECENT`).
const RECENT_SLOTS: usize = 8;

/// The objects a thread looked up last, by handle address, newest first; the oldest entry
/// makes room. The addresses are kept apart from the objects so a lookup scans eight plain
/// words. (Generic only so its order can be tested without objects.)
struct Recent<T = Arc<Object>> {
    /// Each slot's handle address (0: empty, which no lookup asks for: NULL is never found).
    addrs: [usize; RECENT_SLOTS],
    objects: [Option<T>; RECENT_SLOTS],
}

impl Recent {
    #[inline]
    fn find(&self, h: usize, kind: Kind) -> Option<&Arc<Object>> {
        self.find_of(h, &[kind])
    }

    /// The object behind `h` if it is of one of `kinds`: one scan of the addresses.
    #[inline]
    fn find_of(&self, h: usize, kinds: &[Kind]) -> Option<&Arc<Object>> {
        if h == 0 {
            return None;
        }
        let i = self.addrs.iter().position(|&a| a == h)?;
        self.objects[i].as_ref().filter(|o| kinds.contains(&o.kind) && fresh(o, o.kind))
    }
}

impl<T> Recent<T> {
    /// Puts `obj` first: the scan (`find_of`) meets the objects looked up last first, which are
    /// the ones a loop repeats (a kernel and its arguments, after the setup's context and
    /// queue). It takes its own earlier slot if it has one, else an empty one, else the oldest's.
    fn insert(&mut self, h: usize, obj: T) {
        let end = (self.addrs.iter().position(|&a| a == h))
            .or_else(|| self.addrs.iter().position(|&a| a == 0))
            .unwrap_or(RECENT_SLOTS - 1);
        self.addrs[..=end].rotate_right(1);
        self.objects[..=end].rotate_right(1);
        self.addrs[0] = h;
        self.objects[0] = Some(obj);
    }
}

thread_local! {
    /// The objects this thread looked up last: the calls an application repeats on a few
    /// handles (`clSetKernelArg`, `clGetDeviceInfo`, enqueues) find their object here, without
    /// the registry's lock, hashing or reference counting. An entry is good while its object is
    /// not `released` (then the registry has no such handle any more, or another object behind
    /// it).
    static RECENT: std::cell::RefCell<Recent> =
        const { std::cell::RefCell::new(Recent { addrs: [0; RECENT_SLOTS], objects: [const { None }; RECENT_SLOTS] }) };
}

/// Whether `obj`, found under `h`, is what a lookup of `h` as `kind` must answer now. A
/// platform or device whose worker died goes through the registry (`lookup`), which waits for
/// its successor.
#[inline]
fn fresh(obj: &Object, kind: Kind) -> bool {
    obj.kind == kind
        && !obj.released.load(Ordering::Acquire)
        && !(matches!(kind, Kind::Platform | Kind::Device) && obj.conn.is_dead())
}

/// Drops this thread's entries whose objects match (the others' go stale by `released`).
fn forget_recent(matches: impl Fn(&Object) -> bool) {
    let _ = RECENT.try_with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            let r = &mut *r;
            for (addr, slot) in r.addrs.iter_mut().zip(r.objects.iter_mut()) {
                if slot.as_ref().is_some_and(|o| matches(o)) {
                    (*addr, *slot) = (0, None);
                }
            }
        }
    });
}

fn lookup_once(h: *const c_void, kind: Kind) -> Result<Arc<Object>, cl_int> {
    let h = h as usize;
    let recent = RECENT.try_with(|r| {
        let r = r.try_borrow().ok()?;
        r.find(h, kind).cloned()
    });
    if let Ok(Some(o)) = recent {
        return Ok(o);
    }
    let found = match registry().read().unwrap_or_else(|e| e.into_inner()).get(&h) {
        Some(o) if o.kind == kind => o.clone(),
        _ => return Err(kind.invalid()),
    };
    remember(h, &found);
    Ok(found)
}

/// Keeps `obj`, found under `h`, in this thread's `RECENT`; not while a `with_object` up the
/// stack lends out an entry.
fn remember(h: usize, obj: &Arc<Object>) {
    let _ = RECENT.try_with(|r| remember_in(r, h, obj.clone()));
}

/// `remember`, for a caller that holds this thread's `RECENT` already (not borrowed).
#[cold]
fn remember_in(recent: &std::cell::RefCell<Recent>, h: usize, obj: Arc<Object>) {
    if let Ok(mut r) = recent.try_borrow_mut() {
        r.insert(h, obj);
    }
}

/// Validates `h` as a live handle of `kind`. A platform or device whose worker just died is
/// looked up again once its replacement is ready, so recovery needs no retry loop.
pub fn lookup(h: *const c_void, kind: Kind) -> Result<Arc<Object>, cl_int> {
    let found = lookup_once(h, kind)?;
    if matches!(kind, Kind::Platform | Kind::Device) && found.conn.is_dead() && found.conn.above().await_restarts() {
        return lookup_once(h, kind);
    }
    Ok(found)
}

/// `f` applied to the live object of `kind` behind `h`, as `lookup` finds it. For the calls an
/// application makes in tight loops: an object in this thread's `RECENT` is lent to `f` from
/// there, with no reference count touched. While `f` runs, lookups it makes still read
/// `RECENT` but do not change it.
#[inline]
pub fn with_object<R>(h: *const c_void, kind: Kind, f: impl FnOnce(&Object) -> R) -> Result<R, cl_int> {
    let mut f = Some(f);
    if let Some(v) = with_recent(h, kind, |obj| f.take().map(|f| f(obj))) {
        return Ok(v);
    }
    let obj = lookup(h, kind)?;
    match f.take() {
        Some(f) => Ok(f(&obj)),
        None => Err(kind.invalid()), // not reached: `f` is taken only when it ran
    }
}

/// The lookups `with_object_then` hands its caller, for a second handle: read the same borrow
/// of this thread's `RECENT` as the first (`None`: the first came from the registry).
pub struct SecondLookup<'a> {
    recent: Option<&'a Recent>,
    /// An object found in the registry while `recent` was borrowed: `with_object_then` keeps
    /// it in `RECENT` once the borrow ends, so the next call finds it there (applications set
    /// the same buffer as an argument before every enqueue).
    missed: std::cell::Cell<Option<(usize, Arc<Object>)>>,
}

impl SecondLookup<'_> {
    /// `f` applied to the live object behind `h`, if it is of one of `kinds`: which kind, and
    /// what `f` said. One search of `RECENT` and at most one of the registry, whatever the
    /// number of kinds; a value that cannot be a handle (`maybe_handle`) is not searched for.
    /// Not for platforms and devices, whose lookup may wait for a restarted worker (`lookup`).
    #[inline]
    pub fn of_kinds<R>(&self, h: *const c_void, kinds: &[Kind], f: impl FnOnce(&Object) -> R) -> Option<(Kind, R)> {
        debug_assert!(!kinds.iter().any(|k| matches!(k, Kind::Platform | Kind::Device)));
        let addr = h as usize;
        if !maybe_handle(addr) {
            return None;
        }
        if let Some(o) = self.recent.and_then(|r| r.find_of(addr, kinds)) {
            return Some((o.kind, f(o)));
        }
        let found = registry().read().unwrap_or_else(|e| e.into_inner()).get(&addr).cloned()?;
        if !kinds.contains(&found.kind) || found.released.load(Ordering::Acquire) {
            return None;
        }
        let r = (found.kind, f(&found));
        if self.recent.is_none() {
            // No borrow of `RECENT` is held: keep the object at hand for the next call.
            remember(addr, &found);
        } else {
            self.missed.set(Some((addr, found)));
        }
        Some(r)
    }
}

/// `f` applied to the live object of `kind` behind `h` if it is among this thread's recent
/// objects (`RECENT`): for a call's loop case, which gives up (`None`, having changed nothing)
/// on any miss and lets the full path decide.
#[inline(always)]
pub fn with_recent<R>(h: *const c_void, kind: Kind, f: impl FnOnce(&Object) -> Option<R>) -> Option<R> {
    RECENT
        .try_with(|r| {
            let r = r.try_borrow().ok()?;
            let obj = r.find(h as usize, kind)?;
            f(obj)
        })
        .ok()
        .flatten()
}

/// `with_object` for a call that looks up a second handle while it holds the first (the
/// argument of `clSetKernelArg`): `f` gets a lookup of its own that reads the same borrow of
/// this thread's `RECENT`, one thread-local access for both.
#[inline(always)]
pub fn with_object_then<R>(
    h: *const c_void,
    kind: Kind,
    f: impl FnOnce(&Object, &SecondLookup) -> R,
) -> Result<R, cl_int> {
    let addr = h as usize;
    let mut f = Some(f);
    let lent = RECENT.try_with(|r| {
        let borrowed = r.try_borrow().ok()?;
        let obj = borrowed.find(addr, kind)?;
        let f = f.take()?;
        let second = SecondLookup { recent: Some(&borrowed), missed: std::cell::Cell::new(None) };
        let v = f(obj, &second);
        if let Some((addr, found)) = second.missed.take() {
            drop(borrowed);
            remember_in(r, addr, found);
        }
        Some(v)
    });
    if let Ok(Some(v)) = lent {
        return Ok(v);
    }
    let obj = lookup(h, kind)?;
    match f.take() {
        Some(f) => Ok(f(&obj, &SecondLookup { recent: None, missed: std::cell::Cell::new(None) })),
        None => Err(kind.invalid()), // not reached: `f` is taken only when it ran
    }
}

pub fn retain(h: *const c_void, kind: Kind) -> cl_int {
    match lookup(h, kind) {
        Ok(o) => {
            o.refs.fetch_add(1, Ordering::AcqRel);
            CL_SUCCESS
        }
        Err(e) => e,
    }
}

/// Drops one reference; the last one releases the worker's object and retires the handle.
pub fn release(h: *mut c_void, kind: Kind) -> cl_int {
    let obj = match lookup(h, kind) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if matches!(kind, Kind::Platform) || (kind == Kind::Device && obj.id & cloister_ipc::WORKER_ID_BIT != 0) {
        return CL_SUCCESS; // root devices and platforms are not reference counted
    }
    // The application's count only: a release past its last reference is refused, even while
    // other objects keep this one alive (`hold`).
    match obj.refs.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1)) {
        Err(_) => return kind.invalid(),
        Ok(1) => {}
        Ok(_) => return CL_SUCCESS,
    }
    // The application's callbacks of this object go with its last reference, whatever keeps
    // the object: it may free their `user_data` once the release returned.
    unregister_owned_callbacks(&obj);
    if obj.held.load(Ordering::SeqCst) != 0 {
        // Retired when the last object keeping it alive goes (`unhold`). A queue's release
        // flushes it (the OpenCL API says so), which its release in the worker, now later,
        // would have done.
        if kind == Kind::Queue {
            let _ = obj.conn.call(cloister_ipc::FlushOrFinish { queue: obj.id, finish: false });
        }
        return CL_SUCCESS;
    }
    if still_mapped(&obj) {
        // Retired at its last unmap (`retire_if_unmapped`), as pocl keeps a released object
        // until then: the application may still write through the mapping and unmap it, and
        // the mapping's memory (a zero-copy buffer's own, a staged mapping's segment) must stay
        // its own meanwhile: dropped with the object, a write through it faulted (a 1 MiB
        // buffer's memory was unmapped) or landed in the next buffer carved from the same slab.
        return CL_SUCCESS;
    }
    retire(h, &obj, kind)
}

/// Whether `obj` is a memory object with a mapping the application has not unmapped.
fn still_mapped(obj: &Object) -> bool {
    match &obj.data {
        ObjData::Mem { maps, .. } => maps.lock().unwrap_or_else(|e| e.into_inner()).values().any(|l| !l.is_empty()),
        _ => false,
    }
}

/// After an unmap of `h`: a memory object the application released while mapped is retired
/// with its last mapping (`release`).
pub fn retire_if_unmapped(h: *mut c_void) {
    if with_object(h, Kind::Mem, |obj| obj.ref_count() != 0).unwrap_or(true) {
        return;
    }
    if let Ok(obj) = lookup(h, Kind::Mem) {
        if !still_mapped(&obj) {
            retire(h, &obj, Kind::Mem);
        }
    }
}

/// Lets go of an object no reference leads to any more: the worker's object, the handle (to
/// the quarantine), the application's destructor callbacks. Once, whoever calls it first.
fn retire(h: *mut c_void, obj: &Arc<Object>, kind: Kind) -> cl_int {
    if obj.released.swap(true, Ordering::AcqRel) {
        return CL_SUCCESS;
    }
    {
        let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
        cells::unpublish(h as usize);
        reg.remove(&(h as usize));
    }
    forget_recent(|o| std::ptr::eq(o, &**obj));
    obj.conn.forget(obj.id);
    if obj.conn.replays() {
        obj.conn.above().released(&obj.conn, obj.id);
    }
    unregister_owned_callbacks(obj);
    // A dead worker has already dropped everything: releases still succeed (DESIGN.md, Faults).
    // The release of a memory object, kernel, sampler or event is posted (nothing waits on the
    // worker's own release, and it runs after everything enqueued before it, from any thread):
    // a round trip each (11 us on 2 pocl cores, 2-3 on the H200 host) was most of what
    // releasing an application's temporaries cost, and an application that asks every enqueue
    // for its event (pyopencl does) releases one per command. The rest are calls, as the
    // shim's state after them may depend on them (a program's or context's release callbacks,
    // a queue's implicit flush).
    if let Some(&first) = obj.started_by.get() {
        let _ = obj.conn.post(cloister_ipc::Release { object: first });
    }
    let request = cloister_ipc::Release { object: obj.id };
    let _ = match kind {
        Kind::Mem | Kind::Kernel | Kind::Sampler | Kind::Event => obj.conn.post(request),
        _ => obj.conn.call(request),
    };
    let destructors = std::mem::take(&mut *obj.destructors.lock().unwrap_or_else(|e| e.into_inner()));
    for (f, user_data) in destructors.into_iter().rev() {
        // SAFETY: the application registered `f` with this signature for this handle; the handle
        // is still allocated (quarantined below), as the callback may look at its address.
        unsafe { f(h, user_data as *mut c_void) };
    }
    quarantine(h as usize, kind);
    if let Some(&(parent, parent_kind)) = obj.holds.get() {
        unhold(parent as *mut c_void, parent_kind);
    }
    CL_SUCCESS
}

/// Unregisters the callbacks that die with `obj` (`Object::owned_callbacks`), once.
fn unregister_owned_callbacks(obj: &Object) {
    for token in std::mem::take(&mut *obj.owned_callbacks.lock().unwrap_or_else(|e| e.into_inner())) {
        obj.conn.unregister_context_callback(token);
    }
}

/// An object that kept `h` alive (`hold`) went: `h` goes too if nothing else holds it.
fn unhold(h: *mut c_void, kind: Kind) {
    let Ok(obj) = lookup(h, kind) else { return };
    // SeqCst with `release`'s: of the two last lets-go racing, at least one sees the other's.
    if obj.held.fetch_sub(1, Ordering::SeqCst) == 1 && obj.refs.load(Ordering::SeqCst) == 0 && !still_mapped(&obj) {
        retire(h, &obj, kind);
    }
}

/// Makes `child` keep `parent` alive, as the driver does: a kernel its program, a sub-buffer or
/// an image made from a buffer that buffer, an enqueue's event its queue
/// (`new_handle_holding`), other objects their context. The application may
/// release its own references to the parent first; its handle then stays valid (info queries
/// that name it, `CL_KERNEL_PROGRAM`, `CL_MEM_ASSOCIATED_MEMOBJECT`, `CL_QUEUE_CONTEXT`, answer
/// it, and the application may use and retain it again) until the child goes (`retire`), and
/// its destructor callbacks run then, when the driver's would.
pub fn hold(child: *mut c_void, parent: *const c_void, parent_kind: Kind) {
    let Some(obj) = registry().read().unwrap_or_else(|e| e.into_inner()).get(&(child as usize)).cloned() else {
        return;
    };
    if let Ok(p) = lookup(parent, parent_kind) {
        keep_alive(&obj, parent as usize, &p);
    }
}

/// The object `h` keeps alive (`hold`), if any.
pub fn held_by(h: *const c_void) -> Option<(usize, Kind)> {
    registry().read().unwrap_or_else(|e| e.into_inner()).get(&(h as usize)).and_then(|o| o.holds.get().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_objects_are_kept_newest_first_and_the_oldest_makes_room() {
        let mut r: Recent<usize> = Recent { addrs: [0; RECENT_SLOTS], objects: [const { None }; RECENT_SLOTS] };
        let order = |r: &Recent<usize>| r.addrs;
        for h in 1..=3 {
            r.insert(h, h * 10);
        }
        assert_eq!(order(&r), [3, 2, 1, 0, 0, 0, 0, 0]);
        // Again: to the front, not twice.
        r.insert(1, 11);
        assert_eq!(order(&r), [1, 3, 2, 0, 0, 0, 0, 0]);
        assert_eq!(r.objects[0], Some(11));
        // A slot emptied in the middle (an object forgotten) is taken before anything is dropped.
        for h in 4..=8 {
            r.insert(h, h * 10);
        }
        assert_eq!(order(&r), [8, 7, 6, 5, 4, 1, 3, 2]);
        (r.addrs[5], r.objects[5]) = (0, None);
        r.insert(9, 90);
        assert_eq!(order(&r), [9, 8, 7, 6, 5, 4, 3, 2]);
        // Full: the oldest (2) goes.
        r.insert(10, 100);
        assert_eq!(order(&r), [10, 9, 8, 7, 6, 5, 4, 3]);
        for (a, o) in r.addrs.iter().zip(&r.objects) {
            assert_eq!(*o, Some(if *a == 1 { 11 } else { a * 10 }), "{a}");
        }
    }

    #[test]
    fn info_cache_keeps_every_answer_beyond_its_table_and_the_first_of_each_key() {
        let cache = InfoCache::default();
        assert_eq!(cache.get((1, 0), <[u8]>::to_vec), None);
        let n = INFO_SLOTS as u32 * 3;
        for p in 0..n {
            cache.insert((p, u64::from(p % 7)), p.to_ne_bytes().to_vec());
        }
        cache.insert((5, 1000), b"first".to_vec());
        cache.insert((5, 1000), b"second".to_vec());
        for p in 0..n {
            assert_eq!(cache.get((p, u64::from(p % 7)), <[u8]>::to_vec), Some(p.to_ne_bytes().to_vec()), "{p}");
            assert_eq!(cache.get((p, 99), <[u8]>::to_vec), None, "{p}");
        }
        assert_eq!(cache.get((5, 1000), <[u8]>::to_vec), Some(b"first".to_vec()));
    }

    #[test]
    fn info_cache_answers_threads_that_fill_it_at_once() {
        let cache = std::sync::Arc::new(InfoCache::default());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for p in 0..200u32 {
                        cache.insert((p, t % 2), vec![p as u8, (t % 2) as u8]);
                        assert_eq!(cache.get((p, t % 2), <[u8]>::to_vec), Some(vec![p as u8, (t % 2) as u8]));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for p in 0..200u32 {
            for a in 0..2u64 {
                assert_eq!(cache.get((p, a), <[u8]>::to_vec), Some(vec![p as u8, a as u8]));
            }
        }
    }

    #[test]
    fn fast_hasher_spreads_neighbouring_handles_and_params() {
        let hash = |k: &dyn Fn(&mut FastHasher)| {
            let mut h = FastHasher::default();
            k(&mut h);
            h.finish()
        };
        let handles: std::collections::HashSet<u64> =
            (0..1000usize).map(|i| hash(&|h| h.write_usize(0x5555_0000 + 32 * i))).collect();
        assert_eq!(handles.len(), 1000);
        let params: std::collections::HashSet<u64> =
            (0x1000..0x1100u32).map(|p| hash(&|h| std::hash::Hash::hash(&(p, 0u64), h))).collect();
        assert_eq!(params.len(), 0x100);
    }

    #[test]
    fn shared_views_never_reach_outside_their_buffer() {
        let region = cloister_ipc::shm::SharedRegion::create("test", 1 << 16).unwrap();
        let view = SharedView { memory: Arc::new(region.into_mapping()), offset: 0, len: 1 << 16, lease: None };
        assert!(view.at(0, 1 << 16).is_some());
        assert!(view.at(1, 1 << 16).is_none());
        assert!(view.at(usize::MAX, 2).is_none());
        let sub = view.window(4096, 8192).unwrap();
        assert_eq!(sub.at(0, 8192), view.at(4096, 1));
        assert!(sub.at(8192, 1).is_none());
        assert!(view.window(60000, 8192).is_none());
    }
}
