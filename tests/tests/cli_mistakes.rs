//! Everyday mistakes with `cloister run` are one clear message and a documented exit status,
//! said before the application starts (issue: "Mistakes must be errors, said once"): a driver
//! that is no driver, a missing or malformed profile, an unknown option, a missing application,
//! bad setting values, a stale `.icd`; and signals reach the application.

use cloister_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cloister-mistakes-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `cloister ARGS`, with crash reports kept in `state` and extra environment.
fn cloister_in(dir: &Path, state: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(cloister());
    cmd.current_dir(dir).args(args).env("XDG_STATE_HOME", state).env_remove("CLOISTER_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run cloister")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn reports(state: &Path) -> usize {
    std::fs::read_dir(state.join("cloister/crashes")).map(|d| d.count()).unwrap_or(0)
}

/// A driver library that is not a driver: exit 125 with one line naming it and why, no crash
/// report, and the application never started.
#[test]
fn a_library_that_is_no_driver_stops_before_the_app() {
    let dir = scratch("nodriver");
    let libc_copy = dir.join("libnot-a-driver.so");
    std::fs::copy("/usr/lib/x86_64-linux-gnu/libc.so.6", &libc_copy).unwrap();
    let marker = dir.join("app-ran");
    let touch = format!("touch {}", marker.display());
    for (driver, why) in [("/etc/passwd", "invalid ELF header"), ("libnot-a-driver.so", "exports neither")] {
        // The second is relative: resolved against our folder, not the worker's.
        let d = if driver.starts_with('/') { driver.to_string() } else { format!("./{driver}") };
        let out = cloister_in(&dir, &dir.join("state"), &["run", "--driver", &d, "--", "sh", "-c", &touch], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("cannot be used") && err.contains(why), "{err}");
        assert_eq!(err.lines().count(), 1, "said more than once:\n{err}");
        assert!(!marker.exists(), "the application ran");
        assert_eq!(reports(&dir.join("state")), 0, "a crash report was written for a setup mistake");
    }
}

/// A relative `--driver` path works (the README's demo writes one): the fault driver caged.
#[test]
fn a_relative_driver_path_is_resolved_before_anything_starts() {
    let fault = fault_driver();
    let dir = fault.parent().unwrap().to_path_buf();
    let out =
        cloister_in(&dir, &scratch("relative"), &["run", "--driver", "./libfaultcl.so", "--", "clinfo", "-l"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Platform #0"), "{}", text(&out));
}

/// Missing, unreadable and malformed profiles: one message with the file, the line and the
/// known keys; `cloister policy check` says the same without running anything.
#[test]
fn profile_mistakes_are_one_message_naming_file_and_line() {
    let dir = scratch("profiles");
    let out = cloister_in(&dir, &dir, &["run", "--profile", "nonexistent", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("nonexistent") && stderr(&out).contains("pocl, nvidia, generic"), "{}", stderr(&out));
    let pocl = workspace_root().join("sandbox-policy/profiles/pocl.toml");
    let text_of = std::fs::read_to_string(&pocl).unwrap();
    std::fs::write(dir.join("typo.toml"), text_of.replacen("spawn =", "spwan =", 1)).unwrap();
    for args in [&["run", "--profile", "typo.toml", "--", "true"][..], &["info", "--profile", "typo.toml"][..]] {
        let out = cloister_in(&dir, &dir, args, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("typo.toml") && err.contains("line") && err.contains("spwan"), "{err}");
        assert!(err.contains("expected one of") && err.contains("`spawn`"), "{err}");
        assert_eq!(err.matches("unknown field").count(), 1, "said more than once:\n{err}");
    }
    let out = cloister_in(&dir, &dir, &["policy", "check", "typo.toml"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("spwan"));
    let out = cloister_in(&dir, &dir, &["policy", "check", pocl.to_str().unwrap()], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"), "{}", text(&out));
}

/// An unknown option is an error (never taken for the application); the application's own
/// options go after `--`; a missing application is 127 and one that cannot run is 126.
#[test]
fn options_and_applications_exit_as_shells_do() {
    let dir = scratch("options");
    let out = cloister_in(&dir, &dir, &["run", "--bogus", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("--bogus"));
    let out = cloister_in(&dir, &dir, &["run", "--", "sh", "-c", "exit 7"], &[]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let out = cloister_in(&dir, &dir, &["run", "--", "/nonexistent/app"], &[]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let out = cloister_in(&dir, &dir, &["run", "--", "/etc/passwd"], &[]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out));
}

/// Bad values of `CLOISTER_*` settings are said once each (not by every process that reads
/// them), with the value used instead; good ones are silent.
#[test]
fn bad_setting_values_are_said_once_with_the_value_used() {
    let dir = scratch("settings");
    let env = [("CLOISTER_DEADLINE_INFO_MS", "-5"), ("CLOISTER_CRASH_LOOP", "0/0"), ("CLOISTER_SPIN_US", "abc")];
    let out = cloister_in(&dir, &dir, &["run", "--", "clinfo", "-l"], &env);
    let err = stderr(&out);
    assert!(out.status.success(), "{}", text(&out));
    for (name, used) in [
        ("CLOISTER_DEADLINE_INFO_MS", "using 10000"),
        ("CLOISTER_CRASH_LOOP", "using 3/60"),
        ("CLOISTER_SPIN_US", "using 200"),
    ] {
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(name)).collect();
        assert_eq!(lines.len(), 1, "{name}:\n{err}");
        assert!(lines[0].contains(used), "{}", lines[0]);
    }
    let out = cloister_in(&dir, &dir, &["run", "--", "clinfo", "-l"], &[("CLOISTER_SPIN_US", "20")]);
    assert!(!stderr(&out).contains("CLOISTER_SPIN_US"), "{}", stderr(&out));
}

/// A stale `.icd` (its library is gone) is one warning, and the other drivers still run.
#[test]
fn a_stale_icd_is_one_warning_and_the_rest_run() {
    let dir = scratch("stale");
    let vendors = dir.join("vendors");
    std::fs::create_dir_all(&vendors).unwrap();
    std::fs::copy("/etc/OpenCL/vendors/pocl.icd", vendors.join("pocl.icd")).unwrap();
    std::fs::write(vendors.join("gone.icd"), "libgone-driver.so.1\n").unwrap();
    let state = dir.join("state");
    let env = [("CLOISTER_VENDORS_DIR", vendors.to_str().unwrap())];
    let out = cloister_in(&dir, &state, &["run", "--", "clinfo", "-l"], &env);
    let err = stderr(&out);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Portable Computing Language"), "{}", text(&out));
    assert_eq!(err.lines().filter(|l| l.contains("libgone-driver")).count(), 1, "{err}");
    assert!(err.contains("warning") && err.contains("left out"), "{err}");
    assert_eq!(reports(&state), 0);
    // Named explicitly, it is an error.
    let out = cloister_in(&dir, &state, &["run", "--driver", "gone", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
}

/// SIGUSR1 (and the other catchable signals) to `cloister run` reach the application, which
/// decides what they mean; cloister does not die of them and orphan it.
#[test]
fn signals_are_forwarded_to_the_application() {
    let dir = scratch("signals");
    let mut child = Command::new(cloister())
        .current_dir(&dir)
        .env("XDG_STATE_HOME", &dir)
        .args(["run", "--", "sh", "-c", "trap 'echo got-usr1; exit 3' USR1; echo ready; while :; do sleep 0.1; done"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    // A lost signal would leave the application looping: fail after 60 s instead of hanging.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let _ = Command::new("pkill").args(["-f", "trap 'echo got-usr1"]).status();
            panic!("the application never got SIGUSR1");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(status.code(), Some(3), "{rest}");
    assert!(rest.contains("got-usr1"), "{rest}");
}

/// Shell completions and the manual page come from the same CLI description as `--help`: the
/// bash script is valid bash and knows the subcommands; the page is roff naming them.
#[test]
fn completions_and_manual_page_are_generated_from_the_cli() {
    let dir = scratch("completions");
    let out = cloister_in(&dir, &dir, &["completions", "bash"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let script = dir.join("cloister.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(syntax.status.success(), "{}", text(&syntax));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("_cloister") && s.contains("policy") && s.contains("--no-check"), "{s}");
    let out = cloister_in(&dir, &dir, &["manpage"], &[]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && page.contains(".TH cloister 1") && page.contains("crashes"), "{page}");
}
