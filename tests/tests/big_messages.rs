//! Messages of any size cross the cage, both ways (issue 16, items 1 and 2).

use cloister_tests::*;
use std::time::{Duration, Instant};

/// A 100 MB source built and read back, and a pocl binary over 4 MiB read back, created again
/// and run: directly and caged alike.
#[test]
fn a_100_mb_source_and_a_binary_over_4_mib_cross_both_ways() {
    let exe = c_client("big_messages");
    let d = direct(&exe, &["100"], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    assert!(text(&d).contains("binary of more than 4 MiB"), "{}", text(&d));
    let c = caged(&[], &exe, &["100"], &[]);
    assert!(c.status.success(), "caged run failed:\n{}", text(&c));
    assert_eq!(String::from_utf8_lossy(&d.stdout), String::from_utf8_lossy(&c.stdout));
}

/// A worker lane that cannot post its reply (here: a reply over the limit the worker may hold)
/// is a fault at once: the application gets CL_DEVICE_NOT_AVAILABLE without waiting out the
/// call's deadline, and the crash report names the cause and the call.
#[test]
fn a_lane_that_cannot_post_its_reply_is_a_fault_at_once() {
    let exe = c_client("big_messages");
    let state = std::env::temp_dir().join(format!("cloister-cannot-reply-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let started = Instant::now();
    // A 20 MB source read back with a limit of 8 MB; deadlines long enough that waiting one
    // out would fail the test.
    let c = caged(
        &[],
        &exe,
        &["20", "1000"],
        &[
            ("CLOISTER_MAX_REPLY_MB", "8"),
            ("CLOISTER_RECOVERY", "report"),
            ("CLOISTER_DEADLINE_INFO_MS", "600000"),
            ("XDG_STATE_HOME", state.to_str().unwrap()),
        ],
    );
    let elapsed = started.elapsed();
    let out = text(&c);
    assert!(out.contains("FAIL ") && out.contains(": -2\n"), "{out}");
    assert!(elapsed < Duration::from_secs(300), "took {elapsed:?}:\n{out}");
    let dir = state.join("cloister/crashes");
    let reports: Vec<_> = std::fs::read_dir(&dir).expect("a crash report").map(|e| e.unwrap().path()).collect();
    // One: the replacement, started as the application exits, meets a client that left.
    assert_eq!(reports.len(), 1, "{reports:?}\n{out}");
    let report = &reports[0];
    let report = std::fs::read_to_string(report).unwrap();
    assert!(report.contains("\"exit\"") || report.contains("Exit"), "{report}");
    assert!(report.contains("70") && report.contains("GetInfo"), "{report}");
    let _ = std::fs::remove_dir_all(&state);
}
