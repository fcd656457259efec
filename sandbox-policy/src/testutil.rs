//! Running a piece of a test in a forked child, so that what it installs (filters, dropped
//! capabilities, landlock) binds the child and not the test process.

use std::io::Read;
use std::os::fd::FromRawFd;

/// What became of the child.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// It returned; the closure's result.
    Returned(Result<(), String>),
    /// It was killed by this signal (SIGSYS: a seccomp trap).
    Signal(i32),
}

/// Runs `f` in a forked child and reports how it ended.
pub fn run_in_child(f: impl FnOnce() -> Result<(), String>) -> Ended {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child runs `f` and exits without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: the child's end of the pipe; _exit skips the harness's destructors.
        unsafe {
            libc::close(fds[0]);
            let msg = match f() {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("err:{e}"),
            };
            libc::write(fds[1], msg.as_ptr().cast(), msg.len());
            libc::_exit(0);
        }
    }
    // SAFETY: the parent's ends; fds[0] is ours from now on.
    unsafe { libc::close(fds[1]) };
    let mut out = String::new();
    // SAFETY: fds[0] is an open pipe end owned here.
    let _ = unsafe { std::fs::File::from_raw_fd(fds[0]) }.read_to_string(&mut out);
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) {
        return Ended::Signal(libc::WTERMSIG(status));
    }
    match out.strip_prefix("err:") {
        Some(e) => Ended::Returned(Err(e.to_string())),
        None if out == "ok" => Ended::Returned(Ok(())),
        None => Ended::Returned(Err(format!("child said nothing (status {status})"))),
    }
}

/// Runs `f` in a forked child; its result, or the signal that killed it as an error.
pub fn in_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    match run_in_child(f) {
        Ended::Returned(r) => r,
        Ended::Signal(s) => Err(format!("killed by signal {s}")),
    }
}
