//! Command queues: creation, flush/finish, markers and barriers.

use super::*;

impl Serve<CreateCommandQueue> for LaneServer<'_> {
    fn serve(&self, r: CreateCommandQueue) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let dev = tri!(self.obj(r.device, Kind::Device));
        let f = driver_fn!(ctx, clCreateCommandQueue);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context and device.
        let q = unsafe { f(ctx as _, dev as _, r.properties, &mut rc) };
        self.adopt(r.id, Kind::Queue, q, rc)
    }
}

impl Serve<CreateCommandQueueWithProperties> for LaneServer<'_> {
    fn serve(&self, r: CreateCommandQueueWithProperties) -> i32 {
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
}

impl Serve<SetDefaultDeviceCommandQueue> for LaneServer<'_> {
    fn serve(&self, r: SetDefaultDeviceCommandQueue) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let d = tri!(self.obj(r.device, Kind::Device));
        let q = match r.queue {
            Some(id) => tri!(self.obj(id, Kind::Queue)),
            None => 0,
        };
        // SAFETY: live context, device and queue (or NULL).
        unsafe { driver_fn!(ctx, clSetDefaultDeviceCommandQueue)(ctx as _, d as _, q as _) }
    }
}

impl Serve<FlushOrFinish> for LaneServer<'_> {
    fn serve(&self, r: FlushOrFinish) -> i32 {
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
}

impl Serve<EnqueueMarkerOrBarrier> for LaneServer<'_> {
    fn serve(&self, r: EnqueueMarkerOrBarrier) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let f = if r.barrier {
            driver_fn!(q, clEnqueueBarrierWithWaitList)
        } else {
            driver_fn!(q, clEnqueueMarkerWithWaitList)
        };
        // SAFETY: live queue and events.
        self.enqueue(&r.sync, |n, w, e| unsafe { f(q as _, n, w, e) })
    }
}
