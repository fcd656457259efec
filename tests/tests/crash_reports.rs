//! Crash reports as a user reads and manages them: who crashed (the application and its command
//! line), when (a date, not Unix seconds), with which cloister and driver; `cloister crashes
//! clear`; pruning; a corrupt file named as such; and a full disk that leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cloister_tests::*;

fn state_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cloister-test-reports-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The survivor client with its driver crashing in its first enqueue, reports under `state`.
fn crash_once(state: &Path, extra_env: &[(&str, &str)]) -> Output {
    let exe = c_client("survivor");
    // Report mode: one death, one report (replay would run the crashing kernel again).
    let mut env = vec![
        ("CLOISTER_FAULT", "enqueue:segv"),
        ("CLOISTER_RECOVERY", "report"),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
    ];
    env.extend_from_slice(extra_env);
    let c = caged_on_faultcl(&exe, &["--marker-arg"], &env);
    assert!(c.status.success(), "{}", text(&c));
    c
}

fn crashes(state: &Path, args: &[&str]) -> Output {
    Command::new(cloister())
        .arg("crashes")
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .expect("cannot run cloister crashes")
}

fn reports_in(state: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(state.join("cloister/crashes")) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_report_says_who_when_and_with_what() {
    let state = state_dir("who");
    crash_once(&state, &[]);
    let show = crashes(&state, &["show", "latest"]);
    let t = text(&show);
    assert!(show.status.success(), "{t}");
    assert!(t.contains("application: survivor (pid "), "the application's name: {t}");
    assert!(t.contains("command:") && t.contains("survivor --marker-arg"), "its command line: {t}");
    assert!(t.contains(" UTC ("), "a human date: {t}");
    assert!(t.contains(&format!("cloister:  {}", env!("CARGO_PKG_VERSION"))), "cloister's version: {t}");
    assert!(t.contains("(driver "), "the driver's version, as the worker said it: {t}");
    let list = crashes(&state, &[]);
    assert!(text(&list).contains("survivor"), "the listing names the application: {}", text(&list));
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn clear_removes_reports_and_corrupt_ones_are_named() {
    let state = state_dir("clear");
    crash_once(&state, &[]);
    let dir = state.join("cloister/crashes");
    std::fs::write(dir.join("123-4.json"), "{\"time\": ").unwrap();
    let show = crashes(&state, &["show", "123-4"]);
    assert_eq!(show.status.code(), Some(125), "{}", text(&show));
    assert!(text(&show).contains("crash report 123-4") && text(&show).contains("is corrupt"), "{}", text(&show));
    let list = crashes(&state, &[]);
    assert!(text(&list).contains("corrupt:") && text(&list).contains("1 unreadable files"), "{}", text(&list));
    let older = crashes(&state, &["clear", "--older-than", "1"]);
    assert!(text(&older).contains("removed 0 files"), "a fresh report is not a day old: {}", text(&older));
    assert_eq!(reports_in(&state).len(), 2);
    let clear = crashes(&state, &["clear"]);
    assert!(clear.status.success() && text(&clear).contains("removed 2 files"), "{}", text(&clear));
    assert!(reports_in(&state).is_empty());
    assert!(text(&crashes(&state, &[])).contains("no crash reports"));
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn old_reports_are_pruned_when_a_new_one_is_written() {
    let state = state_dir("prune");
    let dir = state.join("cloister/crashes");
    crash_once(&state, &[]);
    // Make the first report a year old, as if written then.
    let first = reports_in(&state).pop().unwrap();
    let json = std::fs::read_to_string(&first).unwrap();
    let year_ago = now_secs() - 365 * 86_400;
    let aged = with_time(&json, year_ago);
    std::fs::write(dir.join(format!("{year_ago}-1.json")), aged).unwrap();
    std::fs::remove_file(&first).unwrap();
    crash_once(&state, &[("CLOISTER_CRASH_KEEP_DAYS", "30")]);
    let left = reports_in(&state);
    assert_eq!(left.len(), 1, "the year-old report went: {left:?}");
    assert!(!left[0].ends_with(format!("{year_ago}-1.json")));
    // Keep only the newest one by count.
    crash_once(&state, &[("CLOISTER_CRASH_KEEP", "1")]);
    assert_eq!(reports_in(&state).len(), 1);
    let _ = std::fs::remove_dir_all(&state);
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// `json` with its top-level `"time"` replaced.
fn with_time(json: &str, time: u64) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["time"] = time.into();
    serde_json::to_string_pretty(&v).unwrap()
}

#[test]
fn a_full_disk_leaves_no_half_written_report() {
    // A 64 KiB file system, filled, in a mount namespace of our own (root, as CI runs).
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to mount a small file system");
        return;
    }
    let state = state_dir("full");
    std::fs::create_dir_all(&state).unwrap();
    let exe = c_client("survivor");
    let driver = fault_driver();
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs '{s}' && mkdir -p '{s}/cloister/crashes' && \
         (dd if=/dev/zero of='{s}/filler' bs=4k 2>/dev/null; true) && \
         CLOISTER_FAULT=enqueue:segv CLOISTER_RECOVERY=report XDG_STATE_HOME='{s}' '{c}' run --driver '{d}' --profile pocl -- '{e}'; \
         echo exit=$?; ls -a '{s}/cloister/crashes'",
        s = state.display(),
        c = cloister().display(),
        d = driver.display(),
        e = exe.display()
    );
    let out = Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]).output();
    let out = out.expect("cannot run unshare");
    let t = text(&out);
    assert!(t.contains("exit=0"), "the application survives: {t}");
    assert!(t.contains("the report could not be written"), "said once, clearly: {t}");
    assert_eq!(t.matches("the report could not be written").count(), 1, "{t}");
    assert!(!t.contains(".json.tmp"), "no half-written file: {t}");
    let _ = std::fs::remove_dir_all(&state);
}
