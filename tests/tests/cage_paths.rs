//! Issue 11, classes 8 to 10: another local user cannot plant a driver or pose as the broker,
//! a hostile driver cannot lie in crash reports or the terminal, and cannot poison later runs
//! through the cache. The cross-user cases need root (CI runs as root): the victim runs as an
//! unprivileged user made for the purpose, the attacker is root.

use cloister_tests::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const USER: &str = "cloistertest";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The unprivileged test user's uid and gid, created once if missing.
fn victim() -> (u32, u32) {
    static ONCE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        let id = |flag: &str| Command::new("id").args([flag, USER]).output().ok().filter(|o| o.status.success());
        if id("-u").is_none() {
            let out = Command::new("useradd").args(["-M", "-r", "-s", "/usr/sbin/nologin", USER]).output().unwrap();
            assert!(out.status.success() || id("-u").is_some(), "useradd: {}", text(&out));
        }
        let num = |flag: &str| String::from_utf8_lossy(&id(flag).unwrap().stdout).trim().parse::<u32>().unwrap();
        (num("-u"), num("-g"))
    })
}

fn tmp_dir(tag: &str, mode: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cloister-paths-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

fn chown(p: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

/// `program args` as the test user, with a clean environment but for `env`; the command first
/// sleeps `delay` in a shell that then execs it (same pid), so the attacker can prepare paths
/// named after that pid.
fn as_victim(program: &Path, args: &[&str], env: &[(&str, &str)], delay: &str) -> std::process::Child {
    let (uid, gid) = victim();
    let mut cmd = Command::new("/usr/bin/setpriv");
    cmd.args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--clear-groups", "--"])
        .args(["/bin/sh", "-c", &format!("sleep {delay}; exec \"$0\" \"$@\"")])
        .arg(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("setpriv")
}

fn victim_home() -> PathBuf {
    let home = tmp_dir("home", 0o700);
    chown(&home, victim());
    home
}

#[test]
fn a_driver_planted_in_the_run_folder_by_another_user_is_never_loaded() {
    if !is_root() {
        eprintln!("skipped: needs root to act as two users");
        return;
    }
    let exe = c_client("survivor");
    let cloister = cloister();
    let loot = tmp_dir("loot", 0o777);
    let planted = loot.join("evil.so");
    std::fs::copy(fault_driver(), &planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = loot.join("loaded");
    let home = victim_home();
    let child = as_victim(
        &cloister,
        &["run", "--driver", "pocl", "--", exe.to_str().unwrap()],
        &[
            ("HOME", home.to_str().unwrap()),
            ("CLOISTER_FAULT", "init:writeout"),
            ("CLOISTER_FAULT_FILE", marker.to_str().unwrap()),
        ],
        "1",
    );
    // The attacker (root here, any other user in life) prepares the folder `cloister run` used
    // to take without XDG_RUNTIME_DIR: writable by the victim, sticky so the victim cannot
    // clear it, with a registry naming the attacker's driver.
    let dir = std::env::temp_dir().join(format!("cloister-{}", child.id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["", "vendors", "direct-vendors", "lib"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    std::fs::write(dir.join("vendors/evil.icd"), format!("{}\n", planted.display())).unwrap();
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    let loaded = marker.exists();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&loot);
    let _ = std::fs::remove_dir_all(&home);
    assert!(!loaded, "the victim's application loaded the driver another user planted:\n{t}");
    assert!(out.status.success() && t.contains("completed without fault"), "{t}");
}

/// A fake broker: a socket another user listens on; counts what clients send it.
struct FakeBroker {
    path: PathBuf,
    got: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeBroker {
    fn listen(path: &Path) -> Self {
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        for d in dir.ancestors().take_while(|d| d.starts_with(std::env::temp_dir()) && *d != std::env::temp_dir()) {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let _ = std::fs::remove_file(path);
        let listener = cloister_ipc::channel::listen_seqpacket(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        // SAFETY: making our own socket non-blocking.
        unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let got = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Acquire) {
                // SAFETY: accept on our listening socket.
                let fd = unsafe { libc::accept(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
                if fd < 0 {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                // SAFETY: a fresh connection fd.
                let conn = unsafe { OwnedFd::from_raw_fd(fd) };
                let tv = libc::timeval { tv_sec: 3, tv_usec: 0 };
                let mut buf = vec![0u8; 65536];
                // SAFETY: a valid timeval and buffer for our own socket.
                let n = unsafe {
                    libc::setsockopt(
                        conn.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_RCVTIMEO,
                        (&tv as *const libc::timeval).cast(),
                        std::mem::size_of::<libc::timeval>() as u32,
                    );
                    libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                };
                if n > 0 {
                    g.fetch_add(n as usize, std::sync::atomic::Ordering::AcqRel);
                }
            }
        });
        Self { path: path.to_path_buf(), got, stop, thread: Some(thread) }
    }

    fn received(&self) -> usize {
        self.got.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn the_shim_never_talks_to_a_broker_of_another_user() {
    if !is_root() {
        eprintln!("skipped: needs root to act as two users");
        return;
    }
    let exe = c_client("survivor");
    ensure_built();
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    let (uid, _) = victim();
    let home = victim_home();
    let env = [("OCL_ICD_VENDORS", vendors.to_str().unwrap()), ("HOME", home.to_str().unwrap())];
    // Where the shim looks for a per-user broker without XDG_RUNTIME_DIR, and where it used to
    // start its private one.
    let user_dir = std::env::temp_dir().join(format!("cloister-{uid}"));
    let _ = std::fs::remove_dir_all(&user_dir);
    let user = FakeBroker::listen(&user_dir.join("cloister/broker.sock"));
    let child = as_victim(&exe, &[], &env, "1");
    let private =
        FakeBroker::listen(&std::env::temp_dir().join(format!("cloister-private-{}", child.id())).join("broker.sock"));
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(user.received(), 0, "the application greeted another user's broker at the per-user path:\n{t}");
    assert_eq!(private.received(), 0, "the application greeted another user's broker at the private path:\n{t}");
    assert!(t.contains("ignoring the broker socket"), "the refusal is said: {t}");
    assert!(out.status.success() && t.contains("completed without fault"), "{t}");

    // Named outright by CLOISTER_SOCKET: refused by its credentials, nothing sent.
    let named = FakeBroker::listen(&std::env::temp_dir().join(format!("cloister-fake-{}/b.sock", std::process::id())));
    let sock = named.path.to_str().unwrap().to_string();
    let out = as_victim(&exe, &[], &[env[0], env[1], ("CLOISTER_SOCKET", &sock)], "0").wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(named.received(), 0, "the application greeted another user's broker named by CLOISTER_SOCKET:\n{t}");
    assert!(t.contains("runs as uid 0, not as this user"), "{t}");
    drop((user, private, named));
    let _ = std::fs::remove_dir_all(&user_dir);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn without_home_the_worker_cache_is_private_to_the_user() {
    if !is_root() {
        eprintln!("skipped: needs root to act as two users");
        return;
    }
    let exe = c_client("survivor");
    let driver = fault_driver();
    let (uid, _) = victim();
    let out = as_victim(
        &cloister(),
        &["run", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--", exe.to_str().unwrap()],
        &[("CLOISTER_FAULT", "init:whereami")],
        "0",
    )
    .wait_with_output()
    .unwrap();
    let t = text(&out);
    assert!(out.status.success() && t.contains("completed without fault"), "{t}");
    let home = t.lines().find_map(|l| l.strip_prefix("faultcl: home=")).unwrap_or_else(|| panic!("no home: {t}"));
    let home = Path::new(home);
    assert!(!home.starts_with("/tmp/cloister/"), "a cache folder shared by all users: {}", home.display());
    for dir in [home, home.parent().unwrap(), home.parent().unwrap().parent().unwrap()] {
        let m = std::fs::symlink_metadata(dir).unwrap();
        assert_eq!(m.uid(), uid, "{} belongs to the user", dir.display());
        assert_eq!(m.mode() & 0o777, 0o700, "{} is private", dir.display());
    }
}

#[test]
fn crash_reports_say_what_the_broker_saw_and_escape_what_the_worker_wrote() {
    let state = tmp_dir("state", 0o755);
    let exe = c_client("survivor");
    let env = [
        ("CLOISTER_FAULT", "build:forge-report"),
        ("CLOISTER_RECOVERY", "report"),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
    ];
    let run = caged_on_faultcl(&exe, &[], &env);
    let t = text(&run);
    assert!(run.status.success(), "{t}");
    let raw = |s: &str| s.chars().any(|c| c.is_control() && c != '\n');
    assert!(!raw(&t), "the broker's line carries raw control characters: {t:?}");
    let crashes = |args: &[&str]| {
        let o = Command::new(cloister()).arg("crashes").args(args).env("XDG_STATE_HOME", &state).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let shown = crashes(&["show", "latest"]);
    let listed = crashes(&[]);
    assert!(!raw(&shown), "`crashes show` prints the worker's escape sequences: {shown:?}");
    assert!(!raw(&listed), "`crashes` prints the worker's escape sequences: {listed:?}");
    assert!(shown.contains("cause:     killed by signal 11 (SIGSEGV)"), "the real cause: {shown}");
    assert!(!shown.contains("hung in") && !shown.contains("seccomp trapped the"), "a forged cause: {shown}");
    assert!(shown.contains("reported by the worker (untrusted)"), "{shown}");
    assert!(shown.contains("\\u{1b}[2J"), "the worker's text is shown, escaped: {shown}");
    let dir = state.join("cloister/crashes");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "the reports' folder");
    assert_eq!(mode(&state.join("cloister")), 0o700, "the reports' parent folder");
    for e in std::fs::read_dir(&dir).unwrap() {
        assert_eq!(mode(&e.unwrap().path()), 0o600, "a report");
    }
    let _ = std::fs::remove_dir_all(&state);
}

fn caged_in(cwd: &Path, program: &Path, env: &[(&str, &str)]) -> Output {
    let driver = fault_driver();
    let mut cmd = Command::new(cloister());
    cmd.args(["run", "--driver", driver.to_str().unwrap(), "--profile", "pocl", "--"]).arg(program).current_dir(cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_driver_cannot_change_the_headers_of_later_builds() {
    let cache = tmp_dir("cache-headers", 0o700);
    let dir = tmp_dir("headers", 0o755);
    std::fs::create_dir_all(dir.join("inc")).unwrap();
    std::fs::write(dir.join("inc/inc.h"), "#define VAL 7\n").unwrap();
    let exe = c_client("printf_include");
    let c = cache.to_str().unwrap();
    // After its build, the driver rewrites every staged header in its cache.
    let first =
        caged_in(&dir, &exe, &[("XDG_CACHE_HOME", c), ("OPTS", "-I inc"), ("CLOISTER_FAULT", "finish:poison-headers")]);
    assert!(text(&first).contains("faultcl: poison-headers succeeded"), "{}", text(&first));
    assert!(String::from_utf8_lossy(&first.stdout).contains("kernel line 7"), "{}", text(&first));
    // The next application with the same headers builds against them, not the driver's.
    let second = caged_in(&dir, &exe, &[("XDG_CACHE_HOME", c), ("OPTS", "-I inc")]);
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{}", text(&second));
    assert!(out.contains("kernel line 7") && !out.contains("kernel line 66"), "poisoned headers were used: {out}");
    let _ = std::fs::remove_dir_all(&cache);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_driver_that_replaces_its_tmp_with_a_file_does_not_stop_later_workers() {
    let cache = tmp_dir("cache-tmp", 0o700);
    let exe = c_client("survivor");
    let c = cache.to_str().unwrap();
    let started = Instant::now();
    let first = caged_in(Path::new("/"), &exe, &[("XDG_CACHE_HOME", c), ("CLOISTER_FAULT", "finish:tmp-file")]);
    assert!(text(&first).contains("faultcl: tmp-file succeeded"), "{}", text(&first));
    let second = caged_in(Path::new("/"), &exe, &[("XDG_CACHE_HOME", c)]);
    let t = text(&second);
    assert!(second.status.success() && t.contains("completed without fault"), "the next worker did not start: {t}");
    assert!(started.elapsed() < Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&cache);
}
