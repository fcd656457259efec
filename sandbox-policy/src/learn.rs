//! Learning mode: the worker runs unconfined but observed. Every system call it (or a child it
//! starts) makes is reported to the broker through a seccomp user-notification listener and then
//! allowed to continue; the broker writes a profile that allows exactly what was used.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::profile::Profile;
use crate::SandboxError;

const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
use crate::seccomp::SECCOMP_RET_USER_NOTIF;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_USER_NOTIF_FLAG_CONTINUE: u32 = 1;
const IOCTL_NOTIF_RECV: libc::c_ulong = 0xC050_2100;
const IOCTL_NOTIF_SEND: libc::c_ulong = 0xC018_2101;
const IOCTL_NOTIF_ID_VALID: libc::c_ulong = 0x4008_2102;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(not(target_arch = "x86_64"))]
const AUDIT_ARCH: u32 = 0;

#[repr(C)]
#[derive(Default)]
struct SeccompData {
    nr: i32,
    arch: u32,
    instruction_pointer: u64,
    args: [u64; 6],
}

#[repr(C)]
#[derive(Default)]
struct Notif {
    id: u64,
    pid: u32,
    flags: u32,
    data: SeccompData,
}

#[repr(C)]
#[derive(Default)]
struct NotifResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

/// Worker side: every system call but `sendmsg` (which hands the listener over) goes to the
/// listener. Returns the listener fd. The process must be single-threaded and `no_new_privs`.
pub fn install_observer() -> Result<OwnedFd, SandboxError> {
    let stmt = |code: u16, k: u32| libc::sock_filter { code, jt: 0, jf: 0, k };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    // clone3 fails with ENOSYS, as under enforcement, so glibc falls back to clone, whose flags
    // say whether the driver starts threads or child processes.
    let prog = [
        stmt(ld, 4),                         // arch
        jeq(AUDIT_ARCH, 0, 5),               // another ABI: allow
        stmt(ld, 0),                         // nr
        jeq(libc::SYS_sendmsg as u32, 3, 0), // sendmsg: allow
        jeq(libc::SYS_clone3 as u32, 1, 0),  // clone3: ENOSYS
        stmt(ret, SECCOMP_RET_USER_NOTIF),
        stmt(ret, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        stmt(ret, SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut _ };
    // SAFETY: fprog points at a valid BPF program for the duration of the call.
    let fd = unsafe {
        libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &fprog as *const _)
    };
    if fd < 0 {
        return Err(SandboxError::Os("seccomp(NEW_LISTENER)", std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel returned a fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// What the observer saw.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// System call number -> how many times it was made.
    pub calls: BTreeMap<i64, u64>,
    /// A vfork-style child was started (the driver runs helper programs).
    pub spawned: bool,
    /// The programs it executed.
    pub executed: std::collections::BTreeSet<String>,
    /// ioctl request (the 32 bits the kernel reads) -> how many times.
    pub ioctls: BTreeMap<u32, u64>,
    /// The socket() domains it asked for.
    pub socket_domains: std::collections::BTreeSet<u64>,
}

impl Observed {
    /// Adds what another observed worker did.
    pub fn merge(&mut self, other: &Observed) {
        for (nr, n) in &other.calls {
            *self.calls.entry(*nr).or_default() += n;
        }
        self.spawned |= other.spawned;
        self.executed.extend(other.executed.iter().cloned());
        for (nr, n) in &other.ioctls {
            *self.ioctls.entry(*nr).or_default() += n;
        }
        self.socket_domains.extend(other.socket_domains.iter().copied());
    }
}

/// Reads a NUL-terminated string from a stopped process (the notified thread waits for us).
fn read_string(pid: u32, addr: u64) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; 4096];
    let n = mem.read_at(&mut buf, addr).ok()?;
    let end = buf[..n].iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// What the supervisor does with each call the filter hands it.
pub enum Supervision<'a> {
    /// Learning: note it and let it run.
    Observe,
    /// Enforcing: a vfork-style `clone` is counted against `max_processes` (when the profile
    /// allows spawning: `Some`); every other call that reaches the listener is forbidden.
    /// `on_violation` gets its number (to record it and kill the worker); the process that made
    /// the call is killed before it returns (with EPERM, never seen).
    Enforce { on_violation: &'a mut dyn FnMut(i64), max_processes: Option<u64> },
}

/// The session of `pid` (`self` for the supervisor's own), from /proc/PID/stat.
fn session_of(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold anything, so up to the last ')'): state, ppid,
    // pgrp, session.
    stat.rsplit_once(')')?.1.split_whitespace().nth(3)?.parse().ok()
}

/// How many processes live in session `sid`. The worker starts a session of its own and no
/// caged process can leave it (`setsid` is in no profile): counting the session counts the
/// cage, however its processes were started and whoever they were reparented to.
pub fn processes_in_session(sid: u64) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return u64::MAX };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .filter(|n| session_of(n) == Some(sid))
        .count() as u64
}

/// The last spawn granted: its session, how many processes that session had, and when.
type LastGrant = Option<(u64, u64, std::time::Instant)>;

/// Decides a vfork-style `clone` from `pid`: `None` lets it run, `Some(errno)` refuses it.
/// A child granted a moment ago may not show in /proc yet: the count waits (at most 20 ms)
/// until the session has grown past what it was at that grant, so no grant is missed.
fn decide_spawn(pid: u32, max: u64, last: &mut LastGrant) -> Option<i32> {
    let Some(sid) = session_of(&pid.to_string()) else { return Some(libc::EAGAIN) };
    // A caller in the supervisor's own session is no cage: nothing sound to count.
    if session_of("self") == Some(sid) {
        return Some(libc::EAGAIN);
    }
    let mut count = processes_in_session(sid);
    if let Some((last_sid, before, at)) = *last {
        let limit = at + std::time::Duration::from_millis(20);
        while last_sid == sid && count <= before && std::time::Instant::now() < limit {
            std::thread::sleep(std::time::Duration::from_micros(200));
            count = processes_in_session(sid);
        }
    }
    if count >= max {
        return Some(libc::EAGAIN);
    }
    *last = Some((sid, count, std::time::Instant::now()));
    None
}

/// Broker side: answers the listener until every observed process is gone.
pub fn observe(listener: OwnedFd) -> Observed {
    supervise(listener, Supervision::Observe)
}

/// Broker side: answers the listener until every supervised process is gone.
pub fn supervise(listener: OwnedFd, mut mode: Supervision) -> Observed {
    let mut seen = Observed::default();
    let mut granted: LastGrant = None;
    loop {
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 500) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if pfd.revents & libc::POLLHUP != 0 && pfd.revents & libc::POLLIN == 0 {
            break;
        }
        if n == 0 {
            continue;
        }
        let mut req = Notif::default();
        // SAFETY: req is a zeroed seccomp_notif of the size the ioctl number encodes.
        if unsafe { libc::ioctl(listener.as_raw_fd(), IOCTL_NOTIF_RECV, &mut req as *mut Notif) } != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                _ => break,
            }
        }
        *seen.calls.entry(req.data.nr as i64).or_default() += 1;
        if req.data.nr as i64 == libc::SYS_clone && req.data.args[0] & libc::CLONE_THREAD as u64 == 0 {
            seen.spawned = true;
        }
        if req.data.nr as i64 == libc::SYS_execve {
            if let Some(path) = read_string(req.pid, req.data.args[0]) {
                // Landlock checks the file itself, so name it, and the loader it needs.
                let real = std::fs::canonicalize(&path).map(|p| p.display().to_string()).unwrap_or(path.clone());
                seen.executed.insert(path);
                seen.executed.insert(real);
            }
        }
        if req.data.nr as i64 == libc::SYS_ioctl {
            *seen.ioctls.entry(req.data.args[1] as u32).or_default() += 1;
        }
        if req.data.nr as i64 == libc::SYS_socket {
            seen.socket_domains.insert(req.data.args[0] & 0xffff_ffff);
        }
        let cont = NotifResp { id: req.id, val: 0, error: 0, flags: SECCOMP_USER_NOTIF_FLAG_CONTINUE };
        let mut resp = match &mut mode {
            Supervision::Observe => cont,
            Supervision::Enforce { max_processes: Some(max), .. }
                if req.data.nr as i64 == libc::SYS_clone && crate::seccomp::is_vfork_clone(req.data.args[0]) =>
            {
                let decision = decide_spawn(req.pid, *max, &mut granted);
                // The caller's pid was read while it waited in the call; still waiting means it
                // was not reused meanwhile.
                // SAFETY: the ioctl reads a u64 id.
                let valid =
                    unsafe { libc::ioctl(listener.as_raw_fd(), IOCTL_NOTIF_ID_VALID, &req.id as *const u64) } == 0;
                match decision {
                    None if valid => cont,
                    None => continue,
                    Some(errno) => NotifResp { id: req.id, val: 0, error: -errno, flags: 0 },
                }
            }
            Supervision::Enforce { on_violation, .. } => {
                on_violation(req.data.nr as i64);
                // The caller dies before its call returns, so no driver code runs after a
                // violation: the worker the broker kills may be the PID namespace's outer
                // process, whose death reaches the caller only later. The id is checked first,
                // so `req.pid` is still the blocked caller, not a reused pid.
                // SAFETY: the ioctl reads a u64 id; kill has no memory preconditions.
                unsafe {
                    if libc::ioctl(listener.as_raw_fd(), IOCTL_NOTIF_ID_VALID, &req.id as *const u64) == 0 {
                        libc::kill(req.pid as i32, libc::SIGKILL);
                    }
                }
                NotifResp { id: req.id, val: 0, error: -libc::EPERM, flags: 0 }
            }
        };
        // SAFETY: resp is a seccomp_notif_resp of the encoded size. ENOENT (the caller died) is fine.
        unsafe { libc::ioctl(listener.as_raw_fd(), IOCTL_NOTIF_SEND, &mut resp as *mut NotifResp) };
    }
    seen
}

/// Calls the allow-list need not name: the seccomp layer rules on them by their arguments.
const RULED_BY_ARGUMENTS: &[&str] = &["clone", "clone3", "kill", "tgkill"];

/// Writes a reviewable profile allowing exactly what was observed; paths and limits start from
/// the `generic` profile, which the reviewer narrows.
pub fn write_profile(name: &str, library: &str, command: &str, seen: &Observed) -> String {
    let generic = Profile::builtin("generic").expect("generic profile");
    let prefix =
        std::path::Path::new(library).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = prefix.split(".so").next().unwrap_or(&prefix).to_string();
    let mut out = String::new();
    out.push_str(&format!("# cloister sandbox profile learned by `cloister policy learn` for {library}\n"));
    out.push_str(&format!("# while running: {command}\n"));
    out.push_str("#\n# Review before use. The system calls below are exactly those the driver (and any program it\n");
    out.push_str("# started) made during that run, with how often; a run that skips a feature (a build, an\n");
    out.push_str("# image, a second device) will not have seen its calls. The filesystem section is copied\n");
    out.push_str("# from the generic profile: narrow it to what the driver reads.\n");
    out.push_str(&format!("name = {name:?}\nlibraries = [{prefix:?}]\nspawn = {}\n\n", seen.spawned));
    out.push_str(&format!("[limits]\nopen_files = {}\naddress_space_mib = 0\n\n", generic.limits.open_files));
    let list = |v: &[String]| v.iter().map(|p| format!("    {p:?},\n")).collect::<String>();
    out.push_str(&format!(
        "[filesystem]\nread = [\n{}]\nexecute = [\n{}]\nwrite = [\n{}]\n\n",
        list(&generic.filesystem.read),
        list(&generic.filesystem.execute.iter().chain(seen.executed.iter()).cloned().collect::<Vec<_>>()),
        list(&generic.filesystem.write)
    ));
    out.push_str("[seccomp]\nallow = [\n");
    for (nr, count) in &seen.calls {
        let Some(name) = crate::seccomp::syscall_name(*nr) else {
            out.push_str(&format!("    # system call {nr} ({count} calls) has no name on this architecture\n"));
            continue;
        };
        if RULED_BY_ARGUMENTS.contains(&name) {
            out.push_str(&format!("    # {name}: {count} calls; checked by argument (threads, and vfork-style children if spawn = true)\n"));
            continue;
        }
        out.push_str(&format!("    {name:?}, # {count} calls\n"));
    }
    out.push_str("]\n");
    if !seen.ioctls.is_empty() {
        out.push_str("# ioctl requests seen (beyond the base set every profile gets), with how often: review each.\n");
        out.push_str("ioctls = [\n");
        for (nr, count) in &seen.ioctls {
            let name = crate::ioctl::display(*nr);
            if crate::ioctl::NEVER.contains(nr) {
                out.push_str(&format!("    # {name}: {count} calls; never allowed (terminal input injection)\n"));
                continue;
            }
            out.push_str(&format!("    {name:?}, # {count} calls\n"));
        }
        out.push_str("]\n");
    }
    if !seen.socket_domains.is_empty() {
        let names: Vec<String> = seen
            .socket_domains
            .iter()
            .filter_map(|d| crate::profile::SOCKET_DOMAINS.iter().find(|(_, v)| v == d).map(|(n, _)| format!("{n:?}")))
            .collect();
        out.push_str(&format!("socket_domains = [{}]\n", names.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learned_profile_parses_and_allows_what_was_seen() {
        let mut seen = Observed::default();
        seen.calls.insert(libc::SYS_read, 10);
        seen.calls.insert(libc::SYS_openat, 3);
        seen.calls.insert(libc::SYS_clone, 2);
        seen.spawned = true;
        seen.ioctls.insert(0x5401, 4);
        seen.ioctls.insert(0x3000_0001, 1);
        seen.ioctls.insert(0x5412, 1);
        let text = write_profile("learned-x", "/opt/x/libx.so.1", "app --flag", &seen);
        let p = Profile::parse(&text).unwrap();
        assert_eq!(p.libraries, vec!["libx".to_string()]);
        assert!(p.spawn);
        assert_eq!(p.seccomp.allow, vec!["read".to_string(), "openat".to_string()]);
        assert!(text.contains("# clone: 2 calls"));
        // ioctl numbers are recorded, by name where known; TIOCSTI never makes it in.
        assert!(p.ioctl_requests().unwrap().contains(&0x3000_0001), "{text}");
        assert!(text.contains("\"TCGETS\", # 4 calls") && text.contains("# TIOCSTI: 1 calls; never allowed"), "{text}");
    }

    #[test]
    fn a_session_counts_its_processes() {
        let sid = session_of("self").expect("own session");
        assert!(processes_in_session(sid) >= 1);
        assert_eq!(session_of(&std::process::id().to_string()), Some(sid));
        // The supervisor's own session is no cage: spawning from it is refused.
        assert_eq!(decide_spawn(std::process::id(), 1000, &mut None), Some(libc::EAGAIN));
    }
}
