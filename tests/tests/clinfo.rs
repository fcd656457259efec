//! `clinfo` through cloister prints what `clinfo` prints directly, except for the lines the
//! README explains: the `cl_cloister_sandbox` platform extension, the extensions cloister does
//! not forward (`cloister_ipc::advertised`), and SVM and native kernels reported as absent.

use cloister_ipc::advertised::MASKED_EXTENSIONS;
use cloister_tests::*;
use std::path::Path;

/// clinfo lines whose value the cage reports as "No" (SVM capabilities, native kernels).
const ABSENT_IN_CAGE: &[&str] = &[
    "Coarse-grained buffer sharing",
    "Fine-grained buffer sharing",
    "Fine-grained system sharing",
    "Atomics",
    "Run native kernels",
];

/// clinfo sections printed only when a masked extension is advertised (header and the more
/// deeply indented lines under it). Command buffers are forwarded at pocl's version, so their
/// section must match too.
const MASKED_SECTIONS: &[&str] = &[];

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Drops the documented differences from clinfo's output; `caged` says which side this is,
/// and the cage's side must say "No" where the README says it does.
fn normalise(out: &str, caged: bool) -> Vec<String> {
    let mut kept = Vec::new();
    let mut skip_deeper_than: Option<usize> = None;
    for line in out.lines() {
        let trimmed = line.trim_start();
        if let Some(level) = skip_deeper_than {
            if indent(line) > level {
                continue;
            }
            skip_deeper_than = None;
        }
        if MASKED_SECTIONS.iter().any(|s| trimmed.starts_with(s)) {
            skip_deeper_than = Some(indent(line));
            continue;
        }
        if let Some(label) = ABSENT_IN_CAGE.iter().find(|l| trimmed.starts_with(*l)) {
            assert!(!caged || trimmed.ends_with("No"), "the cage advertises {label}: {line}");
            continue;
        }
        let first = trimmed.split(' ').next().unwrap_or_default();
        if first == "cl_cloister_sandbox" || MASKED_EXTENSIONS.contains(&first) {
            continue; // an entry of a `*_EXTENSIONS_WITH_VERSION` list
        }
        let words: Vec<&str> =
            line.split(' ').filter(|w| *w != "cl_cloister_sandbox" && !MASKED_EXTENSIONS.contains(w)).collect();
        let line = words.join(" ");
        if !line.trim().is_empty() {
            kept.push(line);
        }
    }
    kept
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
    let (dl, cl) = (normalise(&d, false), normalise(&c, true));
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
