//! Issue 11, class 2: every memfd the trusted side shares is sealed against resizing before the
//! worker sees it. A hostile driver that truncates the lanes, segments and flight recorder it
//! holds is refused (EPERM); neither the application nor the broker dies of SIGBUS.

use cloister_tests::*;

#[test]
fn a_driver_cannot_truncate_shared_memory() {
    let exe = c_client("survivor");
    let c = caged_on_faultcl(&exe, &[], &[("CLOISTER_FAULT", "enqueue:shrink-shm")]);
    let t = text(&c);
    assert!(!t.contains("faultcl: shrink-shm succeeded"), "the driver truncated shared memory:\n{t}");
    assert!(
        t.contains("faultcl: shrink-shm blocked (all") && t.contains("Operation not permitted"),
        "every truncation should be refused with EPERM:\n{t}"
    );
    // The application finished its work, and `cloister run` (the broker) exited with its status.
    assert!(c.status.success() && t.contains("completed without fault"), "{:?}\n{t}", c.status);
}

/// A driver that answers a non-blocking read with success but without the event the worker
/// asked for (and completes it late): the worker finishes the queue before it replies, so the
/// shim copies the driver's data out of the lane, not what was there before.
#[test]
fn a_read_whose_event_the_driver_withholds_is_finished_before_the_reply() {
    let exe = c_client("survivor");
    let c = caged_on_faultcl(
        &exe,
        &[],
        // Pinned staging takes the non-blocking lane path on pocl too; without zero-copy buffers
        // the read goes through the lane.
        &[("CLOISTER_FAULT", "read:late-no-event"), ("CLOISTER_STAGING", "pinned"), ("CLOISTER_ZERO_COPY", "0")],
    );
    let t = text(&c);
    assert!(!t.contains("WRONG RESULT"), "the shim copied the lane before the read completed:\n{t}");
    assert!(c.status.success() && t.contains("completed without fault"), "{:?}\n{t}", c.status);
}
