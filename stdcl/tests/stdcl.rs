//! libstdcl end to end: C programs written against `stdcl.h`, compiled with plain
//! `cc prog.c -I stdcl/include -lstdcl`, run directly on pocl and under `cloister run`, with the
//! same output both ways. The programs are in `tests/c/`; each prints one "ok"/"FAIL" line per
//! finding and exits non-zero on a failure.

use cloister_tests::{cloister, ensure_built, target_dir, text, workspace_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Two CPU devices from pocl (this pocl names its CPU driver "pthread").
const TWO_DEVICES: (&str, &str) = ("POCL_DEVICES", "pthread pthread");

/// Builds libstdcl and stdcl-clld (and, through the harness, cloister) once per process.
fn built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        ensure_built();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .current_dir(workspace_root())
            .args(["build", "-q", "-p", "cloister-stdcl"])
            .status()
            .expect("cannot run cargo build");
        assert!(st.success(), "cargo build -p cloister-stdcl failed");
    });
}

fn sources() -> PathBuf {
    workspace_root().join("stdcl/tests/c")
}

/// A fresh working folder for one test, holding the kernels and headers the programs open.
fn workdir(test: &str) -> PathBuf {
    built();
    let dir = target_dir().join("stdcl-tests").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create work dir");
    for e in std::fs::read_dir(sources()).expect("read tests/c").flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "cl" || x == "h") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).expect("copy kernel");
        }
    }
    dir
}

/// `cc tests/c/NAME.c EXTRA -I stdcl/include -L target/debug -lstdcl -lOpenCL` into `dir`.
fn compile(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let lib = target_dir();
    let out = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-Wno-deprecated-declarations"])
        .arg(sources().join(format!("{name}.c")))
        .args(extra)
        .arg("-I")
        .arg(workspace_root().join("stdcl/include"))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lstdcl", "-lOpenCL", "-o"])
        .arg(&exe)
        .output()
        .expect("cannot run cc");
    assert!(out.status.success(), "compiling {name}.c:\n{}", text(&out));
    exe
}

fn command(caged: bool, dir: &Path, exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = if caged {
        let mut c = Command::new(cloister());
        c.arg("run").arg("--").arg(exe);
        c
    } else {
        let mut c = Command::new(exe);
        c.env_remove("CLOISTER_SOCKET");
        c
    };
    cmd.args(args).current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn run(caged: bool, dir: &Path, exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(caged, dir, exe, args, env).output().expect("cannot run the program")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs directly and caged; both must succeed with the same standard output, which is returned.
fn both_ways(dir: &Path, exe: &Path, env: &[(&str, &str)]) -> String {
    let d = run(false, dir, exe, &[], env);
    assert!(d.status.success(), "direct run of {} failed:\n{}", exe.display(), text(&d));
    let c = run(true, dir, exe, &[], env);
    assert!(c.status.success(), "caged run of {} failed:\n{}", exe.display(), text(&c));
    assert_eq!(stdout(&d), stdout(&c), "direct and caged outputs differ");
    stdout(&c)
}

/// A test program of one function family: every finding "ok", directly and caged.
fn family(name: &str) -> String {
    let dir = workdir(name);
    let exe = compile(&dir, name, &[]);
    let out = both_ways(&dir, &exe, &[]);
    assert!(out.contains("\n0 failed\n") && !out.lines().any(|l| l.starts_with("FAIL")), "{out}");
    out
}

/// The sum the examples print: c[i] = 1.1f*i + 2.2f*i in single precision, summed in double.
fn expected_sum(n: u32) -> String {
    let s: f64 = (0..n).map(|i| (1.1f32 * i as f32 + 2.2f32 * i as f32) as f64).sum();
    format!("sum {s:.1}, 0 wrong")
}

#[test]
fn reference_example_forka_on_one_device_adds_vectors_directly_and_caged() {
    let dir = workdir("example_forka");
    let exe = compile(&dir, "example_forka", &[]);
    let out = both_ways(&dir, &exe, &[]);
    assert!(out.lines().any(|l| l == expected_sum(1024)), "{out}");
    assert!(out.contains("256 281.600006 563.200012 844.800049"), "{out}");
}

#[test]
fn reference_example_on_two_devices_adds_vectors_directly_and_caged() {
    let dir = workdir("example_two_devices");
    let exe = compile(&dir, "example_two_devices", &[]);
    let out = both_ways(&dir, &exe, &[TWO_DEVICES]);
    assert!(out.contains("devices 2\n"), "{out}");
    assert!(out.lines().any(|l| l == expected_sum(2048)), "{out}");
    // With one device the example says so and fails: it really uses two.
    let one = run(false, &dir, &exe, &[], &[]);
    assert!(!one.status.success() && stdout(&one).contains("need two devices, have 1"), "{}", text(&one));
}

#[test]
fn contexts_are_set_before_any_call_and_null_without_such_devices() {
    let out = family("contexts");
    // pocl has CPU devices only.
    assert!(out.contains("ok   stdgpu is NULL (0 GPUs)"), "{out}");
}

/// The same program linked with libstdcl.a: the constructor still sets the contexts.
#[test]
fn contexts_work_with_the_static_library() {
    let dir = workdir("contexts_static");
    let exe = dir.join("contexts");
    let out = Command::new("cc")
        .arg(sources().join("contexts.c"))
        .arg("-I")
        .arg(workspace_root().join("stdcl/include"))
        .arg(target_dir().join("libstdcl.a"))
        .args(["-lOpenCL", "-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cannot run cc");
    assert!(out.status.success(), "static link:\n{}", text(&out));
    let out = both_ways(&dir, &exe, &[]);
    assert!(out.contains("\n0 failed\n"), "{out}");
}

#[test]
fn loading_files_strings_lazy_nobuild_binaries_and_default_options() {
    let out = family("loading");
    assert!(out.contains("ok   -I the working folder (FROM_INCLUDE=4242)"), "{out}");
}

/// stdcl-clld embeds a source and a binary (made by the loading program) into an executable;
/// `clopen(cp, NULL, ...)` finds both.
#[test]
fn embedded_sources_and_binaries_load_with_clopen_null() {
    let dir = workdir("embedded");
    let loading = compile(&dir, "loading", &[]);
    let o = run(false, &dir, &loading, &[], &[]);
    assert!(o.status.success() && dir.join("bin_kern.bin").exists(), "{}", text(&o));
    let clld = Command::new(target_dir().join("stdcl-clld"))
        .current_dir(&dir)
        .args(["-o", "kernels.o", "scale.cl", "bin_kern.bin"])
        .output()
        .expect("run stdcl-clld");
    assert!(clld.status.success(), "stdcl-clld:\n{}", text(&clld));
    let exe = compile(&dir, "embedded", &[dir.join("kernels.o").to_str().unwrap()]);
    // The kernel files are gone: only the executable holds them.
    std::fs::remove_file(dir.join("scale.cl")).unwrap();
    std::fs::remove_file(dir.join("bin_kern.bin")).unwrap();
    let out = both_ways(&dir, &exe, &[]);
    assert!(out.contains("\n0 failed\n") && out.contains("x[7]=1014"), "{out}");
    // Without stdcl-clld's object nothing is embedded, and clopen(cp, NULL) says so.
    let bare = compile(&dir, "embedded", &[]);
    let o = run(false, &dir, &bare, &[], &[]);
    assert!(
        stdout(&o).contains("FAIL clopen(cp, NULL) loads the embedded programs: clopen: no CL programs are embedded"),
        "{}",
        text(&o)
    );
}

#[test]
fn memory_realloc_attach_detach_copy_and_control() {
    family("memory");
}

#[test]
fn clarg_set_takes_every_scalar_and_vector_type() {
    let out = family("args");
    for t in ["char", "ulong", "double", "uchar16", "int3", "long16", "float4", "double16"] {
        assert!(out.contains(&format!("ok   clarg_set {t:<8}")), "{t}: {out}");
    }
}

#[test]
fn fork_forka_flush_and_wait_flags() {
    family("fork");
}

#[test]
fn errors_return_failure_values_with_errno_and_messages() {
    family("errors");
}

/// The first line of `env`'s output under `env_vars`, checked to be the same caged.
fn contexts_with(dir: &Path, exe: &Path, env_vars: &[(&str, &str)]) -> String {
    let out = both_ways(dir, exe, env_vars);
    out.lines().next().unwrap_or_default().to_string()
}

/// Expects pocl's one CPU device (two with POCL_DEVICES), as CI has.
#[test]
fn environment_variables_shape_the_default_contexts() {
    let dir = workdir("env");
    let exe = compile(&dir, "env", &[]);
    let plain = contexts_with(&dir, &exe, &[]);
    assert_eq!(plain, "stddev 1 stdcpu 1 stdgpu NULL stdrpu NULL");
    assert_eq!(contexts_with(&dir, &exe, &[TWO_DEVICES]), "stddev 2 stdcpu 2 stdgpu NULL stdrpu NULL");
    assert_eq!(contexts_with(&dir, &exe, &[("STDCPU", "0")]), "stddev 1 stdcpu NULL stdgpu NULL stdrpu NULL");
    assert_eq!(
        contexts_with(&dir, &exe, &[("STDDEV", "0"), ("STDCPU", "1")]),
        "stddev NULL stdcpu 1 stdgpu NULL stdrpu NULL"
    );
    assert_eq!(
        contexts_with(&dir, &exe, &[TWO_DEVICES, ("STDCPU_MAX_NDEV", "1")]),
        "stddev 2 stdcpu 1 stdgpu NULL stdrpu NULL"
    );
    assert_eq!(
        contexts_with(&dir, &exe, &[("STDDEV_PLATFORM_NAME", "no such platform")]),
        "stddev NULL stdcpu 1 stdgpu NULL stdrpu NULL"
    );
    assert_eq!(
        contexts_with(&dir, &exe, &[("STDCPU_PLATFORM_NAME", "portable computing")]),
        "stddev 1 stdcpu 1 stdgpu NULL stdrpu NULL"
    );
}

/// Waits until a holder has printed its contexts (so it holds its locks).
fn wait_for_line(path: &Path) {
    let end = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(path).map(|s| !s.contains("stdcpu works")).unwrap_or(true) {
        assert!(Instant::now() < end, "the lock holder did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// STDCPU_LOCK: a process holding the only CPU device keeps a second process with the same lock
/// id off it (its stdcpu is NULL), not one with another id; the lock goes with the holder even
/// when it is killed.
#[test]
fn std_lock_gives_devices_to_one_process_and_dies_with_it() {
    let dir = workdir("lock");
    let exe = compile(&dir, "env", &[]);
    let id = format!("t{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
    for caged in [false, true] {
        let lock = [("STDCPU_LOCK", id.as_str()), ("STDCPU_MAX_NDEV", "1")];
        let log = dir.join(format!("holder-{caged}.out"));
        let go = dir.join("go");
        let _ = std::fs::remove_file(&go);
        let mut holder = command(caged, &dir, &exe, &["hold", go.to_str().unwrap()], &lock)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::null())
            .spawn()
            .expect("start holder");
        wait_for_line(&log);
        assert!(std::fs::read_to_string(&log).unwrap().starts_with("stddev 1 stdcpu 1 "), "holder has the device");
        let second = run(caged, &dir, &exe, &[], &lock);
        assert!(stdout(&second).starts_with("stddev 1 stdcpu NULL "), "same lock id: {}", text(&second));
        let other = run(caged, &dir, &exe, &[], &[("STDCPU_LOCK", "another-id"), ("STDCPU_MAX_NDEV", "1")]);
        assert!(stdout(&other).starts_with("stddev 1 stdcpu 1 "), "another lock id: {}", text(&other));
        if caged {
            std::fs::write(&go, "").unwrap();
            assert!(holder.wait().unwrap().success());
        } else {
            holder.kill().unwrap();
            let _ = holder.wait();
        }
        let after = run(caged, &dir, &exe, &[], &lock);
        assert!(stdout(&after).starts_with("stddev 1 stdcpu 1 "), "after the holder ended: {}", text(&after));
    }
}

/// A lock folder that is a symlink (planted by someone) is refused, not followed: the context is
/// NULL and clerror() says why.
#[test]
fn std_lock_refuses_a_planted_lock_folder() {
    let dir = workdir("lock_planted");
    let exe = compile(&dir, "env", &[]);
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&dir, runtime.join("stdcl")).unwrap();
    let rt = runtime.to_str().unwrap();
    let out = both_ways(&dir, &exe, &[("XDG_RUNTIME_DIR", rt), ("STDCPU_LOCK", "planted")]);
    assert!(out.starts_with("stddev 1 stdcpu NULL "), "{out}");
    assert!(out.contains("why: stdcl_init: lock folder ") && out.contains("(refusing it)"), "{out}");
    assert!(!dir.join("STDCPU-planted-0.lock").exists(), "nothing was created through the link");
}
