//! The worker's side of every lane call: translate ids to driver handles, call the driver,
//! translate handles in results back to ids.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex};

use cloister_ipc::cl::*;
use cloister_ipc::lane::Lane;
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::wire::{handle_layout, map_handles, HandleLayout};
use cloister_ipc::*;

use crate::driver_fn;
use crate::notify;
use crate::objects::{Kind, ObjectTable};
use crate::segments::Segments;

/// A live mapping: the driver's pointer, and the segment the application sees instead.
struct Mapping {
    mem: usize,
    ptr: usize,
    size: usize,
    segment: Arc<SharedRegion>,
}

/// State shared by all lanes of one worker.
#[derive(Default)]
pub struct Worker {
    pub objects: ObjectTable,
    pub segments: Segments,
    mappings: Mutex<HashMap<u64, Mapping>>,
}

/// One lane's server: the worker state plus that lane's bulk area.
pub struct LaneServer<'a> {
    pub worker: &'a Worker,
    pub lane: &'a Lane,
}

fn invalid(kind: Kind) -> cl_int {
    match kind {
        Kind::Platform => CL_INVALID_PLATFORM,
        Kind::Device => CL_INVALID_DEVICE,
        Kind::Context => CL_INVALID_CONTEXT,
        Kind::Queue => CL_INVALID_COMMAND_QUEUE,
        Kind::Mem => CL_INVALID_MEM_OBJECT,
        Kind::Program => CL_INVALID_PROGRAM,
        Kind::Kernel => CL_INVALID_KERNEL,
        Kind::Event => CL_INVALID_EVENT,
        Kind::Sampler => CL_INVALID_SAMPLER,
    }
}

fn target_kind(t: InfoTarget) -> Kind {
    match t {
        InfoTarget::Platform => Kind::Platform,
        InfoTarget::Device => Kind::Device,
        InfoTarget::Context => Kind::Context,
        InfoTarget::CommandQueue => Kind::Queue,
        InfoTarget::MemObject | InfoTarget::Image | InfoTarget::Pipe => Kind::Mem,
        InfoTarget::Sampler => Kind::Sampler,
        InfoTarget::Program | InfoTarget::ProgramBuild => Kind::Program,
        InfoTarget::Kernel | InfoTarget::KernelWorkGroup | InfoTarget::KernelArg => Kind::Kernel,
        InfoTarget::Event | InfoTarget::EventProfiling => Kind::Event,
    }
}

/// One `clGet*Info` call on the driver.
#[allow(clippy::too_many_arguments)]
fn info_call(
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
        }
    }
}

const HANDLE: usize = std::mem::size_of::<usize>();

impl LaneServer<'_> {
    fn obj(&self, id: ObjectId, kind: Kind) -> Result<usize, cl_int> {
        self.worker.objects.get(id, kind).ok_or(invalid(kind))
    }

    fn objs(&self, ids: &[ObjectId], kind: Kind, err: cl_int) -> Result<Vec<*mut c_void>, cl_int> {
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

    /// Records a new driver object under the id the shim chose.
    fn adopt(&self, id: ObjectId, kind: Kind, handle: *mut c_void, rc: cl_int) -> cl_int {
        if rc == CL_SUCCESS && !handle.is_null() {
            self.worker.objects.insert(id, kind, handle as usize);
        }
        rc
    }

    /// Runs an enqueue with the call's wait list and event: `call(count, wait_list, event_out)`,
    /// then records the event the driver returned under the id the shim chose.
    fn enqueue(
        &self,
        sync: &EnqueueSync,
        call: impl FnOnce(u32, *const *mut c_void, *mut *mut c_void) -> cl_int,
    ) -> cl_int {
        let wait = match self.wait_list(sync) {
            Ok(w) => w,
            Err(e) => return e,
        };
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

    /// Any handle of the context's platform, for calls whose first argument is not an object.
    fn some_platform(&self) -> Option<usize> {
        self.worker.objects.get(WORKER_ID_BIT, Kind::Platform)
    }
}

fn opt_ptr<T>(v: &Option<Vec<T>>) -> *const T {
    v.as_ref().map_or(null(), |v| v.as_ptr())
}

fn sizes(v: &Option<Vec<u64>>) -> Option<Vec<usize>> {
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
        let kind = target_kind(r.target);
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
        let host = match &r.host_data {
            Some(d) => {
                if d.len() != r.size {
                    return CL_INVALID_VALUE;
                }
                tri!(self.data(d)).0
            }
            None => null_mut(),
        };
        let f = driver_fn!(ctx, clCreateBuffer);
        let mut rc = CL_SUCCESS;
        // SAFETY: host is NULL or points at `size` bytes of shared memory (checked in `data`).
        let m = unsafe { f(ctx as _, r.flags, r.size as usize, host.cast(), &mut rc) };
        self.adopt(r.id, Kind::Mem, m, rc)
    }

    fn create_program_with_source(&self, r: CreateProgramWithSource) -> i32 {
        if let Some(rec) = crate::RECORDER.get() {
            rec.program_source.set(&r.sources.concat());
        }
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let ptrs: Vec<*const c_char> = r.sources.iter().map(|s| s.as_ptr().cast()).collect();
        let lens: Vec<usize> = r.sources.iter().map(|s| s.len()).collect();
        let f = driver_fn!(ctx, clCreateProgramWithSource);
        let mut rc = CL_SUCCESS;
        // SAFETY: ptrs/lens describe r.sources, alive for the call.
        let p = unsafe { f(ctx as _, ptrs.len() as u32, ptrs.as_ptr() as *mut _, lens.as_ptr(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }

    fn build_program(&self, r: BuildProgram) -> i32 {
        if let Some(rec) = crate::RECORDER.get() {
            rec.build_options.set(r.options.as_deref().unwrap_or_default());
        }
        let p = tri!(self.obj(r.program, Kind::Program));
        let devs = match &r.devices {
            Some(ids) => Some(tri!(self.objs(ids, Kind::Device, CL_INVALID_DEVICE))),
            None => None,
        };
        let options = r.options.as_ref().map(|o| {
            let mut o = o.clone();
            o.push(0);
            o
        });
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(p, clBuildProgram);
        // SAFETY: live program and devices; options NUL-terminated.
        unsafe {
            f(
                p as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                cb,
                token,
            )
        }
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
        let set_arg = driver_fn!(k, clSetKernelArg);
        for (index, arg) in &r.args {
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
                return rc;
            }
        }
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
        let (src, _keep) = tri!(self.data(&r.data));
        let blocking = if matches!(r.data, DataRef::Lane { .. }) || r.blocking { CL_TRUE } else { CL_FALSE };
        let f = driver_fn!(q, clEnqueueWriteBuffer);
        let (offset, len) = (r.offset as usize, r.data.len() as usize);
        // SAFETY: src holds `len` bytes of shared memory that outlives the write (lane: blocking;
        // segment: the shim drops it only after the event completes).
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, blocking, offset, len, src.cast(), n, w, e) })
    }

    fn enqueue_read_buffer(&self, r: EnqueueReadBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let (dst, _keep) = tri!(self.data(&r.into));
        // A lane's bulk area is reused by the next call, so reads into it block.
        let blocking = if matches!(r.into, DataRef::Lane { .. }) || r.blocking { CL_TRUE } else { CL_FALSE };
        let f = driver_fn!(q, clEnqueueReadBuffer);
        let (offset, len) = (r.offset as usize, r.into.len() as usize);
        // SAFETY: dst holds `len` writable bytes of shared memory that outlives the read (lane:
        // blocking; segment: the shim drops it only after the event completes).
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, blocking, offset, len, dst.cast(), n, w, e) })
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
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let Some(segment) = self.worker.segments.get(r.segment) else { return CL_INVALID_VALUE };
        if (segment.len() as u64) < r.size {
            return CL_INVALID_VALUE;
        }
        let f = driver_fn!(q, clEnqueueMapBuffer);
        let (flags, offset, size) = (r.flags, r.offset as usize, r.size as usize);
        let mut p = null_mut();
        // SAFETY: live objects; blocking, so the pointer is valid on return.
        let rc = self.enqueue(&r.sync, |n, w, e| {
            let mut rc = CL_SUCCESS;
            p = unsafe { f(q as _, m as _, CL_TRUE, flags, offset, size, n, w, e, &mut rc) };
            rc
        });
        if rc != CL_SUCCESS {
            return rc;
        }
        if flags & CL_MAP_WRITE_INVALIDATE_REGION == 0 && size > 0 && !p.is_null() {
            // SAFETY: the driver mapped `size` readable bytes at p; the segment holds at least
            // `size` bytes (checked above).
            unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), segment.as_ptr(), size) };
        }
        let mapping = Mapping { mem: m, ptr: p as usize, size, segment };
        self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).insert(r.segment, mapping);
        rc
    }

    fn enqueue_unmap_mem_object(&self, r: EnqueueUnmapMemObject) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let mapping = self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.segment);
        let Some(mapping) = mapping else { return CL_INVALID_VALUE };
        if mapping.mem != m {
            self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner()).insert(r.segment, mapping);
            return CL_INVALID_VALUE;
        }
        if r.write_back && mapping.size > 0 && mapping.ptr != 0 {
            // SAFETY: the driver's mapping is writable for `size` bytes; the segment holds as many.
            unsafe { std::ptr::copy_nonoverlapping(mapping.segment.as_ptr(), mapping.ptr as *mut u8, mapping.size) };
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
                driver_fn!(q, clFinish)(q as _)
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

    fn drop_segment(&self, r: DropSegment) -> i32 {
        match self.worker.segments.remove(r.segment) {
            Some(_) => CL_SUCCESS,
            None => CL_INVALID_VALUE,
        }
    }
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
    // SAFETY: only called with live kernel handles from the object table.
    unsafe { crate::driver::dispatch(h) }
}
