//! The worker's side of every lane call: translate ids to driver handles, call the driver,
//! translate handles in results back to ids. Each call is served (`Serve<Call>`) in the module
//! of its API object, as the shim's entry points are; what they share (the lane server, handle
//! lookups, info calls, argument conversions) is here, with the calls on any object.

/// `?` for a call's reply type: an error code becomes the reply.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code.into(),
        }
    };
}

mod command_buffer;
mod context;
mod device;
mod enqueue;
mod event;
mod kernel;
mod memory;
mod program;
mod queue;
mod region;
mod sampler;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex};

use cloister_ipc::cl::*;
use cloister_ipc::fast_hash::{FastMap, FastSet};
use cloister_ipc::image::{self, Strided};
use cloister_ipc::lane::Lane;
use cloister_ipc::shm::SharedMapping;
use cloister_ipc::wire::{handle_layout, map_handles, HandleLayout};
use cloister_ipc::*;

use crate::notify;
use crate::objects::{Kind, ObjectTable};
use crate::segments::Segments;
use crate::{driver_fn, ext_fn};

/// Where the application sees a mapping: a segment holding the mapped rows, packed, or (a
/// zero-copy buffer) the buffer's own shared memory at the mapped offset.
enum View {
    Segment(Arc<SharedMapping>),
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
    /// `Some(offset)`: no driver mapping exists; the map was a read of the buffer at `offset`
    /// into the (pinned) segment, and the unmap writes the segment back (see
    /// `Staging::pins_for`).
    staged: Option<usize>,
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
    mappings: Mutex<FastMap<u64, Mapping>>,
    /// The first late error of a posted enqueue on each queue (by id), until the next blocking
    /// call on that queue returns it (`late_status`).
    late: Mutex<FastMap<ObjectId, cl_int>>,
    /// Each context's callback token, by driver handle: where late errors are told.
    context_tokens: Mutex<FastMap<usize, u64>>,
    /// The failed events `late_failure` made (driver handles). A command waiting on one fails at
    /// once with `CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST`: drivers (pocl 3.1) leave a
    /// command behind an event that failed before it was enqueued queued for ever.
    failed_events: Mutex<FastSet<usize>>,
    /// Buffers whose posted creation failed (`Posted::Create`), by id: the driver's code, which
    /// every later use of the id returns in place of an unknown object's, until its release.
    failed_creations: Mutex<FastMap<ObjectId, cl_int>>,
    /// Shared regions pinned in the driver's contexts for fast transfers (discrete GPUs).
    pub staging: crate::staging::Staging,
    /// Events of commands run in place of the application's (a map served by a read, see
    /// `Mapping::staged`; a transfer the shim made itself, `EnqueueDone`), by driver handle.
    stand_ins: Mutex<FastMap<usize, StandIn>>,
    /// For each kernel argument that was given a pointer-sized value of no object, what such a
    /// value is refused with (`object_arg`), by driver handle and index.
    object_args: Mutex<FastMap<(usize, u32), Option<cl_int>>>,
}

/// What an event standing in for another command answers in that command's place.
#[derive(Clone, Copy)]
pub(crate) struct StandIn {
    /// The command type the application asked for (`CL_EVENT_COMMAND_TYPE`).
    pub command_type: cl_uint,
    /// The queue the command was the application's on (`CL_EVENT_COMMAND_QUEUE`), where the
    /// event is a user event of the worker's (`EnqueueDone`), which has none; 0 where the
    /// driver's answer is right.
    pub queue: usize,
}

/// One lane's server: the worker state plus that lane's bulk area.
pub struct LaneServer<'a> {
    pub worker: &'a Worker,
    pub lane: &'a Lane,
    /// What staging last answered for a transfer of this lane (`Staging::pin_remembered`).
    pub pin_memo: std::cell::RefCell<crate::staging::PinMemo>,
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
        self.worker.objects.get(id, kind).ok_or_else(|| self.missing(id, kind.invalid()))
    }

    pub(crate) fn objs(&self, ids: &[ObjectId], kind: Kind, err: cl_int) -> Result<Vec<*mut c_void>, cl_int> {
        ids.iter()
            .map(|&id| self.worker.objects.get(id, kind).map(|h| h as *mut c_void).ok_or_else(|| self.missing(id, err)))
            .collect()
    }

    /// What a use of `id`, which the table lacks, fails with: the code its posted creation
    /// failed with, if it did, else `err`.
    fn missing(&self, id: ObjectId, err: cl_int) -> cl_int {
        self.worker.failed_creations.lock().unwrap_or_else(|e| e.into_inner()).get(&id).copied().unwrap_or(err)
    }

    fn wait_list(&self, sync: &EnqueueSync) -> Result<Vec<*mut c_void>, cl_int> {
        self.objs(&sync.wait, Kind::Event, CL_INVALID_EVENT_WAIT_LIST)
    }

    /// Resolves bulk data to a pointer into shared memory, bounds-checked.
    fn data(&self, d: &DataRef) -> Result<(*mut u8, Option<Arc<SharedMapping>>), cl_int> {
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
    fn staged(&self, queue: usize, d: &DataRef) -> Result<Staged, cl_int> {
        let (ptr, keep) = self.data(d)?;
        let mut memo = self.pin_memo.borrow_mut();
        let pinned = match &keep {
            Some(region) => self.worker.staging.pin_remembered(&mut memo, queue, region.as_ptr(), region.len()),
            None => {
                let bulk = self.lane.bulk_ptr();
                self.worker.staging.pin_remembered(&mut memo, queue, bulk, cloister_ipc::lane::BULK_CAP)
            }
        };
        Ok(Staged { ptr, _keep: keep, in_lane: matches!(d, DataRef::Lane { .. }), pinned, queue })
    }

    /// Runs a transfer through `staged` bulk data: `call(blocking, count, wait_list, event_out)`
    /// enqueues it. One through a lane's bulk area, which the next call reuses, is complete
    /// before this returns, whatever the application asked: from pinned memory and with no
    /// wait list it is enqueued non-blocking and its event waited for, which NVIDIA's driver
    /// (580, H100) completes about 1 us sooner than the same transfer blocking (4 and 64 KiB,
    /// reads and writes: `tools/measure/lat.c`); else it blocks.
    pub(crate) fn transfer(
        &self,
        sync: &EnqueueSync,
        staged: &Staged,
        blocking: bool,
        call: impl FnOnce(cl_bool, u32, *const *mut c_void, *mut *mut c_void) -> cl_int,
    ) -> cl_int {
        // Behind a wait list the transfer could fail with a failed event, where some drivers'
        // blocking calls still return success (pocl's do): only the blocking call says what the
        // driver says then (`tests/c/semantics.c`).
        if !(staged.in_lane && staged.pinned && sync.wait.is_empty()) {
            let blocking = if staged.in_lane || blocking { CL_TRUE } else { CL_FALSE };
            return self.enqueue(sync, |n, w, e| call(blocking, n, w, e));
        }
        let wait = match self.waits_for(sync) {
            Ok(w) => w,
            Err(e) => return e,
        };
        let mut ev = null_mut();
        let rc = call(CL_FALSE, wait.len() as u32, wait_ptr(&wait), &mut ev);
        if rc != CL_SUCCESS {
            return rc;
        }
        if ev.is_null() {
            // A driver that reports success without the event it was asked for: the lane's bytes
            // may still be in use, so the queue is finished before the reply lets the shim reuse
            // or read them.
            // SAFETY: `staged.queue` is the live queue the transfer was enqueued on.
            return unsafe { driver_fn!(staged.queue, clFinish)(staged.queue as _) };
        }
        // SAFETY: `ev` is the live event the driver just returned.
        let waited = unsafe { driver_fn!(ev as usize, clWaitForEvents)(1, &ev) };
        let rc = match waited {
            CL_SUCCESS => CL_SUCCESS,
            // The transfer failed: its own code if the event has one.
            _ => event_status(ev as usize)
                .ok()
                .filter(|&st| st < 0)
                .unwrap_or(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
        };
        match sync.event {
            Some(id) if rc == CL_SUCCESS => self.adopt(id, Kind::Event, ev, rc),
            _ => {
                // SAFETY: the live event returned above, not handed out.
                unsafe { driver_fn!(ev as usize, clReleaseEvent)(ev) };
                rc
            }
        }
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
        let wait = match self.waits_for(sync) {
            Ok(w) => w,
            Err(e) => return e,
        };
        let mut ev = null_mut();
        let rc = call(wait.len() as u32, wait_ptr(&wait), ev_ptr(sync, &mut ev));
        self.adopt_event(sync, ev, rc)
    }

    /// The driver's events of `sync`'s wait list, or the code for a command that must not run:
    /// an unknown event, or one the worker knows failed.
    fn waits_for(&self, sync: &EnqueueSync) -> Result<Vec<*mut c_void>, cl_int> {
        let wait = self.wait_list(sync)?;
        if !wait.is_empty() {
            let failed = self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner());
            if wait.iter().any(|w| failed.contains(&(*w as usize))) {
                return Err(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
            }
        }
        Ok(wait)
    }

    /// Notes that the event of the command just enqueued for `sync` stands for a command of
    /// type `command_type` (see `Worker::stand_ins`).
    pub(crate) fn stand_in(&self, sync: &EnqueueSync, command_type: cl_uint) {
        if let Some(ev) = sync.event.and_then(|id| self.worker.objects.get(id, Kind::Event)) {
            self.note_stand_in(ev, StandIn { command_type, queue: 0 });
        }
    }

    pub(crate) fn note_stand_in(&self, ev: usize, stand_in: StandIn) {
        self.worker.stand_ins.lock().unwrap_or_else(|e| e.into_inner()).insert(ev, stand_in);
    }

    /// What driver event `ev` stands in for, if it does (see `Worker::stand_ins`).
    pub(crate) fn stand_in_of(&self, ev: usize) -> Option<StandIn> {
        self.worker.stand_ins.lock().unwrap_or_else(|e| e.into_inner()).get(&ev).copied()
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
                        _ => self.missing(*id, CL_INVALID_ARG_VALUE),
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
    /// What a non-zero pointer-sized value of no object given to argument `index` of kernel `k`
    /// is refused with, as the spec says, where the driver would take it for the address of an
    /// object of its own: `None` for an argument that takes plain bytes. Asked of the driver once
    /// per argument, on a clone of the kernel (the kernel's own values stay as they are), with a
    /// NULL value and a zero one:
    ///
    /// | NULL | zero | the argument | a non-zero word |
    /// | --- | --- | --- | --- |
    /// | taken | taken | a `__global` or `__constant` buffer | `CL_INVALID_MEM_OBJECT` |
    /// | taken | refused | `__local` | `CL_INVALID_ARG_VALUE` |
    /// | refused | `CL_INVALID_MEM_OBJECT`, `CL_INVALID_SAMPLER` | an image, a sampler | that code |
    /// | refused | taken, or another code | a value | set as it is |
    ///
    /// (NVIDIA's driver refuses a zero image or sampler; pocl 3.1 takes it, so there an image
    /// or sampler argument reads as a value.) A driver without `clCloneKernel` answers `None`.
    pub(crate) fn object_arg(&self, k: usize, index: u32) -> Option<cl_int> {
        let key = (k, index);
        if let Some(&known) = self.worker.object_args.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return known;
        }
        // SAFETY: k is a live kernel handle from the object table.
        let table = unsafe { crate::driver::dispatch(k) };
        let (Some(clone), Some(set_arg), Some(release)) =
            (table.clCloneKernel, table.clSetKernelArg, table.clReleaseKernel)
        else {
            return None;
        };
        let mut rc = CL_SUCCESS;
        // SAFETY: a live kernel; the clone is released below.
        let probe = unsafe { clone(k as _, &mut rc) };
        if probe.is_null() || rc != CL_SUCCESS {
            return None;
        }
        let zero = 0usize;
        // SAFETY: the clone is a live kernel; a NULL value, and a pointer to a zero word of
        // HANDLE bytes, are valid calls.
        let (null, zeroed) = unsafe {
            (set_arg(probe, index, HANDLE, null()), set_arg(probe, index, HANDLE, (&zero as *const usize).cast()))
        };
        let refused = match (null, zeroed) {
            (CL_SUCCESS, CL_SUCCESS) => Some(CL_INVALID_MEM_OBJECT),
            (CL_SUCCESS, _) => Some(CL_INVALID_ARG_VALUE),
            (_, e @ (CL_INVALID_MEM_OBJECT | CL_INVALID_SAMPLER)) => Some(e),
            _ => None,
        };
        // SAFETY: the clone made above, released once.
        unsafe { release(probe) };
        self.worker.object_args.lock().unwrap_or_else(|e| e.into_inner()).insert(key, refused);
        refused
    }

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
            if self.worker.objects.get_any(id).is_none() {
                if let Ok(ev) = event::user_event_at(ctx, code) {
                    self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner()).insert(ev as usize);
                    self.adopt(id, Kind::Event, ev, CL_SUCCESS);
                }
            }
        }
        self.tell_context(ctx, op, code);
    }

    /// A posted buffer creation (`Posted::Create`) failed with `code` after the application's
    /// call returned success: the id keeps the code for every later use (`missing`), and the
    /// context's callback hears it.
    pub(crate) fn late_creation_failure(&self, context: ObjectId, id: ObjectId, op: u32, code: cl_int) {
        let code = if code < 0 { code } else { CL_OUT_OF_RESOURCES };
        self.worker.failed_creations.lock().unwrap_or_else(|e| e.into_inner()).insert(id, code);
        self.tell_context(self.obj(context, Kind::Context).ok(), op, code);
    }

    /// Tells context `ctx`'s callback, if it has one, of a late error.
    fn tell_context(&self, ctx: Option<usize>, op: u32, code: cl_int) {
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

pub(crate) fn opt_ptr<T, V: AsRef<[T]>>(v: &Option<V>) -> *const T {
    v.as_ref().map_or(null(), |v| v.as_ref().as_ptr())
}

/// A work size as the driver takes it: always three values (those past the ones sent are
/// zero), so a driver reading `work_dim` of them stays within the array whatever was sent.
pub(crate) fn sizes(v: &Option<Dims>) -> Option<[usize; 3]> {
    v.as_ref().map(Dims::to_usize)
}

impl Serve<GetInfo> for LaneServer<'_> {
    fn serve(&self, r: GetInfo) -> InfoReply {
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
        // Only an event's query looks (and takes the lock): every other goes straight on.
        if let Some(stand_in) = (r.target == InfoTarget::Event).then(|| self.stand_in_of(h)).flatten() {
            let value = match r.param {
                CL_EVENT_COMMAND_TYPE => Some(stand_in.command_type.to_ne_bytes().to_vec()),
                CL_EVENT_COMMAND_QUEUE if stand_in.queue != 0 => {
                    let mut v = stand_in.queue.to_ne_bytes().to_vec();
                    if let Some(layout) = handle_layout(r.target, r.param) {
                        self.translate_handles(layout, &mut v);
                    }
                    Some(v)
                }
                _ => None,
            };
            if let Some(value) = value {
                return InfoReply { status: CL_SUCCESS, value_status: CL_SUCCESS, value };
            }
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
        if r.target == InfoTarget::ProgramBuild && r.param == CL_PROGRAM_BUILD_LOG && value_status == CL_SUCCESS {
            value = crate::includes::unstaged(&value);
        }
        if r.target == InfoTarget::Event && r.param == CL_EVENT_COMMAND_EXECUTION_STATUS && value_status == CL_SUCCESS {
            if let Ok(status) = <[u8; 4]>::try_from(value.as_slice()) {
                // Complete or failed: its callbacks go now (see `notify::event_reached`).
                crate::notify::event_reached(h, i32::from_ne_bytes(status));
            }
        }
        InfoReply { status: CL_SUCCESS, value_status, value }
    }
}

impl Serve<Release> for LaneServer<'_> {
    fn serve(&self, r: Release) -> i32 {
        let Some((kind, h)) = self.worker.objects.remove(r.object) else {
            // A buffer whose posted creation failed goes with its release.
            let failed = self.worker.failed_creations.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.object);
            return if failed.is_some() { CL_SUCCESS } else { CL_INVALID_VALUE };
        };
        let hp = h as *mut c_void;
        // What the worker kept about the object goes with it (the driver may reuse a handle).
        match kind {
            Kind::Context => {
                self.worker.staging.forget_context(h);
                self.worker.context_tokens.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
            }
            Kind::Event => {
                self.worker.failed_events.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
                self.worker.stand_ins.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
            }
            Kind::Queue => {
                self.worker.staging.forget_queue(h);
                self.worker.late.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.object);
            }
            Kind::Kernel => {
                self.worker.object_args.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(k, _), _| k != h);
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
}

impl Serve<DropSegment> for LaneServer<'_> {
    fn serve(&self, r: DropSegment) -> i32 {
        match self.worker.segments.remove(r.segment) {
            Some(region) => {
                self.worker.staging.forget_region(region.as_ptr());
                crate::segments::slab_use::forget(r.segment);
                CL_SUCCESS
            }
            None => CL_INVALID_VALUE,
        }
    }
}

impl Serve<RetireSlab> for LaneServer<'_> {
    fn serve(&self, r: RetireSlab) -> i32 {
        if self.worker.segments.get(r.segment).is_none() {
            return CL_INVALID_VALUE;
        }
        crate::segments::slab_use::retire(r.segment);
        CL_SUCCESS
    }
}

/// Keeps a zero-copy buffer's memory mapped until the driver destroys the buffer (after its
/// last release and its last command), then lets it go: a segment of the buffer's own is
/// unmapped then, a slab once the segment table and every buffer in it have let it go. A slab's
/// buffer (`slab`: its segment) counts in `slab_use` until then.
fn keep_until_destroyed(m: usize, memory: Arc<SharedMapping>, slab: Option<u64>) -> cl_int {
    unsafe extern "C" fn destroyed(_m: *mut c_void, user_data: *mut c_void) {
        // SAFETY: user_data is the box leaked below, handed to exactly this one callback.
        let (memory, slab) = *unsafe { Box::from_raw(user_data.cast::<(Arc<SharedMapping>, Option<u64>)>()) };
        drop(memory);
        if let Some(segment) = slab {
            crate::segments::slab_use::let_go(segment);
        }
    }
    // Looked up first: without the callback the memory is never unmapped under the driver.
    let set_destructor = driver_fn!(m, clSetMemObjectDestructorCallback);
    if let Some(segment) = slab {
        // Counted before the callback can run; a refused callback leaves it counted for good
        // (the slab then never comes back, which is safe).
        crate::segments::slab_use::hold(segment);
    }
    let user_data = Box::into_raw(Box::new((memory, slab)));
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

/// Bulk data of a transfer, resolved (`LaneServer::staged`).
pub(crate) struct Staged {
    pub ptr: *mut u8,
    /// The segment it lies in, kept mapped while the transfer is served.
    _keep: Option<Arc<SharedMapping>>,
    /// In the lane's bulk area (else in a segment).
    in_lane: bool,
    /// Pinned in the queue's context.
    pinned: bool,
    /// The driver's queue the transfer is enqueued on.
    queue: usize,
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
