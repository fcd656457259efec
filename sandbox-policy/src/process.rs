//! Process-level layers: hygiene, resource limits and the network namespace.

use crate::profile::Profile;
use crate::{Layer, LayerState};

pub(crate) fn layer(name: &'static str, rc: libc::c_int) -> Layer {
    let state = if rc == 0 { LayerState::On } else { LayerState::Off(std::io::Error::last_os_error().to_string()) };
    Layer { name, state }
}

/// Closes every fd above 2 except `keep`, so the driver inherits nothing of the broker's.
pub fn close_fds_except(keep: &[i32]) -> Layer {
    let mut rc = 0;
    let mut from = 3;
    let mut sorted: Vec<i32> = keep.iter().copied().filter(|&fd| fd >= 3).collect();
    sorted.sort_unstable();
    for k in sorted {
        if k > from {
            // SAFETY: close_range only closes descriptors; this runs before the worker opens
            // any of its own, and `keep` is excluded.
            rc |= unsafe { libc::syscall(libc::SYS_close_range, from as u32, (k - 1) as u32, 0) } as i32;
        }
        from = k + 1;
    }
    // SAFETY: as above.
    rc |= unsafe { libc::syscall(libc::SYS_close_range, from as u32, u32::MAX, 0) } as i32;
    layer("closed fds", rc)
}

/// Dies with the broker, runs in its own session, can never gain privileges, dumps no core.
pub fn hygiene() -> Vec<Layer> {
    // SAFETY: prctl/setsid/setrlimit with constant, valid arguments.
    unsafe {
        let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        vec![
            layer("parent-death signal", libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0)),
            layer("own session", if libc::setsid() < 0 { -1 } else { 0 }),
            layer("no_new_privs", libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
            layer("rlimit core=0", libc::setrlimit(libc::RLIMIT_CORE, &core)),
        ]
    }
}

/// Open-file and address-space limits from the profile.
pub fn rlimits(profile: &Profile) -> Vec<Layer> {
    let files = libc::rlimit { rlim_cur: profile.limits.open_files, rlim_max: profile.limits.open_files };
    // SAFETY: setrlimit with a valid struct.
    let mut out = vec![layer("rlimit open files", unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &files) })];
    if profile.limits.address_space_mib > 0 {
        let bytes = profile.limits.address_space_mib << 20;
        let r = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
        // SAFETY: as above.
        out.push(layer("rlimit address space", unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) }));
    }
    out
}

/// A network namespace of its own (with only a loopback that is down): no network at all.
/// Unprivileged users get one inside a new user namespace.
pub fn no_network() -> Layer {
    // SAFETY: unshare and getuid have no memory-safety preconditions; the worker is still
    // single-threaded here, as CLONE_NEWUSER requires.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNET) == 0 {
            return layer("network namespace", 0);
        }
        let (uid, gid) = (libc::getuid(), libc::getgid());
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0 {
            return layer("network namespace", -1);
        }
        let _ = std::fs::write("/proc/self/setgroups", "deny");
        let _ = std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"));
        let _ = std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"));
    }
    Layer { name: "network namespace", state: LayerState::On }
}

/// How the namespace's init tells the process outside that the worker died of a signal: exit
/// status `SIGNALLED + signal` (worker exit statuses stay below it).
const SIGNALLED: i32 = 128;

/// Puts the worker in a PID namespace of its own, so that no process it starts outlives it: a
/// child (or a vfork-style grandchild, which a parent-death signal does not follow) lives in the
/// namespace, and the kernel kills everything in it when the namespace's init ends.
///
/// Call first thing, while the process is single-threaded. It forks twice: the process the
/// broker started stays outside and waits, reporting the worker's end as its own (exit status,
/// or the same signal); its child is the namespace's init, a reaper that ends when the worker
/// does; the worker goes on in init's child, pid 2 (not init itself: init ignores the signals
/// it raises, so an `abort()` would not end it). Each of the three dies with its parent.
/// Unprivileged, the namespace needs a user namespace: it is made here (mapping the caller's
/// uid and gid), and the worker's later namespaces (`no_network`) are made inside it.
pub fn pid_namespace() -> Layer {
    // SAFETY: getuid/getgid/unshare have no memory-safety preconditions; the caller is
    // single-threaded, as CLONE_NEWUSER requires.
    unsafe {
        let (uid, gid) = (libc::getuid(), libc::getgid());
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) != 0 {
                return layer("pid namespace", -1);
            }
            let _ = std::fs::write("/proc/self/setgroups", "deny");
            let _ = std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"));
            let _ = std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"));
        }
    }
    // The parent is outside the namespace, where init's getppid() cannot see it (it reads 0):
    // init learns whether it is still there from this pipe, whose write end only it holds.
    let mut alive = [0; 2];
    // SAFETY: alive is a valid two-element array.
    if unsafe { libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return layer("pid namespace", -1);
    }
    // SAFETY: fork in a single-threaded process; the child goes on with ordinary code.
    match unsafe { libc::fork() } {
        -1 => return layer("pid namespace", -1),
        0 => {}
        init => {
            // SAFETY: closing our copy of the read end.
            unsafe { libc::close(alive[0]) };
            mirror(init, alive[1])
        }
    }
    // SAFETY: prctl, close and poll on our own descriptors.
    unsafe {
        libc::close(alive[1]);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let mut pfd = libc::pollfd { fd: alive[0], events: libc::POLLIN, revents: 0 };
        if libc::poll(&mut pfd, 1, 0) != 0 {
            // Hung up: the parent died before the parent-death signal was armed.
            libc::_exit(1);
        }
    }
    // Now pid 1 of the new namespace.
    // SAFETY: as above (init is single-threaded too).
    match unsafe { libc::fork() } {
        -1 => {
            // SAFETY: leaving at once; nothing to clean up.
            unsafe { libc::_exit(1) }
        }
        0 => {}
        worker => reap_until(worker),
    }
    die_with_parent(1);
    layer("pid namespace", 0)
}

/// Arms SIGKILL on the parent's death, and dies now if the parent is already gone.
fn die_with_parent(parent: libc::pid_t) {
    // SAFETY: prctl/getppid/_exit with valid arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
}

/// Closes every inherited fd above 2 (the worker's channel, recorder and supervisor socket)
/// but `keep`, so only the worker holds them and the shim sees the channel close when the
/// worker ends.
fn close_inherited(keep: Option<i32>) {
    let keep: Vec<i32> = keep.into_iter().collect();
    close_fds_except(&keep);
}

/// Init of the namespace: reaps every orphan until `worker` ends, then ends the same way
/// (encoded for `mirror`), which kills whatever is left in the namespace.
fn reap_until(worker: libc::pid_t) -> ! {
    close_inherited(None);
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if pid == worker || pid < 0 {
            let code = if pid < 0 {
                1
            } else if libc::WIFSIGNALED(status) {
                SIGNALLED + libc::WTERMSIG(status)
            } else {
                libc::WEXITSTATUS(status)
            };
            // SAFETY: leaving at once.
            unsafe { libc::_exit(code) }
        }
    }
}

/// The process the broker started: waits for the namespace's init and ends as the worker did,
/// so the broker's report sees the worker's own exit status or signal. Holds `alive` (see
/// `pid_namespace`) until it ends.
fn mirror(init: libc::pid_t, alive: i32) -> ! {
    close_inherited(Some(alive));
    let mut status = 0;
    // SAFETY: waiting for our child with a valid status pointer.
    while unsafe { libc::waitpid(init, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // SAFETY: leaving at once.
            unsafe { libc::_exit(1) }
        }
    }
    let code = if libc::WIFSIGNALED(status) { SIGNALLED + libc::WTERMSIG(status) } else { libc::WEXITSTATUS(status) };
    if code > SIGNALLED {
        let signal = code - SIGNALLED;
        // SAFETY: no core dump, then the default action and the signal raised on ourselves; we
        // are not an init, so it ends us like it ended the worker.
        unsafe {
            let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &core);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
    }
    // SAFETY: leaving at once (no destructors of the worker's state to run here).
    unsafe { libc::_exit(code.min(255)) }
}
