//! Events, user events and event callbacks.

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::{CreateUserEvent, GetInfo, InfoTarget, SetEventCallback, SetUserEventStatus, WaitForEvents};

use super::{creation, forward_info, ids_of, retain_release, slice};
use crate::conn::{Callback, EventNotifyFn};
use crate::handle::{lookup, Kind, ObjData, Object};
use crate::info;

pub unsafe fn clWaitForEvents(num_events: cl_uint, event_list: *const cl_event) -> Result<cl_int, cl_int> {
    if num_events == 0 {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: event_list holds num_events handles.
    let evs = unsafe { slice(event_list, num_events as usize, CL_INVALID_VALUE)? };
    let (ids, conn) = ids_of(evs, Kind::Event, CL_INVALID_EVENT)?;
    let conn = conn.ok_or(CL_INVALID_VALUE)?;
    let rc = conn.call(WaitForEvents { events: ids });
    crate::pending::settle(&conn);
    rc
}

forward_info!(clGetEventInfo, cl_event, Kind::Event, InfoTarget::Event, event_answers);

/// An event reported complete must have its reads landed first: the status query settles them.
fn event_answers(obj: &Object, param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    if param_name != CL_EVENT_COMMAND_EXECUTION_STATUS {
        return None;
    }
    let v = info::query(obj, InfoTarget::Event, 0, param_name);
    if matches!(&v, Ok(b) if b.as_slice() == CL_COMPLETE.to_ne_bytes()) {
        crate::pending::settle(&obj.conn);
    }
    Some(v)
}

forward_info!(clGetEventProfilingInfo, cl_event, Kind::Event, InfoTarget::EventProfiling, profiling_answers);

/// An event's timestamps: hidden where only the shim asked for them (`intercept`); those up to
/// its start from its first command where it stands for several (`Object::started_by`, a
/// pipelined transfer's first chunk), so they span the whole transfer as the driver's would.
fn profiling_answers(obj: &Object, param: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    crate::intercept::device::profiling_answers(obj, param).or_else(|| {
        let first = obj.started_by()?;
        if !matches!(param, CL_PROFILING_COMMAND_QUEUED | CL_PROFILING_COMMAND_SUBMIT | CL_PROFILING_COMMAND_START) {
            return None;
        }
        let reply = obj.conn.call(GetInfo { target: InfoTarget::EventProfiling, object: first, aux: 0, param }).ok()?;
        (reply.status == CL_SUCCESS && reply.value_status == CL_SUCCESS && reply.value.len() == 8)
            .then_some(Ok(reply.value))
    })
}

pub unsafe fn clCreateUserEvent(context: cl_context, errcode_ret: *mut cl_int) -> cl_event {
    let r = lookup(context, Kind::Context).and_then(|ctx| {
        super::create_held(
            (context.cast_const(), Kind::Context),
            &ctx.conn,
            Kind::Event,
            ObjData::Event { context: ctx.id, done: false },
            |id| crate::recovery::recorded(&ctx.conn, CreateUserEvent { id, context: ctx.id }),
        )
    });
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clSetUserEventStatus(event: cl_event, execution_status: cl_int) -> cl_int {
    let r = lookup(event, Kind::Event).and_then(|ev| {
        let rc = ev.conn.call(SetUserEventStatus { event: ev.id, status: execution_status });
        if rc == Ok(CL_SUCCESS) && ev.conn.replays() {
            crate::recovery::journal_of(&ev.conn).user_status(ev.id, execution_status);
        }
        rc
    });
    r.unwrap_or_else(|e| e)
}

pub unsafe fn clSetEventCallback(
    event: cl_event,
    callback_type: cl_int,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
) -> Result<cl_int, cl_int> {
    let ev = lookup(event, Kind::Event)?;
    if pfn_notify.is_null() || !(CL_COMPLETE..=CL_SUBMITTED).contains(&callback_type) {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: the application passes a function of clSetEventCallback's type.
    let pfn = unsafe { std::mem::transmute::<*mut c_void, EventNotifyFn>(pfn_notify) };
    if matches!(ev.data, ObjData::Event { done: true, .. }) {
        // Complete since it was made: the callback runs now, on this thread, with the status it
        // was registered for (the specification's `event_command_status`), as pocl runs one on
        // an event already past that status. `ev` keeps the object alive should the callback
        // release the application's last reference.
        // SAFETY: the application's function, with its event and user_data.
        unsafe { pfn(event, callback_type, user_data) };
        return Ok(CL_SUCCESS);
    }
    // The callback receives the application's handle: keep it alive until it has run.
    crate::handle::retain(event, Kind::Event);
    let token =
        ev.conn.register_callback(Callback::Event { pfn, user_data: user_data as usize, event: event as usize });
    // Posted: the shim has made every check but the driver's memory (a refusal then runs the
    // callback with the driver's code, `Posted::Callback`).
    let rc = ev.conn.post(SetEventCallback { event: ev.id, callback_type, token });
    if rc == Ok(CL_SUCCESS) {
        return rc;
    }
    if ev.conn.unregister_callback(token).is_some() {
        crate::handle::release(event, Kind::Event);
    } else if ev.conn.replays() {
        // The worker died meanwhile and its death handling took the callback: replay mode
        // keeps it for the rebuilt event (or fires it failed), so it is registered, once.
        return Ok(CL_SUCCESS);
    }
    // A callback already run (a worker that died meanwhile) has dropped its reference.
    rc
}

retain_release! {
    clRetainEvent, clReleaseEvent, cl_event, Kind::Event;
}
