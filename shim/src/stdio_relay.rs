//! The workers' output, relayed from the trusted side. A worker never holds the application's
//! stdout or stderr (they may be the user's terminal, which a driver could read or type into
//! with TIOCSTI): it gets the write ends of two pipes, and this module copies what arrives to
//! the process's fd 1 and fd 2 *as they are when the bytes arrive*, so an application that
//! redirects its stdout (dup2 to a file) finds kernel `printf` output there, as it would directly.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

/// The read ends (stdout's, stderr's), non-blocking; the lock orders the relay thread and
/// `drain` so bytes are written in the order they arrived.
static READ_ENDS: OnceLock<Mutex<[OwnedFd; 2]>> = OnceLock::new();

fn pipe() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both are fresh fds we own.
    Some(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Creates the two pipes and starts relaying; returns the write ends for the hello (the caller
/// closes them once sent). `None` if pipes cannot be made: the workers then write nowhere.
pub fn start() -> Option<[OwnedFd; 2]> {
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    for fd in [&out_r, &err_r] {
        // SAFETY: setting O_NONBLOCK on our own pipe end.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    }
    let raw = [out_r.as_raw_fd(), err_r.as_raw_fd()];
    READ_ENDS.set(Mutex::new([out_r, err_r])).ok()?;
    std::thread::Builder::new().name("cloister-stdio".into()).spawn(move || relay(raw)).ok()?;
    // SAFETY: registering a function with the C signature atexit expects.
    unsafe { libc::atexit(drain_at_exit) };
    Some([out_w, err_w])
}

/// Waits for bytes (or the workers' last close) and relays them, until both pipes are closed.
fn relay(raw: [i32; 2]) {
    let mut open = [true, true];
    while open.iter().any(|&o| o) {
        let mut pfds: Vec<libc::pollfd> = raw
            .iter()
            .zip(open)
            .filter(|(_, o)| *o)
            .map(|(&fd, _)| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: pfds is a valid array of pfds.len() entries.
        if unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) } < 0 {
            continue;
        }
        let closed = copy_available();
        for (i, c) in closed.into_iter().enumerate() {
            if c {
                open[i] = false;
            }
        }
    }
}

/// Copies what is in the pipes now; says which pipes reached their end.
fn copy_available() -> [bool; 2] {
    let Some(ends) = READ_ENDS.get() else { return [true, true] };
    let ends = ends.lock().unwrap_or_else(|e| e.into_inner());
    let mut closed = [false, false];
    let mut buf = [0u8; 65536];
    for (i, target) in [1, 2].into_iter().enumerate() {
        loop {
            // SAFETY: reading into a buffer we own, at most its length.
            let n = unsafe { libc::read(ends[i].as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                write_all(target, &buf[..n as usize]);
                continue;
            }
            if n == 0 {
                closed[i] = true;
            } else if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
    }
    closed
}

/// Writes to the application's descriptor as it is now. Bytes it cannot take (closed, or full
/// for a long while) are dropped: the application's own state decides, never the worker.
fn write_all(fd: i32, mut bytes: &[u8]) {
    let mut stalls = 0;
    while !bytes.is_empty() {
        // SAFETY: writing from a buffer we own, at most its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock if stalls < 50 => {
                stalls += 1;
                let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 100) };
            }
            _ => return,
        }
    }
}

/// Whether `request` may give a worker a kernel that calls `printf`, so that calls waiting for
/// the device must relay the pipes' contents before they return (`drain`). A program made from
/// source may print only if "printf" is written in its source, its build options (`-D`) or the
/// application's headers it includes; one made from a binary, IL or built-in kernels may always
/// print. Output a driver writes on its own (warnings, debug logs) is relayed as it comes, by
/// the relay thread, with no order to keep.
pub fn may_print(request: &cloister_ipc::Request) -> bool {
    use cloister_ipc::Request;
    fn says(bytes: &[u8]) -> bool {
        bytes.windows(6).any(|w| w == b"printf")
    }
    fn in_options(options: &Option<Vec<u8>>) -> bool {
        options.as_deref().is_some_and(says)
    }
    fn in_headers(includes: &Option<cloister_ipc::AppIncludes>) -> bool {
        includes.as_ref().is_some_and(|i| i.files.iter().any(|(_, text)| says(text)))
    }
    match request {
        Request::CreateProgramWithSource(r) => r.sources.iter().any(|s| says(s)),
        Request::BuildProgram(r) => in_options(&r.options) || in_headers(&r.includes),
        Request::CompileProgram(r) => in_options(&r.options) || in_headers(&r.includes),
        Request::LinkProgram(r) => in_options(&r.options),
        Request::CreateProgramWithBinary(_)
        | Request::CreateProgramWithIl(_)
        | Request::CreateProgramWithBuiltInKernels(_) => true,
        _ => false,
    }
}

/// Relays what the workers wrote so far, before the application goes on: called after calls
/// that wait for the device (kernel `printf` output is written before they return).
pub fn drain() {
    if READ_ENDS.get().is_some() {
        copy_available();
    }
}

extern "C" fn drain_at_exit() {
    drain();
}

#[cfg(test)]
mod tests {
    use super::may_print;
    use cloister_ipc::{
        AppIncludes, BuildProgram, Call, CreateProgramWithBinary, CreateProgramWithSource, FlushOrFinish,
    };

    fn source(text: &str) -> cloister_ipc::Request {
        CreateProgramWithSource { id: 1, context: 2, sources: vec![b"kernel void k() {}".to_vec(), text.into()] }
            .into_request()
    }

    fn build(options: Option<&str>, header: Option<&str>) -> cloister_ipc::Request {
        let includes = header.map(|h| AppIncludes {
            dirs: vec!["/inc".into()],
            files: vec![("/inc/a.h".into(), b"#define X 1".to_vec()), ("/inc/b.h".into(), h.into())],
            macro_dirs: vec![],
        });
        BuildProgram { program: 1, devices: None, options: options.map(Into::into), includes, notify: None }
            .into_request()
    }

    #[test]
    fn a_program_may_print_where_printf_is_written_or_its_code_cannot_be_read() {
        assert!(may_print(&source("kernel void p() { printf(\"%d\", 1); }")));
        assert!(!may_print(&source("kernel void p(global int *a) { a[0] = 1; } // print nothing")));
        assert!(may_print(&build(Some("-DSAY=printf"), None)));
        assert!(!may_print(&build(Some("-DSAY=print -cl-fast-relaxed-math"), None)));
        assert!(may_print(&build(None, Some("#define SAY(x) printf(\"%d\", x)"))));
        assert!(!may_print(&build(None, Some("#define SAY(x) (x)"))));
        let binary = CreateProgramWithBinary { id: 1, context: 2, devices: vec![3], binaries: vec![vec![0; 16]] };
        assert!(may_print(&binary.into_request()));
        assert!(!may_print(&FlushOrFinish { queue: 4, finish: true }.into_request()));
    }
}
