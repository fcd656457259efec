//! pyopencl's own test suite, a large real client touching most of the OpenCL API, passes
//! through the cage wherever it passes directly: `scripts/pyopencl-suite.sh` runs it both ways
//! (installing pyopencl and pytest and fetching the suite when missing) and fails if any test
//! that passes directly does not pass caged.

use std::process::Command;

#[test]
fn pyopencl_suite_passes_caged_wherever_it_passes_directly() {
    let cloister = cloister_tests::cloister();
    let script = cloister_tests::workspace_root().join("scripts/pyopencl-suite.sh");
    let out = Command::new("bash").arg(&script).arg(&cloister).output().expect("cannot run bash");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "{} failed ({}):\n{text}", script.display(), out.status);
}
