//! Reports not lost to SIGTERM or SIGINT: an application ended by one of them (left at its
//! default action) never runs its `atexit` handlers, so the timing and leak reports, the
//! trace's end and a call log file's buffer would be lost. While any of them is on, and only
//! where the application has no handler of its own when the shim starts, the shim's handler
//! writes one byte to a pipe (all it does: async-signal-safe); a thread of the shim's, in
//! ordinary context, then writes the reports and ends the process by the same signal, with its
//! default action restored. An application that installs its own handler later replaces ours,
//! and keeps its own behaviour. Lost regardless: what `_exit`, SIGKILL or a crash cut short.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

/// The signals whose default action ends the process quietly, that users send to stop it.
const SIGNALS: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

/// The pipe's write end (-1: none).
static PIPE: AtomicI32 = AtomicI32::new(-1);
/// The process whose thread reads the pipe: a child the application forked inherits the
/// handler and the pipe, but not the thread, and must not have its parent write reports and die.
static OWNER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: errno is saved and restored around write(2); getpid, signal and raise are
    // async-signal-safe too. The byte is on the stack.
    unsafe {
        if libc::getpid() != OWNER.load(Ordering::Relaxed) {
            // A forked child: it ends as it would have without us (the signal is blocked in
            // this handler, and delivered with its default action once it returns).
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
            return;
        }
        let errno = *libc::__errno_location();
        let byte = sig as u8;
        let _ = libc::write(PIPE.load(Ordering::Relaxed), (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Installs the handler for each signal the application left at its default action; `reports`
/// writes every report (it runs once, on the shim's thread).
pub fn install(reports: extern "C" fn()) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let [read_end, write_end] = fds;
    PIPE.store(write_end, Ordering::Relaxed);
    // SAFETY: getpid cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    let waiter = std::thread::Builder::new().name("cloister-signals".into()).spawn(move || {
        let mut byte = 0u8;
        // SAFETY: reading one byte into a local from our own pipe.
        while unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) } != 1 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
        reports();
        let sig = libc::c_int::from(byte);
        // SAFETY: the default action restored, the signal sent to the whole process again: it
        // ends as it would have without us. Should it still live (the signal blocked in every
        // thread), it exits with the shell's code for that signal.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
            std::thread::sleep(std::time::Duration::from_secs(2));
            libc::_exit(128 + sig);
        }
    });
    if waiter.is_err() {
        return;
    }
    for sig in SIGNALS {
        // SAFETY: querying, then setting, a signal's action with valid sigaction structs; ours
        // is installed only where the action was the default.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            new.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(sig, &new, std::ptr::null_mut());
        }
    }
}
