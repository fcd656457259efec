//! Issue 11, class 4: every wait on the worker has a deadline. A driver that hangs while the
//! worker starts (before its welcome) no longer blocks the application's clGetPlatformIDs: the
//! watchdog kills the worker at the deadline of `Initialize` and writes the report.

use cloister_tests::*;
use std::time::{Duration, Instant};

#[test]
fn a_driver_hanging_in_init_does_not_hang_the_application() {
    let exe = c_client("survivor");
    let driver = fault_driver();
    let state = std::env::temp_dir().join(format!("cloister-deadlines-state-{}", std::process::id()));
    let mut cmd = std::process::Command::new(cloister());
    // Without the start-up check, which would stop the run before the application (below).
    cmd.args(["run", "--no-check", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--"])
        .arg(&exe)
        .env("CLOISTER_FAULT", "init:hang")
        .env("CLOISTER_DEADLINE_OTHER_MS", "1500")
        .env("XDG_STATE_HOME", &state);
    let (c, took) = output_within(cmd, Duration::from_secs(60));
    let t = text(&c);
    // Killed at 1.5 s, and not retried (a start that hangs would hang again): far under the
    // 90 s it hung before (for ever, in fact).
    assert!(took < Duration::from_secs(15), "clGetPlatformIDs took {took:?}:\n{t}");
    assert!(t.contains("Initialize"), "the report should name the worker's start as the hung call:\n{t}");
    let reports = std::fs::read_dir(state.join("cloister/crashes")).map(|d| d.count()).unwrap_or(0);
    assert!(reports > 0, "no crash report was written:\n{t}");
    // The application saw no platform and went on (survivor reports its error and exits).
    assert!(t.contains("ERROR step="), "{t}");
    let _ = std::fs::remove_dir_all(&state);
}

/// With the start-up check, the same hang stops `cloister run` before the application starts:
/// the check's worker is killed at the deadline too, reported, and the run says why, once.
#[test]
fn a_driver_hanging_in_init_stops_the_run_before_the_application() {
    let driver = fault_driver();
    let state = std::env::temp_dir().join(format!("cloister-deadlines-check-{}", std::process::id()));
    let marker = state.join("app-ran");
    let mut cmd = std::process::Command::new(cloister());
    cmd.args(["run", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--", "sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .env("CLOISTER_FAULT", "init:hang")
        .env("CLOISTER_DEADLINE_OTHER_MS", "1500")
        .env("XDG_STATE_HOME", &state);
    let (c, took) = output_within(cmd, Duration::from_secs(60));
    let t = text(&c);
    assert!(took < Duration::from_secs(15), "the check took {took:?}:\n{t}");
    assert_eq!(c.status.code(), Some(125), "{t}");
    assert!(t.contains("cannot be used") && t.contains("Initialize"), "{t}");
    assert!(!marker.exists(), "the application ran");
    let reports = std::fs::read_dir(state.join("cloister/crashes")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(reports, 1, "a hang is a driver fault, reported once:\n{t}");
    let _ = std::fs::remove_dir_all(&state);
}

/// Runs `cmd` in its own process group; kills the group if it runs past `limit` (a hang must
/// fail the test, not block it).
fn output_within(mut cmd: std::process::Command, limit: Duration) -> (std::process::Output, Duration) {
    use std::os::unix::process::CommandExt;
    let started = Instant::now();
    let child = cmd
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run cloister");
    let pgid = child.id() as i32;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        if done_rx.recv_timeout(limit).is_err() {
            // SAFETY: signalling the process group this test started.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("wait for cloister");
    let _ = done_tx.send(());
    let _ = killer.join();
    (out, started.elapsed())
}
