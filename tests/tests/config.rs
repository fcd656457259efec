//! The configuration files (issue 17, "Logs, configuration and reports"): each layer (flag,
//! environment, user file, system file, default) wins over the ones below, as `cloister config`
//! shows; a malformed file or an unknown key is one message with the file and line; a driver's
//! `env` and `pass_env` reach its worker and nothing else of the application's does; a driver's
//! profile from the file is the one its worker runs under; the README's table is the generated one.
//!
//! Each test runs `cloister` with `HOME`, `XDG_CONFIG_HOME` and the system file
//! (`CLOISTER_SYSTEM_CONFIG`) in a scratch folder of its own.

use cloister_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch home: `config/cloister/config.toml` is the user's file, `system/config.toml` the
/// system's.
struct Home(PathBuf);

impl Home {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("cloister-config-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("config/cloister")).unwrap();
        std::fs::create_dir_all(d.join("system")).unwrap();
        Home(d)
    }

    fn user(&self) -> PathBuf {
        self.0.join("config/cloister/config.toml")
    }

    fn system(&self) -> PathBuf {
        self.0.join("system/config.toml")
    }

    fn write(&self, path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// `cloister ARGS` in this home, with no `CLOISTER_*` variable but `env`'s.
    fn cloister(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(cloister());
        cmd.current_dir(&self.0)
            .args(args)
            .env("HOME", &self.0)
            .env("XDG_CONFIG_HOME", self.0.join("config"))
            .env("XDG_STATE_HOME", self.0.join("state"))
            .env("XDG_CACHE_HOME", self.0.join("cache"))
            .env("CLOISTER_SYSTEM_CONFIG", self.system());
        for (k, _) in std::env::vars() {
            if k.starts_with("CLOISTER_") && k != "CLOISTER_SYSTEM_CONFIG" {
                cmd.env_remove(k);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("cannot run cloister")
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `(value, from)` of `key` in `cloister config`'s output: at the top level, or in `[driver.D]`.
fn shown(out: &Output, driver: Option<&str>, key: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut section = None;
    for line in stdout.lines() {
        if let Some(d) = line.strip_prefix("[driver.").and_then(|l| l.strip_suffix(']')) {
            section = Some(d.to_string());
            continue;
        }
        let mut words = line.split_whitespace();
        if section.as_deref() == driver && words.next() == Some(key) {
            let value = words.next().unwrap_or_default().to_string();
            return (value, words.collect::<Vec<_>>().join(" "));
        }
    }
    panic!("no {key} for {driver:?} in:\n{stdout}");
}

/// Each layer wins over the ones below: the flag over the environment over the user's file over
/// the system's over the default, and a driver's section over its file's top level.
#[test]
fn each_layer_wins_over_the_ones_below() {
    let home = Home::new("layers");
    home.write(
        &home.system(),
        "profile = \"nvidia\"\ncopy_threads = 3\nspin_us = 20\nstaging = \"plain\"\ncrash_loop = \"7/7\"\n",
    );
    home.write(
        &home.user(),
        "profile = \"nvidia\"\nspin_us = 10\nstaging = \"pinned\"\n\n[driver.pocl]\ncrash_loop = \"5/9\"\n",
    );
    let env = [("CLOISTER_STAGING", "auto"), ("CLOISTER_PROFILE", "generic")];
    let out = home.cloister(&["config", "--profile", "pocl"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let (user, system) = (home.user().display().to_string(), home.system().display().to_string());
    assert_eq!(shown(&out, None, "profile"), ("pocl".into(), "flag".into()));
    assert_eq!(shown(&out, None, "staging"), ("auto".into(), "environment (CLOISTER_STAGING)".into()));
    assert_eq!(shown(&out, None, "spin_us"), ("10".into(), format!("{user}:2")));
    assert_eq!(shown(&out, None, "copy_threads"), ("3".into(), format!("{system}:2")));
    assert_eq!(shown(&out, None, "crash_loop"), ("7/7".into(), format!("{system}:5")));
    assert_eq!(shown(&out, None, "zero_copy"), ("1".into(), "default".into()));
    assert_eq!(shown(&out, Some("pocl"), "crash_loop"), ("5/9".into(), format!("{user}:6")));
    // Without the flag, the environment's profile; without that, the user's file's.
    let out = home.cloister(&["config"], &env);
    assert_eq!(shown(&out, None, "profile"), ("generic".into(), "environment (CLOISTER_PROFILE)".into()));
    let out = home.cloister(&["config"], &[]);
    assert_eq!(shown(&out, None, "profile"), ("nvidia".into(), format!("{user}:1")));
    assert_eq!(shown(&out, None, "staging"), ("pinned".into(), format!("{user}:3")));
}

/// A system file that another user could have written is said once and not used.
#[test]
fn a_system_file_writable_by_others_is_not_used() {
    let home = Home::new("trust");
    home.write(&home.system(), "spin_us = 20\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.system(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = home.cloister(&["config"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(shown(&out, None, "spin_us"), ("200".into(), "default".into()));
    let err = stderr(&out);
    assert_eq!(err.matches("writable by others").count(), 1, "{err}");
    assert!(err.contains(&home.system().display().to_string()), "{err}");
    std::fs::set_permissions(home.system(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = home.cloister(&["config"], &[]);
    assert_eq!(shown(&out, None, "spin_us").0, "20");
}

/// A malformed file stops `cloister run` before the application, with one message naming the
/// file and line, exit status 125; `config --check` says the same with exit status 1.
#[test]
fn a_malformed_file_stops_run_with_one_message_naming_file_and_line() {
    let home = Home::new("malformed");
    let marker = home.0.join("app-ran");
    let touch = format!("touch {}", marker.display());
    let user = home.user().display().to_string();
    for (file_text, line, what) in [
        ("spin_us = 10\nstaging = \"plain\n", 2, "string"),
        ("spin_us = \"fast\"\n", 1, "integer"),
        ("\n\ncrash_loop = \"0/0\"\n", 3, "K/T"),
        ("[driver.pocl]\nenv = { LD_PRELOAD = \"/tmp/x.so\" }\n", 2, "LD_PRELOAD"),
    ] {
        home.write(&home.user(), file_text);
        let out = home.cloister(&["run", "--", "sh", "-c", &touch], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains(&format!("{user}:{line}")) && err.contains(what), "{file_text:?}: {err}");
        assert_eq!(err.lines().count(), 1, "said more than once:\n{err}");
        assert!(!marker.exists(), "the application ran");
        let out = home.cloister(&["config", "--check", &user], &[]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(stderr(&out).contains(&format!("{user}:{line}")), "{}", stderr(&out));
    }
    home.write(&home.user(), "spin_us = 10\n[driver.pocl]\nprofile = \"generic\"\n");
    let out = home.cloister(&["config", "--check", &user], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"), "{}", text(&out));
}

/// An application caged without `cloister run` (its shim starts a private broker) meets the
/// same malformed file: said once, and it runs with the defaults.
#[test]
fn the_shim_says_a_malformed_file_once_and_runs_with_the_defaults() {
    ensure_built();
    let home = Home::new("shim");
    home.write(&home.user(), "spin_us = \"fast\"\n");
    let runtime = home.0.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    let mut cmd = Command::new("clinfo");
    cmd.arg("-l")
        .env("HOME", &home.0)
        .env("XDG_CONFIG_HOME", home.0.join("config"))
        .env("XDG_CACHE_HOME", home.0.join("cache"))
        .env("XDG_STATE_HOME", home.0.join("state"))
        .env("CLOISTER_SYSTEM_CONFIG", home.system())
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("OCL_ICD_VENDORS", &vendors)
        .env_remove("CLOISTER_SOCKET")
        .env_remove(cloister_ipc::settings::ALREADY_SAID);
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Platform #0"), "{}", text(&out));
    let said: Vec<&str> = err.lines().filter(|l| l.contains("config.toml:1")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("not used"), "{err}");
}

/// An unknown key is refused, naming it, its file and line, and the keys there are.
#[test]
fn an_unknown_key_is_refused_naming_it() {
    let home = Home::new("unknown");
    let user = home.user().display().to_string();
    for (text, key, known, line) in [
        ("spin_us = 10\nspwan_us = 3\n", "spwan_us", "`spin_us`", 2),
        ("[driver.pocl]\nprofil = \"generic\"\n", "profil", "`pass_env`", 2),
    ] {
        home.write(&home.user(), text);
        let out = home.cloister(&["config"], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains(&format!("{user}:{line}: ")), "{err}");
        assert!(err.contains(&format!("unknown key `{key}`")) && err.contains(known), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// The worker's environment lines (`CLOISTER_DEBUG`) in `out`: the names its driver sees.
fn worker_environment(out: &Output) -> Vec<String> {
    let err = stderr(out);
    let line = err.lines().find_map(|l| l.split_once("]: environment: ").map(|(_, names)| names.to_string()));
    line.unwrap_or_else(|| panic!("no worker environment in:\n{err}")).split(' ').map(str::to_string).collect()
}

/// A driver's `env` reaches its driver (pocl prints its debug log for `POCL_DEBUG`), and so do
/// the variables its `pass_env` names; another of the application's variables does not, nor
/// another driver's `env`.
#[test]
fn a_drivers_env_reaches_its_driver_and_nothing_else_does() {
    let home = Home::new("env");
    let run = |env: &[(&str, &str)]| {
        let mut all = vec![("CLOISTER_DEBUG", "1"), ("PASSED_VAR", "1"), ("APP_ONLY_VAR", "1")];
        all.extend_from_slice(env);
        home.cloister(&["run", "--driver", "pocl", "--", "clinfo", "-l"], &all)
    };
    // Without the file, pocl is quiet and sees none of them.
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!stderr(&out).contains("POCL_DEBUG"), "{}", stderr(&out));
    let names = worker_environment(&out);
    assert!(!names.iter().any(|n| n == "PASSED_VAR" || n == "APP_ONLY_VAR"), "{names:?}");
    home.write(
        &home.user(),
        "[driver.pocl]\nenv = { POCL_DEBUG = \"all\", DRIVER_VAR = \"x\" }\npass_env = [\"PASSED_VAR\"]\n\n\
         [driver.other]\nenv = { OTHER_DRIVER_VAR = \"y\" }\n",
    );
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    // pocl's own debug output, relayed from the worker to the application's stderr.
    assert!(stderr(&out).contains("POCL_DEBUG flags"), "{}", stderr(&out));
    let names = worker_environment(&out);
    for wanted in ["POCL_DEBUG", "DRIVER_VAR", "PASSED_VAR", "PATH", "HOME"] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} missing: {names:?}");
    }
    for unwanted in ["APP_ONLY_VAR", "OTHER_DRIVER_VAR", "XDG_CONFIG_HOME", "CLOISTER_SYSTEM_CONFIG"] {
        assert!(!names.iter().any(|n| n == unwanted), "{unwanted} reached the worker: {names:?}");
    }
}

/// A driver's profile from the file is the one its worker runs under, as `cloister info` shows:
/// a built-in name, and a profile file relative to the configuration file's folder.
#[test]
fn a_drivers_profile_from_the_file_is_used() {
    let home = Home::new("profile");
    let profile_of = |home: &Home| {
        let out = home.cloister(&["info", "--driver", "pocl"], &[]);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout.lines().find_map(|l| l.trim().strip_prefix("sandbox profile: ").map(str::to_string)).unwrap()
    };
    assert_eq!(profile_of(&home), "pocl");
    home.write(&home.user(), "[driver.pocl]\nprofile = \"generic\"\n");
    assert_eq!(profile_of(&home), "generic");
    let pocl = std::fs::read_to_string(workspace_root().join("sandbox-policy/profiles/pocl.toml")).unwrap();
    let mine = pocl.replacen("name = \"pocl\"", "name = \"mine\"", 1);
    assert_ne!(mine, pocl, "the pocl profile has no name line to change");
    home.write(&home.0.join("config/cloister/mine.toml"), &mine);
    home.write(&home.user(), "[driver.pocl]\nprofile = \"mine.toml\"\n");
    assert_eq!(profile_of(&home), "mine");
}

/// The README's settings table is the one `cloister config --markdown` prints.
#[test]
fn the_readme_table_is_the_generated_one() {
    let home = Home::new("readme");
    let out = home.cloister(&["config", "--markdown"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let start = "<!-- settings table: cloister config --markdown -->\n";
    let from = readme.find(start).expect("the README has no settings table marker") + start.len();
    let end = readme[from..].find("<!-- end of settings table -->").expect("no end marker") + from;
    assert_eq!(readme[from..end], table, "README's table differs from `cloister config --markdown`");
}

/// A driver's deadlines from its section reach the broker's watchdog and the start-up check:
/// the fault driver hanging in its start is stopped at 1.5 s, not the default 120 s, and the
/// report says so; the section is named by the library path given to `--driver`.
#[test]
fn a_drivers_deadline_from_the_file_is_used() {
    let home = Home::new("deadline");
    let driver = fault_driver().display().to_string();
    home.write(&home.user(), &format!("[driver.\"{driver}\"]\ndeadline_other_ms = 1500\n"));
    let started = std::time::Instant::now();
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", "60"]).arg(cloister()).args([
        "run",
        "--driver",
        &driver,
        "--profile",
        "pocl",
        "--",
        "true",
    ]);
    cmd.env("HOME", &home.0)
        .env("XDG_CONFIG_HOME", home.0.join("config"))
        .env("XDG_STATE_HOME", home.0.join("state"))
        .env("XDG_CACHE_HOME", home.0.join("cache"))
        .env("CLOISTER_SYSTEM_CONFIG", home.system())
        .env("CLOISTER_FAULT", "init:hang")
        .env_remove("CLOISTER_DEADLINE_OTHER_MS")
        .env_remove("CLOISTER_SOCKET");
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}:\n{t}", started.elapsed());
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("Initialize") && t.contains("1500"), "{t}");
}
