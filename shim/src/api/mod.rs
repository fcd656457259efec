//! The forwarded entry points, one module per API object (as in rusticl). Each validates its
//! handles and arguments, then calls safe Rust that talks to the worker.

pub mod command_buffer;
pub mod context;
pub mod device;
pub mod enqueue;
pub mod event;
pub mod extensions;
pub mod kernel;
pub mod memory;
pub mod platform;
pub mod program;
pub mod queue;
pub mod region;
pub mod sampler;

pub use command_buffer::*;
pub use context::*;
pub use device::*;
pub use enqueue::*;
pub use event::*;
pub use kernel::*;
pub use memory::*;
pub use platform::*;
pub use program::*;
pub use queue::*;
pub use region::*;
pub use sampler::*;

use std::ffi::c_void;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::{EnqueueSync, ObjectId, Request};

use crate::conn::Conn;
use crate::handle::{lookup, new_handle, Kind, ObjData, Object};

/// Stores `code` in an optional `errcode_ret`.
///
/// # Safety
/// `errcode_ret` is NULL or valid for a write.
pub unsafe fn set_err(errcode_ret: *mut cl_int, code: cl_int) {
    if !errcode_ret.is_null() {
        // SAFETY: guaranteed by the caller.
        unsafe { *errcode_ret = code };
    }
}

/// Turns the result of a creating call into the C convention (handle + `errcode_ret`).
///
/// # Safety
/// As for `set_err`.
pub unsafe fn creation(r: Result<*mut c_void, cl_int>, errcode_ret: *mut cl_int) -> *mut c_void {
    match r {
        Ok(h) => {
            // SAFETY: forwarded.
            unsafe { set_err(errcode_ret, CL_SUCCESS) };
            h
        }
        Err(e) => {
            // SAFETY: forwarded.
            unsafe { set_err(errcode_ret, e) };
            std::ptr::null_mut()
        }
    }
}

/// `(ptr, n)` as a slice; NULL with n > 0 is the caller's `err`.
///
/// # Safety
/// If non-NULL, `ptr` points at `n` valid `T`s.
pub unsafe fn slice<'a, T>(ptr: *const T, n: usize, err: cl_int) -> Result<&'a [T], cl_int> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(err);
    }
    // SAFETY: guaranteed by the caller.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// Validates a list of handles of one kind and returns their ids, all on one worker.
pub fn ids_of(handles: &[*mut c_void], kind: Kind, err: cl_int) -> Result<(Vec<ObjectId>, Option<Arc<Conn>>), cl_int> {
    let (objects, conn) = objects_of(handles, kind, err)?;
    Ok((objects.iter().map(|o| o.id).collect(), conn))
}

/// Handles' objects of one worker, and that worker (`None` for no handles).
type OfOneWorker = (Vec<Arc<Object>>, Option<Arc<Conn>>);

/// `ids_of`, handing back the objects themselves.
fn objects_of(handles: &[*mut c_void], kind: Kind, err: cl_int) -> Result<OfOneWorker, cl_int> {
    let mut conn: Option<Arc<Conn>> = None;
    let mut objects = Vec::with_capacity(handles.len());
    for &h in handles {
        let o = lookup(h, kind).map_err(|_| err)?;
        if let Some(c) = &conn {
            if !Arc::ptr_eq(c, &o.conn) {
                return Err(crate::conn::mismatch(c, &o.conn, err));
            }
        }
        conn = Some(o.conn.clone());
        objects.push(o);
    }
    Ok((objects, conn))
}

/// Validates an event wait list and allocates the returned event's id if one is wanted.
///
/// # Safety
/// `list` points at `n` events or is NULL.
pub unsafe fn enqueue_sync(
    queue: &Object,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<EnqueueSync, cl_int> {
    if (n == 0) != list.is_null() {
        return Err(CL_INVALID_EVENT_WAIT_LIST);
    }
    if let Some(state) = queue.data.queue_state() {
        state.enqueuing();
    }
    // SAFETY: checked non-NULL with n entries per the API contract.
    let events = unsafe { slice(list, n as usize, CL_INVALID_EVENT_WAIT_LIST)? };
    let (events, conn) = objects_of(events, Kind::Event, CL_INVALID_EVENT_WAIT_LIST)?;
    if let Some(c) = conn {
        if !Arc::ptr_eq(&c, &queue.conn) {
            return Err(crate::conn::mismatch(&c, &queue.conn, CL_INVALID_CONTEXT));
        }
    }
    // An event of another context of the same worker: the enqueue goes as a call, whose answer
    // is the driver's (`conn::waits_across_contexts`).
    let context = queue.data.context();
    crate::conn::waits_across_contexts(events.iter().any(|ev| ev.data.context() != context));
    let wait = events.iter().map(|ev| ev.id).collect();
    Ok(EnqueueSync { wait, event: (!event.is_null()).then(|| queue.conn.alloc_id()) })
}

/// After an enqueue: hands the application its new event, if it asked for one.
///
/// # Safety
/// `event` is NULL or valid for a write.
pub unsafe fn finish_enqueue(
    queue: &Object,
    sync: &EnqueueSync,
    event: *mut cl_event,
    rc: Result<cl_int, cl_int>,
) -> cl_int {
    let rc = rc.unwrap_or_else(|e| e);
    if rc == CL_SUCCESS {
        if let (Some(id), false) = (sync.event, event.is_null()) {
            // SAFETY: checked non-NULL; the API contract makes it writable.
            unsafe {
                *event = crate::handle::new_handle_holding(
                    Kind::Event,
                    id,
                    &queue.conn,
                    ObjData::Event { context: queue.data.context().unwrap_or(0), done: false },
                    queue,
                )
            };
        }
    }
    rc
}

/// The id of the event a successful enqueue handed the application, if it asked for one (for
/// `recovery`, which records the command with it).
///
/// # Safety
/// `event` is NULL or holds the handle the enqueue wrote.
pub unsafe fn returned_event(event: *mut cl_event) -> Option<ObjectId> {
    if event.is_null() {
        return None;
    }
    // SAFETY: per the caller.
    lookup(unsafe { *event }, Kind::Event).ok().map(|e| e.id)
}

/// An enqueue whose data stays in the worker: validates the wait list, makes the call that
/// `make` builds around the resulting `EnqueueSync`, and hands out the event.
///
/// # Safety
/// `list` holds `n` events or is NULL; `event` is NULL or valid for a write.
pub unsafe fn enqueue_call<C: cloister_ipc::Call<Reply = cl_int>>(
    queue: &Object,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    make: impl FnOnce(EnqueueSync) -> C,
) -> Result<cl_int, cl_int> {
    // SAFETY: forwarded from the caller.
    unsafe { enqueue_via(queue, n, list, event, make, |req| queue.conn.call_status(req)) }
}

/// Like `enqueue_call`, for an enqueue the caller has vouched for (live handles of one worker,
/// everything the shim can check checked): it is posted (`Conn::post`) and returns at once;
/// the driver's error, if any, comes late. The event's id is the shim's, so it exists at once.
///
/// # Safety
/// As for `enqueue_call`.
pub unsafe fn enqueue_posted<C: cloister_ipc::Call<Reply = cl_int>>(
    queue: &Object,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    make: impl FnOnce(EnqueueSync) -> C,
) -> Result<cl_int, cl_int> {
    // SAFETY: forwarded from the caller.
    unsafe { enqueue_via(queue, n, list, event, make, |req| queue.conn.post_request(req)) }
}

/// `enqueue_posted` if the caller could vouch for the enqueue, else `enqueue_call` (the
/// driver's refusal is then this call's error, not a late one).
///
/// # Safety
/// As for `enqueue_call`.
pub unsafe fn enqueue_posted_if<C: cloister_ipc::Call<Reply = cl_int>>(
    vouched: bool,
    queue: &Object,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    make: impl FnOnce(EnqueueSync) -> C,
) -> Result<cl_int, cl_int> {
    let send = |req: &Request| match vouched {
        true => queue.conn.post_request(req),
        false => queue.conn.call_status(req),
    };
    // SAFETY: forwarded from the caller.
    unsafe { enqueue_via(queue, n, list, event, make, send) }
}

/// `enqueue_call` and `enqueue_posted`, by how the request travels (`send`).
///
/// # Safety
/// As for `enqueue_call`.
unsafe fn enqueue_via<C: cloister_ipc::Call<Reply = cl_int>>(
    queue: &Object,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    make: impl FnOnce(EnqueueSync) -> C,
    send: impl FnOnce(&Request) -> Result<cl_int, cl_int>,
) -> Result<cl_int, cl_int> {
    // SAFETY: forwarded from the caller.
    let sync = unsafe { enqueue_sync(queue, n, list, event)? };
    let req = make(sync.clone()).into_request();
    // In replay mode the journal keeps the request itself once it is sent: nothing is copied.
    let replays = queue.conn.replays();
    if replays {
        crate::recovery::journal_of(&queue.conn).enqueuing(&req);
    }
    let rc = send(&req);
    if replays && rc == Ok(CL_SUCCESS) {
        crate::recovery::journal_of(&queue.conn).enqueued(req);
    }
    // SAFETY: forwarded from the caller.
    Ok(unsafe { finish_enqueue(queue, &sync, event, rc) })
}

/// Creates an object on the worker under a fresh id and returns its new handle.
pub fn create(
    conn: &Arc<Conn>,
    kind: Kind,
    data: ObjData,
    call: impl FnOnce(ObjectId) -> Result<cl_int, cl_int>,
) -> Result<*mut c_void, cl_int> {
    let id = conn.alloc_id();
    match call(id)? {
        CL_SUCCESS => Ok(new_handle(kind, id, conn, data)),
        e => Err(e),
    }
}

/// `create` for an object that keeps `parent` (a handle of `parent_kind`) alive, as the driver
/// does (`handle::hold`).
pub fn create_held(
    (parent, parent_kind): (*const c_void, Kind),
    conn: &Arc<Conn>,
    kind: Kind,
    data: ObjData,
    call: impl FnOnce(ObjectId) -> Result<cl_int, cl_int>,
) -> Result<*mut c_void, cl_int> {
    create(conn, kind, data, call).inspect(|&h| crate::handle::hold(h, parent, parent_kind))
}

/// Generates a `clGetXInfo` entry point that forwards to the driver, with the shim's
/// reference count and the size protocol applied (`info::get_info`).
///
/// With a fifth argument, a `fn(&Object, param_name) -> Option<Result<Vec<u8>, cl_int>>` that
/// answers some parameters from the shim's own state; `None` asks the driver.
macro_rules! forward_info {
    ($name:ident, $ty:ty, $kind:expr, $target:expr) => {
        forward_info!($name, $ty, $kind, $target, |_, _| None);
    };
    ($name:ident, $ty:ty, $kind:expr, $target:expr, $local:expr) => {
        pub unsafe fn $name(
            handle: $ty,
            param_name: cl_uint,
            size: usize,
            value: *mut c_void,
            size_ret: *mut usize,
        ) -> cl_int {
            // SAFETY: forwarded API contract.
            unsafe {
                info::get_info(handle, $kind, $target, 0, param_name, size, value, size_ret, move |obj| {
                    ($local)(obj, param_name)
                })
            }
        }
    };
}
pub(crate) use forward_info;

/// Generates `clRetainX` / `clReleaseX` for the given kinds.
macro_rules! retain_release {
    ($($retain:ident, $release:ident, $ty:ty, $kind:expr;)*) => {$(
        pub unsafe fn $retain(h: $ty) -> cl_int {
            crate::handle::retain(h, $kind)
        }
        pub unsafe fn $release(h: $ty) -> cl_int {
            crate::handle::release(h, $kind)
        }
    )*};
}
pub(crate) use retain_release;
