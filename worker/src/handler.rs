//! The worker's side of every lane call: translate ids to driver handles, call the driver,
//! translate handles in results back to ids.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex};

use cloister_ipc::cl::*;
use cloister_ipc::image::{self, Strided};
use cloister_ipc::lane::Lane;
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::wire::{handle_layout, map_handles, HandleLayout};
use cloister_ipc::*;

use crate::command_buffer;
use crate::notify;
use crate::objects::{Kind, ObjectTable};
use crate::segments::Segments;
use crate::{driver_fn, ext_fn};

/// Where the application sees a mapping: a segment holding the mapped rows, packed, or (a
/// zero-copy buffer) the buffer's own shared memory at the mapped offset.
enum View {
    Segment(Arc<SharedRegion>),
    InPlace(usize),
}

/// A live mapping: the driver's pointer, the shape of the mapped memory behind it, and where the
/// application sees it instead.
struct Mapping {
    mem: usize,
    ptr: usize,
    shape: Strided,
    view: View,
    /// Whether the view must receive the mapped bytes (not for `CL_MAP_WRITE_INVALIDATE_REGION`).
    wants_fill: bool,
    /// A non-blocking map's event (retained), until the view is filled.
    pending: Option<usize>,
}

impl Mapping {
    /// The view's address, when it is not the driver's mapping itself (then nothing is copied).
    fn copy_target(&self) -> Option<*mut u8> {
        let at = match &self.view {
            View::Segment(s) => s.as_ptr(),
            View::InPlace(p) => *p as *mut u8,
        };
        (self.ptr != 0 && self.ptr != at as usize && self.shape.packed_len() > 0).then_some(at)
    }

    /// Copies the mapped rows into the view once the map is done (at once if it was
    /// blocking, else after waiting for its event).
    fn fill(&mut self) -> cl_int {
        if let Some(ev) = self.pending.take() {
            let evp = ev as *mut c_void;
            // SAFETY: `ev` is the map's event, retained when the map was enqueued.
            let rc = unsafe { driver_fn!(ev, clWaitForEvents)(1, &evp) };
            // SAFETY: as above; this drops our reference.
            unsafe { driver_fn!(ev, clReleaseEvent)(evp) };
            if rc != CL_SUCCESS {
                return rc;
            }
        }
        if let (true, Some(at)) = (self.wants_fill, self.copy_target()) {
            // SAFETY: the driver mapped the shape's rows at ptr and the map is complete; the
            // view holds the packed rows (a segment checked when mapped, or the buffer's own
            // memory at the mapped offset), and is not the driver's mapping itself.
            unsafe { self.shape.pack(self.ptr as *const u8, at) };
            self.wants_fill = false;
        }
        CL_SUCCESS
    }

    /// Copies the view back into the driver's mapping before an unmap that writes back.
    fn write_back(&self) {
        if let Some(at) = self.copy_target() {
            // SAFETY: the driver's mapping covers the shape's rows, writable; the view holds the
            // packed rows (as in `fill`).
            unsafe { self.shape.unpack(at, self.ptr as *mut u8) };
        }
    }
}

/// State shared by all lanes of one worker.
#[derive(Default)]
pub struct Worker {
    pub objects: ObjectTable,
    pub segments: Segments,
    mappings: Mutex<HashMap<u64, Mapping>>,
    /// The first late error of a posted enqueue on each queue (by id), until the next blocking
    /// call on that queue returns it (`late_status`).
    late: Mutex<HashMap<ObjectId, cl_int>>,
    /// Each context's callback token, by driver handle: where late errors are told.
    context_tokens: Mutex<HashMap<usize, u64>>,
    /// The failed events `late_failure` made (driver handles). A command waiting on one fails at
    /// once with `CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST`: drivers (pocl 3.1) leave a
    /// command behind an event that failed before it was enqueued queued for ever.
    failed_events: Mutex<std::collections::HashSet<usize>>,
    /// Shared regions pinned in the driver's contexts for fast transfers (discrete GPUs).
    pub staging: crate::staging::Staging,
}

/// One lane's server: the worker state plus that lane's bulk area.
pub struct LaneServer<'a> {
    pub worker: &'a Worker,
    pub lane: &'a Lane,
}

/// One `clGet*Info` call on the driver.
#[allow(clippy::too_many_arguments)]
pub(crate) fn info_call(
    t: InfoTarget,
    h: usize,
    aux: usize,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let h_ = h as *mut c_void;
    let a = aux as *mut c_void;
    // SAFETY (all arms): h is a live driver handle of the right kind (checked by the caller),
    // value has `size` writable bytes or is NULL with size 0, size_ret is valid or NULL.
    unsafe {
        match t {
            InfoTarget::Platform => driver_fn!(h, clGetPlatformInfo)(h_, param, size, value, size_ret),
            InfoTarget::Device => driver_fn!(h, clGetDeviceInfo)(h_, param, size, value, size_ret),
            InfoTarget::Context => driver_fn!(h, clGetContextInfo)(h_, param, size, value, size_ret),
            InfoTarget::CommandQueue => driver_fn!(h, clGetCommandQueueInfo)(h_, param, size, value, size_ret),
            InfoTarget::MemObject => driver_fn!(h, clGetMemObjectInfo)(h_, param, size, value, size_ret),
            InfoTarget::Image => driver_fn!(h, clGetImageInfo)(h_, param, size, value, size_ret),
            InfoTarget::Pipe => driver_fn!(h, clGetPipeInfo)(h_, param, size, value, size_ret),
            InfoTarget::Sampler => driver_fn!(h, clGetSamplerInfo)(h_, param, size, value, size_ret),
            InfoTarget::Program => driver_fn!(h, clGetProgramInfo)(h_, param, size, value, size_ret),
            InfoTarget::ProgramBuild => driver_fn!(h, clGetProgramBuildInfo)(h_, a, param, size, value, size_ret),
            InfoTarget::Kernel => driver_fn!(h, clGetKernelInfo)(h_, param, size, value, size_ret),
            InfoTarget::KernelWorkGroup => driver_fn!(h, clGetKernelWorkGroupInfo)(h_, a, param, size, value, size_ret),
            InfoTarget::KernelArg => driver_fn!(h, clGetKernelArgInfo)(h_, aux as u32, param, size, value, size_ret),
            InfoTarget::Event => driver_fn!(h, clGetEventInfo)(h_, param, size, value, size_ret),
            InfoTarget::EventProfiling => driver_fn!(h, clGetEventProfilingInfo)(h_, param, size, value, size_ret),
            InfoTarget::CommandBuffer => ext_fn!(clGetCommandBufferInfoKHR)(h_, param, size, value, size_ret),
        }
    }
}

const HANDLE: usize = std::mem::size_of::<usize>();

impl LaneServer<'_> {
    pub(crate) fn obj(&self, id: ObjectId, kind: Kind) -> Result<usize, cl_int> {
        self.worker.objects.get(id, kind).ok_or(kind.invalid())
    }

    pub(crate) fn objs(&self, ids: &[ObjectId], kind: Kind, err: cl_int) -> Result<Vec<*mut c_void>, cl_int> {
        ids.iter().map(|&id| self.worker.objects.get(id, kind).map(|h| h as *mut c_void).ok_or(err)).collect()
    }

    fn wait_list(&self, sync: &EnqueueSync) -> Result<Vec<*mut c_void>, cl_int> {
        self.objs(&sync.wait, Kind::Event, CL_INVALID_EVENT_WAIT_LIST)
    }

    /// Resolves bulk data to a pointer into shared memory, bounds-checked.
    fn data(&self, d: &DataRef) -> Result<(*mut u8, Option<Arc<SharedRegion>>), cl_int> {
        match *d {
            DataRef::Lane { offset, len } => {
                self.lane.bulk_range(offset, len).map(|p| (p, None)).ok_or(CL_INVALID_VALUE)
            }
            DataRef::Segment { id, offset, len } => {
                let seg = self.worker.segments.get(id).ok_or(CL_INVALID_VALUE)?;
                let p = seg.slice_ptr(offset, len).ok_or(CL_INVALID_VALUE)?;
                Ok((p, Some(seg)))
            }
        }
    }

    /// Resolves bulk data for a transfer on `queue`, with the region it lies in pinned in the
    /// queue's context first (see `staging`), so the driver copies at the link's speed.
    fn staged(&self, queue: usize, d: &DataRef) -> Result<(*mut u8, Option<Arc<SharedRegion>>), cl_int> {
        let (p, seg) = self.data(d)?;
        match &seg {
            Some(region) => self.worker.staging.pin(queue, region.as_ptr(), region.len()),
            None => self.worker.staging.pin(queue, self.lane.bulk_ptr(), cloister_ipc::lane::BULK_CAP),
        }
        Ok((p, seg))
    }

    /// Records a new driver object under the id the shim chose.
    pub(crate) fn adopt(&self, id: ObjectId, kind: Kind, handle: *mut c_void, rc: cl_int) -> cl_int {
        if rc == CL_SUCCESS && !handle.is_null() {
            self.worker.objects.insert(id, kind, handle as usize);
        }
        rc
    }

    /// Runs an enqueue with the call's wait list and event: `call(count, wait_list, event_out)`,
    /// then records the event the driver returned under the id the shim chose.
    pub(crate) fn enqueue(
        &self,
        sync: &EnqueueSync,
        call: impl FnOnce(u32, *const *mut c_void, *mut *mut c_void) -> cl_int,
    ) -> cl_int {
        let wait = match self.wait_list(sync) {
            Ok(w) => w,
            Err(e) => return e,
        };
        if !wait.is_empty() {
            let failed = self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner());
            if wait.iter().any(|w| failed.contains(&(*w as usize))) {
                return CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
            }
        }
        let mut ev = null_mut();
        let rc = call(wait.len() as u32, wait_ptr(&wait), ev_ptr(sync, &mut ev));
        self.adopt_event(sync, ev, rc)
    }

    fn adopt_event(&self, sync: &EnqueueSync, ev: *mut c_void, rc: cl_int) -> cl_int {
        match sync.event {
            Some(id) => self.adopt(id, Kind::Event, ev, rc),
            None => rc,
        }
    }

    fn translate_handles(&self, layout: HandleLayout, value: &mut [u8]) {
        map_handles(layout, value, |h| self.worker.objects.id_of(h as usize));
    }

    fn context_properties(&self, props: &Option<Vec<i64>>) -> Result<Option<Vec<isize>>, cl_int> {
        let Some(props) = props else { return Ok(None) };
        let mut out = Vec::with_capacity(props.len() + 1);
        let mut it = props.iter();
        while let Some(&k) = it.next() {
            out.push(k as isize);
            if k == 0 {
                break;
            }
            let v = *it.next().ok_or(CL_INVALID_PROPERTY)?;
            if k as isize == CL_CONTEXT_PLATFORM {
                out.push(self.obj(v as u64, Kind::Platform).map_err(|_| CL_INVALID_PLATFORM)? as isize);
            } else {
                out.push(v as isize);
            }
        }
        if out.last() != Some(&0) {
            out.push(0);
        }
        Ok(Some(out))
    }

    /// Records a new mapping: filled now if the map was blocking, else when `FillMapping` (or
    /// the unmap) says its event is complete.
    fn map_done(&self, sync: &EnqueueSync, blocking: bool, segment: u64, mut mapping: Mapping) -> cl_int {
        if !blocking {
            // The shim always asks a non-blocking map for an event, to know when it is done.
            let Some(ev) = sync.event.and_then(|id| self.worker.objects.get(id, Kind::Event)) else {
                return CL_INVALID_EVENT;
            };
            // SAFETY: a live event; the reference is dropped in `Mapping::fill`.
            unsafe { driver_fn!(ev, clRetainEvent)(ev as *mut c_void) };
            mapping.pending = Some(ev);
        } else {
            let rc = mapping.fill();
            if rc != CL_SUCCESS {
                return rc;
            }
        }
        self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).insert(segment, mapping);
        CL_SUCCESS
    }

    fn opt_devices(&self, ids: &Option<Vec<ObjectId>>) -> Result<Option<Vec<*mut c_void>>, cl_int> {
        ids.as_ref().map(|ids| self.objs(ids, Kind::Device, CL_INVALID_DEVICE)).transpose()
    }

    /// Any handle of the context's platform, for calls whose first argument is not an object.
    pub(crate) fn some_platform(&self) -> Option<usize> {
        self.worker.objects.get(WORKER_ID_BIT, Kind::Platform)
    }

    /// Sets the kernel arguments the shim recorded since the kernel was last used.
    pub(crate) fn set_args(&self, k: usize, args: &[(u32, ArgValue)]) -> Result<(), cl_int> {
        // SAFETY: k is a live kernel handle from the object table.
        let set_arg = unsafe { crate::driver::dispatch(k) }.clSetKernelArg.ok_or(CL_INVALID_OPERATION)?;
        for (index, arg) in args {
            // SAFETY: live kernel; each value pointer is valid for the size passed.
            let rc = unsafe {
                match arg {
                    ArgValue::Bytes(b) => set_arg(k as _, *index, b.len(), b.as_ptr().cast()),
                    ArgValue::Local(n) => set_arg(k as _, *index, *n as usize, null()),
                    ArgValue::Object(id) => match self.worker.objects.get_any(*id) {
                        Some((Kind::Mem | Kind::Sampler, h)) => {
                            set_arg(k as _, *index, HANDLE, (&h as *const usize).cast())
                        }
                        _ => CL_INVALID_ARG_VALUE,
                    },
                }
            };
            if rc != CL_SUCCESS {
                return Err(rc);
            }
        }
        Ok(())
    }
}

impl LaneServer<'_> {
    /// A posted enqueue (`Request::posted`) failed with `code` after the application's call
    /// returned CL_SUCCESS: reported as OpenCL reports asynchronous errors. The application's
    /// event exists anyway, as a user event of the queue's context failed with `code` (so its
    /// status is negative and commands waiting on it fail as the driver makes them); the queue
    /// remembers the code for its next blocking call; the context's callback hears of it.
    pub(crate) fn late_failure(&self, queue: ObjectId, sync: &EnqueueSync, op: u32, code: cl_int) {
        // A failure must read as one: a (nonsensical) positive code becomes a generic error.
        let code = if code < 0 { code } else { CL_OUT_OF_RESOURCES };
        self.worker.late.lock().unwrap_or_else(|e| e.into_inner()).entry(queue).or_insert(code);
        let ctx = self.obj(queue, Kind::Queue).ok().and_then(queue_context);
        if let (Some(id), Some(ctx)) = (sync.event, ctx) {
            // SAFETY: ctx is a live context handle from the driver.
            let table = unsafe { crate::driver::dispatch(ctx) };
            if let (None, Some(create), Some(set)) =
                (self.worker.objects.get_any(id), table.clCreateUserEvent, table.clSetUserEventStatus)
            {
                let mut rc = CL_SUCCESS;
                // SAFETY: a live context; then the user event just created.
                let ev = unsafe { create(ctx as _, &mut rc) };
                if rc == CL_SUCCESS && !ev.is_null() {
                    // SAFETY: as above.
                    unsafe { set(ev, code) };
                    self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner()).insert(ev as usize);
                    self.adopt(id, Kind::Event, ev, rc);
                }
            }
        }
        let token =
            ctx.and_then(|c| self.worker.context_tokens.lock().unwrap_or_else(|e| e.into_inner()).get(&c).copied());
        if let Some(token) = token {
            notify::send(Notification::LateError { token, op, code });
        }
    }

    /// The status a blocking call on `queue` returns: a late error the queue holds takes the
    /// place of its success (once).
    pub(crate) fn late_status(&self, queue: ObjectId, rc: cl_int) -> cl_int {
        match rc {
            CL_SUCCESS => self.take_late(queue).err().unwrap_or(rc),
            _ => rc,
        }
    }

    /// Takes the late error `queue` holds, if any. A blocking map returns it instead of mapping
    /// (a map made and then failed would stay mapped in the driver).
    pub(crate) fn take_late(&self, queue: ObjectId) -> Result<(), cl_int> {
        match self.worker.late.lock().unwrap_or_else(|e| e.into_inner()).remove(&queue) {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// Remembers a context's callback token (see `Worker::context_tokens`).
    fn context_created(&self, ctx: *mut c_void, rc: cl_int, token: Option<u64>) {
        if let (CL_SUCCESS, false, Some(t)) = (rc, ctx.is_null(), token) {
            self.worker.context_tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(ctx as usize, t);
        }
    }
}

/// A queue's context.
fn queue_context(q: usize) -> Option<usize> {
    let mut ctx: usize = 0;
    let (size, ptr) = (HANDLE, (&mut ctx as *mut usize).cast());
    let rc = info_call(InfoTarget::CommandQueue, q, 0, CL_QUEUE_CONTEXT, size, ptr, null_mut());
    (rc == CL_SUCCESS && ctx != 0).then_some(ctx)
}

/// A property list as the driver wants it: zero-terminated, or NULL for `None`.
pub(crate) fn terminated(v: &Option<Vec<u64>>) -> Option<Vec<u64>> {
    v.as_ref().map(|v| {
        let mut v = v.clone();
        if v.last() != Some(&0) {
            v.push(0);
        }
        v
    })
}

/// The property list of a `*WithProperties` call (`None`: the call without properties), where
/// an empty list is the application's NULL.
fn with_properties(v: &Option<Vec<u64>>) -> Option<Option<Vec<u64>>> {
    v.as_ref().map(|p| if p.is_empty() { None } else { terminated(&Some(p.clone())) })
}

/// The flight recorder keeps the last build's options for the crash report.
fn record_build_options(options: &Option<Vec<u8>>) {
    if let Some(rec) = crate::RECORDER.get() {
        rec.build_options.set(options.as_deref().unwrap_or_default());
    }
}

/// Build options as the driver gets them: NUL-terminated, with the application's headers
/// staged and `-I` pointing at them.
fn build_options(includes: &Option<AppIncludes>, options: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, cl_int> {
    match includes {
        Some(inc) => Ok(Some(nul_terminated(&crate::includes::stage(inc, options.as_deref())?))),
        None => Ok(options.as_deref().map(nul_terminated)),
    }
}

fn nul_terminated(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.push(0);
    v
}

/// A 4- or 8-byte info value of a memory object.
fn mem_info<T: Default + Copy>(m: usize, image: bool, param: u32) -> Result<T, cl_int> {
    let mut v = T::default();
    let size = std::mem::size_of::<T>();
    let ptr = (&mut v as *mut T).cast();
    let target = if image { InfoTarget::Image } else { InfoTarget::MemObject };
    match info_call(target, m, 0, param, size, ptr, null_mut()) {
        CL_SUCCESS => Ok(v),
        e => Err(e),
    }
}

fn image_element_size(m: usize) -> Result<usize, cl_int> {
    mem_info::<usize>(m, true, CL_IMAGE_ELEMENT_SIZE)
}

fn mem_type(m: usize) -> Result<u32, cl_int> {
    mem_info::<u32>(m, false, CL_MEM_TYPE)
}

/// An event's execution status, without waiting.
fn event_status(ev: usize) -> Result<cl_int, cl_int> {
    let mut st: cl_int = CL_QUEUED;
    let (size, ptr) = (std::mem::size_of::<cl_int>(), (&mut st as *mut cl_int).cast());
    match info_call(InfoTarget::Event, ev, 0, CL_EVENT_COMMAND_EXECUTION_STATUS, size, ptr, null_mut()) {
        CL_SUCCESS => Ok(st),
        e => Err(e),
    }
}

pub(crate) fn opt_ptr<T>(v: &Option<Vec<T>>) -> *const T {
    v.as_ref().map_or(null(), |v| v.as_ptr())
}

pub(crate) fn sizes(v: &Option<Vec<u64>>) -> Option<Vec<usize>> {
    v.as_ref().map(|v| v.iter().map(|&x| x as usize).collect())
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code.into(),
        }
    };
}

impl Handler for LaneServer<'_> {
    fn get_info(&self, r: GetInfo) -> InfoReply {
        let kind = r.target.object_kind();
        let h = tri!(self.obj(r.object, kind));
        let aux = match r.target {
            InfoTarget::ProgramBuild | InfoTarget::KernelWorkGroup if r.aux != 0 => {
                tri!(self.obj(r.aux, Kind::Device))
            }
            InfoTarget::KernelArg => r.aux as usize,
            _ => 0,
        };
        if r.target == InfoTarget::Program && r.param == CL_PROGRAM_BINARIES {
            // The value is an array of application pointers; not forwarded yet.
            return CL_INVALID_OPERATION.into();
        }
        let mut size = 0usize;
        let rc = info_call(r.target, h, aux, r.param, 0, null_mut(), &mut size);
        if rc != CL_SUCCESS {
            return rc.into();
        }
        // Ask for the value even when it is empty, with a real pointer, as applications do:
        // some drivers refuse that, and the application must see them refuse.
        if size == 0 {
            // Nothing to fetch: asking anyway crashes pocl on an empty CL_CONTEXT_PROPERTIES.
            return InfoReply { status: CL_SUCCESS, value_status: CL_SUCCESS, value: Vec::new() };
        }
        let mut value = vec![0u8; size];
        let value_status = info_call(r.target, h, aux, r.param, size, value.as_mut_ptr().cast(), null_mut());
        // On a refused value the bytes are meaningless, but their count is the size answer.
        value.truncate(size);
        if let Some(layout) = handle_layout(r.target, r.param) {
            self.translate_handles(layout, &mut value);
        }
        InfoReply { status: CL_SUCCESS, value_status, value }
    }

    fn get_device_ids(&self, r: GetDeviceIds) -> IdsReply {
        let p = tri!(self.obj(r.platform, Kind::Platform));
        let f = driver_fn!(p, clGetDeviceIDs);
        let mut n: cl_uint = 0;
        // SAFETY: p is a live platform; count query with a valid out pointer.
        let rc = unsafe { f(p as _, r.device_type, 0, null_mut(), &mut n) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut devs = vec![null_mut(); n as usize];
        // SAFETY: devs has room for n handles.
        let rc = unsafe { f(p as _, r.device_type, n, devs.as_mut_ptr(), null_mut()) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        IdsReply { status: CL_SUCCESS, ids: devs.iter().map(|&d| self.worker.objects.id_of(d as usize)).collect() }
    }

    fn release(&self, r: Release) -> i32 {
        let Some((kind, h)) = self.worker.objects.remove(r.object) else {
            return CL_INVALID_VALUE;
        };
        let hp = h as *mut c_void;
        // What the worker kept about the object goes with it (the driver may reuse a handle).
        match kind {
            Kind::Context => {
                self.worker.staging.forget_context(h);
                self.worker.context_tokens.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
            }
            Kind::Event => drop(self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner()).remove(&h)),
            Kind::Queue => {
                self.worker.staging.forget_queue(h);
                self.worker.late.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.object);
            }
            _ => {}
        }
        // SAFETY: h was a live handle of `kind`; the shim sends one release per object.
        unsafe {
            match kind {
                Kind::Platform => CL_SUCCESS,
                Kind::Device => driver_fn!(h, clReleaseDevice)(hp),
                Kind::Context => driver_fn!(h, clReleaseContext)(hp),
                Kind::Queue => driver_fn!(h, clReleaseCommandQueue)(hp),
                Kind::Mem => driver_fn!(h, clReleaseMemObject)(hp),
                Kind::Program => driver_fn!(h, clReleaseProgram)(hp),
                Kind::Kernel => driver_fn!(h, clReleaseKernel)(hp),
                Kind::Event => driver_fn!(h, clReleaseEvent)(hp),
                Kind::Sampler => driver_fn!(h, clReleaseSampler)(hp),
                Kind::CommandBuffer => ext_fn!(clReleaseCommandBufferKHR)(hp),
            }
        }
    }

    fn create_context(&self, r: CreateContext) -> i32 {
        let props = tri!(self.context_properties(&r.properties));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        let Some(&first) = devs.first() else {
            return CL_INVALID_VALUE;
        };
        let f = driver_fn!(first as usize, clCreateContext);
        let mut rc = CL_SUCCESS;
        let (cb, token) = notify_pair(r.notify, notify::on_context_error as *mut c_void);
        // SAFETY: props is zero-terminated or NULL; devs holds live devices; the callback has
        // the signature clCreateContext expects.
        let ctx = unsafe { f(opt_ptr(&props), devs.len() as u32, devs.as_ptr(), cb, token, &mut rc) };
        self.context_created(ctx, rc, r.notify);
        self.adopt(r.id, Kind::Context, ctx, rc)
    }

    fn create_context_from_type(&self, r: CreateContextFromType) -> i32 {
        let props = tri!(self.context_properties(&r.properties));
        let platform = props
            .as_ref()
            .and_then(|p| p.chunks(2).find(|kv| kv[0] == CL_CONTEXT_PLATFORM).map(|kv| kv[1] as usize))
            .or_else(|| self.some_platform());
        let Some(platform) = platform else {
            return CL_INVALID_PLATFORM;
        };
        let f = driver_fn!(platform, clCreateContextFromType);
        let mut rc = CL_SUCCESS;
        let (cb, token) = notify_pair(r.notify, notify::on_context_error as *mut c_void);
        // SAFETY: as in create_context.
        let ctx = unsafe { f(opt_ptr(&props), r.device_type, cb, token, &mut rc) };
        self.context_created(ctx, rc, r.notify);
        self.adopt(r.id, Kind::Context, ctx, rc)
    }

    fn create_command_queue(&self, r: CreateCommandQueue) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let dev = tri!(self.obj(r.device, Kind::Device));
        let f = driver_fn!(ctx, clCreateCommandQueue);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context and device.
        let q = unsafe { f(ctx as _, dev as _, r.properties, &mut rc) };
        self.adopt(r.id, Kind::Queue, q, rc)
    }

    fn create_command_queue_with_properties(&self, r: CreateCommandQueueWithProperties) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let dev = tri!(self.obj(r.device, Kind::Device));
        let f = driver_fn!(ctx, clCreateCommandQueueWithProperties);
        let mut rc = CL_SUCCESS;
        let mut props = r.properties.clone();
        if let Some(p) = props.as_mut() {
            if p.last() != Some(&0) {
                p.push(0);
            }
        }
        // SAFETY: live context and device; props zero-terminated or NULL.
        let q = unsafe { f(ctx as _, dev as _, opt_ptr(&props), &mut rc) };
        self.adopt(r.id, Kind::Queue, q, rc)
    }

    fn create_buffer(&self, r: CreateBuffer) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        // A zero-copy buffer lives in the segment the shim sent: USE_HOST_PTR over it (its
        // initial contents, if any, are already there).
        let memory = match r.memory {
            Some(id) => {
                let region = tri!(self.worker.segments.take(id).ok_or(CL_INVALID_VALUE));
                if (region.len() as u64) < r.size || r.host_data.is_some() {
                    return CL_INVALID_VALUE;
                }
                Some(region)
            }
            None => None,
        };
        let (flags, host) = match (&memory, &r.host_data) {
            (Some(region), _) => {
                ((r.flags & !(CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR)) | CL_MEM_USE_HOST_PTR, region.as_ptr())
            }
            (None, Some(d)) => {
                if d.len() != r.size {
                    return CL_INVALID_VALUE;
                }
                (r.flags, tri!(self.data(d)).0)
            }
            (None, None) => (r.flags, null_mut()),
        };
        let mut rc = CL_SUCCESS;
        let m = match with_properties(&r.properties) {
            Some(props) => {
                let f = driver_fn!(ctx, clCreateBufferWithProperties);
                // SAFETY: props is zero-terminated or NULL; host is NULL or points at `size`
                // bytes of shared memory (checked in `data`, or the segment's length above).
                unsafe { f(ctx as _, opt_ptr(&props), flags, r.size as usize, host.cast(), &mut rc) }
            }
            None => {
                let f = driver_fn!(ctx, clCreateBuffer);
                // SAFETY: as above.
                unsafe { f(ctx as _, flags, r.size as usize, host.cast(), &mut rc) }
            }
        };
        if let (Some(region), CL_SUCCESS, false) = (memory, rc, m.is_null()) {
            keep_until_destroyed(m as usize, region);
        }
        self.adopt(r.id, Kind::Mem, m, rc)
    }

    fn create_program_with_source(&self, r: CreateProgramWithSource) -> i32 {
        if let Some(rec) = crate::RECORDER.get() {
            rec.program_source.set(&r.sources.concat());
        }
        let ctx = tri!(self.obj(r.context, Kind::Context));
        // NUL-terminated copies: a length of 0 tells the driver to look for the NUL, so an empty
        // string must still point at one (a bare empty Vec points nowhere: pocl crashed on it).
        let sources: Vec<Vec<u8>> = r.sources.iter().map(|s| nul_terminated(s)).collect();
        let ptrs: Vec<*const c_char> = sources.iter().map(|s| s.as_ptr().cast()).collect();
        let lens: Vec<usize> = r.sources.iter().map(|s| s.len()).collect();
        let f = driver_fn!(ctx, clCreateProgramWithSource);
        let mut rc = CL_SUCCESS;
        // SAFETY: ptrs/lens describe `sources`, alive for the call.
        let p = unsafe { f(ctx as _, ptrs.len() as u32, ptrs.as_ptr() as *mut _, lens.as_ptr(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }

    fn build_program(&self, r: BuildProgram) -> BuildReply {
        record_build_options(&r.options);
        let p = tri!(self.obj(r.program, Kind::Program));
        let devs = tri!(self.opt_devices(&r.devices));
        let options = tri!(build_options(&r.includes, r.options));
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(p, clBuildProgram);
        // SAFETY: live program and devices; options NUL-terminated.
        let (status, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                p as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                cb,
                token,
            )
        });
        BuildReply { status, callback_sent }
    }

    fn create_kernel(&self, r: CreateKernel) -> KernelReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let mut name = r.name.clone();
        name.push(0);
        let f = driver_fn!(p, clCreateKernel);
        let mut rc = CL_SUCCESS;
        // SAFETY: live program, NUL-terminated name.
        let k = unsafe { f(p as _, name.as_ptr().cast(), &mut rc) };
        let rc = self.adopt(r.id, Kind::Kernel, k, rc);
        if rc != CL_SUCCESS {
            return rc.into();
        }
        KernelReply { status: CL_SUCCESS, num_args: kernel_num_args(k as usize) }
    }

    fn create_kernels_in_program(&self, r: CreateKernelsInProgram) -> KernelsReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let f = driver_fn!(p, clCreateKernelsInProgram);
        let mut count: cl_uint = 0;
        let mut ks = vec![null_mut(); r.ids.len()];
        let out = if ks.is_empty() { null_mut() } else { ks.as_mut_ptr() };
        // SAFETY: live program; ks has room for ids.len() kernels.
        let rc = unsafe { f(p as _, ks.len() as u32, out, &mut count) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut num_args = Vec::new();
        if !ks.is_empty() {
            for (k, &id) in ks.iter().zip(&r.ids).take(count as usize) {
                self.adopt(id, Kind::Kernel, *k, CL_SUCCESS);
                num_args.push(kernel_num_args(*k as usize));
            }
        }
        KernelsReply { status: CL_SUCCESS, count, num_args }
    }

    fn enqueue_nd_range(&self, r: EnqueueNdRange) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let k = tri!(self.obj(r.kernel, Kind::Kernel));
        tri!(self.set_args(k, &r.args));
        let (offset, global, local) = (sizes(&r.offset), sizes(&r.global), sizes(&r.local));
        let f = driver_fn!(q, clEnqueueNDRangeKernel);
        // SAFETY: live queue and kernel; size arrays hold work_dim entries or are NULL (the driver
        // validates work_dim against them, as the shim sent exactly work_dim).
        self.enqueue(&r.sync, |n, w, e| unsafe {
            f(q as _, k as _, r.work_dim, opt_ptr(&offset), opt_ptr(&global), opt_ptr(&local), n, w, e)
        })
    }

    fn enqueue_write_buffer(&self, r: EnqueueWriteBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let (src, _keep) = tri!(self.staged(q, &r.data));
        let blocking = if matches!(r.data, DataRef::Lane { .. }) || r.blocking { CL_TRUE } else { CL_FALSE };
        let f = driver_fn!(q, clEnqueueWriteBuffer);
        let (offset, len) = (r.offset as usize, r.data.len() as usize);
        // SAFETY: src holds `len` bytes of shared memory that outlives the write (lane: blocking;
        // segment: the shim drops it only after the event completes).
        let rc =
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, blocking, offset, len, src.cast(), n, w, e) });
        if r.blocking {
            self.late_status(r.queue, rc)
        } else {
            rc
        }
    }

    fn enqueue_read_buffer(&self, r: EnqueueReadBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let (dst, _keep) = tri!(self.staged(q, &r.into));
        // A lane's bulk area is reused by the next call, so reads into it block.
        let blocking = if matches!(r.into, DataRef::Lane { .. }) || r.blocking { CL_TRUE } else { CL_FALSE };
        let f = driver_fn!(q, clEnqueueReadBuffer);
        let (offset, len) = (r.offset as usize, r.into.len() as usize);
        // SAFETY: dst holds `len` writable bytes of shared memory that outlives the read (lane:
        // blocking; segment: the shim drops it only after the event completes).
        let rc =
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, blocking, offset, len, dst.cast(), n, w, e) });
        if r.blocking {
            self.late_status(r.queue, rc)
        } else {
            rc
        }
    }

    fn enqueue_copy_buffer(&self, r: EnqueueCopyBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let s = tri!(self.obj(r.src, Kind::Mem));
        let d = tri!(self.obj(r.dst, Kind::Mem));
        let f = driver_fn!(q, clEnqueueCopyBuffer);
        let (so, d_o, size) = (r.src_offset as usize, r.dst_offset as usize, r.size as usize);
        // SAFETY: live objects.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, s as _, d as _, so, d_o, size, n, w, e) })
    }

    fn enqueue_fill_buffer(&self, r: EnqueueFillBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let f = driver_fn!(q, clEnqueueFillBuffer);
        let pattern = if r.pattern.is_empty() { null() } else { r.pattern.as_ptr() };
        let (len, offset, size) = (r.pattern.len(), r.offset as usize, r.size as usize);
        // SAFETY: pattern holds `len` bytes; the driver copies it before returning.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, pattern.cast(), len, offset, size, n, w, e) })
    }

    fn enqueue_map_buffer(&self, r: EnqueueMapBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        if r.blocking {
            tri!(self.take_late(r.queue));
        }
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let (flags, offset, size) = (r.flags, r.offset as usize, r.size as usize);
        let view = if r.in_place {
            // A zero-copy buffer: the application sees the buffer's own memory, which is the
            // driver's host pointer (a sub-buffer's is its parent's plus its origin).
            let host: usize = tri!(mem_info(m, false, CL_MEM_HOST_PTR));
            if host == 0 {
                return CL_INVALID_OPERATION;
            }
            View::InPlace(tri!(host.checked_add(offset).ok_or(CL_INVALID_VALUE)))
        } else {
            let Some(segment) = self.worker.segments.get(r.segment) else { return CL_INVALID_VALUE };
            if (segment.len() as u64) < r.size {
                return CL_INVALID_VALUE;
            }
            View::Segment(segment)
        };
        let f = driver_fn!(q, clEnqueueMapBuffer);
        let blocking = if r.blocking { CL_TRUE } else { CL_FALSE };
        let mut p = null_mut();
        // SAFETY: live objects; the pointer is valid on return, its bytes once the map completes.
        let rc = self.enqueue(&r.sync, |n, w, e| {
            let mut rc = CL_SUCCESS;
            p = unsafe { f(q as _, m as _, blocking, flags, offset, size, n, w, e, &mut rc) };
            rc
        });
        if rc != CL_SUCCESS {
            return rc;
        }
        let mapping = Mapping {
            mem: m,
            ptr: p as usize,
            shape: Strided::linear(size),
            view,
            wants_fill: flags & CL_MAP_WRITE_INVALIDATE_REGION == 0,
            pending: None,
        };
        self.map_done(&r.sync, r.blocking, r.segment, mapping)
    }

    fn fill_mapping(&self, r: FillMapping) -> i32 {
        let mut mappings = self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner());
        match mappings.get_mut(&r.segment) {
            Some(m) => m.fill(),
            None => CL_INVALID_VALUE,
        }
    }

    fn enqueue_unmap_mem_object(&self, r: EnqueueUnmapMemObject) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let mapping = self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.segment);
        let Some(mut mapping) = mapping else { return CL_INVALID_VALUE };
        if mapping.mem != m {
            self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).insert(r.segment, mapping);
            return CL_INVALID_VALUE;
        }
        // Unmapped before its non-blocking map was seen complete: fill the segment first if the
        // map is done by now; if it is not, the application cannot have written through the
        // mapping, and nothing is written back (waiting here could wait forever on a user
        // event the application sets later).
        let complete = mapping.pending.is_none_or(|ev| event_status(ev) == Ok(CL_COMPLETE));
        let write_back = r.write_back && complete && mapping.fill() == CL_SUCCESS;
        if !complete {
            if let Some(ev) = mapping.pending.take() {
                // SAFETY: our reference on the map's event, taken when it was enqueued.
                unsafe { driver_fn!(ev, clReleaseEvent)(ev as *mut c_void) };
            }
        }
        if write_back {
            mapping.write_back();
        }
        let f = driver_fn!(q, clEnqueueUnmapMemObject);
        let ptr = mapping.ptr as *mut c_void;
        // SAFETY: ptr is the driver's own mapping of m. The segment stays mapped: the shim pools
        // it for the next map.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, ptr, n, w, e) })
    }

    fn enqueue_marker_or_barrier(&self, r: EnqueueMarkerOrBarrier) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let f = if r.barrier {
            driver_fn!(q, clEnqueueBarrierWithWaitList)
        } else {
            driver_fn!(q, clEnqueueMarkerWithWaitList)
        };
        // SAFETY: live queue and events.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, n, w, e) })
    }

    fn flush_or_finish(&self, r: FlushOrFinish) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        // SAFETY: live queue.
        unsafe {
            if r.finish {
                self.late_status(r.queue, driver_fn!(q, clFinish)(q as _))
            } else {
                driver_fn!(q, clFlush)(q as _)
            }
        }
    }

    fn wait_for_events(&self, r: WaitForEvents) -> i32 {
        let evs = tri!(self.objs(&r.events, Kind::Event, CL_INVALID_EVENT));
        let Some(&first) = evs.first() else {
            return CL_INVALID_VALUE;
        };
        // SAFETY: live events.
        unsafe { driver_fn!(first as usize, clWaitForEvents)(evs.len() as u32, evs.as_ptr()) }
    }

    fn create_user_event(&self, r: CreateUserEvent) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: live context.
        let ev = unsafe { driver_fn!(ctx, clCreateUserEvent)(ctx as _, &mut rc) };
        self.adopt(r.id, Kind::Event, ev, rc)
    }

    fn set_user_event_status(&self, r: SetUserEventStatus) -> i32 {
        let ev = tri!(self.obj(r.event, Kind::Event));
        // SAFETY: live event.
        unsafe { driver_fn!(ev, clSetUserEventStatus)(ev as _, r.status) }
    }

    fn set_event_callback(&self, r: SetEventCallback) -> i32 {
        let ev = tri!(self.obj(r.event, Kind::Event));
        // SAFETY: live event; the callback has the signature clSetEventCallback expects and
        // `token` is an opaque integer, never dereferenced.
        unsafe {
            driver_fn!(ev, clSetEventCallback)(
                ev as _,
                r.callback_type,
                notify::on_event_status as *mut c_void,
                r.token as *mut c_void,
            )
        }
    }

    fn get_timers(&self, r: GetTimers) -> TimersReply {
        let d = tri!(self.obj(r.device, Kind::Device));
        let (mut device_timestamp, mut host_timestamp) = (0u64, 0u64);
        // SAFETY: a live device; both out pointers are valid u64s.
        let status = unsafe {
            if r.with_device {
                driver_fn!(d, clGetDeviceAndHostTimer)(d as _, &mut device_timestamp, &mut host_timestamp)
            } else {
                driver_fn!(d, clGetHostTimer)(d as _, &mut host_timestamp)
            }
        };
        TimersReply { status, device_timestamp, host_timestamp }
    }

    fn create_sub_buffer(&self, r: CreateSubBuffer) -> i32 {
        let b = tri!(self.obj(r.buffer, Kind::Mem));
        let region = cl_buffer_region { origin: r.origin as usize, size: r.size as usize };
        let mut rc = CL_SUCCESS;
        // SAFETY: a live buffer; the region struct outlives the call.
        let m = unsafe {
            driver_fn!(b, clCreateSubBuffer)(
                b as _,
                r.flags,
                CL_BUFFER_CREATE_TYPE_REGION,
                (&region as *const cl_buffer_region).cast(),
                &mut rc,
            )
        };
        self.adopt(r.id, Kind::Mem, m, rc)
    }

    fn create_image(&self, r: CreateImage) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let format = cl_image_format { image_channel_order: r.format.0, image_channel_data_type: r.format.1 };
        let buffer = match r.desc.buffer {
            Some(id) => tri!(self.obj(id, Kind::Mem)) as *mut c_void,
            None => null_mut(),
        };
        let host = match &r.host_data {
            Some(d) => {
                let elem = tri!(image::element_size(format.image_channel_order, format.image_channel_data_type)
                    .ok_or(CL_IMAGE_FORMAT_NOT_SUPPORTED));
                let extent = image::host_extent(elem, &r.desc).map(|e| e.2);
                if extent != Some(d.len()) {
                    return CL_INVALID_HOST_PTR;
                }
                tri!(self.data(d)).0
            }
            None => null_mut(),
        };
        let desc = cl_image_desc {
            image_type: r.desc.image_type,
            image_width: r.desc.width as usize,
            image_height: r.desc.height as usize,
            image_depth: r.desc.depth as usize,
            image_array_size: r.desc.array_size as usize,
            image_row_pitch: r.desc.row_pitch as usize,
            image_slice_pitch: r.desc.slice_pitch as usize,
            num_mip_levels: r.desc.num_mip_levels,
            num_samples: r.desc.num_samples,
            buffer,
        };
        let (fmt, dsc) = ((&format as *const cl_image_format).cast(), (&desc as *const cl_image_desc).cast());
        let mut rc = CL_SUCCESS;
        // SAFETY: format and desc are valid C structs for the call; host is NULL or the image's
        // whole host extent in shared memory (checked above).
        let m = unsafe {
            match with_properties(&r.properties) {
                Some(props) => driver_fn!(ctx, clCreateImageWithProperties)(
                    ctx as _,
                    opt_ptr(&props),
                    r.flags,
                    fmt,
                    dsc,
                    host.cast(),
                    &mut rc,
                ),
                None => driver_fn!(ctx, clCreateImage)(ctx as _, r.flags, fmt, dsc, host.cast(), &mut rc),
            }
        };
        self.adopt(r.id, Kind::Mem, m, rc)
    }

    fn create_pipe(&self, r: CreatePipe) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: a live context; no properties.
        let m =
            unsafe { driver_fn!(ctx, clCreatePipe)(ctx as _, r.flags, r.packet_size, r.max_packets, null(), &mut rc) };
        self.adopt(r.id, Kind::Mem, m, rc)
    }

    fn get_supported_image_formats(&self, r: GetSupportedImageFormats) -> FormatsReply {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let f = driver_fn!(ctx, clGetSupportedImageFormats);
        let mut n: cl_uint = 0;
        // SAFETY: a live context; count query.
        let rc = unsafe { f(ctx as _, r.flags, r.image_type, 0, null_mut(), &mut n) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut formats = vec![cl_image_format::default(); n as usize];
        if n > 0 {
            // SAFETY: formats has room for n entries.
            let rc = unsafe { f(ctx as _, r.flags, r.image_type, n, formats.as_mut_ptr().cast(), null_mut()) };
            if rc != CL_SUCCESS {
                return rc.into();
            }
        }
        let formats = formats.iter().map(|f| (f.image_channel_order, f.image_channel_data_type)).collect();
        FormatsReply { status: CL_SUCCESS, formats }
    }

    fn create_sampler(&self, r: CreateSampler) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let props = terminated(&r.properties);
        let mut rc = CL_SUCCESS;
        let table = unsafe_dispatch(ctx);
        // SAFETY: (both arms) a live context; props zero-terminated or NULL.
        let s = match table.clCreateSamplerWithProperties {
            Some(f) if !r.legacy => unsafe { f(ctx as _, opt_ptr(&props), &mut rc) },
            _ => {
                let props = props.unwrap_or_default();
                // A 1.x driver: the three properties the 1.x call knows, with its defaults.
                let get = |k| props.chunks(2).find(|kv| kv[0] == k).map(|kv| kv[1]);
                let normalized = get(CL_SAMPLER_NORMALIZED_COORDS).unwrap_or(1) as cl_uint;
                let addressing = get(CL_SAMPLER_ADDRESSING_MODE).unwrap_or(0x1132) as cl_uint;
                let filter = get(CL_SAMPLER_FILTER_MODE).unwrap_or(0x1140) as cl_uint;
                let f = driver_fn!(ctx, clCreateSampler);
                unsafe { f(ctx as _, normalized, addressing, filter, &mut rc) }
            }
        };
        self.adopt(r.id, Kind::Sampler, s, rc)
    }

    fn enqueue_region_transfer(&self, r: EnqueueRegionTransfer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let region = r.region.map(|x| x as usize);
        let width = match r.target {
            RegionTarget::Image { .. } => tri!(image_element_size(m)) * region[0],
            RegionTarget::BufferRect { .. } => region[0],
        };
        let packed = Strided::packed(width, region[1], region[2]).packed_len();
        if packed as u64 != r.data.len() {
            return CL_INVALID_VALUE;
        }
        let (host, _keep) = tri!(self.staged(q, &r.data));
        // A lane's bulk area is reused by the next call, so transfers through it block.
        let blocking = if matches!(r.data, DataRef::Lane { .. }) || r.blocking { CL_TRUE } else { CL_FALSE };
        let zero = [0usize; 3];
        let host_c = host as *const c_void;
        let host_m = host as *mut c_void;
        // SAFETY (all arms): live queue and memory object; `host` holds the packed region (checked
        // above) in shared memory that outlives the transfer (lane: blocking; segment: the shim
        // drops it only after the event completes); host pitches of 0 mean packed.
        self.enqueue(&r.sync, |n, w, e| unsafe {
            match (r.target, r.write) {
                (RegionTarget::Image { origin }, false) => {
                    let o = origin.map(|x| x as usize);
                    driver_fn!(q, clEnqueueReadImage)(
                        q as _,
                        m as _,
                        blocking,
                        o.as_ptr(),
                        region.as_ptr(),
                        0,
                        0,
                        host_m,
                        n,
                        w,
                        e,
                    )
                }
                (RegionTarget::Image { origin }, true) => {
                    let o = origin.map(|x| x as usize);
                    driver_fn!(q, clEnqueueWriteImage)(
                        q as _,
                        m as _,
                        blocking,
                        o.as_ptr(),
                        region.as_ptr(),
                        0,
                        0,
                        host_c,
                        n,
                        w,
                        e,
                    )
                }
                (RegionTarget::BufferRect { origin, row_pitch, slice_pitch }, write) => {
                    let o = origin.map(|x| x as usize);
                    let (rp, sp) = (row_pitch as usize, slice_pitch as usize);
                    if write {
                        driver_fn!(q, clEnqueueWriteBufferRect)(
                            q as _,
                            m as _,
                            blocking,
                            o.as_ptr(),
                            zero.as_ptr(),
                            region.as_ptr(),
                            rp,
                            sp,
                            0,
                            0,
                            host_c,
                            n,
                            w,
                            e,
                        )
                    } else {
                        driver_fn!(q, clEnqueueReadBufferRect)(
                            q as _,
                            m as _,
                            blocking,
                            o.as_ptr(),
                            zero.as_ptr(),
                            region.as_ptr(),
                            rp,
                            sp,
                            0,
                            0,
                            host_m,
                            n,
                            w,
                            e,
                        )
                    }
                }
            }
        })
    }

    fn enqueue_copy_region(&self, r: EnqueueCopyRegion) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let s = tri!(self.obj(r.src, Kind::Mem));
        let d = tri!(self.obj(r.dst, Kind::Mem));
        let (so, d_o, region) =
            (r.src_origin.map(|x| x as usize), r.dst_origin.map(|x| x as usize), r.region.map(|x| x as usize));
        let (srp, ssp) = (r.src_pitches.0 as usize, r.src_pitches.1 as usize);
        let (drp, dsp) = (r.dst_pitches.0 as usize, r.dst_pitches.1 as usize);
        // SAFETY (all arms): live queue and memory objects; origin/region arrays of three.
        self.enqueue(&r.sync, |n, w, e| unsafe {
            let (sp, dp, rp) = (so.as_ptr(), d_o.as_ptr(), region.as_ptr());
            match r.kind {
                CopyKind::BufferRect => driver_fn!(q, clEnqueueCopyBufferRect)(
                    q as _, s as _, d as _, sp, dp, rp, srp, ssp, drp, dsp, n, w, e,
                ),
                CopyKind::Image => driver_fn!(q, clEnqueueCopyImage)(q as _, s as _, d as _, sp, dp, rp, n, w, e),
                CopyKind::ImageToBuffer => {
                    driver_fn!(q, clEnqueueCopyImageToBuffer)(q as _, s as _, d as _, sp, rp, d_o[0], n, w, e)
                }
                CopyKind::BufferToImage => {
                    driver_fn!(q, clEnqueueCopyBufferToImage)(q as _, s as _, d as _, so[0], dp, rp, n, w, e)
                }
            }
        })
    }

    fn enqueue_fill_image(&self, r: EnqueueFillImage) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        if r.color.len() != 16 {
            return CL_INVALID_VALUE;
        }
        let (origin, region) = (r.origin.map(|x| x as usize), r.region.map(|x| x as usize));
        let f = driver_fn!(q, clEnqueueFillImage);
        // SAFETY: live objects; the colour is the 16 bytes of a cl_float4/cl_int4/cl_uint4.
        self.enqueue(&r.sync, |n, w, e| unsafe {
            f(q as _, m as _, r.color.as_ptr().cast(), origin.as_ptr(), region.as_ptr(), n, w, e)
        })
    }

    fn enqueue_map_image(&self, r: EnqueueMapImage) -> MapImageReply {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        if r.blocking {
            tri!(self.take_late(r.queue));
        }
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let Some(segment) = self.worker.segments.get(r.segment) else { return CL_INVALID_VALUE.into() };
        let region = r.region.map(|x| x as usize);
        let elem = tri!(image_element_size(m));
        let image_type = tri!(mem_type(m));
        let packed = Strided::packed(elem * region[0], region[1], region[2]);
        if segment.len() < packed.packed_len() {
            return CL_INVALID_VALUE.into();
        }
        let origin = r.origin.map(|x| x as usize);
        let f = driver_fn!(q, clEnqueueMapImage);
        let (mut row_pitch, mut slice_pitch) = (0usize, 0usize);
        let mut p = null_mut();
        let blocking = if r.blocking { CL_TRUE } else { CL_FALSE };
        // SAFETY: live objects; the pointer and pitches are valid on return, the bytes once the
        // map completes.
        let rc = self.enqueue(&r.sync, |n, w, e| {
            let mut rc = CL_SUCCESS;
            p = unsafe {
                f(
                    q as _,
                    m as _,
                    blocking,
                    r.flags,
                    origin.as_ptr(),
                    region.as_ptr(),
                    &mut row_pitch,
                    &mut slice_pitch,
                    n,
                    w,
                    e,
                    &mut rc,
                )
            };
            rc
        });
        if rc != CL_SUCCESS {
            return rc.into();
        }
        // In a 1D array the rows are the array's images, a slice pitch apart.
        let row_step = if image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY { slice_pitch } else { row_pitch };
        let shape = Strided { row_pitch: row_step, slice_pitch, ..packed };
        let wants_fill = r.flags & CL_MAP_WRITE_INVALIDATE_REGION == 0;
        let mapping =
            Mapping { mem: m, ptr: p as usize, shape, view: View::Segment(segment), wants_fill, pending: None };
        let rc = self.map_done(&r.sync, r.blocking, r.segment, mapping);
        if rc != CL_SUCCESS {
            return rc.into();
        }
        // The application sees packed rows, with the pitches the spec gives each image type.
        let row = packed.row_bytes as u64;
        let slice = match image_type {
            CL_MEM_OBJECT_IMAGE1D_ARRAY => row,
            CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE2D_ARRAY => packed.slice_pitch as u64,
            _ => 0,
        };
        MapImageReply { status: CL_SUCCESS, row_pitch: row, slice_pitch: slice }
    }

    fn enqueue_migrate_mem_objects(&self, r: EnqueueMigrateMemObjects) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let mems = tri!(self.objs(&r.mems, Kind::Mem, CL_INVALID_MEM_OBJECT));
        let f = driver_fn!(q, clEnqueueMigrateMemObjects);
        // SAFETY: live queue and memory objects.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, mems.len() as u32, wait_ptr(&mems), r.flags, n, w, e) })
    }

    fn create_program_with_binary(&self, r: CreateProgramWithBinary) -> StatusesReply {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        if devs.len() != r.binaries.len() {
            return CL_INVALID_VALUE.into();
        }
        let lens: Vec<usize> = r.binaries.iter().map(|b| b.len()).collect();
        let ptrs: Vec<*const u8> = r.binaries.iter().map(|b| b.as_ptr()).collect();
        let mut statuses = vec![CL_SUCCESS; devs.len()];
        let f = driver_fn!(ctx, clCreateProgramWithBinary);
        let mut rc = CL_SUCCESS;
        // SAFETY: devs, lens, ptrs and statuses all hold devs.len() entries, alive for the call.
        let p = unsafe {
            f(
                ctx as _,
                devs.len() as u32,
                devs.as_ptr(),
                lens.as_ptr(),
                ptrs.as_ptr() as *mut _,
                statuses.as_mut_ptr(),
                &mut rc,
            )
        };
        let status = self.adopt(r.id, Kind::Program, p, rc);
        StatusesReply { status, statuses }
    }

    fn create_program_with_il(&self, r: CreateProgramWithIl) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: the IL bytes outlive the call.
        let p = unsafe { driver_fn!(ctx, clCreateProgramWithIL)(ctx as _, r.il.as_ptr().cast(), r.il.len(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }

    fn create_program_with_built_in_kernels(&self, r: CreateProgramWithBuiltInKernels) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        let names = nul_terminated(&r.names);
        let f = driver_fn!(ctx, clCreateProgramWithBuiltInKernels);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context and devices; names NUL-terminated.
        let p = unsafe { f(ctx as _, devs.len() as u32, wait_ptr(&devs), names.as_ptr().cast(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }

    fn compile_program(&self, r: CompileProgram) -> BuildReply {
        record_build_options(&r.options);
        let p = tri!(self.obj(r.program, Kind::Program));
        let devs = tri!(self.opt_devices(&r.devices));
        let options = tri!(build_options(&r.includes, r.options));
        let header_ids: Vec<ObjectId> = r.headers.iter().map(|h| h.0).collect();
        let headers = tri!(self.objs(&header_ids, Kind::Program, CL_INVALID_VALUE));
        let names: Vec<Vec<u8>> = r.headers.iter().map(|h| nul_terminated(&h.1)).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr().cast()).collect();
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(p, clCompileProgram);
        // SAFETY: live program, devices and headers; every string NUL-terminated; the arrays
        // hold the counts passed.
        let (status, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                p as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                headers.len() as u32,
                wait_ptr(&headers),
                if name_ptrs.is_empty() { null_mut() } else { name_ptrs.as_ptr() as *mut _ },
                cb,
                token,
            )
        });
        BuildReply { status, callback_sent }
    }

    fn link_program(&self, r: LinkProgram) -> CreatedReply {
        record_build_options(&r.options);
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.opt_devices(&r.devices));
        let inputs = tri!(self.objs(&r.inputs, Kind::Program, CL_INVALID_PROGRAM));
        let options = r.options.as_deref().map(nul_terminated);
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(ctx, clLinkProgram);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context, devices and programs; options NUL-terminated.
        let (p, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                ctx as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                inputs.len() as u32,
                wait_ptr(&inputs),
                cb,
                token,
                &mut rc,
            )
        });
        if !p.is_null() {
            self.worker.objects.insert(r.id, Kind::Program, p as usize);
        }
        CreatedReply { status: rc, created: !p.is_null(), callback_sent }
    }

    fn get_program_binaries(&self, r: GetProgramBinaries) -> BinariesReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let f = driver_fn!(p, clGetProgramInfo);
        let mut size = 0usize;
        // SAFETY: a live program; size query.
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARY_SIZES, 0, null_mut(), &mut size) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut sizes = vec![0usize; size / HANDLE];
        // SAFETY: sizes holds `size` bytes.
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARY_SIZES, size, sizes.as_mut_ptr().cast(), null_mut()) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut binaries: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut ptrs: Vec<*mut u8> =
            binaries.iter_mut().map(|b| if b.is_empty() { null_mut() } else { b.as_mut_ptr() }).collect();
        // SAFETY: one pointer per device, each to as many bytes as the driver said (or NULL).
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARIES, ptrs.len() * HANDLE, ptrs.as_mut_ptr().cast(), null_mut()) };
        BinariesReply { status: rc, binaries: if rc == CL_SUCCESS { binaries } else { Vec::new() } }
    }

    fn set_program_specialization_constant(&self, r: SetProgramSpecializationConstant) -> i32 {
        let p = tri!(self.obj(r.program, Kind::Program));
        let value = if r.value.is_empty() { null() } else { r.value.as_ptr() };
        // SAFETY: a live program; value holds value.len() bytes.
        unsafe { driver_fn!(p, clSetProgramSpecializationConstant)(p as _, r.spec_id, r.value.len(), value.cast()) }
    }

    fn unload_platform_compiler(&self, r: UnloadPlatformCompiler) -> i32 {
        let p = tri!(self.obj(r.platform, Kind::Platform));
        // SAFETY: a live platform.
        unsafe { driver_fn!(p, clUnloadPlatformCompiler)(p as _) }
    }

    fn clone_kernel(&self, r: CloneKernel) -> i32 {
        let k = tri!(self.obj(r.source, Kind::Kernel));
        let mut rc = CL_SUCCESS;
        // SAFETY: a live kernel.
        let c = unsafe { driver_fn!(k, clCloneKernel)(k as _, &mut rc) };
        self.adopt(r.id, Kind::Kernel, c, rc)
    }

    fn get_kernel_sub_group_info(&self, r: GetKernelSubGroupInfo) -> InfoReply {
        let k = tri!(self.obj(r.kernel, Kind::Kernel));
        let d = if r.device == 0 { 0 } else { tri!(self.obj(r.device, Kind::Device)) };
        let f = driver_fn!(k, clGetKernelSubGroupInfo);
        let input = if r.input.is_empty() { null() } else { r.input.as_ptr() };
        let mut size = 0usize;
        // SAFETY: (both calls) live kernel and device; input holds input.len() bytes; value
        // holds `size` bytes.
        let status = unsafe { f(k as _, d as _, r.param, r.input.len(), input.cast(), 0, null_mut(), &mut size) };
        if status != CL_SUCCESS {
            return status.into();
        }
        let mut value = vec![0u8; size];
        let value_status = if size == 0 {
            CL_SUCCESS
        } else {
            unsafe {
                f(k as _, d as _, r.param, r.input.len(), input.cast(), size, value.as_mut_ptr().cast(), null_mut())
            }
        };
        InfoReply { status, value_status, value }
    }

    fn create_sub_devices(&self, r: CreateSubDevices) -> CountReply {
        let d = tri!(self.obj(r.device, Kind::Device));
        let mut props: Vec<isize> = r.properties.iter().map(|&p| p as isize).collect();
        if props.last() != Some(&0) {
            props.push(0);
        }
        let mut out = vec![null_mut(); r.ids.len()];
        let mut count: cl_uint = 0;
        let f = driver_fn!(d, clCreateSubDevices);
        let out_ptr = if out.is_empty() { null_mut() } else { out.as_mut_ptr() };
        // SAFETY: a live device; props zero-terminated; out has room for ids.len() devices.
        let rc = unsafe { f(d as _, props.as_ptr(), out.len() as u32, out_ptr, &mut count) };
        if rc == CL_SUCCESS {
            for (&h, &id) in out.iter().zip(&r.ids).filter(|(h, _)| !h.is_null()) {
                self.worker.objects.insert(id, Kind::Device, h as usize);
            }
        }
        CountReply { status: rc, count }
    }

    fn set_default_device_command_queue(&self, r: SetDefaultDeviceCommandQueue) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let d = tri!(self.obj(r.device, Kind::Device));
        let q = match r.queue {
            Some(id) => tri!(self.obj(id, Kind::Queue)),
            None => 0,
        };
        // SAFETY: live context, device and queue (or NULL).
        unsafe { driver_fn!(ctx, clSetDefaultDeviceCommandQueue)(ctx as _, d as _, q as _) }
    }

    fn set_kernel_arg(&self, r: SetKernelArg) -> i32 {
        let k = tri!(self.obj(r.kernel, Kind::Kernel));
        self.set_args(k, &[(r.index, r.value)]).err().unwrap_or(CL_SUCCESS)
    }

    fn probe_program_release_callback(&self, r: ProbeProgramReleaseCallback) -> i32 {
        let p = tri!(self.obj(r.program, Kind::Program));
        // SAFETY: a live program; the callback has the signature the driver calls.
        unsafe { driver_fn!(p, clSetProgramReleaseCallback)(p as _, notify::ignore_program as *mut c_void, null_mut()) }
    }

    fn create_command_buffer(&self, r: CreateCommandBuffer) -> i32 {
        command_buffer::create(self, r).unwrap_or_else(|e| e)
    }

    fn finalize_command_buffer(&self, r: FinalizeCommandBuffer) -> i32 {
        command_buffer::finalize(self, r).unwrap_or_else(|e| e)
    }

    fn record_command(&self, r: RecordCommand) -> SyncPointReply {
        command_buffer::record(self, r).unwrap_or_else(SyncPointReply::from)
    }

    fn enqueue_command_buffer(&self, r: EnqueueCommandBuffer) -> i32 {
        command_buffer::enqueue(self, r).unwrap_or_else(|e| e)
    }

    fn drop_segment(&self, r: DropSegment) -> i32 {
        match self.worker.segments.remove(r.segment) {
            Some(region) => {
                self.worker.staging.forget_region(region.as_ptr());
                CL_SUCCESS
            }
            None => CL_INVALID_VALUE,
        }
    }
}

/// Keeps a zero-copy buffer's memory mapped until the driver destroys the buffer (after its
/// last release and its last command), then unmaps it. The fd is closed at once (both sides
/// have mapped it): an application with thousands of buffers must not run out of descriptors.
fn keep_until_destroyed(m: usize, region: Arc<SharedRegion>) -> cl_int {
    unsafe extern "C" fn destroyed(_m: *mut c_void, user_data: *mut c_void) {
        // SAFETY: user_data is the box leaked below, handed to exactly this one callback.
        drop(unsafe { Box::from_raw(user_data.cast::<cloister_ipc::shm::SharedMapping>()) });
    }
    // Looked up first: without the callback the memory is never unmapped under the driver.
    let set_destructor = driver_fn!(m, clSetMemObjectDestructorCallback);
    let region = match Arc::try_unwrap(region) {
        Ok(region) => region,
        Err(shared) => {
            // Another lane still holds it (a shim naming the segment twice): kept mapped for
            // good, never unmapped under the driver.
            std::mem::forget(shared);
            return CL_SUCCESS;
        }
    };
    let user_data = Box::into_raw(Box::new(region.into_mapping()));
    // SAFETY: m is the live buffer just created; the callback has the destructor signature.
    // If the driver refuses, the box stays leaked: mapped for the worker's life, never unmapped
    // under the driver.
    unsafe { set_destructor(m as _, destroyed as *mut c_void, user_data.cast()) }
}

fn notify_pair(token: Option<u64>, cb: *mut c_void) -> (*mut c_void, *mut c_void) {
    match token {
        Some(t) => (cb, t as *mut c_void),
        None => (null_mut(), null_mut()),
    }
}

fn wait_ptr(w: &[*mut c_void]) -> *const *mut c_void {
    if w.is_empty() {
        null()
    } else {
        w.as_ptr()
    }
}

fn ev_ptr(sync: &EnqueueSync, ev: &mut *mut c_void) -> *mut *mut c_void {
    if sync.event.is_some() {
        ev
    } else {
        null_mut()
    }
}

fn kernel_num_args(k: usize) -> u32 {
    let mut n: cl_uint = 0;
    let f = match unsafe_dispatch(k).clGetKernelInfo {
        Some(f) => f,
        None => return 0,
    };
    // SAFETY: live kernel, 4-byte out value.
    let rc = unsafe { f(k as _, CL_KERNEL_NUM_ARGS, 4, (&mut n as *mut u32).cast(), null_mut()) };
    if rc == CL_SUCCESS {
        n
    } else {
        0
    }
}

fn unsafe_dispatch<'a>(h: usize) -> &'a cloister_ipc::dispatch::IcdDispatch {
    // SAFETY: only called with live driver handles from the object table.
    unsafe { crate::driver::dispatch(h) }
}
