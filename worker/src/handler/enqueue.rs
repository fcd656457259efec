//! Kernel launches and buffer transfers and maps, staged through the lane or a shared segment.

use super::*;

impl Serve<EnqueueNdRange> for LaneServer<'_> {
    fn serve(&self, r: EnqueueNdRange) -> i32 {
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
}

impl Serve<EnqueueWriteBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueWriteBuffer) -> i32 {
        let (sync, data, offset) = (&r.sync, &r.data, r.offset as usize);
        self.buffer_transfer(r.queue, r.mem, sync, data, r.blocking, |q, m, b, len, src, n, w, e| {
            // SAFETY: live queue and buffer; src holds `len` bytes of shared memory that outlives
            // the write (lane: complete on return; segment: the shim drops it only after the
            // event completes).
            unsafe { driver_fn!(q, clEnqueueWriteBuffer)(q as _, m as _, b, offset, len, src.cast(), n, w, e) }
        })
    }
}

impl Serve<EnqueueReadBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueReadBuffer) -> i32 {
        let (sync, into, offset) = (&r.sync, &r.into, r.offset as usize);
        self.buffer_transfer(r.queue, r.mem, sync, into, r.blocking, |q, m, b, len, dst, n, w, e| {
            // SAFETY: live queue and buffer; dst holds `len` writable bytes of shared memory that
            // outlives the read (lane: complete on return; segment: the shim drops it only after
            // the event completes).
            unsafe { driver_fn!(q, clEnqueueReadBuffer)(q as _, m as _, b, offset, len, dst.cast(), n, w, e) }
        })
    }
}

impl LaneServer<'_> {
    /// A `clEnqueueWriteBuffer` or `clEnqueueReadBuffer` of `data`'s bulk bytes, staged
    /// (`staged`) and run as `transfer` runs it; a blocking one also answers an earlier command's
    /// late error on the queue. `call(queue, mem, blocking, len, bulk, count, wait_list,
    /// event_out)` makes the driver's call.
    fn buffer_transfer(
        &self,
        queue: ObjectId,
        mem: ObjectId,
        sync: &EnqueueSync,
        data: &DataRef,
        blocking: bool,
        call: impl FnOnce(usize, usize, cl_bool, usize, *mut u8, u32, *const *mut c_void, *mut *mut c_void) -> cl_int,
    ) -> i32 {
        let q = tri!(self.obj(queue, Kind::Queue));
        let m = tri!(self.obj(mem, Kind::Mem));
        let staged = tri!(self.staged(q, data));
        let (len, bulk) = (data.len() as usize, staged.ptr);
        let rc = self.transfer(sync, &staged, blocking, |b, n, w, e| call(q, m, b, len, bulk, n, w, e));
        if blocking {
            self.late_status(queue, rc)
        } else {
            rc
        }
    }
}

/// Reads enqueued non-blocking, one after the other, then one `clFinish`: a replay checkpoint
/// that reads back thousands of small buffers pays one round trip, not one each. The queue is
/// finished on every path, so no read writes into the segment after the reply.
impl Serve<ReadBack> for LaneServer<'_> {
    fn serve(&self, r: ReadBack) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let Some((offsets, total)) = cloister_ipc::read_back_offsets(r.reads.iter().map(|&(_, size)| size)) else {
            return CL_INVALID_VALUE;
        };
        // The segment, bounded by `total` and pinned as any transfer's (a pooled one comes back
        // for the next checkpoint).
        let staged = tri!(self.staged(q, &DataRef::Segment { id: r.segment, offset: 0, len: total }));
        let base = staged.ptr;
        let read = driver_fn!(q, clEnqueueReadBuffer);
        let mut rc = CL_SUCCESS;
        for (&(mem, size), at) in r.reads.iter().zip(offsets) {
            let m = match self.obj(mem, Kind::Mem) {
                Ok(m) => m,
                Err(e) => {
                    rc = e;
                    break;
                }
            };
            // SAFETY: `[at, at + size)` lies within the segment (`staged` checked `total` against
            // it), which `staged` keeps mapped; the queue is finished below, before it goes.
            rc = unsafe {
                read(q as _, m as _, CL_FALSE, 0, size as usize, base.add(at as usize).cast(), 0, null(), null_mut())
            };
            if rc != CL_SUCCESS {
                break;
            }
        }
        // SAFETY: live queue.
        let finished = unsafe { driver_fn!(q, clFinish)(q as _) };
        if rc == CL_SUCCESS {
            finished
        } else {
            rc
        }
    }
}

impl Serve<EnqueueCopyBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueCopyBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let s = tri!(self.obj(r.src, Kind::Mem));
        let d = tri!(self.obj(r.dst, Kind::Mem));
        let f = driver_fn!(q, clEnqueueCopyBuffer);
        let (so, d_o, size) = (r.src_offset as usize, r.dst_offset as usize, r.size as usize);
        // SAFETY: live objects.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, s as _, d as _, so, d_o, size, n, w, e) })
    }
}

impl Serve<EnqueueFillBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueFillBuffer) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let m = tri!(self.obj(r.mem, Kind::Mem));
        let f = driver_fn!(q, clEnqueueFillBuffer);
        let pattern = if r.pattern.is_empty() { null() } else { r.pattern.as_ptr() };
        let (len, offset, size) = (r.pattern.len(), r.offset as usize, r.size as usize);
        // SAFETY: pattern holds `len` bytes; the driver copies it before returning.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, pattern.cast(), len, offset, size, n, w, e) })
    }
}

impl Serve<EnqueueMapBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueMapBuffer) -> i32 {
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
        if let View::Segment(segment) = &view {
            // A map of no bytes is the driver's too: a read of none succeeds, a map of none not.
            if r.size > 0 && self.worker.staging.pins_for(q) && host_access_unrestricted(m) {
                return self.map_by_reading(&r, q, m, segment.clone());
            }
        }
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
            wants_fill: map_fills(flags),
            pending: None,
            staged: None,
        };
        self.map_done(&r.sync, r.blocking, r.segment, mapping)
    }
}

/// Whether `m` was made without host-access flags (`CL_MEM_HOST_*`). Only such a buffer's map is
/// served by a read and its unmap by a write (`map_by_reading`): with them, that read or write
/// answers otherwise than the driver's map (a writing map of a host-read-only buffer would
/// succeed by reading and fail at its unmap; one of a host-write-only buffer fail at its read).
fn host_access_unrestricted(m: usize) -> bool {
    let restricted = CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS;
    mem_info::<u64>(m, false, CL_MEM_FLAGS).is_ok_and(|flags| flags & restricted == 0)
}

impl Serve<FillMapping> for LaneServer<'_> {
    fn serve(&self, r: FillMapping) -> i32 {
        let mut mappings = self.worker.mappings.lock().unwrap_or_else(|e| e.into_inner());
        match mappings.get_mut(&r.segment) {
            Some(m) => m.fill(),
            None => CL_INVALID_VALUE,
        }
    }
}

impl Serve<EnqueueUnmapMemObject> for LaneServer<'_> {
    fn serve(&self, r: EnqueueUnmapMemObject) -> i32 {
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
        let rc = match mapping.staged {
            Some(offset) => self.unmap_by_writing(&r, q, m, offset, &mapping, write_back),
            None => {
                if write_back {
                    mapping.write_back();
                }
                let f = driver_fn!(q, clEnqueueUnmapMemObject);
                let ptr = mapping.ptr as *mut c_void;
                // SAFETY: ptr is the driver's own mapping of m. The segment stays mapped: the
                // shim pools it for the next map.
                self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, ptr, n, w, e) })
            }
        };
        if rc == CL_SUCCESS && r.stands_for != 0 {
            self.stand_in(&r.sync, r.stands_for);
        }
        rc
    }
}

impl LaneServer<'_> {
    /// A map on a device that transfers from pinned memory (a discrete GPU): the buffer's bytes
    /// are read straight into the segment the application sees (the driver's DMA, at the
    /// link's speed), instead of mapping them into host memory and copying that into the segment.
    /// The event answers `CL_COMMAND_MAP_BUFFER`, as the application asked.
    fn map_by_reading(&self, r: &EnqueueMapBuffer, q: usize, m: usize, segment: Arc<SharedMapping>) -> cl_int {
        let (offset, size) = (r.offset as usize, r.size as usize);
        self.worker.staging.pin(q, segment.as_ptr(), segment.len());
        let rc = if !map_fills(r.flags) {
            // Nothing to read: the application overwrites the region.
            let f = driver_fn!(q, clEnqueueMarkerWithWaitList);
            // SAFETY: a live queue; the wait list and event come from `enqueue`.
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, n, w, e) })
        } else {
            let f = driver_fn!(q, clEnqueueReadBuffer);
            let blocking = if r.blocking { CL_TRUE } else { CL_FALSE };
            let dst = segment.as_ptr().cast::<c_void>();
            // SAFETY: live objects; the segment holds at least `size` bytes (checked by the
            // caller) and stays mapped while the mapping lives.
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, blocking, offset, size, dst, n, w, e) })
        };
        if rc != CL_SUCCESS {
            return rc;
        }
        self.stand_in(&r.sync, CL_COMMAND_MAP_BUFFER);
        let mapping = Mapping {
            mem: m,
            ptr: 0,
            shape: Strided::linear(size),
            view: View::Segment(segment),
            wants_fill: false,
            pending: None,
            staged: Some(offset),
        };
        self.map_done(&r.sync, r.blocking, r.segment, mapping)
    }

    /// The unmap of a mapping made by `map_by_reading`: the segment is written back to the
    /// buffer by the driver's DMA (without waiting: the shim keeps the segment until the
    /// unmap's event completes), or, for a map for reading, a marker stands in for the unmap.
    fn unmap_by_writing(
        &self,
        r: &EnqueueUnmapMemObject,
        q: usize,
        m: usize,
        offset: usize,
        mapping: &Mapping,
        write_back: bool,
    ) -> cl_int {
        let View::Segment(segment) = &mapping.view else { return CL_INVALID_VALUE };
        let rc = if write_back {
            let f = driver_fn!(q, clEnqueueWriteBuffer);
            let (src, size) = (segment.as_ptr().cast::<c_void>().cast_const(), mapping.shape.packed_len());
            // SAFETY: live objects; the segment holds the mapped `size` bytes and outlives the
            // write (the shim pools it only once the unmap's event is complete).
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, m as _, CL_FALSE, offset, size, src, n, w, e) })
        } else {
            let f = driver_fn!(q, clEnqueueMarkerWithWaitList);
            // SAFETY: a live queue; the wait list and event come from `enqueue`.
            self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, n, w, e) })
        };
        if rc == CL_SUCCESS {
            self.stand_in(&r.sync, CL_COMMAND_UNMAP_MEM_OBJECT);
        }
        rc
    }
}
