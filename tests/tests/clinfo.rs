//! `clinfo` through cloister prints what `clinfo` prints directly, except for the lines the
//! README explains (the `cl_cloister_sandbox` platform extension).

use cloister_tests::*;
use std::path::Path;

/// The only differences the README documents: the extension cloister adds to the platform,
/// as a word in the extension list and as its own entry in the versioned list.
fn documented_difference(line: &str) -> Option<String> {
    if line.trim_start().starts_with("cl_cloister_sandbox") {
        return None; // the `CL_PLATFORM_EXTENSIONS_WITH_VERSION` entry
    }
    Some(line.replace(" cl_cloister_sandbox", ""))
}

#[test]
fn clinfo_matches_direct_except_documented_lines() {
    let clinfo = Path::new("/usr/bin/clinfo");
    assert!(clinfo.exists(), "clinfo is not installed (scripts/setup.sh installs it)");
    let d = direct(clinfo, &[], &[]);
    let c = caged(&[], clinfo, &[], &[]);
    assert!(d.status.success() && c.status.success(), "direct:\n{}\ncaged:\n{}", text(&d), text(&c));
    let d = String::from_utf8_lossy(&d.stdout).into_owned();
    let c = String::from_utf8_lossy(&c.stdout).into_owned();
    assert!(c.contains("cl_cloister_sandbox") && !d.contains("cl_cloister_sandbox"));
    assert!(d.contains("Number of devices"), "no device found directly:\n{d}");
    let strip = |s: &str| -> Vec<String> {
        s.lines().filter_map(documented_difference).filter(|l| !l.trim().is_empty()).collect()
    };
    let (dl, cl) = (strip(&d), strip(&c));
    let diff: Vec<String> =
        dl.iter().zip(cl.iter()).filter(|(a, b)| a != b).map(|(a, b)| format!("- {a}\n+ {b}")).collect();
    assert!(
        diff.is_empty() && dl.len() == cl.len(),
        "clinfo differs ({} vs {} lines):\n{}",
        dl.len(),
        cl.len(),
        diff.join("\n")
    );
}
