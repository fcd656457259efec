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
        if let (Some((region, _)), CL_SUCCESS, false) = (memory, rc, m.is_null()) {
            keep_until_destroyed(m as usize, region, slab);
        }
        self.adopt(r.id, Kind::Mem, m, rc)
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
