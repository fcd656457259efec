//! `cloister policy learn` writes a profile from what a driver really did; that profile then
//! confines the same workload, and removing a call it needs breaks it (the profile is enforced).

use cloister_tests::*;
use std::process::Command;

#[test]
fn learned_profile_confines_the_workload_it_was_learned_from() {
    let exe = c_client("survivor");
    // A fresh cache, so pocl compiles and links the kernel (spawning the linker) while observed.
    let cache = std::env::temp_dir().join(format!("cloister-learn-cache-{}", std::process::id()));
    let profile = std::env::temp_dir().join(format!("cloister-learned-{}.toml", std::process::id()));
    let learn = Command::new(cloister())
        .args(["policy", "learn", "--driver", "pocl", "--output"])
        .arg(&profile)
        .arg("--")
        .arg(&exe)
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .expect("run cloister policy learn");
    assert!(learn.status.success() && text(&learn).contains("completed without fault"), "{}", text(&learn));
    let text_profile = std::fs::read_to_string(&profile).expect("learned profile written");
    assert!(text_profile.contains("spawn = true"), "pocl runs the linker, which learning must see:\n{text_profile}");
    assert!(text_profile.contains("\"execve\""), "{text_profile}");
    // ioctl requests are recorded by number (the linker probes its output for a terminal).
    assert!(text_profile.contains("ioctls = [\n    \"TCGETS\", #"), "{text_profile}");

    let fresh = cache.join("second");
    let run = |p: &std::path::Path| {
        let mut cmd = Command::new(cloister());
        cmd.args(["run", "--require-sandbox", "--profile"]).arg(p).arg("--").arg(&exe).env("XDG_CACHE_HOME", &fresh);
        cmd.output().expect("run cloister")
    };
    let ok = run(&profile);
    assert!(ok.status.success() && text(&ok).contains("completed without fault"), "{}", text(&ok));

    // Without openat the driver cannot even load its pieces: the profile is really enforced.
    let crippled = profile.with_extension("crippled.toml");
    std::fs::write(&crippled, text_profile.replace("    \"openat\",", "    # openat removed by the test\n")).unwrap();
    let bad = run(&crippled);
    let t = text(&bad);
    assert!(t.contains("forbidden system call `openat`"), "{t}");
    // `cloister run` starts the driver once before the application: it stops there, said once.
    assert_eq!(bad.status.code(), Some(125), "{t}");
    assert!(t.contains("cannot be used") && !t.contains("still running"), "{t}");
    assert_eq!(t.matches("forbidden system call").count(), 1, "{t}");
    // Without that check the application starts and survives the driver's death.
    let mut cmd = Command::new(cloister());
    cmd.args(["run", "--no-check", "--require-sandbox", "--profile"]).arg(&crippled).arg("--").arg(&exe);
    let bad = cmd.env("XDG_CACHE_HOME", &fresh).output().expect("run cloister");
    let t = text(&bad);
    assert!(t.contains("forbidden system call `openat`"), "{t}");
    assert!(bad.status.success() && t.contains("still running"), "the application must survive: {t}");

    let _ = std::fs::remove_dir_all(&cache);
    let _ = std::fs::remove_file(&profile);
    let _ = std::fs::remove_file(&crippled);
}

#[test]
fn info_reports_every_layer() {
    let out = Command::new(cloister()).arg("info").output().expect("run cloister info");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for layer in [
        "closed fds: on",
        "no_new_privs: on",
        "rlimit open files: on",
        "landlock: on",
        "seccomp: on",
        "network namespace: on",
        "capabilities dropped: on",
    ] {
        assert!(t.contains(layer), "missing `{layer}` in:\n{t}");
    }
    assert!(t.contains("sandbox profile: pocl") && t.contains("device: "), "{t}");
}
