//! Memory objects: buffers (zero-copy ones too), sub-buffers, images, pipes, migration.

use super::*;

impl Serve<CreateBuffer> for LaneServer<'_> {
    fn serve(&self, r: CreateBuffer) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        // A zero-copy buffer lives in the segment the shim sent: USE_HOST_PTR over its `size`
        // bytes there (its initial contents, if any, are already there).
        // `slab`: the slab's segment, whose buffers `slab_use` counts.
        let (memory, slab) = match r.memory {
            Some(BufferMemory::Whole { segment }) => {
                (Some((tri!(self.worker.segments.take(segment).ok_or(CL_INVALID_VALUE)), 0)), None)
            }
            Some(BufferMemory::Slab { segment, offset }) => {
                (Some((tri!(self.worker.segments.get(segment).ok_or(CL_INVALID_VALUE)), offset)), Some(segment))
            }
            None => (None, None),
        };
        let (flags, host) = match (&memory, &r.host_data) {
            (Some(_), Some(_)) => return CL_INVALID_VALUE,
            (Some((region, offset)), None) => (
                (r.flags & !(CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR)) | CL_MEM_USE_HOST_PTR,
                tri!(region.slice_ptr(*offset, r.size).ok_or(CL_INVALID_VALUE)),
            ),
            (None, Some(d)) => {
                if d.len() != r.size {
                    return CL_INVALID_VALUE;
                }
                (r.flags, tri!(self.data(d)).0)
            }
            (None, None) => (r.flags, null_mut()),
        };
        let props = with_properties(&r.properties);
        // SAFETY: `ctx` is a live driver handle (from the object table).
        let table = unsafe { crate::driver::dispatch(ctx) };
        // The driver's creation with `flags` over `host` (NULL, or `size` bytes of shared memory:
        // checked in `data`, or the segment's length above); `CL_INVALID_OPERATION` from a driver
        // without the entry point.
        let create = |flags: u64, host: *mut u8| {
            let mut rc = CL_INVALID_OPERATION;
            let m = match (&props, table.clCreateBufferWithProperties, table.clCreateBuffer) {
                // SAFETY: props is zero-terminated; host as above.
                (Some(props), Some(f), _) => unsafe {
                    f(ctx as _, opt_ptr(props), flags, r.size as usize, host.cast(), &mut rc)
                },
                // SAFETY: as above.
                (None, _, Some(f)) => unsafe { f(ctx as _, flags, r.size as usize, host.cast(), &mut rc) },
                _ => null_mut(),
            };
            (m, rc)
        };
        let uploaded = match (&memory, &r.host_data) {
            (None, Some(d)) => self.uploaded(ctx, &r, d, &create),
            _ => None,
        };
        let (m, rc) = uploaded.map_or_else(|| create(flags, host), |m| (m, CL_SUCCESS));
        if let (Some((region, _)), CL_SUCCESS, false) = (memory, rc, m.is_null()) {
            keep_until_destroyed(m as usize, region, slab);
        }
        self.adopt(r.id, Kind::Mem, m, rc)
    }
}

/// Contents from this size on are written by the device (`LaneServer::uploaded`); below it, the
/// driver's own copy at creation costs no more than a write's round trip to the device (256 KiB
/// on the H200: 118-136 us a creation that way, pinning included, against 51 as a call).
const UPLOAD_MIN: u64 = 1 << 20;

impl LaneServer<'_> {
    /// A new buffer whose `CL_MEM_COPY_HOST_PTR` contents the device wrote from pinned shared
    /// memory (`d`), made without them and written on a queue of the worker's own
    /// (`Staging::upload_queue`): the driver's copy at creation would be a second copy of what
    /// the application just copied into shared memory (on the H200, 1 MiB a creation took
    /// 119-137 us caged that way against 54-92 directly; 16 MiB 2.8 ms against 1.6). `None`
    /// where that does not apply (a host-unified device, contents not yet pinned, host writes
    /// refused, smaller than `UPLOAD_MIN`) or fails: the driver then copies them as it creates.
    fn uploaded(
        &self,
        ctx: usize,
        r: &CreateBuffer,
        d: &DataRef,
        create: &dyn Fn(u64, *mut u8) -> (*mut c_void, cl_int),
    ) -> Option<*mut c_void> {
        const ELSEWHERE: u64 =
            CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS | CL_MEM_ALLOC_HOST_PTR | CL_MEM_USE_HOST_PTR;
        if r.size < UPLOAD_MIN || r.flags & CL_MEM_COPY_HOST_PTR == 0 || r.flags & ELSEWHERE != 0 {
            return None;
        }
        let queue = self.worker.staging.upload_queue(ctx)?;
        let staged = self.staged(queue, d).ok().filter(|s| s.pinned)?;
        // SAFETY: `queue` is a live driver handle.
        let write = unsafe { crate::driver::dispatch(queue) }.clEnqueueWriteBuffer?;
        let (m, rc) = create(r.flags & !CL_MEM_COPY_HOST_PTR, null_mut());
        if rc != CL_SUCCESS || m.is_null() {
            return None;
        }
        // SAFETY: a live queue of `ctx` and the buffer just made in it; `staged.ptr` holds
        // `size` bytes of shared memory (`data` checked them), and the write is complete on
        // return.
        let wrote =
            unsafe { write(queue as _, m, CL_TRUE, 0, r.size as usize, staged.ptr.cast(), 0, null(), null_mut()) };
        if wrote != CL_SUCCESS {
            // SAFETY: the buffer just made, not handed out.
            if let Some(release) = unsafe { crate::driver::dispatch(m as usize) }.clReleaseMemObject {
                // SAFETY: as above.
                unsafe { release(m) };
            }
            return None;
        }
        if self.worker.staging.debug() {
            eprintln!("cloister-worker: staging: {} bytes of a new buffer's contents written by the device", r.size);
        }
        Some(m)
    }
}

impl Serve<CreateSubBuffer> for LaneServer<'_> {
    fn serve(&self, r: CreateSubBuffer) -> i32 {
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
}

impl Serve<CreateImage> for LaneServer<'_> {
    fn serve(&self, r: CreateImage) -> i32 {
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
}

impl Serve<CreatePipe> for LaneServer<'_> {
    fn serve(&self, r: CreatePipe) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: a live context; no properties.
        let m =
            unsafe { driver_fn!(ctx, clCreatePipe)(ctx as _, r.flags, r.packet_size, r.max_packets, null(), &mut rc) };
        self.adopt(r.id, Kind::Mem, m, rc)
    }
}

impl Serve<EnqueueMigrateMemObjects> for LaneServer<'_> {
    fn serve(&self, r: EnqueueMigrateMemObjects) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let mems = tri!(self.objs(&r.mems, Kind::Mem, CL_INVALID_MEM_OBJECT));
        let f = driver_fn!(q, clEnqueueMigrateMemObjects);
        // SAFETY: live queue and memory objects.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, mems.len() as u32, wait_ptr(&mems), r.flags, n, w, e) })
    }
}
