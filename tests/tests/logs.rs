//! Diagnostic logs (`CLOISTER_LOG`): off by default; when on, every process of a run (the CLI
//! with its broker, the worker, the shim in the application) writes whole lines with a
//! timestamp, a level and the process, and says which client and worker a line is about.

use std::process::Output;

use cloister_tests::*;

fn run_clinfo(env: &[(&str, &str)]) -> Output {
    let clinfo = std::path::Path::new("/usr/bin/clinfo");
    let out = caged(&[], clinfo, &["-l"], env);
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// Whether `s` starts like a log line: `2026-11-23T18:33:33.805622Z `.
fn starts_with_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 28
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[10] == b'T'
        && s[..28].contains('Z')
        && b[19] == b'.'
}

/// Every timestamp in the output, with whether it begins its line.
fn timestamps(t: &str) -> Vec<(bool, &str)> {
    let mut found = Vec::new();
    for line in t.lines() {
        for (i, _) in line.match_indices("Z ").filter(|(i, _)| *i >= 26) {
            let start = i - 26;
            if line.is_char_boundary(start) && starts_with_timestamp(&line[start..]) {
                found.push((start == 0, line));
            }
        }
    }
    found
}

#[test]
fn logs_are_off_unless_asked_for() {
    let out = run_clinfo(&[("CLOISTER_LOG", ""), ("RUST_LOG", "")]);
    let t = text(&out);
    assert!(timestamps(&t).is_empty(), "no log lines by default:\n{t}");
    assert!(t.contains("Platform #0"), "{t}");
}

#[test]
fn every_process_logs_whole_lines_naming_its_client_and_worker() {
    let out = run_clinfo(&[("CLOISTER_LOG", "debug")]);
    let t = text(&out);
    let stamps = timestamps(&t);
    assert!(stamps.len() >= 8, "log lines expected:\n{t}");
    for (at_start, line) in &stamps {
        assert!(at_start, "a log line cut into another: {line:?}");
    }
    for process in ["run[", "worker[", "shim["] {
        assert!(stamps.iter().any(|(_, l)| l[28..].starts_with(process)), "no line from {process}:\n{t}");
    }
    for level in [" INFO ", "DEBUG "] {
        assert!(t.contains(level), "level {level:?}:\n{t}");
    }
    let connected = t.lines().find(|l| l.contains("client connected")).expect("the broker says who connected");
    assert!(connected.contains("app=clinfo") && connected.contains("client="), "{connected}");
    let started = t.lines().find(|l| l.contains("worker started") && l.contains("probe=false")).expect("worker");
    assert!(started.contains("driver=pocl") && started.contains("client=") && started.contains("worker="), "{started}");
    assert!(t.contains("Platform #0"), "the application's own output is intact:\n{t}");
}

#[test]
fn the_filter_picks_levels_and_a_bad_one_is_said_once() {
    let t = text(&run_clinfo(&[("CLOISTER_LOG", "warn")]));
    assert!(!t.contains(" INFO ") && !t.contains("DEBUG "), "warn hides info and debug:\n{t}");
    let t = text(&run_clinfo(&[("CLOISTER_LOG", "cloister_worker=info")]));
    let stamps = timestamps(&t);
    assert!(!stamps.is_empty() && stamps.iter().all(|(_, l)| l[28..].starts_with("worker[")), "only the worker:\n{t}");
    let t = text(&run_clinfo(&[("CLOISTER_LOG", "=[bad")]));
    assert_eq!(t.matches("is not a log filter").count(), 1, "said once:\n{t}");
    assert!(timestamps(&t).is_empty(), "{t}");
}
