//! Driver callbacks, relayed to the shim as notifications on the socket. The driver calls them
//! on its own threads; the shim runs the application's callback on its notifier thread.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::RawFd;
use std::sync::{Mutex, OnceLock};

use cloister_ipc::cl::*;
use cloister_ipc::{channel, Notification, WorkerMessage};

struct Notifier {
    sock: RawFd,
    lock: Mutex<()>,
}

static NOTIFIER: OnceLock<Notifier> = OnceLock::new();

pub fn init(sock: RawFd) {
    let _ = NOTIFIER.set(Notifier { sock, lock: Mutex::new(()) });
}

pub fn send(n: Notification) {
    let Some(notifier) = NOTIFIER.get() else {
        return;
    };
    let _guard = notifier.lock.lock().unwrap_or_else(|e| e.into_inner());
    // A failed send means the shim is gone; the control loop notices the EOF and exits.
    let _ = channel::send(&notifier.sock, &WorkerMessage::Notify(n), &[]);
}

/// `pfn_notify` of `clCreateContext`; `user_data` carries the shim's token.
pub extern "C" fn on_context_error(
    errinfo: *const c_char,
    private_info: *const c_void,
    cb: usize,
    user_data: *mut c_void,
) {
    let errinfo = if errinfo.is_null() {
        String::new()
    } else {
        // SAFETY: the driver passes a NUL-terminated string valid for the callback's duration.
        unsafe { CStr::from_ptr(errinfo) }.to_string_lossy().into_owned()
    };
    let private_info = if private_info.is_null() || cb == 0 || cb > 1 << 20 {
        Vec::new()
    } else {
        // SAFETY: the driver promises `cb` readable bytes at `private_info`.
        unsafe { std::slice::from_raw_parts(private_info.cast::<u8>(), cb) }.to_vec()
    };
    send(Notification::ContextError { token: user_data as u64, errinfo, private_info });
}

/// Build calls in progress with a callback, by token: whether the driver has called it yet.
static BUILDS_IN_CALL: Mutex<Option<HashMap<u64, bool>>> = Mutex::new(None);

/// Runs a build, compile or link whose callback token is `token`, and says whether the driver
/// called the callback before the call returned.
pub fn build_call<T>(token: Option<u64>, call: impl FnOnce() -> T) -> (T, bool) {
    let Some(token) = token else { return (call(), false) };
    let in_call = || BUILDS_IN_CALL.lock().unwrap_or_else(|e| e.into_inner());
    in_call().get_or_insert_with(HashMap::new).insert(token, false);
    let v = call();
    let fired = in_call().as_mut().and_then(|m| m.remove(&token)).unwrap_or(false);
    (v, fired)
}

/// `pfn_notify` of `clBuildProgram`.
pub extern "C" fn on_build_done(_program: cl_program, user_data: *mut c_void) {
    let token = user_data as u64;
    if let Some(fired) =
        BUILDS_IN_CALL.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|m| m.get_mut(&token))
    {
        *fired = true;
    }
    send(Notification::BuildDone { token });
}

/// The driver's side of `clSetProgramReleaseCallback`: the application's callback runs in the
/// shim, so there is nothing to do here.
pub extern "C" fn ignore_program(_program: cl_program, _user_data: *mut c_void) {}

/// `pfn_notify` of `clSetEventCallback`.
pub extern "C" fn on_event_status(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    send(Notification::EventStatus { token: user_data as u64, status });
}
