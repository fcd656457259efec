//! Test harness: builds cloister and the C clients once per test process, and runs programs
//! directly on the driver and through `cloister run`, as real processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("debug")
}

/// Builds the binaries the tests drive (cargo test builds only test targets).
pub fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace_root())
            .args([
                "build",
                "-q",
                "-p",
                "cloister-broker",
                "-p",
                "cloister-worker",
                "-p",
                "cloister-shim",
                "-p",
                "cloister-fault-driver",
            ])
            .status()
            .expect("cannot run cargo build");
        assert!(status.success(), "cargo build of the cloister binaries failed");
    });
}

pub fn cloister() -> PathBuf {
    ensure_built();
    target_dir().join("cloister")
}

pub fn fault_driver() -> PathBuf {
    ensure_built();
    target_dir().join("libfaultcl.so")
}

/// Compiles `tests/c/NAME.c` against the system's `-lOpenCL` (once per process).
pub fn c_client(name: &str) -> PathBuf {
    c_program(&workspace_root().join("tests/c").join(format!("{name}.c")))
}

/// Compiles a C source file of the workspace against the system's `-lOpenCL`.
pub fn c_program(src: &Path) -> PathBuf {
    let name = src.file_stem().expect("a C file").to_string_lossy().into_owned();
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out_dir = target_dir().join("c-clients");
    std::fs::create_dir_all(&out_dir).expect("create c-clients dir");
    let exe = out_dir.join(&name);
    // Newer than the source and than every header beside it (`check.h`, `replay_common.h`).
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let headers = src.parent().and_then(|d| std::fs::read_dir(d).ok()).into_iter().flatten().flatten();
    let newest = headers.map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "h")).map(|p| modified(&p));
    let fresh = newest.chain([modified(src)]).all(|m| modified(&exe) >= m);
    if !fresh || !exe.exists() {
        // Tests run in processes of their own (nextest): each compiles into a file of its own and
        // renames it into place, so none runs a binary another is still writing (one test failed
        // so, at once, while another compiled the same client).
        let partial = out_dir.join(format!(".{name}.{}", std::process::id()));
        let out = Command::new("cc")
            .arg("-O1")
            .arg("-Wno-deprecated-declarations")
            .arg(src)
            .arg("-o")
            .arg(&partial)
            .args(["-lOpenCL", "-lpthread"])
            .output()
            .expect("cannot run cc");
        assert!(out.status.success(), "compiling {}: {}", src.display(), String::from_utf8_lossy(&out.stderr));
        std::fs::rename(&partial, &exe).expect("move the compiled client into place");
    }
    exe
}

/// A one-driver ICD registry naming `library`, for running a driver directly.
pub fn vendors_dir_for(library: &Path) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cloister-test-vendors-{}-{}",
        std::process::id(),
        library.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&dir).expect("create vendors dir");
    std::fs::write(dir.join("driver.icd"), format!("{}\n", library.display())).expect("write icd");
    dir
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs `program` directly on the system's drivers.
pub fn direct(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args).env_remove("CLOISTER_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

/// Runs `program` through `cloister run [cloister_args] --`.
pub fn caged(cloister_args: &[&str], program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(cloister());
    cmd.arg("run").args(cloister_args).arg("--").arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run cloister")
}

/// Waits up to `limit` for `path` to appear (a broker's socket, once it listens); says whether
/// it did.
/// Runs `program` caged on `libfaultcl.so` (pocl, misbehaving where `CLOISTER_FAULT` in `env`
/// says), with the pocl profile.
pub fn caged_on_faultcl(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let driver = fault_driver();
    caged(&["--driver", driver.to_str().unwrap(), "--profile", "pocl"], program, args, env)
}

pub fn wait_for_path(path: &Path, limit: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + limit;
    while !path.exists() {
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}
