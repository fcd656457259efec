//! Contexts.

use std::ffi::c_void;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::{CreateContext, CreateContextFromType, InfoTarget};

use super::{create, creation, forward_info, ids_of, retain_release, slice};
use crate::conn::{Callback, Conn, ContextNotifyFn};
use crate::handle::{lookup, Kind, ObjData};
use crate::info;

/// Translates a property list (platform handles become ids) and finds its worker.
///
/// # Safety
/// `props` is NULL or a zero-terminated property list.
/// A context property list as the worker takes it, and the worker its platform names.
type WireProperties = (Option<Vec<i64>>, Option<Arc<Conn>>);

unsafe fn properties(props: *const isize) -> Result<WireProperties, cl_int> {
    if props.is_null() {
        return Ok((None, None));
    }
    let mut out = Vec::new();
    let mut conn = None;
    let mut i = 0;
    loop {
        // SAFETY: the list is zero-terminated per the API contract; we stop at the 0 key.
        let key = unsafe { *props.add(i) };
        if key == 0 {
            break;
        }
        // SAFETY: every non-zero key is followed by a value.
        let val = unsafe { *props.add(i + 1) };
        if key == CL_CONTEXT_PLATFORM {
            let p = lookup(val as *const c_void, Kind::Platform).map_err(|_| CL_INVALID_PLATFORM)?;
            out.extend([key as i64, p.id as i64]);
            conn = Some(p.conn.clone());
        } else {
            out.extend([key as i64, val as i64]);
        }
        i += 2;
        if i > 256 {
            return Err(CL_INVALID_PROPERTY);
        }
    }
    out.push(0);
    Ok((Some(out), conn))
}

fn notify_token(conn: &Conn, pfn: *mut c_void, user_data: *mut c_void) -> Result<Option<u64>, cl_int> {
    if pfn.is_null() {
        return if user_data.is_null() { Ok(None) } else { Err(CL_INVALID_VALUE) };
    }
    // SAFETY: the application passes a function of clCreateContext's pfn_notify type.
    let pfn = unsafe { std::mem::transmute::<*mut c_void, ContextNotifyFn>(pfn) };
    Ok(Some(conn.register_callback(Callback::Context { pfn, user_data: user_data as usize })))
}

/// Ties a context's notification to its handle: it goes when the application releases the
/// context, or at once when no context was made.
/// In replay mode the callback is recorded too, to be registered again after a rebuild.
fn own_notify(
    conn: &Conn,
    notify: Option<u64>,
    pfn: *mut c_void,
    user_data: *mut c_void,
    created: Result<*mut c_void, cl_int>,
) -> Result<*mut c_void, cl_int> {
    let Some(token) = notify else { return created };
    match created.as_ref().ok().map(|&h| lookup(h, Kind::Context)) {
        Some(Ok(ctx)) => {
            ctx.own_callback(token);
            if conn.replays() {
                // SAFETY: as in notify_token, which accepted it (non-NULL).
                let pfn = unsafe { std::mem::transmute::<*mut c_void, ContextNotifyFn>(pfn) };
                crate::recovery::journal_of(conn).context_notify(ctx.id, pfn, user_data as usize, token);
            }
        }
        _ => {
            let _ = conn.unregister_callback(token);
        }
    }
    created
}

pub unsafe fn clCreateContext(
    properties_: *const isize,
    num_devices: cl_uint,
    devices: *const cl_device_id,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    let r = (|| {
        // SAFETY: API contract.
        let (props, _) = unsafe { properties(properties_)? };
        if num_devices == 0 {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: API contract: `devices` holds num_devices handles.
        let devs = unsafe { slice(devices, num_devices as usize, CL_INVALID_VALUE)? };
        let (ids, conn) = ids_of(devs, Kind::Device, CL_INVALID_DEVICE)?;
        let conn = conn.ok_or(CL_INVALID_VALUE)?;
        super::device::decide_recovery(&conn);
        let notify = notify_token(&conn, pfn_notify, user_data)?;
        let r = create(&conn, Kind::Context, ObjData::Context, |id| {
            crate::recovery::recorded(&conn, CreateContext { id, properties: props, devices: ids, notify })
        });
        own_notify(&conn, notify, pfn_notify, user_data, r)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateContextFromType(
    properties_: *const isize,
    device_type: cl_bitfield,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    let r = (|| {
        // SAFETY: API contract.
        let (props, conn) = unsafe { properties(properties_)? };
        let conn = match conn {
            Some(c) => c,
            None => crate::runtime::runtime().conns().first().cloned().ok_or(CL_INVALID_PLATFORM)?,
        };
        super::device::decide_recovery(&conn);
        let notify = notify_token(&conn, pfn_notify, user_data)?;
        let r = create(&conn, Kind::Context, ObjData::Context, |id| {
            crate::recovery::recorded(&conn, CreateContextFromType { id, properties: props, device_type, notify })
        });
        own_notify(&conn, notify, pfn_notify, user_data, r)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

forward_info!(clGetContextInfo, cl_context, Kind::Context, InfoTarget::Context);

pub unsafe fn clSetContextDestructorCallback(context: cl_context, pfn: *mut c_void, user_data: *mut c_void) -> cl_int {
    super::memory::add_destructor(context, Kind::Context, pfn, user_data)
}

retain_release! {
    clRetainContext, clReleaseContext, cl_context, Kind::Context;
}
