//! Device commands in the trace and the timing report, timed by the driver's profiling events.
//!
//! While either is on, every queue is created with `CL_QUEUE_PROFILING_ENABLE`; for a queue
//! the application did not ask it for, its own queries answer as if it had not been turned on
//! (`CL_QUEUE_PROPERTIES` without the bit, `clGetEventProfilingInfo` says
//! `CL_PROFILING_INFO_NOT_AVAILABLE`). Each enqueue's event (the application's, retained, or one
//! of our own when it asked for none) waits in a list until it completes; its start and end
//! then become a complete event on the queue's track.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cloister_ipc::cl::*;

use crate::handle::{lookup, Kind, Object};

/// Whether device commands are timed: for the trace and the timing report.
fn profiling() -> bool {
    super::active() & super::DEVICE != 0
}

/// An object's identity that survives handle lookups: its worker and id.
fn key(obj: &Object) -> (usize, u64) {
    (Arc::as_ptr(&obj.conn) as usize, obj.id)
}

fn key_of(h: *mut c_void, kind: Kind) -> Option<(usize, u64)> {
    lookup(h, kind).ok().map(|o| key(&o))
}

/// Queues (and their events) whose profiling is ours, not the application's.
#[derive(Default)]
struct Hidden {
    queues: HashSet<(usize, u64)>,
    events: HashSet<(usize, u64)>,
}

fn hidden() -> &'static Mutex<Hidden> {
    static H: OnceLock<Mutex<Hidden>> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// `properties` with profiling on while tracing; whether that was our doing.
pub fn add_profiling(properties: cl_bitfield) -> (cl_bitfield, bool) {
    match profiling() && properties & CL_QUEUE_PROFILING_ENABLE == 0 {
        true => (properties | CL_QUEUE_PROFILING_ENABLE, true),
        false => (properties, false),
    }
}

/// The same for a zero-terminated property list (`None` for NULL).
pub fn add_profiling_list(properties: Option<Vec<u64>>) -> (Option<Vec<u64>>, bool) {
    if !profiling() {
        return (properties, false);
    }
    let mut list = properties.unwrap_or_else(|| vec![0]);
    let mut i = 0;
    while i + 1 < list.len() {
        if list[i] == u64::from(CL_QUEUE_PROPERTIES) {
            let (p, forced) = add_profiling(list[i + 1]);
            list[i + 1] = p;
            return (Some(list), forced);
        }
        i += 2;
    }
    let end = list.len() - 1;
    list.splice(end..end, [u64::from(CL_QUEUE_PROPERTIES), CL_QUEUE_PROFILING_ENABLE]);
    (Some(list), true)
}

/// After a queue's creation: remembers that its profiling is hidden from the application.
pub fn queue_created(r: Result<*mut c_void, cl_int>, forced: bool) -> Result<*mut c_void, cl_int> {
    if let (Ok(q), true) = (&r, forced) {
        if let Some(k) = key_of(*q, Kind::Queue) {
            hidden().lock().unwrap_or_else(|e| e.into_inner()).queues.insert(k);
        }
    }
    r
}

fn is_hidden(obj: &Object, events: bool) -> bool {
    let h = hidden().lock().unwrap_or_else(|e| e.into_inner());
    match events {
        true => h.events.contains(&key(obj)),
        false => h.queues.contains(&key(obj)),
    }
}

/// `clGetCommandQueueInfo`'s answer for a queue whose profiling is ours: properties without it.
pub fn queue_answers(obj: &Object, param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    if param_name != CL_QUEUE_PROPERTIES || !is_hidden(obj, false) {
        return None;
    }
    let real = crate::info::query(obj, cloister_ipc::InfoTarget::CommandQueue, 0, param_name);
    Some(real.map(|v| match <[u8; 8]>::try_from(v.as_slice()) {
        Ok(b) => (u64::from_ne_bytes(b) & !CL_QUEUE_PROFILING_ENABLE).to_ne_bytes().to_vec(),
        Err(_) => v,
    }))
}

/// `clGetEventProfilingInfo`'s answer for an event of such a queue: not available.
pub fn profiling_answers(obj: &Object, _param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    is_hidden(obj, true).then_some(Err(CL_PROFILING_INFO_NOT_AVAILABLE))
}

/// An `event` out-argument of an enqueue, replaced by `own` when the application passed NULL,
/// so that the trace has an event to time (any other argument passes unchanged).
pub fn own_event<T: Copy + 'static>(on: u8, name: &str, mut v: T, own: &mut *mut c_void) -> T {
    if on & super::DEVICE != 0 && name == "event" {
        if let Some(p) = (&mut v as &mut dyn std::any::Any).downcast_mut::<*mut *mut c_void>() {
            if p.is_null() {
                *p = own as *mut *mut c_void;
            }
        }
    }
    v
}

/// A command waiting for its event to complete.
struct Pending {
    /// The command, and for a kernel its name and global size: `NDRangeKernel fill [64]`.
    label: String,
    queue: u64,
    event: usize,
}

fn pending() -> &'static Mutex<Vec<Pending>> {
    static P: OnceLock<Mutex<Vec<Pending>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// What a command is called in the trace and the timing report: for a kernel, its name and
/// global size (read while the enqueue's arguments are still the application's).
pub fn label(name: &str, args: &[super::Arg]) -> String {
    let short = name.trim_start_matches("clEnqueue");
    let arg = |n: &str| args.iter().find(|a| a.name == n).map(|a| a.raw).unwrap_or(0);
    if name != "clEnqueueNDRangeKernel" {
        return short.to_string();
    }
    let kernel = arg("kernel") as usize as *mut c_void;
    let mut text = [0u8; 128];
    let mut len = 0usize;
    // SAFETY: an info query into a buffer of text.len() bytes.
    let rc = unsafe {
        crate::api::clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, text.len(), text.as_mut_ptr().cast(), &mut len)
    };
    let kernel_name = match rc {
        CL_SUCCESS => String::from_utf8_lossy(&text[..len.min(text.len())]).trim_end_matches('\0').to_string(),
        _ => "?".into(),
    };
    let (dims, sizes) = (arg("work_dim").min(3) as usize, arg("global_work_size"));
    let global: Vec<usize> = match sizes {
        0 => Vec::new(),
        // SAFETY: a successful enqueue read work_dim sizes there.
        p => unsafe { std::slice::from_raw_parts(p as usize as *const usize, dims) }.to_vec(),
    };
    format!("{short} {kernel_name} {global:?}")
}

/// After a successful enqueue: its event (the application's `app_event`, or `own`) joins the
/// list, retained so it outlives the application's release; the list is drained when long.
pub fn enqueued(label: String, queue: u64, app_event: u64, own: *mut c_void) {
    let event = if !own.is_null() {
        own as usize
    } else if app_event != 0 {
        // SAFETY: a successful enqueue wrote a live event where the application asked.
        let ev = unsafe { *(app_event as usize as *const *mut c_void) };
        // SAFETY: a live event handle.
        unsafe { crate::api::clRetainEvent(ev) };
        ev as usize
    } else {
        return;
    };
    if let Some(k) = key_of(event as *mut c_void, Kind::Event) {
        let hide = key_of(queue as usize as *mut c_void, Kind::Queue)
            .is_some_and(|q| hidden().lock().unwrap_or_else(|e| e.into_inner()).queues.contains(&q));
        if hide {
            hidden().lock().unwrap_or_else(|e| e.into_inner()).events.insert(k);
        }
    }
    let long = {
        let mut p = pending().lock().unwrap_or_else(|e| e.into_inner());
        p.push(Pending { label, queue, event });
        p.len() >= 256
    };
    if long {
        drain();
    }
}

/// Writes the completed commands to the trace and releases their events. It never waits (a
/// command may wait for a user event that never completes): called after `clFinish` and
/// `clWaitForEvents`, before a queue or context is released, and at exit. Each worker is asked
/// about all of its events in one call (`EventProfiles`): three calls a command (the status, the
/// start, the end) made a timed stream of small writes several times slower than an untimed one.
pub fn drain() {
    let Some(settings) = super::SETTINGS.get() else { return };
    let taken = std::mem::take(&mut *pending().lock().unwrap_or_else(|e| e.into_inner()));
    let mut left = Vec::new();
    for (p, profile) in profiles(taken) {
        if profile.status > CL_COMPLETE {
            left.push(p);
            continue;
        }
        if let (CL_COMPLETE, Some((start, end))) = (profile.status, profile.times) {
            if end >= start {
                if let Some(sink) = &settings.trace {
                    let queue = super::names::name_of("queue", p.queue);
                    super::trace::device_command(sink, &p.label, &queue, start, end);
                }
                if settings.timing.is_some() {
                    super::timing::add_device(&p.label, std::time::Duration::from_nanos(end - start));
                }
            }
        }
        // SAFETY: the reference taken (or the event created) for the trace.
        unsafe { crate::api::clReleaseEvent(p.event as *mut c_void) };
    }
    pending().lock().unwrap_or_else(|e| e.into_inner()).extend(left);
}

/// Each command's event status and times, asked of each worker in one call. An event the shim
/// no longer knows, or whose worker cannot answer (dead, or answering with another count than
/// it was asked for, which cuts it off), reads as settled without times.
fn profiles(taken: Vec<Pending>) -> Vec<(Pending, cloister_ipc::EventProfile)> {
    let unknown = cloister_ipc::EventProfile { status: CL_INVALID_EVENT, times: None };
    // Per connection: its events' ids and where each command stands in `taken`.
    let mut asks: Vec<(Arc<crate::conn::Conn>, Vec<cloister_ipc::ObjectId>, Vec<usize>)> = Vec::new();
    let mut answers = vec![unknown; taken.len()];
    for (i, p) in taken.iter().enumerate() {
        let Ok(ev) = lookup(p.event as *const c_void, Kind::Event) else { continue };
        match asks.iter_mut().find(|(conn, ..)| Arc::ptr_eq(conn, &ev.conn)) {
            Some((_, ids, at)) => {
                ids.push(ev.id);
                at.push(i);
            }
            None => asks.push((ev.conn.clone(), vec![ev.id], vec![i])),
        }
    }
    for (conn, ids, at) in asks {
        let n = ids.len();
        let got = match conn.call(cloister_ipc::EventProfiles { events: ids }) {
            Ok(r) if r.status == CL_SUCCESS && r.profiles.len() == n => r.profiles,
            Ok(r) if r.status == CL_SUCCESS => {
                let what = format!("{} profiles for {n} events", r.profiles.len());
                conn.reject("EventProfiles", &what);
                continue;
            }
            _ => continue,
        };
        for (i, profile) in at.into_iter().zip(got) {
            answers[i] = profile;
        }
    }
    taken.into_iter().zip(answers).collect()
}
