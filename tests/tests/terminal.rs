//! Issue 11, class 5: a driver can neither reach the user's terminal nor outlive its
//! application. The worker holds pipes, never the application's stdio (the shim relays the
//! pipes' bytes to its fd 1 and 2 as they are when they arrive); a process the driver starts dies
//! with the worker (PID namespace); a per-user broker ends a client's workers when it goes.

use cloister_tests::*;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `cmd` with a new pseudo-terminal as its controlling terminal and stdin/stdout/stderr;
/// returns its success and everything written to the terminal.
fn in_pty(mut cmd: Command) -> (bool, String) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two fds; NULL name, termios and winsize are allowed.
    let rc =
        unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh fds we own.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave.try_clone().unwrap()).stderr(slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the terminal's slave.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn under a pty");
    drop(slave);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let _fd = master.as_raw_fd();
    std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        // Ends with EIO once no process holds the terminal any more.
        while let Ok(n @ 1..) = f.read(&mut buf) {
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let ok = child.wait().unwrap().success();
    std::thread::sleep(Duration::from_millis(500));
    let out = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    (ok, out)
}

fn faulty(action: &str) -> (std::path::PathBuf, String) {
    (fault_driver(), format!("enqueue:{action}"))
}

#[test]
fn a_caged_driver_cannot_reach_the_terminal() {
    let exe = c_client("survivor");
    let (driver, fault) = faulty("tty");
    let vendors = vendors_dir_for(&driver);
    let mut direct = Command::new(&exe);
    direct.env("CLOISTER_FAULT", &fault).env("OCL_ICD_VENDORS", &vendors).env_remove("CLOISTER_SOCKET");
    let (_, d) = in_pty(direct);
    assert!(d.contains("faultcl: tty succeeded"), "directly, the driver should find the terminal:\n{d}");
    let mut caged = Command::new(cloister());
    caged
        .args(["run", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--"])
        .arg(&exe)
        .env("CLOISTER_FAULT", &fault);
    let (ok, c) = in_pty(caged);
    assert!(!c.contains("faultcl: tty succeeded"), "caged, the driver reached the terminal:\n{c}");
    assert!(c.contains("faultcl: tty blocked (no terminal"), "caged, the attempt should be reported blocked:\n{c}");
    assert!(ok && c.contains("completed without fault"), "{c}");
}

/// Processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// Waits (at most `limit`) for every process matching `needle` to be gone; kills what is left
/// (so a failing run leaves nothing behind) and returns how many there were.
fn gone_within(needle: &str, limit: Duration) -> usize {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if processes_with(needle).is_empty() {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = processes_with(needle);
    for &pid in &left {
        // SAFETY: killing a test leftover by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    left.len()
}

#[test]
fn a_process_the_driver_starts_dies_with_the_application() {
    let exe = c_client("survivor");
    let (driver, fault) = faulty("spawn-sleeper");
    let vendors = vendors_dir_for(&driver);
    // A unique duration names the sleeper.
    let seconds = format!("3600.{}", std::process::id());
    let needle = format!("/bin/sleep {seconds}");
    let d = direct(
        &exe,
        &[],
        &[
            ("CLOISTER_FAULT", &fault),
            ("OCL_ICD_VENDORS", vendors.to_str().unwrap()),
            ("CLOISTER_FAULT_FILE", &seconds),
        ],
    );
    assert!(text(&d).contains("faultcl: spawn-sleeper succeeded"), "{}", text(&d));
    // One per enqueue.
    assert!(gone_within(&needle, Duration::from_secs(1)) >= 1, "directly, the sleepers outlive the application");
    // Unconfined (--no-sandbox), so the driver can start processes at all: the PID namespace
    // still holds them.
    let c = caged(
        &["--driver", driver.to_str().unwrap(), "--no-sandbox"],
        &exe,
        &[],
        &[("CLOISTER_FAULT", &fault), ("CLOISTER_FAULT_FILE", &seconds)],
    );
    let t = text(&c);
    assert!(t.contains("faultcl: spawn-sleeper succeeded") && t.contains("completed without fault"), "{t}");
    assert_eq!(gone_within(&needle, Duration::from_secs(5)), 0, "the driver's sleeper outlived the application:\n{t}");
}

#[test]
fn a_per_user_broker_ends_the_workers_of_a_client_that_exited() {
    let exe = c_client("survivor");
    let (driver, fault) = faulty("linger");
    let dir = std::env::temp_dir().join(format!("cloister-linger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("broker.sock");
    let cache = dir.join("cache");
    let mut broker = Command::new(cloister())
        .args(["broker", "--socket"])
        .arg(&socket)
        .args(["--driver", driver.to_str().unwrap(), "--profile", "pocl"])
        .env("CLOISTER_FAULT", &fault)
        .env("XDG_CACHE_HOME", &cache)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start cloister broker");
    wait_for_path(&socket, std::time::Duration::from_millis(5000));
    ensure_built();
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    // Output to a file, not a pipe: a worker that held the application's stdio (as before
    // issue 11) would keep a pipe open, and the test would wait for it forever.
    let log = dir.join("client.log");
    let started = Instant::now();
    let status = Command::new(&exe)
        .env("OCL_ICD_VENDORS", &vendors)
        .env("CLOISTER_SOCKET", &socket)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .status()
        .unwrap();
    let t = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success() && t.contains("faultcl: linger armed") && t.contains("completed without fault"), "{t}");
    eprintln!("client ran {:?}", started.elapsed());
    // The worker's command line names its cache, inside our unique folder.
    let needle = cache.to_string_lossy().into_owned();
    let left = gone_within(&needle, Duration::from_secs(5));
    let _ = broker.kill();
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(left, 0, "the worker outlived its client under a per-user broker");
}

#[test]
fn kernel_printf_follows_the_applications_stdout() {
    let exe = c_client("printf_redirect");
    let file = |tag: &str| std::env::temp_dir().join(format!("cloister-printf-{tag}-{}", std::process::id()));
    let (df, cf) = (file("direct"), file("caged"));
    let d = direct(&exe, &[df.to_str().unwrap()], &[]);
    let c = caged(&[], &exe, &[cf.to_str().unwrap()], &[]);
    let (dt, ct) = (text(&d), text(&c));
    let (dfile, cfile) =
        (std::fs::read_to_string(&df).unwrap_or_default(), std::fs::read_to_string(&cf).unwrap_or_default());
    let _ = (std::fs::remove_file(&df), std::fs::remove_file(&cf));
    assert!(dt.contains("PRINTF IN FILE") && dfile.contains("kernel says 42"), "directly:\n{dt}");
    assert!(ct.contains("PRINTF IN FILE") && cfile.contains("kernel says 42"), "caged:\n{ct}\nfile: {cfile:?}");
    assert!(!c.stdout.windows(14).any(|w| w == b"kernel says 42"), "caged, the output also went to the old stdout");
}
