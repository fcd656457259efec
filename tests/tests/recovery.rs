//! Recovery in report mode (`CLOISTER_RECOVERY=report`, set explicitly: replay is the
//! default): after a driver fault the application recreates its context on the same device
//! handle and finishes its work correctly; restarts leak nothing; a crash-looping driver stops
//! being restarted and its device reads unavailable.

use cloister_tests::*;

fn recover(fault: &str, attempts: &str, extra: &[(&str, &str)]) -> (bool, String) {
    let exe = c_client("recover");
    // A fresh cache directory per run, so `:once` faults fire once per test.
    let tag = format!("{}-{attempts}", fault.replace(':', "-"));
    let cache = std::env::temp_dir().join(format!("cloister-recover-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut env =
        vec![("CLOISTER_RECOVERY", "report"), ("CLOISTER_FAULT", fault), ("XDG_CACHE_HOME", cache.to_str().unwrap())];
    env.extend_from_slice(extra);
    let out = caged_on_faultcl(&exe, &[attempts], &env);
    let _ = std::fs::remove_dir_all(&cache);
    (out.status.success(), text(&out))
}

fn assert_recovers(fault: &str) {
    let (ok, t) = recover(fault, "5", &[]);
    assert!(ok, "{fault}: {t}");
    assert!(t.contains("attempt 1: CL_DEVICE_NOT_AVAILABLE"), "{fault}: the first attempt should meet the fault:\n{t}");
    assert!(t.contains("attempt 2 succeeded after 1 faults; results correct"), "{fault}:\n{t}");
    // The context's pfn_notify heard the cause and where the report is, with its user_data.
    let told = t
        .lines()
        .find(|l| l.starts_with("context notified (recover)"))
        .unwrap_or_else(|| panic!("{fault}: no context notification:\n{t}"));
    assert!(
        told.contains("died") && told.contains("report: /") && told.contains("create a new context"),
        "{fault}: {told}"
    );
}

#[test]
fn recovers_from_a_crash_in_context_creation() {
    assert_recovers("context:segv:once");
}

#[test]
fn recovers_from_an_abort_in_build() {
    assert_recovers("build:abort:once");
}

#[test]
fn recovers_from_sigbus_in_enqueue() {
    assert_recovers("enqueue:bus:once");
}

#[test]
fn recovers_from_exit_in_enqueue() {
    assert_recovers("enqueue:exit:once");
}

#[test]
fn recovers_from_a_crash_in_finish() {
    assert_recovers("finish:segv:once");
}

#[test]
fn recovers_from_an_asynchronous_crash() {
    assert_recovers("enqueue:async-segv:once");
}

#[test]
fn a_crash_during_platform_init_is_retried_unseen() {
    // The first worker dies while the driver enumerates; the shim starts another before the
    // application's first call returns, so the application sees its platform as usual.
    let (ok, t) = recover("init:segv:once", "5", &[]);
    assert!(ok && t.contains("attempt 1 succeeded after 0 faults; results correct"), "{t}");
    assert!(t.contains("starting another worker"), "{t}");
}

#[test]
fn recovers_from_a_hang_in_build() {
    // The deadline must also let the replacement's real build finish: a pocl compile from a cold
    // cache took over a second on a loaded 2-core machine, which a 1 s deadline called a hang.
    let (ok, t) = recover("build:hang:once", "5", &[("CLOISTER_DEADLINE_BUILD_MS", "6000")]);
    assert!(
        ok && t.contains("hung in BuildProgram") && t.contains("attempt 2 succeeded after 1 faults; results correct"),
        "{t}"
    );
}

#[test]
fn fifty_restarts_in_a_row_leak_nothing() {
    let (_, t) = recover("enqueue:segv", "50", &[("CLOISTER_CRASH_LOOP", "1000/60")]);
    assert!(t.contains("gave up after 50 faults"), "{t}");
    assert_eq!(t.matches("device available now: yes").count(), 50, "every restart should bring the device back:\n{t}");
    let line = t.lines().find(|l| l.starts_with("fds: ")).expect("fd counts");
    let counts: Vec<i64> = line[5..].split(" then ").map(|n| n.trim().parse().unwrap()).collect();
    assert_eq!(counts[0], counts[1], "fds leaked across 49 restarts: {line}");
}

#[test]
fn a_crash_loop_stops_the_restarts() {
    let (_, t) = recover("enqueue:segv", "6", &[("CLOISTER_CRASH_LOOP", "3/60")]);
    assert!(t.contains("crashed 3 times within 60 s: not restarting it"), "{t}");
    assert_eq!(t.matches("not restarting it").count(), 1, "the application is told once:\n{t}");
    assert!(t.contains("attempt 6: CL_DEVICE_NOT_AVAILABLE; device available now: no"), "{t}");
    assert!(t.contains("gave up after 6 faults"), "{t}");
}
