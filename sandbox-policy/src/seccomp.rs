//! The seccomp layer: an allow-list from the profile, with calls checked by argument: `clone`
//! (threads; vfork-style children through the broker's supervisor, which bounds how many live
//! at once; never a fork, never a new namespace), the calls that name a process (only the
//! worker itself), `ioctl` (only the profile's request numbers) and `socket` (only the profile's
//! domains). Anything else goes to the broker's supervisor (or, on kernels without listeners,
//! traps to the worker's SIGSYS handler), which records the call and kills the worker, so the
//! report names the forbidden call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicPtr, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::profile::Profile;
use crate::SandboxError;

#[cfg(target_arch = "x86_64")]
use crate::syscalls_x86_64::SYSCALLS;
#[cfg(not(target_arch = "x86_64"))]
const SYSCALLS: &[(&str, i64)] = &[];

pub fn syscall_number(name: &str) -> Option<i64> {
    SYSCALLS.iter().find(|(n, _)| *n == name).map(|&(_, nr)| nr)
}

pub fn syscall_name(nr: i64) -> Option<&'static str> {
    SYSCALLS.iter().find(|&&(_, n)| n == nr).map(|&(name, _)| name)
}

/// What the worker itself needs whatever its driver: its channel and lanes, its threads,
/// memory, and returning from signal handlers. Allowed under every profile.
pub const WORKER_BASE: &[&str] = &[
    "read",
    "write",
    "close",
    "fstat",
    "newfstatat",
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "brk",
    "futex",
    "recvmsg",
    "sendmsg",
    "poll",
    "ppoll",
    "rt_sigreturn",
    "rt_sigaction",
    "rt_sigprocmask",
    "sigaltstack",
    "restart_syscall",
    "exit",
    "exit_group",
    "getpid",
    "gettid",
    "sched_yield",
    "clock_gettime",
    "clock_nanosleep",
    "nanosleep",
    "set_robust_list",
    "rseq",
];

fn arch() -> Result<seccompiler::TargetArch, SandboxError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| SandboxError::Unsupported(format!("no seccomp support for {}", std::env::consts::ARCH)))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conds).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

fn cond32(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

/// Where a vfork-style `clone` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spawning {
    /// To the broker's supervisor, which counts the cage's processes and lets it run, or answers
    /// EAGAIN past the profile's limit (the flags are registers: no TOCTOU).
    Supervised,
    /// Allowed in the filter, unbounded: kernels without user-notification listeners.
    Unsupervised,
}

/// `clone` flags that make new namespaces. A child in a user namespace of its own holds every
/// capability there (`CAP_NET_ADMIN` over a new network namespace: nf_tables, packet sockets),
/// which unprivileged processes may create: no cage process may.
pub const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// Does a `clone` with these flags start a vfork-style child (not a thread, not a fork, in no
/// new namespace)?
pub fn is_vfork_clone(flags: u64) -> bool {
    let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64;
    flags & (vfork | libc::CLONE_THREAD as u64 | NAMESPACE_FLAGS) == vfork
}

/// Builds the filters for `profile`, vfork-style children going to the supervisor.
pub fn build(profile: &Profile) -> Result<Vec<BpfProgram>, SandboxError> {
    build_with(profile, Spawning::Supervised)
}

/// Builds the filters for `profile`. Two filters, because seccomp takes the strictest answer
/// of all installed filters: the first makes `clone3` fail with ENOSYS (its flags live in
/// memory, out of BPF's reach, and glibc then falls back to `clone`, whose flags we can check);
/// the second is the allow-list, trapping everything else. Calls that name another process
/// (`kill`, `tgkill`, `rt_sigqueueinfo`, `prlimit64`) must name the worker itself; `ioctl` only
/// with the profile's request numbers; `socket` only in the profile's domains.
pub fn build_with(profile: &Profile, spawning: Spawning) -> Result<Vec<BpfProgram>, SandboxError> {
    if SYSCALLS.is_empty() {
        return Err(SandboxError::Unsupported(format!("no system call table for {}", std::env::consts::ARCH)));
    }
    let arch = arch()?;
    let pid = std::process::id() as u64;
    let mut allow: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for name in WORKER_BASE.iter().copied().chain(profile.seccomp.allow.iter().map(String::as_str)) {
        let nr = syscall_number(name).ok_or_else(|| SandboxError::Profile(format!("unknown system call {name}")))?;
        allow.insert(nr, vec![]);
    }
    // Threads always; vfork-style children only if the profile allows spawning (and then
    // through the supervisor, which bounds them); never fork.
    let thread = libc::CLONE_THREAD as u64;
    let mut clone_rules = vec![rule(vec![cond(0, SeccompCmpOp::MaskedEq(thread | NAMESPACE_FLAGS), thread)?])?];
    if profile.spawn && spawning == Spawning::Unsupervised {
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64;
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(vfork | thread | NAMESPACE_FLAGS), vfork)?])?);
    }
    allow.insert(libc::SYS_clone, clone_rules);
    allow.insert(libc::SYS_clone3, vec![]);
    // Signals and limits only to itself: a driver must not signal, or change the limits of, the
    // broker or the application (same uid: the kernel would let it). 0 means "myself" to prlimit.
    allow.insert(libc::SYS_kill, vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?]);
    allow.insert(libc::SYS_tgkill, vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?]);
    if let Some(rules) = allow.get_mut(&libc::SYS_rt_sigqueueinfo) {
        *rules = vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?];
    }
    if let Some(rules) = allow.get_mut(&libc::SYS_rt_tgsigqueueinfo) {
        *rules = vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?];
    }
    if let Some(rules) = allow.get_mut(&libc::SYS_prlimit64) {
        *rules = vec![rule(vec![cond(0, SeccompCmpOp::Eq, 0)?])?, rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?];
    }
    if let Some(ioctl) = allow.get_mut(&libc::SYS_ioctl) {
        *ioctl = ioctl_rules(&profile.ioctl_type_bytes()?, &profile.ioctl_requests()?)?;
    }
    if let Some(socket) = allow.get_mut(&libc::SYS_socket) {
        let mut rules = Vec::new();
        for domain in profile.socket_domain_numbers()? {
            rules.push(rule(vec![cond32(0, SeccompCmpOp::Eq, domain)?])?);
        }
        *socket = rules;
    }
    let mut no_clone3 = BTreeMap::new();
    no_clone3.insert(libc::SYS_clone3, vec![]);
    let first = SeccompFilter::new(no_clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    let second = SeccompFilter::new(allow, SeccompAction::Trap, SeccompAction::Allow, arch)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    let mut out = Vec::new();
    for f in [first, second] {
        out.push(BpfProgram::try_from(f).map_err(|e| SandboxError::Seccomp(e.to_string()))?);
    }
    Ok(out)
}

/// The rules that let `ioctl` through: the request's type byte is one of `types`, or its number
/// is one of `requests` (the kernel reads 32 bits of it; so do the rules). seccompiler tries a
/// system call's rules one after the other and the first that matches allows it, so every
/// ioctl the driver makes pays for the rules before the one it matches, and `ioctl` is the one
/// call the kernel cannot answer from its cache (the verdict depends on an argument): drivers
/// that submit through ioctls make one per submission, NVIDIA's makes about 600 starting up
/// (none per round trip: `perf stat`, README). So the type bytes come first (NVIDIA's `'F'`
/// requests), and each run of consecutive numbers is one range (NVIDIA's 127 UVM numbers are
/// four rules, not 127). `examples/ioctl_cost.rs` on the H200 host: an
/// `'F'` ioctl on /dev/null took 337-350 ns with the type rule after the numbers, 157-202 now,
/// 114-127 unconfined (README, "Figures (issue 12)").
fn ioctl_rules(types: &[u8], requests: &[u32]) -> Result<Vec<SeccompRule>, SandboxError> {
    let mut rules = Vec::new();
    for &t in types {
        rules.push(rule(vec![cond32(1, SeccompCmpOp::MaskedEq(0xff00), (t as u64) << 8)?])?);
    }
    for (first, last) in request_runs(requests) {
        rules.push(match first == last {
            true => rule(vec![cond32(1, SeccompCmpOp::Eq, first as u64)?])?,
            false => rule(vec![cond32(1, SeccompCmpOp::Ge, first as u64)?, cond32(1, SeccompCmpOp::Le, last as u64)?])?,
        });
    }
    Ok(rules)
}

/// `requests` as runs of consecutive numbers, `(first, last)` each, in ascending order.
fn request_runs(requests: &[u32]) -> Vec<(u32, u32)> {
    let mut sorted = requests.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for nr in sorted {
        match runs.last_mut() {
            Some((_, last)) if last.checked_add(1) == Some(nr) => *last = nr,
            _ => runs.push((nr, nr)),
        }
    }
    runs
}

/// Installs the filters on every thread of the process.
/// Installs the filters on the (single-threaded) calling process. A violation goes to a
/// user-notification listener, returned here for the broker: the broker records the call and
/// kills the worker. That is robust where a SIGSYS handler is not (compilers inside drivers,
/// LLVM's among them, install their own SIGSYS handlers). Kernels without listeners get the
/// SIGSYS trap instead, and `None`.
pub fn install(filters: &[BpfProgram], fallback: &[BpfProgram]) -> Result<Option<std::os::fd::OwnedFd>, SandboxError> {
    let Some((last, first)) = filters.split_last() else { return Ok(None) };
    for f in first {
        seccompiler::apply_filter(f).map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    }
    let notify: Vec<libc::sock_filter> = last
        .iter()
        .map(|i| {
            let ret_trap = i.code == (libc::BPF_RET | libc::BPF_K) as u16 && i.k == SECCOMP_RET_TRAP;
            libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: if ret_trap { SECCOMP_RET_USER_NOTIF } else { i.k },
            }
        })
        .collect();
    let fprog = libc::sock_fprog { len: notify.len() as u16, filter: notify.as_ptr() as *mut _ };
    const SET_MODE_FILTER: libc::c_ulong = 1;
    const FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
    // SAFETY: fprog points at a valid BPF program for the duration of the call.
    let fd = unsafe { libc::syscall(libc::SYS_seccomp, SET_MODE_FILTER, FLAG_NEW_LISTENER, &fprog as *const _) };
    if fd >= 0 {
        // SAFETY: the kernel returned a fresh fd.
        return Ok(Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) }));
    }
    // No listener: the variant that needs no supervisor (vfork-style children unbounded).
    let last = fallback.last().unwrap_or(last);
    seccompiler::apply_filter(last).map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    Ok(None)
}

const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
pub(crate) const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;

/// Where the SIGSYS handler records the trapped call: a word in the flight recorder.
static TRAP_SLOT: AtomicPtr<AtomicI64> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: for SIGSYS the kernel fills siginfo's _sigsys member: the call number is the int
    // at byte offset 24 (after si_signo, si_errno, si_code, padding and _call_addr).
    let nr = unsafe { *((info as *const u8).add(24) as *const libc::c_int) } as i64;
    let slot = TRAP_SLOT.load(Ordering::Acquire);
    if !slot.is_null() {
        // SAFETY: the slot points into the flight recorder mapping, which is never unmapped.
        unsafe { (*slot).store(nr, Ordering::Release) };
    }
    let mut msg = *b"cloister-worker: seccomp trapped a forbidden system call: ........................\n";
    let name = syscall_name(nr).unwrap_or("unknown").as_bytes();
    let start = msg.len() - 25;
    for (i, b) in name.iter().take(24).enumerate() {
        msg[start + i] = *b;
    }
    let len = start + name.len().min(24);
    // SAFETY: write, signal and raise are async-signal-safe; dying by SIGSYS is the point.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), len);
        libc::write(2, b"\n".as_ptr().cast(), 1);
        libc::signal(libc::SIGSYS, libc::SIG_DFL);
        libc::raise(libc::SIGSYS);
    }
}

/// Installs the SIGSYS handler that records into `slot` (a word of the flight recorder).
pub fn install_trap_handler(slot: &'static AtomicI64) -> Result<(), SandboxError> {
    TRAP_SLOT.store(slot as *const AtomicI64 as *mut AtomicI64, Ordering::Release);
    // SAFETY: a zeroed sigaction with our handler and SA_SIGINFO is valid.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err(SandboxError::Os("sigaction(SIGSYS)", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        assert_eq!(syscall_number("read"), Some(libc::SYS_read));
        assert_eq!(syscall_name(libc::SYS_ptrace), Some("ptrace"));
        assert_eq!(syscall_number("definitely_not_a_syscall"), None);
    }

    #[test]
    fn every_builtin_profile_compiles_to_bpf() {
        for (name, _) in crate::profile::BUILTIN {
            let p = Profile::builtin(name).unwrap();
            let filters = build(&p).unwrap();
            assert_eq!(filters.len(), 2);
            assert!(filters[1].len() > p.seccomp.allow.len(), "{name}");
        }
    }

    use crate::testutil::{run_in_child, Ended};

    /// Runs `call` in a child confined by `profile`'s filters (no listener: a violation is
    /// SIGSYS) and says whether it was allowed.
    fn allowed(profile: &str, call: impl FnOnce() -> i64) -> bool {
        let p = Profile::builtin(profile).unwrap();
        let ended = run_in_child(move || {
            // SAFETY: prctl/setrlimit with constant arguments (no core file for the SIGSYS).
            unsafe {
                libc::setrlimit(libc::RLIMIT_CORE, &libc::rlimit { rlim_cur: 0, rlim_max: 0 });
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            }
            for f in build(&p).map_err(|e| e.to_string())? {
                seccompiler::apply_filter(&f).map_err(|e| e.to_string())?;
            }
            call();
            Ok(())
        });
        match ended {
            Ended::Returned(Ok(())) => true,
            Ended::Signal(libc::SIGSYS) => false,
            other => panic!("unexpected end: {other:?}"),
        }
    }

    fn pid() -> i64 {
        // SAFETY: getpid cannot fail.
        unsafe { libc::getpid() as i64 }
    }

    // SAFETY (the calls below): raw system calls with scalar arguments or null pointers the
    // kernel checks; the point is whether seccomp lets them reach it.

    #[test]
    fn signals_only_to_itself() {
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_kill, pid(), 0) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_kill, pid() + 1, 0) }));
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_tgkill, pid(), pid(), 0) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_tgkill, pid() - 1, pid(), 0) }));
        for profile in ["generic", "nvidia"] {
            let info = [0u8; 128];
            assert!(allowed(profile, || unsafe { libc::syscall(libc::SYS_rt_sigqueueinfo, pid(), 0, info.as_ptr()) }));
            assert!(!allowed(profile, || unsafe {
                libc::syscall(libc::SYS_rt_sigqueueinfo, pid() + 1, 0, info.as_ptr())
            }));
        }
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_rt_sigqueueinfo, pid(), 0, 0) }));
    }

    #[test]
    fn limits_only_of_itself() {
        let null = std::ptr::null::<u8>();
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_prlimit64, 0, 7, null, null) }));
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_prlimit64, pid(), 7, null, null) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_prlimit64, pid() + 1, 7, null, null) }));
        assert!(!allowed("generic", || unsafe { libc::syscall(libc::SYS_prlimit64, 1, 7, null, null) }));
    }

    #[test]
    fn ioctl_by_request_number() {
        let tcgets = libc::TCGETS as i64;
        let mut buf = [0u8; 256];
        let b = buf.as_mut_ptr();
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_ioctl, 0, tcgets, b) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_ioctl, 0, tcgets + 1, b) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_ioctl, 0, tcgets - 1, b) }));
        // The kernel reads 32 bits of the request; so does the filter.
        assert!(allowed("pocl", || unsafe { libc::syscall(libc::SYS_ioctl, 0, tcgets | (1 << 32), b) }));
        assert!(!allowed("generic", || unsafe { libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSTI as i64, b) }));
        // NVIDIA's 'F' requests pass whatever their number and size; the next type does not.
        let nv = 0xC020_46D6_i64; // _IOWR('F', 0xd6, 32 bytes)
        assert!(allowed("nvidia", || unsafe { libc::syscall(libc::SYS_ioctl, -1, nv, b) }));
        assert!(!allowed("nvidia", || unsafe { libc::syscall(libc::SYS_ioctl, -1, nv + 0x100, b) }));
        assert!(!allowed("nvidia", || unsafe { libc::syscall(libc::SYS_ioctl, -1, nv - 0x100, b) }));
    }

    #[test]
    fn request_numbers_become_runs() {
        assert_eq!(request_runs(&[]), vec![]);
        assert_eq!(request_runs(&[5]), vec![(5, 5)]);
        // Unsorted and repeated numbers make the same runs; a gap of one splits a run.
        assert_eq!(request_runs(&[3, 1, 2, 2, 7, 5, 6, 9]), vec![(1, 3), (5, 7), (9, 9)]);
        assert_eq!(request_runs(&[u32::MAX, u32::MAX - 1, 0]), vec![(0, 0), (u32::MAX - 1, u32::MAX)]);
        // NVIDIA's UVM numbers (1-127 but 9, 2047, UVM_(DE)INITIALIZE) beside the terminal
        // requests every profile has (TCGETS, TIOCGWINSZ, ...).
        let p = Profile::builtin("nvidia").unwrap();
        let runs = request_runs(&p.ioctl_requests().unwrap());
        let (terminal, uvm): (Vec<_>, Vec<_>) = runs.iter().partition(|(first, _)| (0x5400..0x5500).contains(first));
        assert_eq!(uvm, vec![&(1, 8), &(10, 127), &(2047, 2047), &(0x3000_0001, 0x3000_0002)]);
        assert!(terminal.contains(&&(libc::TIOCGWINSZ as u32, libc::TIOCGWINSZ as u32)));
    }

    /// Every bound of every run of NVIDIA's request numbers passes, and the number beside it
    /// does not (Firecracker's way: each rule with its allowed and off-by-one arguments).
    #[test]
    fn ioctl_ranges_hold_at_their_bounds() {
        let p = Profile::builtin("nvidia").unwrap();
        let mut buf = [0u8; 256];
        let b = buf.as_mut_ptr() as usize;
        let ioctl = |nr: u32| move || unsafe { libc::syscall(libc::SYS_ioctl, -1, nr as i64, b) };
        for (first, last) in request_runs(&p.ioctl_requests().unwrap()) {
            assert!(allowed("nvidia", ioctl(first)), "{first:#x}");
            assert!(allowed("nvidia", ioctl(last)), "{last:#x}");
            assert!(!allowed("nvidia", ioctl(first - 1)), "{:#x}", first - 1);
            assert!(!allowed("nvidia", ioctl(last + 1)), "{:#x}", last + 1);
        }
        // Inside a run too, and the number UVM's tests use (9) stays out.
        assert!(allowed("nvidia", ioctl(75)));
        assert!(!allowed("nvidia", ioctl(9)));
    }

    #[test]
    fn sockets_only_in_listed_domains() {
        let stream = libc::SOCK_STREAM as i64;
        assert!(allowed("nvidia", || unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX as i64, stream, 0) }));
        assert!(!allowed("nvidia", || unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX as i64 + 1, stream, 0) }));
        assert!(!allowed("generic", || unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX as i64, stream, 0) }));
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX as i64, stream, 0) }));
    }

    #[test]
    fn threads_pass_and_processes_go_to_the_supervisor() {
        assert!(is_vfork_clone((libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64));
        assert!(!is_vfork_clone(libc::SIGCHLD as u64));
        assert!(!is_vfork_clone((libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_THREAD) as u64));
        assert!(!is_vfork_clone((libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_NEWUSER) as u64));
        assert!(!is_vfork_clone((libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_NEWNET) as u64));
        // A thread in a new namespace traps (the kernel would refuse some; the filter all).
        let thread =
            (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND | libc::CLONE_THREAD) as i64;
        assert!(!allowed("pocl", || unsafe {
            libc::syscall(libc::SYS_clone, thread | libc::CLONE_NEWNET as i64, 0, 0, 0, 0)
        }));
        assert!(!allowed("pocl", || unsafe {
            libc::syscall(libc::SYS_clone, thread | libc::CLONE_NEWUTS as i64, 0, 0, 0, 0)
        }));
        // With no supervisor at all (old kernels), a vfork into a new user namespace still traps.
        let p = Profile::builtin("pocl").unwrap();
        let ended = run_in_child(move || {
            // SAFETY: as in `allowed`.
            unsafe {
                libc::setrlimit(libc::RLIMIT_CORE, &libc::rlimit { rlim_cur: 0, rlim_max: 0 });
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            }
            for f in build_with(&p, Spawning::Unsupervised).map_err(|e| e.to_string())? {
                seccompiler::apply_filter(&f).map_err(|e| e.to_string())?;
            }
            let flags = (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_NEWUSER | libc::SIGCHLD) as i64;
            // SAFETY: trapped before the kernel runs it (a child sharing our stack otherwise).
            unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
            Ok(())
        });
        assert_eq!(ended, Ended::Signal(libc::SIGSYS));
        // A fork (no CLONE_VM) traps in every profile; with no supervisor, so does a vfork.
        assert!(!allowed("generic", || unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as i64, 0, 0, 0, 0) }));
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as i64;
        assert!(!allowed("pocl", || unsafe { libc::syscall(libc::SYS_clone, vfork, 0, 0, 0, 0) }));
    }
}
