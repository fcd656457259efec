//! What the application does, seen from the shim: a call log (`CLOISTER_LOG_CALLS`,
//! `CLOISTER_LOG_ERRORS`), host timing per entry point (`CLOISTER_TIMING`), a Chrome/Perfetto
//! trace (`CLOISTER_TRACE`), program dump and inject (`CLOISTER_DUMP`, `CLOISTER_INJECT`,
//! `CLOISTER_BUILD_OPTIONS_APPEND`) and objects leaked at exit (`CLOISTER_LEAKS`), after the
//! OpenCL Intercept Layer's controls of the same purpose.
//!
//! Every entry point generated from the API table (`entry_body!` in lib.rs) asks `active()`
//! first: with everything off that is one relaxed atomic load and a branch per call. The
//! settings are read once, at the first call (each is a `CLOISTER_*` variable and a key of the
//! configuration file: `cloister_ipc::config`).

mod calllog;
pub mod device;
mod leaks;
mod names;
mod output;
pub mod program;
mod reports;
mod signals;
mod timing;
mod trace;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use cloister_ipc::cl::cl_int;

pub use names::{Arg, AsRaw};

/// `active()` bits: which per-call observers run.
pub const LOG_ALL: u8 = 1;
pub const LOG_ERRORS: u8 = 2;
pub const TIMING: u8 = 4;
pub const TRACE: u8 = 8;
/// Handles are given names (creation hooks run) without anything else per call: `--leaks`.
pub const NAMES: u8 = 16;
/// Device commands are timed by profiling events (for the trace or the timing report).
pub const DEVICE: u8 = 32;
/// The settings have not been read yet.
const UNREAD: u8 = 0x80;

static ACTIVE: AtomicU8 = AtomicU8::new(UNREAD);

/// Which observers run, as last read: 0 when none does (the common case: one relaxed load and
/// one branch per call); non-zero also before the settings are read (see `settled`).
#[inline(always)]
pub fn state() -> u8 {
    ACTIVE.load(Ordering::Relaxed)
}

/// `state()`'s value made final: the settings read if they were not yet.
pub fn settled(on: u8) -> u8 {
    if on & UNREAD != 0 {
        return init();
    }
    on
}

/// Which observers run (for callers off the per-call path).
pub fn active() -> u8 {
    settled(state())
}

/// The settings, as read from the environment at the first call.
struct Settings {
    log: Option<output::Sink>,
    timing: Option<output::Sink>,
    trace: Option<output::Sink>,
    leaks: bool,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// When the process (its first OpenCL call) started: the origin of log and trace times, and the
/// same moment on CLOCK_MONOTONIC_RAW in nanoseconds (the clock of pocl's profiling timestamps).
fn epoch_pair() -> (Instant, u64) {
    static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime fills the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
        (Instant::now(), ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    })
}

fn epoch() -> Instant {
    epoch_pair().0
}

#[cold]
fn init() -> u8 {
    let s = SETTINGS.get_or_init(|| {
        epoch();
        let all = output::Sink::from_setting("log_calls");
        let errors = output::Sink::from_setting("log_errors");
        let log_errors_only = all.is_none() && errors.is_some();
        let s = Settings {
            log: all.or(errors).map(|sink| sink.errors_only(log_errors_only)),
            timing: output::Sink::from_setting("timing"),
            trace: output::Sink::from_setting("trace"),
            leaks: cloister_ipc::settings::switch("leaks"),
        };
        if let Some(t) = &s.trace {
            trace::start(t);
        }
        if s.timing.is_some() || s.trace.is_some() || s.leaks || s.log.is_some() {
            // SAFETY: registering a function with the C signature atexit expects.
            unsafe { libc::atexit(at_exit) };
            signals::install(at_exit);
        }
        s
    });
    let mut on = 0;
    if let Some(log) = &s.log {
        on |= if log.errors_only { LOG_ERRORS } else { LOG_ALL };
    }
    if s.timing.is_some() {
        on |= TIMING | DEVICE;
    }
    if s.trace.is_some() {
        on |= TRACE | DEVICE;
    }
    if s.leaks {
        on |= NAMES;
    }
    ACTIVE.store(on, Ordering::Relaxed);
    on
}

/// Called once the shim has its broker at `path`: with the timing report on, the report can be
/// asked for while the application runs (`cloister timing PID`).
pub fn serve_reports(path: &str) {
    if active() & TIMING != 0 {
        reports::serve(path);
    }
}

/// Whether lane calls ask the worker for its own time (the timing report is on).
#[inline]
pub fn timing_on() -> bool {
    state() & TIMING != 0
}

thread_local! {
    /// The worker's time in the calling thread's current entry point: nanoseconds, and how many
    /// timed replies it came from (none: the call never waited for the worker).
    static WORKER_TIME: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// A timed reply said the worker spent `worker_ns` on it; the shim waited `waited` for it. The
/// worker's figure is its claim only: clamped to what the shim saw, it cannot be more than the
/// whole (nor less than nothing: it is unsigned).
pub fn note_worker_time(worker_ns: u64, waited: std::time::Duration) {
    let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
    let _ = WORKER_TIME.try_with(|t| {
        let (ns, n) = t.get();
        t.set((ns.saturating_add(worker_ns.min(waited)), n.saturating_add(1)));
    });
}

/// The worker's time since the last call, and forgets it.
fn take_worker_time() -> (u64, u32) {
    WORKER_TIME.try_with(|t| t.replace((0, 0))).unwrap_or((0, 0))
}

/// One observed call, from its start.
pub struct Call {
    on: u8,
    start: Instant,
}

impl Call {
    #[inline]
    pub fn begin(on: u8, name: &'static str) -> Self {
        if on & DEVICE != 0 && matches!(name, "clReleaseCommandQueue" | "clReleaseContext") {
            device::drain();
        }
        if on & TIMING != 0 {
            take_worker_time();
        }
        Call { on, start: Instant::now() }
    }

    /// After the call: `result` is what it returned (as a number), `status` its error code where
    /// one is known (the return value, or `errcode_ret`).
    /// `own_event` is the event the trace made the call return when the application asked for
    /// none (NULL otherwise).
    pub fn end(
        self,
        name: &'static str,
        ret_ty: &'static str,
        result: u64,
        status: Option<cl_int>,
        args: &[Arg],
        own_event: *mut std::ffi::c_void,
    ) {
        let elapsed = self.start.elapsed();
        let worker = if self.on & TIMING != 0 { take_worker_time() } else { (0, 0) };
        let ok = status.is_none_or(|s| s >= 0);
        if ok {
            names::note_created(ret_ty, result, args);
        }
        if self.on & NAMES != 0 {
            leaks::note_call(name, ret_ty, result, ok, args);
        }
        if self.on & DEVICE != 0 {
            let arg = |n: &str| args.iter().find(|a| a.name == n).map(|a| a.raw);
            if let (true, Some(queue), Some(event)) = (ok, arg("command_queue"), arg("event")) {
                device::enqueued(device::label(name, args), queue, event, own_event);
            } else if !own_event.is_null() {
                // SAFETY: an event the failed call made anyway is ours to release.
                unsafe { crate::api::clReleaseEvent(own_event) };
            }
            if matches!(name, "clFinish" | "clWaitForEvents") {
                device::drain();
            }
        }
        let Some(s) = SETTINGS.get() else { return };
        if self.on & (LOG_ALL | LOG_ERRORS) != 0 && (self.on & LOG_ALL != 0 || !ok) {
            if let Some(sink) = &s.log {
                calllog::write(sink, self.start, elapsed, name, ret_ty, result, status, args);
            }
        }
        if self.on & TIMING != 0 {
            let (ns, replies) = worker;
            timing::add(name, elapsed, std::time::Duration::from_nanos(ns).min(elapsed), replies > 0);
        }
        if self.on & TRACE != 0 {
            if let Some(sink) = &s.trace {
                trace::host_call(sink, name, self.start, elapsed, status);
            }
        }
    }
}

/// The calling thread's kernel id (what `top -H` and Perfetto show).
fn thread_id() -> u32 {
    thread_local! {
        static TID: u32 = {
            // SAFETY: gettid has no arguments and cannot fail.
            (unsafe { libc::syscall(libc::SYS_gettid) }) as u32
        };
    }
    TID.with(|t| *t)
}

/// Microseconds since `epoch()`.
fn micros(at: Instant) -> f64 {
    at.saturating_duration_since(epoch()).as_secs_f64() * 1e6
}

/// At exit (or on SIGTERM or SIGINT): the timing report, the leak report, the trace's end,
/// every file flushed.
extern "C" fn at_exit() {
    // Once: at exit, or on SIGTERM or SIGINT (`signals`), whichever comes first.
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(s) = SETTINGS.get() else { return };
    device::drain();
    if s.leaks {
        leaks::report();
    }
    if let Some(t) = &s.timing {
        timing::report(t);
    }
    if let Some(t) = &s.trace {
        trace::finish(t);
    }
    if let Some(l) = &s.log {
        l.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The worker's time is its claim: more than the round trip the shim measured is cut to
    /// it, and claims add up per call until taken.
    #[test]
    fn the_workers_time_is_clamped_to_the_round_trip() {
        take_worker_time();
        note_worker_time(u64::MAX, Duration::from_micros(5));
        note_worker_time(1_000, Duration::from_micros(5));
        assert_eq!(take_worker_time(), (6_000, 2));
        assert_eq!(take_worker_time(), (0, 0));
    }
}
