//! A fatal signal sent to the worker from outside ends it at once and is reported as such
//! (issue 16, item 7); the old context's calls then answer CL_DEVICE_NOT_AVAILABLE, even with
//! the device handle rebound to the replacement (item 10), and a new context works.

use cloister_tests::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The parent pid of `pid`, from /proc.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The process under `root` that hosts the driver (the worker proper, inside its PID
/// namespace's init, itself under the process the broker started).
fn driver_host_under(root: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let mut up = pid;
        let descends = std::iter::from_fn(|| {
            up = parent(up)?;
            Some(up)
        })
        .take(16)
        .any(|p| p == root);
        (descends && maps.contains("libpocl")).then_some(pid)
    })
}

#[test]
fn one_outside_sigsegv_ends_the_worker_and_the_old_context_reads_unavailable() {
    let exe = c_client("outside_signal");
    let state = std::env::temp_dir().join(format!("cloister-outside-signal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(&exe)
        .env("XDG_STATE_HOME", &state)
        // Report mode: the old context reads unavailable (replay would carry it over).
        .env("CLOISTER_RECOVERY", "report")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let worker = driver_host_under(child.id() as i32).expect("the worker hosting pocl");
    // SAFETY: one signal to the worker process found above.
    assert_eq!(unsafe { libc::kill(worker, libc::SIGSEGV) }, 0);
    let end = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{worker}")).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dead = !std::path::Path::new(&format!("/proc/{worker}")).exists();
    if !dead {
        // SAFETY: ending the test's own leftover worker.
        unsafe { libc::kill(worker, libc::SIGKILL) };
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    let out = format!("{rest}{err}");
    assert!(dead, "one SIGSEGV from outside did not end the worker:\n{out}");
    assert!(status.success(), "{out}");
    for call in ["finish on the old queue", "old context, queue on the device", "old context, buffer"] {
        assert!(out.contains(&format!("{call}: -2\n")), "{call}:\n{out}");
    }
    assert!(out.contains("new context: results correct"), "{out}");
    assert!(out.contains("killed by signal 11 (SIGSEGV) (sent from outside the worker"), "{out}");
    let dir = state.join("cloister/crashes");
    let report = std::fs::read_dir(&dir).expect("a report").next().expect("one report").unwrap().path();
    let report = std::fs::read_to_string(report).unwrap();
    assert!(report.contains("signal_from_outside") && report.contains("\"signal\": 11"), "{report}");
    let _ = std::fs::remove_dir_all(&state);
}
