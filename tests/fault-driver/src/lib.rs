//! `libfaultcl.so`: an OpenCL ICD that wraps the real pocl driver and misbehaves on request.
//!
//! `CLOISTER_FAULT=POINT:ACTION[,POINT:ACTION...]` picks what happens where. Points: `init`
//! (platform enumeration), `context` (clCreateContext), `build` (clBuildProgram), `enqueue`
//! (clEnqueueNDRangeKernel), `finish` (clFinish). Actions: crashes (`segv`, `abort`, `bus`,
//! `exit`, `async-segv` a moment after the call returned), `hang`, `closefds`, and attacks that
//! a caged driver must not be able to make (`exec`, `connect`, `readhome`, `writeout`,
//! `kill-parent`, `ptrace-parent`, `fork50`, `fds100k`, `shrink-shm`, `tty`, `spawn-sleeper`;
//! `linger` makes the process never exit); against later runs and the reports: `forge-report`,
//! `poison-headers`, `tmp-file`; `whereami` prints the worker's HOME); against the cage itself: `caps`
//! (holds any capability), `parent-environ` (reads the parent's /proc environ),
//! `sigqueue-parent`, `ioctl-tiocsti`, `vfork-chain` (65 vfork-style children alive at once),
//! `broker` (asks the broker socket named by CLOISTER_FAULT_FILE for workers). Point `read`
//! (clEnqueueReadBuffer) takes `late-no-event`: a non-blocking read with no wait list that asks
//! for an event returns success without one and completes 300 ms later. Point `create`
//! (clCreateBuffer) takes `fail-odd`: a buffer of an odd size fails with
//! `CL_MEM_OBJECT_ALLOCATION_FAILURE`, as a driver out of memory would. Point `enqueue` also
//! takes `refuse-odd`: an NDRange whose first global size is odd fails with
//! `CL_OUT_OF_RESOURCES`, as a driver short of resources would (a refusal no shape tells). Point `callback`
//! (clSetEventCallback) takes `late`: every event callback is called 3 s after the driver would
//! have called it, from a thread of its own (NVIDIA's driver calls them some microseconds after
//! a wait on the event returned; this makes that delay plain to see), and `refuse`: every
//! registration fails with `CL_OUT_OF_HOST_MEMORY`, as a driver out of memory would. Each attack prints
//! `faultcl: ATTACK succeeded` or `faultcl: ATTACK blocked (why)` on stderr and the call goes on.
//!
//! It intercepts by patching pocl's dispatch table in place (every pocl handle points at it), so
//! the wrapped driver behaves exactly like pocl everywhere else. `CLOISTER_FAULT_REAL` names the
//! library to wrap (default `libpocl.so.2`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use cloister_ipc::cl::*;
use cloister_ipc::dispatch::IcdDispatch;

type GetPlatforms = unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;

struct Real {
    get_platforms: GetPlatforms,
}

static REAL: OnceLock<Option<Real>> = OnceLock::new();
static ORIG: OnceLock<IcdDispatch> = OnceLock::new();

fn fault_for(point: &str) -> Option<String> {
    let spec = std::env::var("CLOISTER_FAULT").ok()?;
    spec.split(',').find_map(|item| {
        let (p, action) = item.split_once(':')?;
        (p == point).then(|| action.to_string())
    })
}

fn report(attack: &str, result: Result<(), String>) {
    match result {
        Ok(()) => eprintln!("faultcl: {attack} succeeded"),
        Err(why) => eprintln!("faultcl: {attack} blocked ({why})"),
    }
}

fn errno() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Does what CLOISTER_FAULT says for this point, if anything.
fn fault_point(point: &str) {
    let Some(spec) = fault_for(point) else { return };
    // `ACTION:once` fires in the first process only: a marker in $HOME (a caged worker's private
    // cache directory, kept across its restarts) says it already did.
    let (action, once) = match spec.split_once(':') {
        Some((a, "once")) => (a.to_string(), true),
        _ => (spec.clone(), false),
    };
    // CLOISTER_FAULT_SKIP=N lets the first N calls through (a crash in the middle of a run).
    static HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let skip: u64 = std::env::var("CLOISTER_FAULT_SKIP").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < skip {
        return;
    }
    if once {
        let marker = format!("{}/.faultcl-fired-{point}", std::env::var("HOME").unwrap_or_else(|_| "/tmp".into()));
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&marker).is_err() {
            return;
        }
    }
    // SAFETY (crash arms): deliberately faulting is the purpose of this library.
    unsafe {
        match action.as_str() {
            "segv" => std::ptr::write_volatile(16 as *mut u32, 1),
            "abort" => libc::abort(),
            // A real bus error: touching a mapping past the end of its (empty) file. (A raised
            // SIGBUS would be swallowed by Rust's stack-overflow handler.)
            "bus" => {
                let path = format!("{}/.faultcl-bus\0", std::env::var("HOME").unwrap_or_else(|_| "/tmp".into()));
                let fd = libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, 0o600);
                let p =
                    libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
                std::ptr::write_volatile(p as *mut u32, 1);
            }
            "exit" => libc::_exit(3),
            // Sleeping, as a driver stuck waiting on its device would.
            "hang" => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            "async-segv" => {
                std::thread::spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(150));
                    std::ptr::write_volatile(16 as *mut u32, 1);
                });
            }
            "closefds" => {
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0);
            }
            "exec" => report("exec", exec_shell()),
            "connect" => report("connect", connect_tcp()),
            "readhome" => report("readhome", read_home()),
            "writeout" => report("writeout", write_outside()),
            "kill-parent" => {
                report("kill-parent", if libc::kill(libc::getppid(), 0) == 0 { Ok(()) } else { Err(errno()) })
            }
            // PTRACE_SEIZE attaches without stopping the parent (PTRACE_ATTACH would leave it
            // stopped); the attachment ends when this process exits.
            "ptrace-parent" => report(
                "ptrace-parent",
                if libc::ptrace(libc::PTRACE_SEIZE, libc::getppid(), 0, 0) == 0 { Ok(()) } else { Err(errno()) },
            ),
            "fork50" => report("fork50", fork_many(50)),
            "fds100k" => report("fds100k", open_many(100_000)),
            "shrink-shm" => report("shrink-shm", shrink_shared_memory()),
            "tty" => report("tty", reach_terminal()),
            "spawn-sleeper" => report("spawn-sleeper", spawn_sleeper()),
            // Never exits once asked to: an exit handler that sleeps forever.
            "linger" => {
                extern "C" fn forever() {
                    loop {
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    }
                }
                libc::atexit(forever);
                eprintln!("faultcl: linger armed");
            }
            // Lies in the flight recorder (fd 4 in the worker): escape sequences in its text
            // fields, a hang and a trapped system call that never happened; then a real SIGSEGV.
            "forge-report" => {
                forge_recorder();
                std::ptr::write_volatile(16 as *mut u32, 1);
            }
            // Says where the worker's HOME (its cache) is, for the tests to check its owner.
            "whereami" => eprintln!("faultcl: home={}", std::env::var("HOME").unwrap_or_default()),
            // Rewrites every staged header of every application in this driver's cache.
            "poison-headers" => report("poison-headers", poison_headers()),
            // Replaces the cache's tmp (the worker's TMPDIR) with a file.
            "tmp-file" => report("tmp-file", tmp_to_file()),
            "caps" => report("caps", holds_capabilities()),
            "parent-environ" => report("parent-environ", read_parent_environ()),
            "sigqueue-parent" => report("sigqueue-parent", sigqueue_parent()),
            "ioctl-tiocsti" => report("ioctl-tiocsti", ioctl_tiocsti()),
            "vfork-chain" => report("vfork-chain", vfork_chain(VFORK_DEPTH)),
            "broker" => report("broker", ask_the_broker()),
            other => eprintln!("faultcl: unknown action {other}"),
        }
    }
}

/// Truncates every cloister memfd this process holds (the lanes and segments the application
/// shares, the broker's flight recorder): unsealed, the other side's next touch dies of SIGBUS.
fn shrink_shared_memory() -> Result<(), String> {
    let mut found = 0;
    let mut refused = Vec::new();
    for fd in 3..4096 {
        let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else { continue };
        if !target.to_string_lossy().starts_with("/memfd:cloister") {
            continue;
        }
        found += 1;
        // SAFETY: truncating an fd this process holds; the attack itself.
        if unsafe { libc::ftruncate(fd, 0) } != 0 {
            refused.push(errno());
        }
    }
    match (found, refused.len()) {
        (0, _) => Err("no cloister memfd found".into()),
        (n, r) if r < n => {
            eprintln!("faultcl: shrink-shm truncated {} of {n} memfds", n - r);
            Ok(())
        }
        (n, _) => Err(format!("all {n} truncations refused: {}", refused[0])),
    }
}

/// Looks for a terminal: stdin, stdout or stderr, or the controlling terminal. One the driver
/// holds lets it read what the user types (and, with TIOCSTI, type into their shell).
fn reach_terminal() -> Result<(), String> {
    let mut found = Vec::new();
    for fd in 0..=2 {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } == 1 {
            found.push(format!("fd {fd} is a terminal"));
        }
    }
    // SAFETY: opening a path with valid flags; the fd is closed below.
    let tty = unsafe { libc::open(c"/dev/tty".as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    let tty_err = errno();
    if tty >= 0 {
        found.push("/dev/tty opened".into());
    }
    // Injecting a character is the worst of it; a NUL harms nobody (refused by the kernel's
    // dev.tty.legacy_tiocsti=0 or without CAP_SYS_ADMIN: informational).
    for fd in [tty, 0, 1, 2] {
        // SAFETY: isatty/ioctl on a descriptor number with a pointer to a valid byte.
        if fd >= 0 && unsafe { libc::isatty(fd) } == 1 {
            let c = 0u8;
            let rc = unsafe { libc::ioctl(fd, libc::TIOCSTI, &c) };
            eprintln!("faultcl: tty TIOCSTI on fd {fd}: {}", if rc == 0 { "injected".into() } else { errno() });
            break;
        }
    }
    if tty >= 0 {
        // SAFETY: closing the fd we opened.
        unsafe { libc::close(tty) };
    }
    if found.is_empty() {
        Err(format!("no terminal on fds 0-2; /dev/tty: {tty_err}"))
    } else {
        eprintln!("faultcl: tty found: {}", found.join("; "));
        Ok(())
    }
}

/// Starts `sleep $CLOISTER_FAULT_FILE` the way a driver's helper would (posix_spawn: vfork and
/// exec, so no parent-death signal follows it) and leaves it running.
fn spawn_sleeper() -> Result<(), String> {
    let arg = std::env::var("CLOISTER_FAULT_FILE").map_err(|_| "CLOISTER_FAULT_FILE not set".to_string())?;
    let prog = c"/bin/sleep";
    let arg = std::ffi::CString::new(arg).map_err(|e| e.to_string())?;
    let argv = [prog.as_ptr() as *mut c_char, arg.as_ptr() as *mut c_char, std::ptr::null_mut()];
    let mut pid = 0;
    // SAFETY: file actions initialised before use and destroyed after; argv is NULL-terminated;
    // the environment is empty. The sleeper's stdio is /dev/null, so it holds no one's pipes.
    let rc = unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut actions);
        for fd in 0..=2 {
            libc::posix_spawn_file_actions_addopen(&mut actions, fd, c"/dev/null".as_ptr(), libc::O_RDWR, 0);
        }
        let env = [std::ptr::null_mut()];
        let rc = libc::posix_spawn(&mut pid, prog.as_ptr(), &actions, std::ptr::null(), argv.as_ptr(), env.as_ptr());
        libc::posix_spawn_file_actions_destroy(&mut actions);
        rc
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc).to_string())
    }
}

fn forge_recorder() {
    use cloister_ipc::recorder::{FlightRecorder, RECORDER_BYTES, RECORDER_FD};
    use std::os::fd::FromRawFd;
    // SAFETY: dup of the worker's recorder fd; the copy is ours to own.
    let fd = unsafe { libc::dup(RECORDER_FD) };
    if fd < 0 {
        eprintln!("faultcl: forge-report: no recorder: {}", errno());
        return;
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let Ok(region) = cloister_ipc::shm::SharedRegion::from_fd(fd, RECORDER_BYTES) else { return };
    let Ok(rec) = FlightRecorder::from_region(region) else { return };
    let h = rec.header();
    let lie = b"\x1b[2J\x1b[HPassword: \x07\r\x1b]0;pwned\x07";
    h.device.set(lie);
    h.program_source.set(lie);
    h.build_options.set(lie);
    h.hung_op.store(1, std::sync::atomic::Ordering::Release);
    h.trapped_syscall.store(libc::SYS_execve, std::sync::atomic::Ordering::Release);
    // The mapping stays: the broker reads it after we die.
    std::mem::forget(rec);
}

fn poison_headers() -> Result<(), String> {
    let base = std::env::temp_dir().join("cloister-includes");
    let mut stack = vec![base];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "h") {
                std::fs::write(&path, b"#define VAL 66\n").map_err(|e| e.to_string())?;
                n += 1;
            }
        }
    }
    if n == 0 {
        return Err("no staged header found".into());
    }
    Ok(())
}

fn tmp_to_file() -> Result<(), String> {
    let tmp = std::env::temp_dir();
    std::fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::write(&tmp, b"not a folder").map_err(|e| e.to_string())
}

/// Runs a shell, straight and through the dynamic loader (`ld.so /bin/sh`: execve of the
/// loader, which the cage must allow, and the loader maps the shell itself); succeeds if
/// either route ran it.
fn exec_shell() -> Result<(), String> {
    let run = |cmd: &mut std::process::Command| match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("ended with {s}")),
        Err(e) => Err(e.to_string()),
    };
    let straight = run(std::process::Command::new("/bin/sh").arg("-c").arg("exit 0"));
    let loader = ["/lib64/ld-linux-x86-64.so.2", "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"]
        .into_iter()
        .find(|l| std::path::Path::new(l).exists())
        .ok_or("no dynamic loader found".to_string())
        .and_then(|l| run(std::process::Command::new(l).arg("/bin/sh").arg("-c").arg("exit 0")));
    match (straight, loader) {
        (Ok(()), _) | (_, Ok(())) => Ok(()),
        (Err(a), Err(b)) => Err(format!("/bin/sh: {a}; ld.so /bin/sh: {b}")),
    }
}

/// Holds any capability, in any of the five sets.
fn holds_capabilities() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let sets: Vec<&str> = status.lines().filter(|l| l.starts_with("Cap")).collect();
    let held = sets.iter().any(|l| l.split_whitespace().nth(1).is_some_and(|v| !v.trim_start_matches('0').is_empty()));
    if held {
        Ok(())
    } else {
        Err(format!("none held: {}", sets.join(" ")))
    }
}

/// Reads the parent's environment (in the cage, the broker's: its secrets).
fn read_parent_environ() -> Result<(), String> {
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    std::fs::read(format!("/proc/{ppid}/environ")).map(|_| ()).map_err(|e| e.to_string())
}

/// Queues signal 0 (a probe: it proves delivery would work, harming nothing) to the parent.
fn sigqueue_parent() -> Result<(), String> {
    // si_code SI_QUEUE (-1), as sigqueue(3) sends: the kernel refuses codes >= 0 from users.
    let mut info = [0u8; 128];
    info[8..12].copy_from_slice(&(-1i32).to_ne_bytes());
    // SAFETY: rt_sigqueueinfo reads 128 bytes of siginfo from `info`; signal 0 only probes.
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigqueueinfo, libc::getppid(), 0, info.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Issues TIOCSTI (terminal input injection) on /dev/null: the kernel answers ENOTTY, so it
/// harms nothing, but reaching the kernel at all is what the cage must refuse.
fn ioctl_tiocsti() -> Result<(), String> {
    // SAFETY: opening /dev/null; the ioctl reads one byte from `c`.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return Err(format!("open /dev/null: {}", errno()));
        }
        let c = b'x';
        libc::ioctl(fd, libc::TIOCSTI, &c as *const u8);
        libc::close(fd);
    }
    Ok(())
}

/// How deep the vfork chain goes: far past any profile's process limit.
const VFORK_DEPTH: usize = 64;
/// The deepest link reached and the first error, written by the children (they share our
/// memory: CLONE_VM).
static CHAIN_DEPTH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static CHAIN_ERRNO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
const CHAIN_STACK: usize = 64 * 1024;

extern "C" fn chain_link(arg: *mut c_void) -> libc::c_int {
    let depth = arg as usize;
    CHAIN_DEPTH.fetch_max(depth, std::sync::atomic::Ordering::SeqCst);
    if depth < VFORK_DEPTH {
        chain_spawn(depth + 1);
    }
    0
}

/// Starts link `depth` as a vfork-style child (the parent waits, suspended, until it ends) on
/// its own preallocated stack.
fn chain_spawn(depth: usize) {
    static STACKS: OnceLock<usize> = OnceLock::new();
    let base = *STACKS.get_or_init(|| {
        // SAFETY: an anonymous mapping for every link's stack, made before the first clone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHAIN_STACK * (VFORK_DEPTH + 1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        p as usize
    });
    let top = (base + CHAIN_STACK * (depth + 1)) as *mut c_void;
    // SAFETY: libc::clone runs chain_link on the given (unused, mapped) stack; CLONE_VFORK
    // suspends us until it exits, so no two links use one stack.
    let pid = unsafe {
        libc::clone(chain_link, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, depth as *mut c_void)
    };
    if pid < 0 {
        let _ = CHAIN_ERRNO.compare_exchange(
            0,
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1),
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        );
        return;
    }
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
}

/// A chain of vfork-style children, each alive while the next one runs: `VFORK_DEPTH + 1`
/// processes at once at its deepest.
fn vfork_chain(n: usize) -> Result<(), String> {
    chain_spawn(1);
    let reached = CHAIN_DEPTH.load(std::sync::atomic::Ordering::SeqCst);
    if reached >= n {
        Ok(())
    } else {
        let e = std::io::Error::from_raw_os_error(CHAIN_ERRNO.load(std::sync::atomic::Ordering::SeqCst));
        Err(format!("{reached} of {n} links: {e}"))
    }
}

/// Connects to the broker socket named by CLOISTER_FAULT_FILE and asks it for workers, as a
/// shim would.
fn ask_the_broker() -> Result<(), String> {
    use cloister_ipc::{channel, BrokerReply, BrokerRequest};
    let path = std::env::var("CLOISTER_FAULT_FILE").map_err(|_| "CLOISTER_FAULT_FILE not set".to_string())?;
    let sock = channel::connect_seqpacket(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    channel::send(&sock, &BrokerRequest::Hello(cloister_ipc::handshake::Hello::new()), &[])
        .map_err(|e| e.to_string())?;
    match channel::recv::<BrokerReply>(&sock).map_err(|e| e.to_string())? {
        (BrokerReply::Workers { grants, .. }, _) => {
            eprintln!("faultcl: the broker granted {} workers", grants.len());
            Ok(())
        }
        (BrokerReply::Refused { reason }, _) => Err(format!("broker refused: {reason}")),
        _ => Err("unexpected reply".into()),
    }
}

fn connect_tcp() -> Result<(), String> {
    let port: u16 = std::env::var("CLOISTER_FAULT_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(9);
    // A refused connection still proves the network is reachable; only "unreachable" or a
    // permission error means it is blocked.
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn read_home() -> Result<(), String> {
    let path = std::env::var("CLOISTER_FAULT_FILE").map_err(|_| "CLOISTER_FAULT_FILE not set".to_string())?;
    std::fs::read(&path).map(|_| ()).map_err(|e| e.to_string())
}

fn write_outside() -> Result<(), String> {
    let path = std::env::var("CLOISTER_FAULT_FILE").map_err(|_| "CLOISTER_FAULT_FILE not set".to_string())?;
    std::fs::write(&path, b"written by faultcl\n").map_err(|e| e.to_string())
}

fn fork_many(n: usize) -> Result<(), String> {
    let mut pids = Vec::new();
    let mut result = Ok(());
    for _ in 0..n {
        // SAFETY: the child only calls _exit after a short sleep.
        match unsafe { libc::fork() } {
            0 => unsafe {
                libc::usleep(200_000);
                libc::_exit(0)
            },
            -1 => {
                result = Err(format!("fork {} of {n}: {}", pids.len() + 1, errno()));
                break;
            }
            pid => pids.push(pid),
        }
    }
    for pid in pids {
        // SAFETY: reaping our own children.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    result
}

fn open_many(n: usize) -> Result<(), String> {
    // Take all the hard limit allows, as an attacker would.
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    let mut fds = Vec::new();
    let mut result = Ok(());
    for _ in 0..n {
        // SAFETY: opening /dev/null read-only.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            result = Err(format!("open {} of {n}: {}", fds.len() + 1, errno()));
            break;
        }
        fds.push(fd);
    }
    for fd in fds {
        // SAFETY: closing fds we opened.
        unsafe { libc::close(fd) };
    }
    result
}

fn real() -> Option<&'static Real> {
    REAL.get_or_init(|| {
        let lib = std::env::var("CLOISTER_FAULT_REAL").unwrap_or_else(|_| "libpocl.so.2".into());
        let c = std::ffi::CString::new(lib.clone()).ok()?;
        // SAFETY: loading the wrapped driver.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            eprintln!("faultcl: cannot load {lib}");
            return None;
        }
        // SAFETY: symbol lookups on a valid handle.
        let gefa = unsafe { libc::dlsym(h, c"clGetExtensionFunctionAddress".as_ptr()) };
        if gefa.is_null() {
            return None;
        }
        type Gefa = unsafe extern "C" fn(*const c_char) -> *mut c_void;
        // SAFETY: the ICD extension lookup has this signature.
        let gefa: Gefa = unsafe { std::mem::transmute::<*mut c_void, Gefa>(gefa) };
        // SAFETY: valid C string.
        let f = unsafe { gefa(c"clIcdGetPlatformIDsKHR".as_ptr()) };
        if f.is_null() {
            return None;
        }
        // SAFETY: the ICD entry has this signature.
        let get_platforms: GetPlatforms = unsafe { std::mem::transmute::<*mut c_void, GetPlatforms>(f) };
        let mut p: cl_platform_id = std::ptr::null_mut();
        // SAFETY: one platform slot.
        if unsafe { get_platforms(1, &mut p, std::ptr::null_mut()) } != CL_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: an ICD platform handle starts with its dispatch table pointer.
        let table = unsafe { &mut **(p as *mut *mut IcdDispatch) };
        patch(table);
        Some(Real { get_platforms })
    })
    .as_ref()
}

/// Replaces the intercepted slots of the driver's (shared, static) dispatch table.
fn patch(table: &mut IcdDispatch) {
    // SAFETY: IcdDispatch is a plain array of pointers; a bitwise copy is a valid value.
    let _ = ORIG.set(unsafe { std::ptr::read(table) });
    let page = 4096usize;
    let start = (table as *mut IcdDispatch as usize) & !(page - 1);
    let end = table as *mut IcdDispatch as usize + std::mem::size_of::<IcdDispatch>();
    // SAFETY: making the pages holding the table writable; they are mapped (we just read them).
    unsafe { libc::mprotect(start as *mut c_void, end - start, libc::PROT_READ | libc::PROT_WRITE) };
    table.clCreateContext = Some(create_context);
    table.clBuildProgram = Some(build_program);
    table.clEnqueueNDRangeKernel = Some(enqueue_nd_range);
    table.clFinish = Some(finish);
    table.clEnqueueReadBuffer = Some(read_buffer);
    table.clCreateBuffer = Some(create_buffer);
    table.clSetEventCallback = Some(set_event_callback);
}

fn orig() -> &'static IcdDispatch {
    ORIG.get().expect("patched before any call")
}

unsafe extern "C" fn create_context(
    p: *const isize,
    n: cl_uint,
    d: *const cl_device_id,
    f: *mut c_void,
    u: *mut c_void,
    e: *mut cl_int,
) -> cl_context {
    fault_point("context");
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { orig().clCreateContext.expect("pocl has clCreateContext")(p, n, d, f, u, e) }
}

unsafe extern "C" fn build_program(
    p: cl_program,
    n: cl_uint,
    d: *const cl_device_id,
    o: *const c_char,
    f: *mut c_void,
    u: *mut c_void,
) -> cl_int {
    fault_point("build");
    // SAFETY: as above.
    unsafe { orig().clBuildProgram.expect("pocl has clBuildProgram")(p, n, d, o, f, u) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn enqueue_nd_range(
    q: cl_command_queue,
    k: cl_kernel,
    dim: cl_uint,
    off: *const usize,
    g: *const usize,
    l: *const usize,
    n: cl_uint,
    w: *const cl_event,
    e: *mut cl_event,
) -> cl_int {
    if fault_for("enqueue").as_deref() == Some("refuse-odd") {
        // SAFETY: a non-NULL global size holds `dim` values per the API contract, at least one.
        if !g.is_null() && dim >= 1 && unsafe { *g } % 2 == 1 {
            eprintln!("faultcl: enqueue refuse-odd");
            return CL_OUT_OF_RESOURCES;
        }
    } else {
        fault_point("enqueue");
    }
    // SAFETY: as above.
    unsafe { orig().clEnqueueNDRangeKernel.expect("pocl has clEnqueueNDRangeKernel")(q, k, dim, off, g, l, n, w, e) }
}

/// `read:late-no-event`: breaks the contract that a successful enqueue returns the event it was
/// asked for, and completes the read late, so a caller that trusts the call's success alone
/// reads the destination before the data is there.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn read_buffer(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    off: usize,
    size: usize,
    ptr: *mut c_void,
    n: cl_uint,
    w: *const cl_event,
    e: *mut cl_event,
) -> cl_int {
    let read = orig().clEnqueueReadBuffer.expect("pocl has clEnqueueReadBuffer");
    if fault_for("read").as_deref() != Some("late-no-event") || blocking != CL_FALSE || n != 0 || e.is_null() {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { read(q, b, blocking, off, size, ptr, n, w, e) };
    }
    // SAFETY: pocl's own entry points on the caller's live queue; the user event gates the read
    // and is completed (then released) by the thread below; the read's own event is released.
    unsafe {
        let mut ctx: cl_context = std::ptr::null_mut();
        let info = orig().clGetCommandQueueInfo.expect("pocl has clGetCommandQueueInfo");
        let rc =
            info(q, CL_QUEUE_CONTEXT, std::mem::size_of::<cl_context>(), (&raw mut ctx).cast(), std::ptr::null_mut());
        if rc != CL_SUCCESS {
            return rc;
        }
        let mut rc = CL_SUCCESS;
        let gate = orig().clCreateUserEvent.expect("pocl has clCreateUserEvent")(ctx, &mut rc);
        if rc != CL_SUCCESS {
            return rc;
        }
        let mut done: cl_event = std::ptr::null_mut();
        let rc = read(q, b, CL_FALSE, off, size, ptr, 1, &gate, &mut done);
        if rc == CL_SUCCESS {
            orig().clReleaseEvent.expect("pocl has clReleaseEvent")(done);
        }
        let gate = gate as usize;
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            orig().clSetUserEventStatus.expect("pocl has clSetUserEventStatus")(gate as cl_event, CL_COMPLETE);
            orig().clReleaseEvent.expect("pocl has clReleaseEvent")(gate as cl_event);
        });
        eprintln!("faultcl: read late-no-event ({size} bytes, rc {rc})");
        *e = std::ptr::null_mut();
        rc
    }
}

/// `create:fail-odd`: an allocation that fails, for buffers of odd sizes only (the client picks
/// which of its buffers the driver cannot make).
unsafe extern "C" fn create_buffer(
    c: cl_context,
    flags: cl_bitfield,
    size: usize,
    host: *mut c_void,
    err: *mut cl_int,
) -> cl_mem {
    if size % 2 == 1 && fault_for("create").as_deref() == Some("fail-odd") {
        eprintln!("faultcl: create fail-odd ({size} bytes)");
        if !err.is_null() {
            // SAFETY: the caller's errcode_ret, non-NULL.
            unsafe { *err = CL_MEM_OBJECT_ALLOCATION_FAILURE };
        }
        return std::ptr::null_mut();
    }
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { orig().clCreateBuffer.expect("pocl has clCreateBuffer")(c, flags, size, host, err) }
}

type EventNotify = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);

/// What a late callback calls, 3 s after the driver called it.
struct LateCallback {
    pfn: EventNotify,
    user_data: usize,
}

/// How much later than the driver `callback:late` calls a callback.
const CALLBACK_DELAY: std::time::Duration = std::time::Duration::from_secs(3);

/// The driver's callback under `callback:late`: the event is kept (retained) and the caller's
/// callback called from a thread of its own after `CALLBACK_DELAY`.
unsafe extern "C" fn late_callback(event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: `set_event_callback` passed a leaked Box<LateCallback>; the driver calls this once.
    let late = unsafe { Box::from_raw(user_data.cast::<LateCallback>()) };
    // SAFETY: a live event (its callback is running).
    unsafe { orig().clRetainEvent.expect("pocl has clRetainEvent")(event) };
    let event = event as usize;
    std::thread::spawn(move || {
        std::thread::sleep(CALLBACK_DELAY);
        // SAFETY: the caller's callback with its own user data; the event kept alive above.
        unsafe {
            (late.pfn)(event as cl_event, status, late.user_data as *mut c_void);
            orig().clReleaseEvent.expect("pocl has clReleaseEvent")(event as cl_event);
        }
    });
}

unsafe extern "C" fn set_event_callback(
    event: cl_event,
    callback_type: cl_int,
    pfn: *mut c_void,
    user_data: *mut c_void,
) -> cl_int {
    let set = orig().clSetEventCallback.expect("pocl has clSetEventCallback");
    let fault = fault_for("callback");
    if fault.as_deref() == Some("refuse") {
        return CL_OUT_OF_HOST_MEMORY;
    }
    if fault.as_deref() != Some("late") || pfn.is_null() {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { set(event, callback_type, pfn, user_data) };
    }
    // SAFETY: a non-NULL pfn_notify of clSetEventCallback has this signature.
    let pfn = unsafe { std::mem::transmute::<*mut c_void, EventNotify>(pfn) };
    let late = Box::into_raw(Box::new(LateCallback { pfn, user_data: user_data as usize }));
    // SAFETY: our trampoline has the callback's signature and takes back the box.
    let rc = unsafe { set(event, callback_type, late_callback as *mut c_void, late.cast()) };
    if rc != CL_SUCCESS {
        // SAFETY: the driver refused it, so the trampoline never runs: the box is still ours.
        drop(unsafe { Box::from_raw(late) });
    }
    rc
}

unsafe extern "C" fn finish(q: cl_command_queue) -> cl_int {
    fault_point("finish");
    // SAFETY: as above.
    unsafe { orig().clFinish.expect("pocl has clFinish")(q) }
}

#[no_mangle]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    n: cl_uint,
    platforms: *mut cl_platform_id,
    num: *mut cl_uint,
) -> cl_int {
    fault_point("init");
    match real() {
        // SAFETY: forwarding the caller's arguments.
        Some(r) => unsafe { (r.get_platforms)(n, platforms, num) },
        None => CL_PLATFORM_NOT_FOUND_KHR,
    }
}

#[no_mangle]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: NUL-terminated per the API.
    match unsafe { CStr::from_ptr(name) }.to_bytes() {
        b"clIcdGetPlatformIDsKHR" => clIcdGetPlatformIDsKHR as *mut c_void,
        // ocl-icd asks for this one too, to read the platform's ICD suffix.
        b"clGetPlatformInfo" => {
            real().and_then(|_| orig().clGetPlatformInfo).map_or(std::ptr::null_mut(), |f| f as *mut c_void)
        }
        _ => std::ptr::null_mut(),
    }
}
