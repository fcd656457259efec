//! clpeak, a real benchmark client, runs to its end through the cage: every section it prints
//! directly it prints caged, each with numbers, and it reports no error.

use cloister_tests::*;
use std::path::Path;

/// Section titles (unindented or once-indented lines ending in a unit in parentheses, or the
/// latency line) and whether each has at least one number under it.
fn sections(out: &str) -> Vec<(String, bool)> {
    let mut found: Vec<(String, bool)> = Vec::new();
    for line in out.lines() {
        let t = line.trim();
        let is_title = (t.ends_with("PS)") || t.ends_with("GFLOPS)")) && !t.contains(':');
        if is_title {
            found.push((t.to_string(), false));
        } else if t.starts_with("Kernel launch latency") {
            let number = t
                .rsplit(':')
                .next()
                .is_some_and(|v| v.trim().split(' ').next().is_some_and(|n| n.parse::<f64>().is_ok()));
            found.push(("Kernel launch latency".into(), number));
        } else if let Some((_, v)) = t.rsplit_once(':') {
            if v.trim().parse::<f64>().is_ok() {
                if let Some(last) = found.last_mut() {
                    last.1 = true;
                }
            }
        }
    }
    found
}

#[test]
fn clpeak_runs_to_the_end_with_every_section() {
    let clpeak = Path::new("/usr/bin/clpeak");
    assert!(clpeak.exists(), "clpeak is not installed (scripts/setup.sh installs it)");
    let d = direct(clpeak, &[], &[]);
    let c = caged(&[], clpeak, &[], &[]);
    let (dt, ct) = (text(&d), text(&c));
    assert!(d.status.success(), "clpeak failed directly:\n{dt}");
    assert!(c.status.success(), "clpeak failed caged:\n{ct}");
    let (ds, cs) = (sections(&dt), sections(&ct));
    assert!(ds.len() >= 5, "clpeak printed too little directly:\n{dt}");
    let names = |s: &[(String, bool)]| s.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&ds), names(&cs), "caged:\n{ct}");
    for (name, has_numbers) in &cs {
        assert!(has_numbers, "section {name} has no numbers caged:\n{ct}");
    }
    assert!(!ct.to_lowercase().contains("error"), "{ct}");
    println!("clpeak caged:\n{ct}");
}

#[test]
fn section_parser_finds_titles_and_numbers() {
    let out = "Platform: x\n  Device: y\n    Global memory bandwidth (GBPS)\n      float   : 8.62\n\n    \
               Single-precision compute (GFLOPS)\n      float   : \n\n    Kernel launch latency : 9.42 us\n";
    let s = sections(out);
    assert_eq!(
        s,
        [
            ("Global memory bandwidth (GBPS)".to_string(), true),
            ("Single-precision compute (GFLOPS)".to_string(), false),
            ("Kernel launch latency".to_string(), true)
        ]
    );
}
