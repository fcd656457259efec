//! A hostile worker (tests/src/bin/hostile_worker.rs) answers with garbage, truncated,
//! oversized, scribbled, wrongly typed or doubled replies, dies mid-call, or never answers. Each
//! is a fault like a crash: the application gets an error and goes on; neither it nor the broker
//! (`cloister run`, whose exit status is the application's) crashes or hangs.

use cloister_tests::*;
use std::time::{Duration, Instant};

fn hostile(mode: &str) {
    let exe = c_client("survivor");
    let worker = env!("CARGO_BIN_EXE_cloister-hostile-worker");
    let fault = format!("hostile:{mode}");
    let started = Instant::now();
    let out = caged(
        &[],
        &exe,
        &[],
        &[
            ("CLOISTER_WORKER", worker),
            ("CLOISTER_FAULT", &fault),
            ("CLOISTER_DEADLINE_INFO_MS", "1500"),
            ("CLOISTER_QUIET", "1"),
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{mode}: the application or cloister did not survive ({:?}):\n{t}", out.status);
    assert!(t.contains("still running after the driver fault"), "{mode}: the application should see an error:\n{t}");
    assert!(started.elapsed() < Duration::from_secs(25), "{mode}: took {:?}", started.elapsed());
}

#[test]
fn garbage_reply() {
    hostile("garbage");
}

#[test]
fn truncated_reply() {
    hostile("truncated");
}

#[test]
fn oversized_reply_length() {
    hostile("oversized");
}

#[test]
fn scribbled_lane_header() {
    hostile("scribble");
}

#[test]
fn reply_of_another_call() {
    hostile("wrong-type");
}

#[test]
fn two_replies_to_one_request() {
    hostile("twice");
}

#[test]
fn worker_exits_mid_call() {
    hostile("exit");
}

#[test]
fn worker_never_answers() {
    hostile("silent");
}
