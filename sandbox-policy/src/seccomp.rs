//! The seccomp layer: an allow-list from the profile, with a few calls checked by argument.
//! Anything else traps: the worker's SIGSYS handler records the call in the flight recorder
//! (shared with the broker) and the worker dies, so the report names the forbidden call.

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

/// Builds the filters for `profile`. Two filters, because seccomp takes the strictest answer
/// of all installed filters: the first makes `clone3` fail with ENOSYS (its flags live in
/// memory, out of BPF's reach, and glibc then falls back to `clone`, whose flags we can check);
/// the second is the allow-list, trapping everything else.
pub fn build(profile: &Profile) -> Result<Vec<BpfProgram>, SandboxError> {
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
    // Threads always; vfork-style children only if the profile allows spawning; never fork.
    let mut clone_rules =
        vec![rule(vec![cond(0, SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64), libc::CLONE_THREAD as u64)?])?];
    if profile.spawn {
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64;
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(vfork), vfork)?])?);
    }
    allow.insert(libc::SYS_clone, clone_rules);
    allow.insert(libc::SYS_clone3, vec![]);
    // Signals only to itself: a driver must not signal the broker or the application.
    allow.insert(libc::SYS_kill, vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?]);
    allow.insert(libc::SYS_tgkill, vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?]);
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

/// Installs the filters on every thread of the process.
/// Installs the filters on the (single-threaded) calling process. A violation goes to a
/// user-notification listener, returned here for the broker: the broker records the call and
/// kills the worker. That is robust where a SIGSYS handler is not (compilers inside drivers,
/// LLVM's among them, install their own SIGSYS handlers). Kernels without listeners get the
/// SIGSYS trap instead, and `None`.
pub fn install(filters: &[BpfProgram]) -> Result<Option<std::os::fd::OwnedFd>, SandboxError> {
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
}
