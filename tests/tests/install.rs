//! `cloister install` end to end: after `install --system` (as root) or `install --user` (as a
//! created unprivileged user), a plain `clinfo` (no `cloister run`) lists the pocl platform once,
//! caged, and a pyopencl program computes through the cage without pocl in its process;
//! `uninstall` puts every file back as it was; a driver `.icd` put back by a "package upgrade"
//! is warned about and hidden again by a second install.
//!
//! A system install changes /etc, /usr/local and /var/lib (the dpkg diversions), which other
//! tests running at the same time use: each of these tests runs again (the `#[ignore]`d `inner_`
//! test of the same name) in a private mount namespace where those three are overlays on a
//! temporary folder (`unshare --mount` + overlayfs), so nothing outside sees the change and
//! nothing is left behind even if the test fails half way. The created user exists only there
//! too (useradd writes the overlaid /etc/passwd).
//!
//! `cargo install --path broker` is a full release build (minutes): that test is `#[ignore]`d
//! and run by scripts/test.sh as a separate step.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cloister_tests::{cloister, text, workspace_root};

/// Set (to the parent's pid) for the run inside the private namespace.
const NAMESPACE_ENV: &str = "CLOISTER_INSTALL_TEST_NAMESPACE";
const TEST_USER: &str = "cloister-install-test";

/// pyopencl through the platform the loader gives: exactly one, cloister's (its extension), a
/// kernel's results checked, and no pocl library mapped in this process (the driver runs in the
/// worker, not here).
const PYOPENCL_CHECK: &str = r#"
import pyopencl as cl, numpy as np
ps = cl.get_platforms()
assert len(ps) == 1, [p.name for p in ps]
assert "cl_cloister_sandbox" in ps[0].extensions, ps[0].extensions
ctx = cl.Context(ps[0].get_devices())
q = cl.CommandQueue(ctx)
a = np.arange(4096, dtype=np.float32)
mf = cl.mem_flags
src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
dst = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
k = "__kernel void k(__global const float *a, __global float *o) { int i = get_global_id(0); o[i] = a[i] * 3.0f + 1.0f; }"
cl.Program(ctx, k).build().k(q, a.shape, None, src, dst)
r = np.empty_like(a)
cl.enqueue_copy(q, r, dst)
assert (r == a * 3 + 1).all()
maps = open("/proc/self/maps").read()
assert "libcloister" in maps and "libpocl" not in maps, "pocl loaded in the application"
print("pyopencl-ok", ps[0].name)
"#;

/// Runs the `inner_NAME` test of this binary in a private mount namespace with /etc,
/// /usr/local and /var/lib overlaid, and fails with its output if it does.
fn in_private_namespace(name: &str) {
    cloister(); // built before, outside: the inner run only uses it
    let tmp = tempdir(&format!("ns-{name}"));
    let setup = r#"set -e
t="$1"; shift
for d in /etc /usr/local /var/lib; do
    n=$(echo "$d" | tr / _)
    mkdir -p "$t/$n.upper" "$t/$n.work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$t/$n.upper,workdir=$t/$n.work" "$d"
done
exec "$@""#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", setup, "sh"])
        .arg(&tmp)
        .arg(std::env::current_exe().expect("own test binary"))
        .args(["--exact", &format!("inner_{name}"), "--ignored", "--nocapture", "--test-threads=1"])
        .env(NAMESPACE_ENV, std::process::id().to_string())
        .output()
        .expect("cannot run unshare (util-linux)");
    let shown = text(&out);
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(out.status.success(), "{name} in a private mount namespace failed:\n{shown}");
    assert!(shown.contains("1 passed"), "inner_{name} did not run:\n{shown}");
}

/// The inner tests change /etc: refuse to run anywhere but in the namespace made above.
fn assert_in_private_namespace() {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("mount namespace");
    assert!(
        std::env::var_os(NAMESPACE_ENV).is_some_and(|p| ns(&p.to_string_lossy()) != ns("self")),
        "this test changes /etc and runs only inside the private mount namespace its outer test makes"
    );
}

fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cloister-install-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary folder");
    dir
}

/// A command with a clean environment of a session: PATH, HOME, a private XDG_RUNTIME_DIR (no
/// broker of another test found there), and `env`.
fn session(program: &str, home: &Path, runtime: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", home)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("LANG", "C.UTF-8");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn ok(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}", out.status, text(&out));
    out
}

/// The platforms `clinfo -l` lists.
fn platforms(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("Platform #")).map(String::from).collect()
}

/// Plain clinfo: exactly one platform, pocl's, through cloister (the extension the cage adds).
fn assert_clinfo_once_caged(cmd: impl Fn(&[&str]) -> Command) {
    let listed = ok(cmd(&["-l"]));
    let names = platforms(&listed);
    assert_eq!(names.len(), 1, "clinfo should list one platform:\n{}", text(&listed));
    assert!(names[0].contains("Portable Computing Language"), "{names:?}");
    let full = ok(cmd(&[]));
    let ext: Vec<String> = String::from_utf8_lossy(&full.stdout)
        .lines()
        .filter(|l| l.trim_start().strip_prefix("Platform Extensions").is_some_and(|rest| rest.starts_with("  ")))
        .map(String::from)
        .collect();
    assert!(
        ext.len() == 1 && ext[0].contains("cl_cloister_sandbox"),
        "the platform is not the caged one: {ext:?}\n{}",
        text(&full)
    );
}

/// Every file under `roots` (path -> type, mode, bytes or link target): what must be the same
/// before install and after uninstall.
fn snapshot(roots: &[&str]) -> BTreeMap<PathBuf, String> {
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(m) = std::fs::symlink_metadata(p) else { return };
        let kind = if m.file_type().is_symlink() {
            format!("link {}", std::fs::read_link(p).unwrap().display())
        } else if m.is_dir() {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                walk(&e.path(), out);
            }
            "dir".into()
        } else {
            format!("file {:x} {}", std::fs::read(p).map(|b| fnv(&b)).unwrap_or(0), m.len())
        };
        out.insert(p.to_path_buf(), format!("{kind} mode {:o} uid {}", m.mode() & 0o7777, m.uid()));
    }
    let mut out = BTreeMap::new();
    for r in roots {
        walk(Path::new(r), &mut out);
    }
    out
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

fn assert_same(before: &BTreeMap<PathBuf, String>, after: &BTreeMap<PathBuf, String>) {
    let changed: Vec<String> = before
        .iter()
        .filter(|(p, v)| after.get(*p) != Some(v))
        .map(|(p, v)| format!("{}: {v} -> {:?}", p.display(), after.get(p)))
        .chain(after.keys().filter(|p| !before.contains_key(*p)).map(|p| format!("{}: left behind", p.display())))
        .collect();
    assert!(changed.is_empty(), "uninstall did not restore everything:\n{}", changed.join("\n"));
}

#[test]
fn system_install_cages_every_application_and_uninstall_restores() {
    in_private_namespace("system_install_cages_every_application_and_uninstall_restores");
}

#[test]
#[ignore = "changes /etc: run by system_install_cages_every_application_and_uninstall_restores in a private namespace"]
fn inner_system_install_cages_every_application_and_uninstall_restores() {
    assert_in_private_namespace();
    let watched = [
        "/etc/OpenCL",
        "/etc/cloister",
        "/etc/systemd/user",
        "/usr/local/bin",
        "/usr/local/lib/cloister",
        "/var/lib/cloister",
        "/var/lib/dpkg/diversions",
    ];
    let before = snapshot(&watched);
    assert!(
        Path::new("/etc/OpenCL/vendors/pocl.icd").exists(),
        "pocl is not registered (scripts/setup.sh installs it)"
    );
    let home = tempdir("root-home");
    let runtime = tempdir("root-runtime");
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cmd = |program: &str| session(program, &home, &runtime, &[]);
    let clinfo = |args: &[&str]| {
        let mut c = cmd("clinfo");
        c.args(args);
        c
    };
    // Before: pocl alone, not caged.
    assert_eq!(platforms(&ok(clinfo(&["-l"]))).len(), 1);

    let mut install = cmd(cloister().to_str().unwrap());
    install.args(["install", "--system"]);
    let said = text(&ok(install));
    assert!(said.contains("hid driver pocl"), "{said}");
    assert_clinfo_once_caged(clinfo);
    let mut py = cmd("python3");
    py.args(["-c", PYOPENCL_CHECK]);
    assert!(text(&ok(py)).contains("pyopencl-ok"));
    // The installed pieces, and dpkg sending pocl's upgrades to the hidden registry.
    let unit = std::fs::read_to_string("/etc/systemd/user/cloister-broker.service").expect("the broker's unit");
    assert!(unit.contains("ExecStart=/usr/local/bin/cloister broker"), "{unit}");
    assert_eq!(
        std::fs::read_to_string("/etc/OpenCL/vendors/cloister.icd").unwrap().trim(),
        "/usr/local/lib/cloister/libcloister.so"
    );
    let mut truename = cmd("dpkg-divert");
    truename.args(["--truename", "/etc/OpenCL/vendors/pocl.icd"]);
    assert_eq!(String::from_utf8_lossy(&ok(truename).stdout).trim(), "/etc/cloister/vendors/pocl.icd");
    let mut drivers = cmd("/usr/local/bin/cloister");
    drivers.arg("drivers");
    assert!(String::from_utf8_lossy(&ok(drivers).stdout).starts_with("pocl\t"), "the installed cloister finds pocl");

    // A driver update that puts pocl.icd back: seen twice, said once, hidden again by install.
    let hidden = std::fs::read("/etc/cloister/vendors/pocl.icd").unwrap();
    std::fs::write("/etc/OpenCL/vendors/pocl.icd", &hidden).unwrap();
    let twice = ok(clinfo(&["-l"]));
    assert_eq!(platforms(&twice).len(), 2, "{}", text(&twice));
    let warned = String::from_utf8_lossy(&twice.stderr);
    assert_eq!(warned.matches("pocl.icd in /etc/OpenCL/vendors beside cloister.icd").count(), 1, "{warned}");
    assert!(warned.contains("cloister install --system"), "{warned}");
    let mut again = cmd("/usr/local/bin/cloister");
    again.args(["install", "--system"]);
    assert!(text(&ok(again)).contains("hid /etc/OpenCL/vendors/pocl.icd again"));
    let once = ok(clinfo(&["-l"]));
    assert!(!text(&once).contains("warning"), "{}", text(&once));
    assert_clinfo_once_caged(clinfo);

    let mut uninstall = cmd("/usr/local/bin/cloister");
    uninstall.arg("uninstall");
    ok(uninstall);
    assert_same(&before, &snapshot(&watched));
    let direct = ok(clinfo(&[]));
    assert!(!String::from_utf8_lossy(&direct.stdout).contains("cl_cloister_sandbox"), "still caged after uninstall");
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&runtime);
}

#[test]
fn user_install_cages_the_users_applications_and_uninstall_restores() {
    in_private_namespace("user_install_cages_the_users_applications_and_uninstall_restores");
}

#[test]
#[ignore = "creates a user: run by user_install_cages_the_users_applications_and_uninstall_restores in a private namespace"]
fn inner_user_install_cages_the_users_applications_and_uninstall_restores() {
    assert_in_private_namespace();
    let base = tempdir("user");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (home, runtime) = (base.join("home"), base.join("runtime"));
    let mut add = Command::new("useradd");
    add.args(["--no-create-home", "--shell", "/bin/bash", "--home-dir"]).arg(&home).arg(TEST_USER);
    if Command::new("id").arg(TEST_USER).output().map(|o| !o.status.success()).unwrap_or(true) {
        ok(add);
    }
    for d in [&home, &runtime] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        ok({
            let mut c = Command::new("chown");
            c.arg(format!("{TEST_USER}:")).arg(d);
            c
        });
    }
    // A profile of the user's own, which uninstall must give back exactly.
    let profile = home.join(".profile");
    let mine = "# the user's own profile\nexport EDITOR=vi";
    std::fs::write(&profile, mine).unwrap();
    ok({
        let mut c = Command::new("chown");
        c.arg(format!("{TEST_USER}:")).arg(&profile);
        c
    });
    let before = snapshot(&[home.to_str().unwrap()]);
    let as_user = |program: &str, env: &[(&str, &str)]| {
        let mut c = session("runuser", &home, &runtime, env);
        c.args(["-u", TEST_USER, "--", program]);
        c
    };

    let mut install = as_user(cloister().to_str().unwrap(), &[]);
    install.args(["install", "--user"]);
    ok(install);
    let env_file =
        std::fs::read_to_string(home.join(".config/environment.d/cloister.conf")).expect("environment.d file");
    let vendors = env_file.trim().strip_prefix("OCL_ICD_VENDORS=").expect("OCL_ICD_VENDORS in the environment file");
    assert_eq!(vendors, home.join(".local/share/cloister/vendors").to_str().unwrap());
    // A login shell gets the same from ~/.profile.
    let mut login = as_user("bash", &[]);
    login.args(["-l", "-c", "echo \"$OCL_ICD_VENDORS\""]);
    assert_eq!(String::from_utf8_lossy(&ok(login).stdout).trim(), vendors);
    let env = [("OCL_ICD_VENDORS", vendors)];
    assert_clinfo_once_caged(|args| {
        let mut c = as_user("clinfo", &env);
        c.args(args);
        c
    });
    let mut py = as_user("python3", &env);
    py.args(["-c", PYOPENCL_CHECK]);
    assert!(text(&ok(py)).contains("pyopencl-ok"));
    // The installed cloister, from the user's prefix, finds its pieces in ../lib/cloister.
    let mut info = as_user(home.join(".local/bin/cloister").to_str().unwrap(), &[]);
    info.args(["run", "--", "clinfo", "-l"]);
    assert_eq!(platforms(&ok(info)).len(), 1);
    assert!(home.join(".config/systemd/user/cloister-broker.service").exists());
    // Other users' drivers were not touched.
    assert!(Path::new("/etc/OpenCL/vendors/pocl.icd").exists());

    let mut uninstall = as_user(home.join(".local/bin/cloister").to_str().unwrap(), &[]);
    uninstall.arg("uninstall");
    ok(uninstall);
    assert_eq!(std::fs::read_to_string(&profile).unwrap(), mine);
    // What applications wrote meanwhile (caches, crash reports) is theirs; the rest is back.
    let after: BTreeMap<_, _> = snapshot(&[home.to_str().unwrap()])
        .into_iter()
        .filter(|(p, _)| !p.starts_with(home.join(".cache")) && !p.starts_with(home.join(".local/state")))
        .collect();
    assert_same(&before, &after);
    let _ = std::fs::remove_dir_all(&base);
}

/// `cargo install --path broker` alone gives a working cloister: the shim and worker come from
/// the copies embedded in the binary, unpacked into a private folder of the user.
#[test]
#[ignore = "a release build of the workspace (minutes): scripts/test.sh runs it as its own step"]
fn cargo_install_gives_a_working_cloister() {
    let root = tempdir("cargo-root");
    let home = tempdir("cargo-home");
    let runtime = tempdir("cargo-runtime");
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A target folder of its own that lasts between runs: later runs are incremental.
    let target = workspace_root().join("target/cargo-install-test");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(workspace_root())
        .args(["install", "--locked", "--quiet", "--path", "broker", "--root"])
        .arg(&root)
        .arg("--target-dir")
        .arg(&target);
    ok(build);
    let bin = root.join("bin/cloister");
    assert!(!root.join("bin/libcloister.so").exists() && !root.join("bin/cloister-worker").exists());
    let mut run = session(bin.to_str().unwrap(), &home, &runtime, &[]);
    run.args(["run", "--", "clinfo"]);
    let out = ok(run);
    assert!(String::from_utf8_lossy(&out.stdout).contains("cl_cloister_sandbox"), "{}", text(&out));
    let unpacked: Vec<PathBuf> = std::fs::read_dir(home.join(".local/lib/cloister/embedded"))
        .expect("the pieces are unpacked under ~/.local/lib/cloister/embedded")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(unpacked.len(), 1, "{unpacked:?}");
    assert_eq!(std::fs::metadata(&unpacked[0]).unwrap().mode() & 0o777, 0o700);
    assert!(unpacked[0].join("libcloister.so").exists() && unpacked[0].join("cloister-worker").exists());
    // A plain application started without `cloister run` finds its broker through the `cloister`
    // linked beside the unpacked shim.
    let vendors = tempdir("cargo-vendors");
    std::fs::write(vendors.join("cloister.icd"), format!("{}\n", unpacked[0].join("libcloister.so").display()))
        .unwrap();
    let mut plain = session("clinfo", &home, &runtime, &[("OCL_ICD_VENDORS", vendors.to_str().unwrap())]);
    plain.arg("-l");
    assert_eq!(platforms(&ok(plain)).len(), 1);
    for d in [root, home, runtime, vendors] {
        let _ = std::fs::remove_dir_all(d);
    }
}
