//! A fatal signal sent to the worker from outside ends it at once, whatever handlers the driver
//! installed. LLVM's and Rust's handlers for SIGSEGV/SIGBUS/SIGILL/SIGFPE restore the previous
//! handler and return, expecting the fault to happen again; a signal sent with `kill` never
//! does, so each such handler swallowed one: it took three `kill -SEGV` to end a pocl worker.
//!
//! The worker's own handler goes on top of whatever is installed (after the driver loaded, and
//! again after every build, where LLVM installs its own). A signal with `si_code <= 0` was sent
//! by a process (`kill`, `sigqueue`, `tgkill`), not raised by a fault in the driver's code: the
//! worker notes it in the flight recorder, restores the default action and raises it again, so
//! it dies of that signal. A real fault goes to the handler that was there before, as if this
//! one did not exist.

use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicUsize, Ordering};

const FATAL: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

/// The handler each signal had before ours (`sa_sigaction` and `sa_flags`), by `FATAL` index.
static PREVIOUS: [AtomicUsize; 4] = [const { AtomicUsize::new(libc::SIG_DFL) }; 4];
static PREVIOUS_FLAGS: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Where the sender of an outside signal is noted (the flight recorder's `outside_signal`).
static NOTE: AtomicPtr<AtomicI64> = AtomicPtr::new(std::ptr::null_mut());

/// Notes outside signals in `slot` from now on.
pub fn note_in(slot: &'static AtomicI64) {
    NOTE.store(slot as *const AtomicI64 as *mut AtomicI64, Ordering::Release);
}

/// Puts the worker's handler on top for every fatal signal where another took its place.
pub fn ensure_last() {
    for (i, &sig) in FATAL.iter().enumerate() {
        // SAFETY: reading the current action into a zeroed sigaction.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
            continue;
        }
        if cur.sa_sigaction == on_fatal as *const () as usize {
            continue;
        }
        PREVIOUS[i].store(cur.sa_sigaction, Ordering::Release);
        PREVIOUS_FLAGS[i].store(cur.sa_flags as usize, Ordering::Release);
        // SAFETY: a zeroed sigaction with our handler; SA_ONSTACK so a stack overflow still
        // reaches Rust's handler on its alternate stack.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fatal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = FATAL.iter().position(|&s| s == sig) else { return };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, pid) = unsafe { ((*info).si_code, (*info).si_pid()) };
    // SAFETY (below): only async-signal-safe calls (sigaction, raise) and atomics.
    if code <= 0 {
        let note = NOTE.load(Ordering::Acquire);
        if !note.is_null() {
            // SAFETY: NOTE points at the leaked, 'static flight recorder header.
            unsafe { &*note }.store(i64::from(sig) << 32 | i64::from(pid as u32), Ordering::Release);
        }
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            // Pending until this handler returns, then fatal.
            libc::raise(sig);
        }
        return;
    }
    let prev = PREVIOUS[i].load(Ordering::Acquire);
    let flags = PREVIOUS_FLAGS[i].load(Ordering::Acquire) as libc::c_int;
    match prev {
        // The fault happens again on return, with the default action: the worker dies of it.
        libc::SIG_DFL | libc::SIG_IGN => unsafe {
            libc::signal(sig, libc::SIG_DFL);
        },
        // SAFETY: `prev` was installed as a handler of this signal with these flags.
        f if flags & libc::SA_SIGINFO != 0 => unsafe {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(f);
            f(sig, info, ctx)
        },
        // SAFETY: as above, a plain handler.
        f => unsafe {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(f);
            f(sig)
        },
    }
}
