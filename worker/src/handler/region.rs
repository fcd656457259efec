//! Rectangular transfers, copies, fills and maps of images and buffer regions.

use super::*;

impl Serve<EnqueueRegionTransfer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueRegionTransfer) -> i32 {
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
        let staged = tri!(self.staged(q, &r.data));
        let zero = [0usize; 3];
        let host_c = staged.ptr as *const c_void;
        let host_m = staged.ptr as *mut c_void;
        // SAFETY (all arms): live queue and memory object; `host` holds the packed region (checked
        // above) in shared memory that outlives the transfer (lane: complete on return; segment:
        // the shim drops it only after the event completes); host pitches of 0 mean packed.
        self.transfer(&r.sync, &staged, r.blocking, |blocking, n, w, e| unsafe {
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
}

impl Serve<EnqueueCopyRegion> for LaneServer<'_> {
    fn serve(&self, r: EnqueueCopyRegion) -> i32 {
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
}

impl Serve<EnqueueFillImage> for LaneServer<'_> {
    fn serve(&self, r: EnqueueFillImage) -> i32 {
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
}

impl Serve<EnqueueMapImage> for LaneServer<'_> {
    fn serve(&self, r: EnqueueMapImage) -> MapImageReply {
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
        let wants_fill = map_fills(r.flags);
        let mapping = Mapping {
            mem: m,
            ptr: p as usize,
            shape,
            view: View::Segment(segment),
            wants_fill,
            pending: None,
            staged: None,
        };
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
}
