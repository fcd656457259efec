//! Command queues.

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::{CreateCommandQueue, CreateCommandQueueWithProperties, FlushOrFinish, InfoTarget};

use super::{creation, forward_info};
use crate::handle::{lookup, Kind, ObjData, Object};
use crate::info;
use crate::queue_state::QueueState;

/// A new queue's state for direct transfers (`direct`): capable if it runs in order on a
/// context of CPU devices whose buffers are zero-copy.
fn queue_state(ctx: &Object, device: u64, properties: cl_bitfield) -> QueueState {
    let in_order = properties & (CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_ON_DEVICE) == 0;
    let capable = in_order && super::memory::zero_copy_context(ctx) && super::memory::cpu_context(ctx);
    QueueState::new(ctx.id, device, in_order, capable).with_profiling(properties & CL_QUEUE_PROFILING_ENABLE != 0)
}

fn context_and_device(
    context: cl_context,
    device: cl_device_id,
) -> Result<(std::sync::Arc<crate::handle::Object>, u64), cl_int> {
    let ctx = lookup(context, Kind::Context)?;
    let dev = lookup(device, Kind::Device)?;
    if !std::sync::Arc::ptr_eq(&ctx.conn, &dev.conn) {
        return Err(crate::conn::mismatch(&ctx.conn, &dev.conn, CL_INVALID_DEVICE));
    }
    Ok((ctx, dev.id))
}

pub unsafe fn clCreateCommandQueue(
    context: cl_context,
    device: cl_device_id,
    properties: cl_bitfield,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    let (properties, traced) = crate::intercept::device::add_profiling(properties);
    let r = context_and_device(context, device).and_then(|(ctx, dev)| {
        let state = queue_state(&ctx, dev, properties);
        super::create_held((context.cast_const(), Kind::Context), &ctx.conn, Kind::Queue, ObjData::Queue(state), |id| {
            crate::recovery::recorded(&ctx.conn, CreateCommandQueue { id, context: ctx.id, device: dev, properties })
        })
    });
    let r = crate::intercept::device::queue_created(r, traced);
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateCommandQueueWithProperties(
    context: cl_context,
    device: cl_device_id,
    properties: *const cl_bitfield,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    let r = context_and_device(context, device).and_then(|(ctx, dev)| {
        let props = if properties.is_null() {
            None
        } else {
            let mut v = Vec::new();
            let mut i = 0;
            loop {
                // SAFETY: zero-terminated list per the API contract.
                let k = unsafe { *properties.add(i) };
                v.push(k);
                if k == 0 {
                    break;
                }
                // SAFETY: every key has a value.
                v.push(unsafe { *properties.add(i + 1) });
                i += 2;
                if i > 64 {
                    return Err(CL_INVALID_VALUE);
                }
            }
            Some(v)
        };
        let queue_properties = props
            .as_deref()
            .and_then(|p| p.chunks_exact(2).find(|kv| kv[0] == CL_QUEUE_PROPERTIES as u64).map(|kv| kv[1]));
        let state = queue_state(&ctx, dev, queue_properties.unwrap_or(0));
        let (props, traced) = crate::intercept::device::add_profiling_list(props);
        let held = (context.cast_const(), Kind::Context);
        let r = super::create_held(held, &ctx.conn, Kind::Queue, ObjData::Queue(state), |id| {
            let req = CreateCommandQueueWithProperties { id, context: ctx.id, device: dev, properties: props };
            crate::recovery::recorded(&ctx.conn, req)
        });
        crate::intercept::device::queue_created(r, traced)
    });
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

forward_info!(
    clGetCommandQueueInfo,
    cl_command_queue,
    Kind::Queue,
    InfoTarget::CommandQueue,
    crate::intercept::device::queue_answers
);

fn flush_or_finish(queue: cl_command_queue, finish: bool) -> cl_int {
    match lookup(queue, Kind::Queue) {
        Ok(q) => flush_or_finish_queue(&q, finish),
        Err(e) => e,
    }
}

/// `clFlush` or `clFinish` on a queue already looked up (a direct transfer on a busy queue
/// finishes it first). A `clFinish` of an idle queue of CPU devices is answered here
/// (`direct::finish_is_idle`).
pub(super) fn flush_or_finish_queue(q: &Object, finish: bool) -> cl_int {
    let settled = finish.then(|| super::enqueue::SettleAfter::new(q));
    let rc = match finish && crate::direct::finish_is_idle(q) {
        true => CL_SUCCESS,
        false => {
            if finish && q.conn.replays() {
                crate::recovery::journal_of(&q.conn).finishing();
            }
            q.conn.call(FlushOrFinish { queue: q.id, finish }).unwrap_or_else(|e| e)
        }
    };
    let finished = finish && rc == CL_SUCCESS;
    if finished {
        if let Some(state) = q.data.queue_state() {
            state.blocking_call_returned();
        }
    }
    if let Some(settled) = settled {
        if finished {
            // Every command enqueued before the call is complete.
            settled.completed();
        }
        // Settles now, before the journal's checkpoint reads anything back.
        drop(settled);
    }
    if finished && q.conn.replays() {
        crate::recovery::journal_of(&q.conn).finished(&q.conn, q.id);
    }
    rc
}

/// Waits for a queue's earlier commands before a blocking transfer the shim makes itself, as the
/// driver's transfer would have waited for them: `Ok(None)` when they are done, `Ok(Some(code))`
/// when they are done but the `clFinish` returned an earlier posted command's late error, which
/// is then the transfer's to return after it is made (the worker's blocking transfers are made
/// and return it the same way: a write still lands). The late error is taken by the first
/// `clFinish`, so a second one says whether the queue is done; `Err(code)` when it is not.
pub(super) fn finish_before_transfer(q: &Object) -> Result<Option<cl_int>, cl_int> {
    match flush_or_finish_queue(q, true) {
        CL_SUCCESS => Ok(None),
        late => match flush_or_finish_queue(q, true) {
            CL_SUCCESS => Ok(Some(late)),
            _ => Err(late),
        },
    }
}

/// A transfer's code after `finish_before_transfer` met a late error: the transfer's own failure,
/// or else the late error.
pub(super) fn after_late(rc: cl_int, late: Option<cl_int>) -> cl_int {
    match (rc, late) {
        (CL_SUCCESS, Some(late)) => late,
        _ => rc,
    }
}

pub unsafe fn clFlush(queue: cl_command_queue) -> cl_int {
    flush_or_finish(queue, false)
}

pub unsafe fn clFinish(queue: cl_command_queue) -> cl_int {
    flush_or_finish(queue, true)
}

pub unsafe fn clSetDefaultDeviceCommandQueue(
    context: cl_context,
    device: cl_device_id,
    command_queue: cl_command_queue,
) -> Result<cl_int, cl_int> {
    let c = lookup(context, Kind::Context)?;
    let d = lookup(device, Kind::Device)?;
    // NULL goes to the driver: a device without device-side queues answers
    // CL_INVALID_OPERATION before it looks at the queue.
    let queue = match command_queue.is_null() {
        true => None,
        false => Some(c.same_worker(lookup(command_queue, Kind::Queue)?)?.id),
    };
    c.conn.call(cloister_ipc::SetDefaultDeviceCommandQueue { context: c.id, device: d.id, queue })
}

pub unsafe fn clRetainCommandQueue(queue: cl_command_queue) -> cl_int {
    crate::handle::retain(queue, Kind::Queue)
}

/// The last reference to a queue with eventless writes pending (`api::enqueue`'s
/// `eventless_write`) finishes it first: nothing later on it would say they completed, and their
/// segments would never return to the pool.
pub unsafe fn clReleaseCommandQueue(queue: cl_command_queue) -> cl_int {
    if let Ok(q) = lookup(queue, Kind::Queue) {
        if q.app_refs() == 1 && crate::pending::of(&q.conn).has_eventless(q.id) {
            flush_or_finish_queue(&q, true);
        }
    }
    crate::handle::release(queue, Kind::Queue)
}
