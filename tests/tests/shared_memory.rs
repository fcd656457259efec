//! Issue 11, class 2: every memfd the trusted side shares is sealed against resizing before the
//! worker sees it. A hostile driver that truncates the lanes, segments and flight recorder it
//! holds is refused (EPERM); neither the application nor the broker dies of SIGBUS.

use cloister_tests::*;

#[test]
fn a_driver_cannot_truncate_shared_memory() {
    let exe = c_client("survivor");
    let driver = fault_driver();
    let c = caged(
        &["--driver", driver.to_str().unwrap(), "--profile", "pocl"],
        &exe,
        &[],
        &[("CLOISTER_FAULT", "enqueue:shrink-shm")],
    );
    let t = text(&c);
    assert!(!t.contains("faultcl: shrink-shm succeeded"), "the driver truncated shared memory:\n{t}");
    assert!(
        t.contains("faultcl: shrink-shm blocked (all") && t.contains("Operation not permitted"),
        "every truncation should be refused with EPERM:\n{t}"
    );
    // The application finished its work, and `cloister run` (the broker) exited with its status.
    assert!(c.status.success() && t.contains("completed without fault"), "{:?}\n{t}", c.status);
}
