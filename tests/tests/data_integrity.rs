//! Data integrity of transfers and maps (`tests/c/data_integrity.c`): random bytes at odd sizes
//! and offsets, sub-buffers, overlapping maps, maps against kernels, host-pointer flags, and
//! thousands of large buffers under a low descriptor limit. The client checks every byte
//! against its own reference; it runs directly (to prove the client right), caged with zero-copy
//! buffers (pocl is host-unified), and caged with them turned off (`CLOISTER_ZERO_COPY=0`, the
//! staged path discrete GPUs take).

use cloister_tests::*;

fn passes(env: &[(&str, &str)]) {
    let exe = c_client("data_integrity");
    let d = direct(&exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let c = caged(&[], &exe, &[], env);
    let out = text(&c);
    assert!(c.status.success() && out.contains("data integrity ok"), "caged run failed:\n{out}");
    // The same findings directly and caged, line for line.
    assert_eq!(String::from_utf8_lossy(&d.stdout), String::from_utf8_lossy(&c.stdout));
}

#[test]
fn zero_copy_buffers_keep_every_byte() {
    passes(&[]);
}

#[test]
fn staged_buffers_keep_every_byte() {
    passes(&[("CLOISTER_ZERO_COPY", "0")]);
}

/// Staged transfers with their shared memory pinned in the context (`CLOISTER_STAGING=pinned`,
/// forced on pocl; see worker/src/staging.rs).
#[test]
fn pinned_staging_keeps_every_byte() {
    passes(&[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_STAGING", "pinned")]);
}
