//! Handles: what the application holds. Each is a heap cell whose first word is the dispatch
//! table (cl_khr_icd), followed by the shared object state. Handles are validated against a
//! registry before they are dereferenced, so a garbage, NULL or released handle yields the
//! right `CL_INVALID_*` instead of a crash.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use cloister_ipc::cl::*;
use cloister_ipc::dispatch::IcdDispatch;
use cloister_ipc::{ArgValue, ObjectId};

use crate::conn::Conn;

pub use cloister_ipc::ObjectKind as Kind;

/// What the application holds. Only the dispatch pointer lives here (the ICD loader reads it);
/// the object is found through the registry, keyed by the handle's address.
#[repr(C)]
pub struct Handle {
    dispatch: *const IcdDispatch,
}

/// Retired handles stay allocated (and keep their dispatch pointer) for a while: through the ICD
/// loader, a released handle is still dereferenced by the loader before we can say
/// `CL_INVALID_*`, so freeing it at once would turn a use-after-release into a crash.
const QUARANTINE: usize = 1 << 16;

fn quarantine(h: usize) {
    static Q: Mutex<std::collections::VecDeque<usize>> = Mutex::new(std::collections::VecDeque::new());
    let mut q = Q.lock().unwrap_or_else(|e| e.into_inner());
    q.push_back(h);
    if q.len() > QUARANTINE {
        if let Some(old) = q.pop_front() {
            // SAFETY: `old` came from Box::into_raw in new_handle, was unregistered before it
            // entered the quarantine, and leaves it exactly once.
            drop(unsafe { Box::from_raw(old as *mut Handle) });
        }
    }
}

/// A mapping the application holds: where it points, and the segment behind it.
pub struct MapRecord {
    pub segment: crate::conn::Segment,
    pub flags: u64,
    /// For a `CL_MEM_USE_HOST_PTR` object: the application's rows the mapping points at, packed
    /// back into the segment when a writing map is unmapped.
    pub mirror: Option<crate::pending::Mirror>,
}

#[derive(Default)]
pub struct KernelArgs {
    pub values: Vec<Option<ArgValue>>,
    pub dirty: Vec<u32>,
    /// The argument shapes the driver has accepted (`kernel::ArgShape`): a value of a known
    /// shape is recorded here and sent with the next enqueue; a new shape is checked at once.
    pub accepted: std::collections::HashSet<(u32, u64, u8)>,
}

/// What the shim needs to pack an image's rows: the pixel size and the image type, and for a
/// `CL_MEM_USE_HOST_PTR` image the application's memory and its pitches.
#[derive(Clone, Copy, Debug)]
pub struct ImageMeta {
    pub elem: usize,
    pub image_type: u32,
    pub host: Option<HostImage>,
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
    Queue,
    /// `host_ptr` is the application's memory of a `CL_MEM_USE_HOST_PTR` buffer (0 otherwise),
    /// kept in step with the device on blocking reads and maps; `image` is set for images.
    Mem {
        flags: u64,
        host_ptr: usize,
        /// The bytes of the application's memory at `host_ptr` (the buffer's size): the shim
        /// never copies outside them.
        host_len: usize,
        image: Option<ImageMeta>,
        maps: Mutex<HashMap<usize, Vec<MapRecord>>>,
    },
    /// `app_source` is the application's own text when the driver was given a rewritten one
    /// (absolute `#include` names made relative to the staged headers' root).
    Program {
        app_source: Option<Vec<u8>>,
        /// The `CL_PROGRAM_BINARY_SIZES` the application was last told: it sized its
        /// `CL_PROGRAM_BINARIES` buffers from them, so no binary may be longer.
        binary_sizes: Mutex<Option<Vec<usize>>>,
    },
    Kernel {
        num_args: u32,
        args: Mutex<KernelArgs>,
    },
    Event,
    Sampler,
    CommandBuffer,
}

impl ObjData {
    /// A program whose source, if any, the driver has as the application wrote it.
    pub fn program() -> Self {
        Self::program_with(None)
    }

    /// A program whose source the driver has rewritten; `app_source` is the application's.
    pub fn program_with(app_source: Option<Vec<u8>>) -> Self {
        ObjData::Program { app_source, binary_sizes: Mutex::new(None) }
    }

    pub fn mem(flags: u64, host_ptr: usize, host_len: usize, image: Option<ImageMeta>) -> Self {
        ObjData::Mem { flags, host_ptr, host_len, image, maps: Mutex::new(HashMap::new()) }
    }
}

/// A destructor callback (`clSetMemObjectDestructorCallback`, `clSetContextDestructorCallback`,
/// `clSetProgramReleaseCallback`): all three take the handle and the user data.
pub type DestructorFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

pub struct Object {
    pub kind: Kind,
    pub id: ObjectId,
    pub conn: Arc<Conn>,
    refs: AtomicU32,
    /// Platform and device info never changes: cached after the first query.
    pub info_cache: Mutex<HashMap<(u32, u64), Vec<u8>>>,
    pub data: ObjData,
    released: AtomicBool,
    /// Run, last registered first, when the application's last reference goes.
    destructors: Mutex<Vec<(DestructorFn, usize)>>,
    /// Callback tokens that die with this object (a context's `pfn_notify`): unregistered at
    /// its release, so no later notification or worker death calls the application with
    /// `user_data` it has freed since.
    owned_callbacks: Mutex<Vec<u64>>,
}

impl Object {
    pub fn ref_count(&self) -> u32 {
        self.refs.load(Ordering::Acquire)
    }

    /// `other`, if it lives in the same worker as `self` (ids mean nothing across workers).
    pub fn same_worker(&self, other: Arc<Object>) -> Result<Arc<Object>, cl_int> {
        match Arc::ptr_eq(&self.conn, &other.conn) {
            true => Ok(other),
            false => Err(crate::conn::mismatch(&self.conn, &other.conn, CL_INVALID_CONTEXT)),
        }
    }

    /// Ties callback `token` to this object's life (see `owned_callbacks`).
    pub fn own_callback(&self, token: u64) {
        self.owned_callbacks.lock().unwrap_or_else(|e| e.into_inner()).push(token);
    }

    pub fn add_destructor(&self, f: DestructorFn, user_data: usize) {
        self.destructors.lock().unwrap_or_else(|e| e.into_inner()).push((f, user_data));
    }
}

// SAFETY: handles are plain heap cells; the registry owns them and all shared state inside
// `Object` is synchronised.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

fn registry() -> &'static RwLock<HashMap<usize, Arc<Object>>> {
    static REG: std::sync::OnceLock<RwLock<HashMap<usize, Arc<Object>>>> = std::sync::OnceLock::new();
    REG.get_or_init(Default::default)
}

/// Creates a handle for a new object and registers it.
pub fn new_handle(kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) -> *mut c_void {
    let h = Box::into_raw(Box::new(Handle { dispatch: &crate::DISPATCH }));
    rebind(h as usize, kind, id, conn, data);
    h.cast()
}

/// Registers the object behind handle `h`. New handles start here; platform and device handles
/// come back here to point at their successor in a new worker, so the application's handles
/// survive a restart (DESIGN.md, Faults).
pub fn rebind(h: usize, kind: Kind, id: ObjectId, conn: &Arc<Conn>, data: ObjData) {
    let obj = Arc::new(Object {
        kind,
        id,
        conn: conn.clone(),
        refs: AtomicU32::new(1),
        info_cache: Mutex::new(HashMap::new()),
        data,
        released: AtomicBool::new(false),
        destructors: Mutex::new(Vec::new()),
        owned_callbacks: Mutex::new(Vec::new()),
    });
    registry().write().unwrap_or_else(|e| e.into_inner()).insert(h, obj);
    conn.remember(id, h);
}

/// Forgets every handle of a worker's objects, so the connection can go (the fuzz harness
/// ends each input with this; the handles' cells are left allocated, as in the quarantine).
pub fn forget_worker(conn: &Arc<Conn>) {
    registry().write().unwrap_or_else(|e| e.into_inner()).retain(|_, o| !Arc::ptr_eq(&o.conn, conn));
}

fn lookup_once(h: *const c_void, kind: Kind) -> Result<Arc<Object>, cl_int> {
    match registry().read().unwrap_or_else(|e| e.into_inner()).get(&(h as usize)) {
        Some(o) if o.kind == kind => Ok(o.clone()),
        _ => Err(kind.invalid()),
    }
}

/// Validates `h` as a live handle of `kind`. A platform or device whose worker just died is
/// looked up again once its replacement is ready, so recovery needs no retry loop.
pub fn lookup(h: *const c_void, kind: Kind) -> Result<Arc<Object>, cl_int> {
    let found = lookup_once(h, kind)?;
    if matches!(kind, Kind::Platform | Kind::Device) && found.conn.is_dead() && crate::runtime::await_restarts() {
        return lookup_once(h, kind);
    }
    Ok(found)
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
    if obj.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return CL_SUCCESS;
    }
    if obj.released.swap(true, Ordering::AcqRel) {
        return CL_SUCCESS;
    }
    registry().write().unwrap_or_else(|e| e.into_inner()).remove(&(h as usize));
    obj.conn.forget(obj.id);
    for token in std::mem::take(&mut *obj.owned_callbacks.lock().unwrap_or_else(|e| e.into_inner())) {
        obj.conn.unregister_context_callback(token);
    }
    // A dead worker has already dropped everything: releases still succeed (DESIGN.md, Faults).
    let _ = obj.conn.call(cloister_ipc::Release { object: obj.id });
    let destructors = std::mem::take(&mut *obj.destructors.lock().unwrap_or_else(|e| e.into_inner()));
    for (f, user_data) in destructors.into_iter().rev() {
        // SAFETY: the application registered `f` with this signature for this handle; the handle
        // is still allocated (quarantined below), as the callback may look at its address.
        unsafe { f(h, user_data as *mut c_void) };
    }
    quarantine(h as usize);
    CL_SUCCESS
}
