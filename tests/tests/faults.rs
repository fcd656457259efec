//! A driver that crashes kills the application when used directly, and only its worker when
//! caged. These tests are of report mode (`CLOISTER_RECOVERY=report`, set explicitly: replay is
//! the default): the application sees CL_DEVICE_NOT_AVAILABLE and keeps running.

use cloister_tests::*;

/// Report mode: a worker's death costs the application its objects.
const REPORT: (&str, &str) = ("CLOISTER_RECOVERY", "report");

fn run_fault(fault: &str) -> (std::process::Output, std::process::Output) {
    run_fault_with(fault, &[])
}

/// As `run_fault`, with more environment for the caged run (`CLOISTER_SYNC`).
fn run_fault_with(fault: &str, env: &[(&str, &str)]) -> (std::process::Output, std::process::Output) {
    let exe = c_client("survivor");
    let driver = fault_driver();
    let vendors = vendors_dir_for(&driver);
    let direct_env = [("CLOISTER_FAULT", fault), ("OCL_ICD_VENDORS", vendors.to_str().unwrap())];
    let d = direct(&exe, &[], &direct_env);
    // The test driver wraps pocl, so it runs under the pocl profile.
    let caged_env: Vec<(&str, &str)> =
        [("CLOISTER_FAULT", fault), REPORT].into_iter().chain(env.iter().copied()).collect();
    let c = caged_on_faultcl(&exe, &[], &caged_env);
    (d, c)
}

fn assert_survives(fault: &str, step: &str) {
    assert_survives_with(fault, step, &[]);
}

fn assert_survives_with(fault: &str, step: &str, env: &[(&str, &str)]) {
    let (d, c) = run_fault_with(fault, env);
    assert!(!d.status.success(), "{fault}: directly, the driver fault should kill the app:\n{}", text(&d));
    assert!(!text(&d).contains("still running"), "{fault}: directly the app must not survive:\n{}", text(&d));
    assert_caged_survived(fault, step, &c);
}

fn assert_caged_survived(fault: &str, step: &str, c: &std::process::Output) {
    let t = text(c);
    assert!(c.status.success(), "{fault}: caged app did not survive ({:?}):\n{t}", c.status);
    assert!(
        t.contains(&format!("ERROR step={step} code=-2")),
        "{fault}: expected CL_DEVICE_NOT_AVAILABLE at {step}:\n{t}"
    );
    assert!(t.contains("still running after the driver fault"), "{t}");
}

/// Without `CLOISTER_RECOVERY` (`replay`), a crash in an enqueue costs the application nothing,
/// and it is told it was carried over: with zero-copy buffers and with staged ones
/// (`CLOISTER_ZERO_COPY=0`, as on a discrete GPU). `auto` replays only the former and reports
/// the latter, as `CLOISTER_RECOVERY=report` does.
#[test]
fn by_default_every_driver_is_replayed_and_report_mode_loses_the_context() {
    let cache = std::env::temp_dir().join(format!("cloister-faults-default-{}", std::process::id()));
    let driver = fault_driver();
    let run = |recovery: Option<&str>, zero_copy: &str| {
        let _ = std::fs::remove_dir_all(&cache);
        let mut c = std::process::Command::new(cloister());
        c.args(["run", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--"]).arg(c_client("survivor"));
        match recovery {
            Some(r) => c.env("CLOISTER_RECOVERY", r),
            None => c.env_remove("CLOISTER_RECOVERY"),
        };
        c.env("CLOISTER_ZERO_COPY", zero_copy);
        // `:once` (its marker in the worker's cache folder): the replay does not crash again.
        let out = c.env("CLOISTER_FAULT", "enqueue:segv:once").env("XDG_CACHE_HOME", &cache).output().unwrap();
        let _ = std::fs::remove_dir_all(&cache);
        text(&out)
    };
    let carried = |t: &str| {
        assert!(t.contains("SIGSEGV"), "the fault did not fire:\n{t}");
        assert!(t.contains("completed without fault") && !t.contains("ERROR step="), "{t}");
        assert!(t.contains("carried over to a new worker"), "{t}");
    };
    let reported = |t: &str| {
        assert!(t.contains("SIGSEGV"), "the fault did not fire:\n{t}");
        assert!(t.contains("ERROR step=") && !t.contains("carried over"), "not report mode:\n{t}");
    };
    carried(&run(None, "1"));
    carried(&run(None, "0"));
    carried(&run(Some("auto"), "1"));
    carried(&run(Some("replay"), "0"));
    reported(&run(Some("auto"), "0"));
    reported(&run(Some("report"), "1"));
}

#[test]
fn no_fault_runs_to_completion_both_ways() {
    let (d, c) = run_fault("");
    assert!(text(&d).contains("completed without fault"), "{}", text(&d));
    assert!(text(&c).contains("completed without fault"), "{}", text(&c));
}

/// The client's one NDRange is the first of its launch shape, so it goes as a call (the driver
/// says whether it takes the shape: `launch_shapes`) and the crash is that call's; in strict mode
/// too. A crash in a posted NDRange surfaces at the next call: `async_enqueue`'s
/// `a_worker_dying_with_posted_enqueues_queued_leaves_nothing_hanging`.
#[test]
fn segv_in_enqueue() {
    assert_survives("enqueue:segv", "enqueue");
    assert_survives_with("enqueue:segv", "enqueue", &[("CLOISTER_SYNC", "1")]);
}

#[test]
fn abort_in_build() {
    assert_survives("build:abort", "build");
}

#[test]
fn sigbus_in_enqueue() {
    assert_survives("enqueue:bus", "enqueue");
}

#[test]
fn exit_in_finish() {
    assert_survives("finish:exit", "finish");
}

#[test]
fn segv_in_context_creation() {
    assert_survives("context:segv", "context");
}

#[test]
fn driver_closing_its_fds() {
    // Directly this breaks the application's own fds. In the worker it cuts the socket, but the
    // lanes are shared memory that stays mapped: the application must either finish with
    // correct results or get CL_DEVICE_NOT_AVAILABLE, and never die or hang.
    let (_, c) = run_fault("finish:closefds");
    let t = text(&c);
    assert!(c.status.success(), "{t}");
    assert!(t.contains("completed without fault") || t.contains("code=-2"), "{t}");
}

#[test]
fn asynchronous_crash_after_the_call_returned() {
    // The kernel enqueue returns; 150 ms later a driver thread crashes. Some later call fails.
    let (d, c) = run_fault("enqueue:async-segv");
    assert!(!d.status.success(), "{}", text(&d));
    let t = text(&c);
    assert!(c.status.success() && t.contains("code=-2") && t.contains("still running"), "{t}");
}

#[test]
fn crash_during_platform_init_leaves_no_platforms() {
    let (d, c) = run_fault("init:segv");
    assert!(!d.status.success(), "{}", text(&d));
    // `cloister run` starts the driver once before the application: the crash stops the run
    // there, with the broker's one line (and its report).
    let t = text(&c);
    assert_eq!(c.status.code(), Some(125), "{t}");
    assert!(t.contains("cannot be used") && t.contains("SIGSEGV") && !t.contains("step="), "{t}");
    // Started without that check, the application lives on with no platform.
    let driver = fault_driver();
    let args = ["--no-check", "--driver", driver.to_str().unwrap(), "--profile", "pocl"];
    let c = caged(&args, &c_client("survivor"), &[], &[("CLOISTER_FAULT", "init:segv"), REPORT]);
    let t = text(&c);
    assert!(c.status.success() && t.contains("ERROR step=platforms code=-1001"), "{t}");
}

/// A hang: directly the application would wait forever, so only the caged run is made. The
/// watchdog (deadlines shortened through the environment) kills the worker and names the call.
fn assert_hang_caught(fault: &str, step: &str, call: &str, deadline_var: &str) {
    let exe = c_client("survivor");
    let started = std::time::Instant::now();
    let c = caged_on_faultcl(&exe, &[], &[("CLOISTER_FAULT", fault), (deadline_var, "1500"), REPORT]);
    let t = text(&c);
    assert_caged_survived(fault, step, &c);
    assert!(t.contains(&format!("hung in {call}")), "the report should name {call}:\n{t}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn hang_in_finish_is_killed_by_the_watchdog() {
    assert_hang_caught("finish:hang", "finish", "FlushOrFinish", "CLOISTER_DEADLINE_WAIT_MS");
}

#[test]
fn hang_in_build_is_killed_by_the_watchdog() {
    assert_hang_caught("build:hang", "build", "BuildProgram", "CLOISTER_DEADLINE_BUILD_MS");
}

#[test]
fn crash_report_names_the_call_in_flight_and_the_last_calls() {
    let state = std::env::temp_dir().join(format!("cloister-test-state-{}", std::process::id()));
    let exe = c_client("survivor");
    let c = caged_on_faultcl(
        &exe,
        &[],
        &[("CLOISTER_FAULT", "enqueue:segv"), ("XDG_STATE_HOME", state.to_str().unwrap()), REPORT],
    );
    assert!(c.status.success(), "{}", text(&c));
    let dir = state.join("cloister/crashes");
    let report = std::fs::read_dir(&dir).expect("a crash report").next().expect("one report").unwrap().path();
    let json = std::fs::read_to_string(&report).unwrap();
    assert!(json.contains("\"signal\": 11"), "{json}");
    assert!(json.contains("\"op\": \"EnqueueNdRange\""), "the call in flight: {json}");
    assert!(json.contains("\"op\": \"BuildProgram\""), "the last calls include the build: {json}");
    assert!(json.contains("\"signature\": \"/") && json.contains("SIGSEGV:EnqueueNdRange"), "{json}");
    assert!(json.contains("\"device\": \"") && !json.contains("\"device\": null"), "the device: {json}");
    assert!(json.contains("\"program_source\": \"__kernel void k"), "the program involved: {json}");
    let _ = std::fs::remove_dir_all(&state);
}
