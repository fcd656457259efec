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
