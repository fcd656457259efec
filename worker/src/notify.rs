//! Driver callbacks, relayed to the shim as notifications on the socket. The driver calls them
//! on its own threads; the shim runs the application's callback on its notifier thread.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use cloister_ipc::cl::*;
use cloister_ipc::{channel, Notification, WorkerMessage};

/// Notifications not sent yet, oldest first, and whether the sending thread is writing one.
///
/// A sender never waits for the shim to read: the shim's notifier thread runs the
/// application's callbacks, which may wait for this worker's lanes (a release after other
/// threads' enqueues, any call), while a lane thread sends a notification from inside a driver
/// call (pocl calls a callback registered on a complete event inside `clSetEventCallback`).
/// Written by that lane thread itself onto a full socket, it deadlocked the two processes: 500
/// callbacks registered on complete events, each event released by its own callback, hung the
/// application's next `clFinish`. So a notification is written at once only where the socket
/// has room and none is waiting before it; otherwise it waits here for the sending thread
/// (`init`), which alone may block on the socket.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Vec<u8>>,
    sending: bool,
    /// A send failed: the shim is gone (the control loop notices and exits), so nothing is
    /// kept for it any more.
    closed: bool,
}

impl Outbox {
    /// Takes `frame` for the shim: written at once by `try_send` (`Ok(false)`: no room) where
    /// none waits before it, else queued for the sending thread. Whether it was queued.
    fn offer(&mut self, frame: Vec<u8>, try_send: impl FnOnce(&[u8]) -> Result<bool, cloister_ipc::IpcError>) -> bool {
        if self.closed {
            return false;
        }
        if self.queue.is_empty() && !self.sending {
            match try_send(&frame) {
                Ok(false) => {}
                Ok(true) => return false,
                Err(_) => {
                    self.close();
                    return false;
                }
            }
        }
        self.queue.push_back(frame);
        true
    }

    fn close(&mut self) {
        self.closed = true;
        self.queue = VecDeque::new();
    }
}

struct Notifier {
    sock: RawFd,
    outbox: Mutex<Outbox>,
    ready: Condvar,
}

static NOTIFIER: OnceLock<Notifier> = OnceLock::new();

pub fn init(sock: RawFd) {
    let notifier = NOTIFIER.get_or_init(|| Notifier { sock, outbox: Mutex::default(), ready: Condvar::new() });
    let _ = std::thread::Builder::new().name("notify-send".into()).spawn(move || loop {
        let frame = {
            let mut outbox = notifier.outbox.lock().unwrap_or_else(|e| e.into_inner());
            while outbox.queue.is_empty() {
                outbox = notifier.ready.wait(outbox).unwrap_or_else(|e| e.into_inner());
            }
            outbox.sending = true;
            outbox.queue.pop_front()
        };
        let sent = frame.is_none_or(|f| channel::send_raw(notifier.sock, &f, &[]).is_ok());
        let mut outbox = notifier.outbox.lock().unwrap_or_else(|e| e.into_inner());
        outbox.sending = false;
        if !sent {
            outbox.close();
            return;
        }
    });
}

pub fn send(n: Notification) {
    let Some(notifier) = NOTIFIER.get() else {
        return;
    };
    let Ok(frame) = channel::encode(&WorkerMessage::Notify(n)) else { return };
    let mut outbox = notifier.outbox.lock().unwrap_or_else(|e| e.into_inner());
    if outbox.offer(frame, |f| channel::try_send_raw(notifier.sock, f)) {
        notifier.ready.notify_one();
    }
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

/// Event callbacks registered with the driver and not yet sent to the shim: the event (the
/// driver's handle) and the status each asked for, by token, and the tokens of each event.
///
/// A driver may call an event's callbacks well after a wait on the event has returned
/// (NVIDIA's 580 calls a `CL_COMPLETE` callback 9-10 us after `clWaitForEvents` returns:
/// `tools/measure/cblat.c`), and the shim returns from a wait only once the callbacks of
/// complete events have run, so that delay was the application's. So when the worker itself
/// learns that an event is complete or failed (a wait on it succeeded, its status was asked),
/// it sends that event's callbacks at once ([`event_reached`]), and the driver's own call for
/// a token already sent is dropped: each callback is sent once, by whichever comes first.
#[derive(Default)]
struct AwaitedCallbacks {
    by_token: HashMap<u64, (usize, cl_int)>,
    by_event: HashMap<usize, Vec<u64>>,
}

static AWAITED: Mutex<Option<AwaitedCallbacks>> = Mutex::new(None);

/// How many tokens `AWAITED` holds: a wait or status query with none awaited takes no lock.
static AWAITED_COUNT: AtomicUsize = AtomicUsize::new(0);

fn awaited() -> std::sync::MutexGuard<'static, Option<AwaitedCallbacks>> {
    AWAITED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers callback `token` of `event` for `callback_type` before the driver is asked to call
/// it (the driver may call it before `clSetEventCallback` returns).
pub fn await_event_callback(event: usize, token: u64, callback_type: cl_int) {
    let mut guard = awaited();
    let a = guard.get_or_insert_with(AwaitedCallbacks::default);
    if a.by_token.insert(token, (event, callback_type)).is_none() {
        AWAITED_COUNT.fetch_add(1, Ordering::SeqCst);
    }
    a.by_event.entry(event).or_default().push(token);
}

/// Takes `token` out of the awaited callbacks: whether it was there (not sent yet).
pub fn take_event_callback(token: u64) -> bool {
    let mut guard = awaited();
    let Some(a) = guard.as_mut() else { return false };
    let Some((event, _)) = a.by_token.remove(&token) else { return false };
    AWAITED_COUNT.fetch_sub(1, Ordering::SeqCst);
    if let Some(tokens) = a.by_event.get_mut(&event) {
        tokens.retain(|&t| t != token);
        if tokens.is_empty() {
            a.by_event.remove(&event);
        }
    }
    true
}

/// The worker has seen `event` reach `status` (`CL_COMPLETE`, or a negative code): sends every
/// callback of it not sent yet, with its own status (what a driver passes: the status it was
/// registered for) or the error.
pub fn event_reached(event: usize, status: cl_int) {
    if status > CL_COMPLETE || AWAITED_COUNT.load(Ordering::SeqCst) == 0 {
        return;
    }
    let due: Vec<(u64, cl_int)> = {
        let mut guard = awaited();
        let Some(a) = guard.as_mut() else { return };
        let Some(tokens) = a.by_event.remove(&event) else { return };
        tokens.into_iter().filter_map(|t| a.by_token.remove(&t).map(|(_, asked)| (t, asked))).collect()
    };
    AWAITED_COUNT.fetch_sub(due.len(), Ordering::SeqCst);
    for (token, asked) in due {
        send(Notification::EventStatus { token, status: if status < 0 { status } else { asked } });
    }
}

/// A posted callback registration the driver refused with `code`: the callback runs now, with
/// that code (a failure must read as one), so that nothing waits for it forever.
pub fn callback_refused(token: u64, code: cl_int) {
    let status = if code < 0 { code } else { CL_OUT_OF_RESOURCES };
    send(Notification::EventStatus { token, status });
}

/// `pfn_notify` of `clSetEventCallback`: sent unless the worker sent it already.
pub extern "C" fn on_event_status(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    let token = user_data as u64;
    if take_event_callback(token) {
        send(Notification::EventStatus { token, status });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each event callback is sent once: by the driver's call or by the worker once it knows the
    /// event complete or failed, whichever comes first; an event still running sends nothing.
    #[test]
    fn an_event_callback_goes_once_whichever_side_sends_it_first() {
        let (event, other) = (0x7000_1000usize, 0x7000_2000usize);
        await_event_callback(event, 9001, CL_COMPLETE);
        await_event_callback(event, 9002, CL_SUBMITTED);
        await_event_callback(other, 9003, CL_COMPLETE);
        // The driver called the first one: it is no longer awaited.
        assert!(take_event_callback(9001));
        assert!(!take_event_callback(9001));
        // Running is not complete: nothing goes.
        event_reached(event, CL_RUNNING);
        assert!(awaited().as_ref().is_some_and(|a| a.by_token.contains_key(&9002)));
        // Complete: the second goes now, and the driver's later call of it is dropped.
        event_reached(event, CL_COMPLETE);
        assert!(!take_event_callback(9002));
        assert!(awaited().as_ref().is_some_and(|a| !a.by_event.contains_key(&event)));
        // Another event's callback is untouched, and goes on a failure too.
        assert!(awaited().as_ref().is_some_and(|a| a.by_token.contains_key(&9003)));
        event_reached(other, CL_OUT_OF_RESOURCES);
        assert!(!take_event_callback(9003));
    }

    /// A notification is written at once only where none waits before it; once a send failed
    /// (the shim is gone), nothing more is kept: before, every later notification queued up
    /// until the worker exited.
    #[test]
    fn notifications_keep_their_order_and_none_is_kept_for_a_shim_that_is_gone() {
        let mut outbox = Outbox::default();
        assert!(!outbox.offer(vec![1], |_| Ok(true)), "room: written at once");
        assert!(outbox.offer(vec![2], |_| Ok(false)), "no room: queued");
        assert!(outbox.offer(vec![3], |_| panic!("written before the one queued")), "queued behind it");
        assert_eq!(outbox.queue, [vec![2], vec![3]]);
        // The sending thread takes one: the next waits for it, whatever the room.
        let taken = outbox.queue.pop_front();
        outbox.sending = true;
        assert!(outbox.offer(vec![4], |_| panic!("written beside the sending thread")));
        assert_eq!((taken, outbox.queue.len()), (Some(vec![2]), 2));
        // Its send failed: nothing more is kept.
        outbox.sending = false;
        outbox.close();
        assert!(!outbox.offer(vec![5], |_| panic!("written to a shim that is gone")));
        assert!(outbox.queue.is_empty());
        // A write at once that fails closes it as well.
        let mut outbox = Outbox::default();
        assert!(!outbox.offer(vec![6], |_| Err(cloister_ipc::IpcError::Protocol("gone"))));
        assert!(!outbox.offer(vec![7], |_| Ok(false)));
        assert!(outbox.closed && outbox.queue.is_empty());
    }
}
