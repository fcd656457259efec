//! Issue 11, classes 1 and 3: a scripted hostile worker (tests/src/bin/hostile_worker.rs)
//! answers every call well-formed and lies in one field; tests/c/hostile_replies.c guards each
//! buffer it hands over with canary bytes. The worker never decides how many bytes land in the
//! application's memory: each lie is a worker fault (`CL_DEVICE_NOT_AVAILABLE`) or refused,
//! the canaries stay intact and the application lives. No callback runs after the application
//! released its object.

use cloister_tests::*;
use std::time::{Duration, Instant};

/// Runs the client in `mode` against the worker scripted with `worker_mode`, with a hard limit
/// (the application is killed past it, so a hang fails the test instead of stalling it).
fn run(worker_mode: &str, mode: &str) -> String {
    run_in(worker_mode, mode, "report")
}

/// As `run`, with `CLOISTER_RECOVERY=recovery`. The lies are checked in report mode, where a
/// fault ends the worker's objects; in replay mode (the default) the replacement would then
/// answer the application's call again.
fn run_in(worker_mode: &str, mode: &str, recovery: &str) -> String {
    let exe = c_client("hostile_replies");
    let worker = env!("CARGO_BIN_EXE_cloister-hostile-worker");
    let fault = format!("hostile:{worker_mode}");
    let started = Instant::now();
    let exe = exe.to_string_lossy();
    let out = caged(
        &[],
        std::path::Path::new("/usr/bin/timeout"),
        &["-s", "KILL", "60", &exe, mode],
        &[
            ("CLOISTER_WORKER", worker),
            ("CLOISTER_FAULT", &fault),
            ("CLOISTER_QUIET", "1"),
            ("CLOISTER_RECOVERY", recovery),
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{mode}: the application failed or died ({:?}):\n{t}", out.status);
    assert!(t.contains("survived"), "{mode}: the application did not finish:\n{t}");
    assert!(!t.contains("FAILED"), "{mode}:\n{t}");
    assert!(started.elapsed() < Duration::from_secs(30), "{mode}: took {:?}:\n{t}", started.elapsed());
    t
}

#[test]
fn binary_longer_than_its_announced_size_is_a_fault() {
    run("long-binary", "long-binary");
}

#[test]
fn huge_kernel_argument_count_is_a_fault() {
    run("huge-num-args", "huge-num-args");
}

#[test]
fn mapped_image_pitch_comes_from_the_shim() {
    run("wide-pitch", "wide-pitch");
}

#[test]
fn use_host_ptr_copies_stay_within_the_buffer() {
    run("accept-all", "use-host-ptr");
}

#[test]
fn zero_copy_addresses_come_from_the_shim() {
    let t = run("zero-copy", "zero-copy");
    assert!(t.contains("ok map\n") && t.contains("ok sub-buffer\n"), "{t}");
}

#[test]
fn a_short_status_answer_is_a_fault() {
    let t = run("few-statuses", "few-statuses");
    assert!(t.contains("ok nothing was copied into the application's memory"), "{t}");
}

/// The kernel's required work-group size, which the shim asks for before posting NDRanges with
/// no local size, answered with zero and 2^64 - 1 work-items: it only sorts NDRanges into
/// launch shapes, divides nothing by zero, and every NDRange returns the worker's answer.
#[test]
fn a_required_work_group_size_of_zero_or_huge_only_sorts_launches() {
    let t = run("group-size", "group-size");
    assert!(t.contains("ok every NDRange returned the worker's answer"), "{t}");
}

#[test]
fn huge_welcome_is_refused() {
    run("huge-welcome", "huge-welcome");
}

#[test]
fn released_context_callback_never_runs() {
    let t = run("die-on-finish", "context-callback");
    assert!(t.contains("ok the released context's callback did not run"), "{t}");
}

/// Replay mode rebuilds a released context (objects made from it may live on) but never tells
/// it of the carry-over: its `pfn_notify`'s user data is freed.
#[test]
fn released_context_callback_never_runs_in_replay_mode() {
    let t = run_in("die-on-finish", "context-callback", "replay");
    assert!(t.contains("ok the released context's callback did not run"), "{t}");
}
