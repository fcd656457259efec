//! A hostile driver attempts what a caged driver must not be able to do. Directly on the
//! driver each attempt succeeds (which proves the attacks are real); through cloister each is
//! blocked, the application never dies, and where the worker is killed the report names the
//! forbidden system call.

use cloister_tests::*;

struct Outcome {
    direct: String,
    caged: String,
    caged_ok: bool,
}

fn attack(action: &str, extra_env: &[(&str, &str)]) -> Outcome {
    let exe = c_client("survivor");
    let driver = fault_driver();
    let vendors = vendors_dir_for(&driver);
    let fault = format!("enqueue:{action}");
    let mut env: Vec<(&str, &str)> = vec![("CLOISTER_FAULT", &fault), ("OCL_ICD_VENDORS", vendors.to_str().unwrap())];
    env.extend_from_slice(extra_env);
    let d = direct(&exe, &[], &env);
    let mut env: Vec<(&str, &str)> = vec![("CLOISTER_FAULT", &fault)];
    env.extend_from_slice(extra_env);
    let c = caged(&["--driver", driver.to_str().unwrap(), "--profile", "pocl", "--require-sandbox"], &exe, &[], &env);
    Outcome { direct: text(&d), caged: text(&c), caged_ok: c.status.success() }
}

/// The attack worked directly, was refused in the cage, and the application finished its work.
fn assert_blocked_in_place(name: &str, o: &Outcome) {
    assert!(o.direct.contains(&format!("faultcl: {name} succeeded")), "directly, {name} should succeed:\n{}", o.direct);
    assert!(o.caged.contains(&format!("faultcl: {name} blocked")), "caged, {name} should be blocked:\n{}", o.caged);
    assert!(o.caged_ok && o.caged.contains("completed without fault"), "{}", o.caged);
}

/// The attack worked directly; in the cage seccomp killed the worker, the report names the call
/// and the application got CL_DEVICE_NOT_AVAILABLE instead of dying.
fn assert_trapped(name: &str, o: &Outcome, syscalls: &[&str]) {
    assert!(o.direct.contains(&format!("faultcl: {name} succeeded")), "directly, {name} should succeed:\n{}", o.direct);
    assert!(!o.caged.contains(&format!("faultcl: {name} succeeded")), "{}", o.caged);
    assert!(
        syscalls.iter().any(|s| o.caged.contains(&format!("forbidden system call `{s}`"))),
        "the report should name one of {syscalls:?}:\n{}",
        o.caged
    );
    assert!(o.caged_ok && o.caged.contains("code=-2") && o.caged.contains("still running"), "{}", o.caged);
}

#[test]
fn exec_a_shell() {
    assert_blocked_in_place("exec", &attack("exec", &[]));
}

#[test]
fn tcp_connection_to_localhost() {
    // No network namespace escape is needed: seccomp stops the socket before it is used.
    let o = attack("connect", &[]);
    assert_trapped("connect", &o, &["socket", "connect"]);
}

#[test]
fn read_a_file_in_home() {
    let home = std::env::var("HOME").expect("HOME");
    let secret = format!("{home}/.cloister-attack-secret-{}", std::process::id());
    std::fs::write(&secret, "secret").unwrap();
    let o = attack("readhome", &[("CLOISTER_FAULT_FILE", &secret)]);
    std::fs::remove_file(&secret).unwrap();
    assert_blocked_in_place("readhome", &o);
}

#[test]
fn write_outside_the_cache() {
    let target = std::env::temp_dir().join(format!("cloister-attack-escape-{}", std::process::id()));
    let o = attack("writeout", &[("CLOISTER_FAULT_FILE", target.to_str().unwrap())]);
    let existed = target.exists();
    let _ = std::fs::remove_file(&target);
    assert!(existed, "the direct run should have written {}", target.display());
    assert_blocked_in_place("writeout", &o);
}

#[test]
fn signal_the_parent() {
    assert_trapped("kill-parent", &attack("kill-parent", &[]), &["kill"]);
}

#[test]
fn ptrace_the_parent() {
    assert_trapped("ptrace-parent", &attack("ptrace-parent", &[]), &["ptrace"]);
}

#[test]
fn fork_fifty_processes() {
    assert_trapped("fork50", &attack("fork50", &[]), &["clone"]);
}

/// How many fds the attack managed to open before it was stopped (all of them: 100000).
fn fds_opened(out: &str) -> usize {
    if out.contains("faultcl: fds100k succeeded") {
        return 100_000;
    }
    let at = out.find("fds100k blocked (open ").expect("fds100k reported") + "fds100k blocked (open ".len();
    out[at..].split(' ').next().and_then(|n| n.parse::<usize>().ok()).expect("a count") - 1
}

#[test]
fn open_a_hundred_thousand_fds() {
    // Directly the attack takes whatever the machine's hard limit allows; the cage holds it to
    // the pocl profile's 4096.
    let o = attack("fds100k", &[]);
    let (direct, caged) = (fds_opened(&o.direct), fds_opened(&o.caged));
    assert!(direct > 4096, "directly the driver should open more than 4096 fds, opened {direct}:\n{}", o.direct);
    assert!(caged < 4096, "caged the driver should be held under 4096 fds, opened {caged}:\n{}", o.caged);
    assert!(o.caged_ok && o.caged.contains("completed without fault"), "{}", o.caged);
}
