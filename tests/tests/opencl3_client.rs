//! An application written with the `opencl3` crate runs every scenario directly and through the
//! cage, and each scenario checks its own results (see src/bin/e2e_client.rs).

use cloister_tests::*;
use std::path::Path;

fn scenario(name: &str) {
    let exe = Path::new(env!("CARGO_BIN_EXE_cloister-e2e-client"));
    let d = direct(exe, &[name], &[]);
    assert!(d.status.success(), "{name} failed directly (the client itself is wrong):\n{}", text(&d));
    let c = caged(&[], exe, &[name], &[]);
    assert!(c.status.success(), "{name} failed through cloister:\n{}", text(&c));
    assert!(text(&c).contains(&format!("ok {name}")), "{}", text(&c));
}

#[test]
fn vector_add() {
    scenario("vecadd");
}

#[test]
fn reduction_with_local_memory() {
    scenario("reduction");
}

#[test]
fn many_kernels_and_buffers() {
    scenario("many");
}

#[test]
fn every_call_family() {
    scenario("families");
}

#[test]
fn error_paths_return_the_drivers_codes() {
    scenario("errors");
}

#[test]
fn eight_threads_at_once() {
    scenario("threads");
}
