//! What a build reads and what a kernel prints: `#include` and `-I` find the application's own
//! headers (which the caged driver cannot open), and kernel `printf` output reaches the
//! application's stdout in order with its own, whichever broker started the worker.

use cloister_tests::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn header_dir(tag: &str, val: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cloister-inc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("inc")).unwrap();
    std::fs::write(dir.join("inc/inc.h"), format!("#define VAL {val}\n")).unwrap();
    dir
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run the client");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn includes_resolve_to_the_applications_files_and_printf_keeps_its_order() {
    let exe = c_client("printf_include");
    let dir = header_dir("run", 7);
    for (cwd, opts) in
        [(dir.clone(), "-I inc"), (dir.join("inc"), ""), (PathBuf::from("/"), &*format!("-I{}/inc", dir.display()))]
    {
        let direct = run(Command::new(&exe).current_dir(&cwd).env("OPTS", opts));
        let caged = run(Command::new(cloister()).arg("run").arg("--").arg(&exe).current_dir(&cwd).env("OPTS", opts));
        assert!(direct.contains("kernel line 27"), "direct, in {}: {direct}", cwd.display());
        assert_eq!(direct, caged, "in {} with {opts:?}", cwd.display());
    }
    // A header the application edits between builds is read afresh.
    std::fs::write(dir.join("inc/inc.h"), "#define VAL 8\n").unwrap();
    let caged = run(Command::new(cloister()).args(["run", "--"]).arg(&exe).current_dir(&dir).env("OPTS", "-I inc"));
    assert!(caged.contains("kernel line 28"), "{caged}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A header with an error: the build log names the application's header (by its absolute path,
/// where the driver saw `-I inc` relative to the working folder), never the worker's copy of it.
#[test]
fn a_build_log_names_the_applications_headers() {
    let exe = c_client("printf_include");
    let dir = header_dir("log", 3);
    std::fs::write(dir.join("inc/inc.h"), "#define VAL 3\nint broken(;\n").unwrap();
    let direct = text(&Command::new(&exe).current_dir(&dir).env("OPTS", "-I inc").output().unwrap());
    let out = Command::new(cloister()).args(["run", "--"]).arg(&exe).current_dir(&dir).env("OPTS", "-I inc").output();
    let caged = text(&out.unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(direct.contains("build failed -11") && direct.contains("inc/inc.h:2:"), "{direct}");
    let header = format!("{}/inc/inc.h:2:", dir.display());
    assert!(caged.contains("build failed -11") && caged.contains(&header), "{caged}");
    assert!(!caged.contains("cloister-includes"), "the log names the worker's copy:\n{caged}");
}

/// `#include "/abs/path.h"`, also from inside a header: the caged driver may not open the
/// application's files, yet the build finds them, and the program's source reads back as the
/// application wrote it.
#[test]
fn absolute_includes_resolve_and_the_source_reads_back_unchanged() {
    let exe = c_client("printf_include");
    let dir = header_dir("abs", 5);
    let inner = dir.join("inc/inc.h");
    let outer = dir.join("outer.h");
    std::fs::write(&outer, format!("#include \"{}\"\n", inner.display())).unwrap();
    for header in [&inner, &outer] {
        let include = header.to_string_lossy();
        let direct = run(Command::new(&exe).current_dir("/").env("INCLUDE", &*include));
        let caged =
            run(Command::new(cloister()).args(["run", "--"]).arg(&exe).current_dir("/").env("INCLUDE", &*include));
        assert!(direct.contains("source read back as written") && direct.contains("kernel line 25"), "{direct}");
        assert_eq!(direct, caged, "including {include}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn printf_reaches_the_application_through_a_shared_broker() {
    let exe = c_client("printf_include");
    let dir = header_dir("broker", 7);
    let runtime = std::env::temp_dir().join(format!("cloister-rt-printf-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    // The broker's own output goes nowhere: the worker must write to the application's.
    let mut broker = Command::new(cloister())
        .arg("broker")
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cloister broker");
    let socket = runtime.join("cloister/broker.sock");
    wait_for_path(&socket, std::time::Duration::from_millis(5000));
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    let out = run(Command::new(&exe)
        .current_dir(&dir)
        .env("OPTS", "-I inc")
        .env("OCL_ICD_VENDORS", &vendors)
        .env("XDG_RUNTIME_DIR", &runtime));
    let _ = broker.kill();
    let _ = broker.wait();
    let lines: Vec<&str> = out.lines().skip_while(|l| l.starts_with("build options")).collect();
    let want = ["host before 0", "kernel line 7", "host after 0", "host before 1", "kernel line 17", "host after 1"];
    assert_eq!(&lines[..want.len()], want, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&runtime);
}

/// A header named by a macro built from a `-D` folder (hashcat's `#include
/// M2S(INCLUDE_PATH/inc_vendor.h)` with `-D INCLUDE_PATH=...`), and the header it includes in
/// turn, reach the caged driver: the build gives the same result directly and caged.
#[test]
fn a_header_named_by_a_macro_from_a_define_folder_is_found() {
    let exe = c_client("macro_include");
    let dir = std::env::temp_dir().join(format!("cloister-macro-inc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("inc_val.h"), "#include \"inc_more.h\"\n#define VAL 41\n").unwrap();
    std::fs::write(dir.join("inc_more.h"), "#define MORE 1\n").unwrap();
    let arg = dir.to_str().unwrap();
    let d = direct(&exe, &[arg], &[]);
    assert_eq!(String::from_utf8_lossy(&d.stdout), "kernel computed 42\n", "{}", text(&d));
    let c = caged(&[], &exe, &[arg], &[]);
    assert_eq!(String::from_utf8_lossy(&c.stdout), "kernel computed 42\n", "{}", text(&c));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-I"/path"` with literal quotes: pocl 3.1 directly refuses the build (the quotes reach clang),
/// caged the shim strips them and the build works. A difference the README lists; this test
/// says when it no longer holds.
#[test]
fn quoted_include_folders_are_the_documented_difference() {
    let exe = c_client("printf_include");
    let dir = header_dir("quoted", 9);
    let opts = format!("-I\"{}/inc\"", dir.display());
    let d = Command::new(&exe).current_dir("/").env("OPTS", &opts).output().unwrap();
    assert!(!d.status.success(), "pocl now takes quoted -I folders directly: update the README\n{}", text(&d));
    let caged = run(Command::new(cloister()).args(["run", "--"]).arg(&exe).current_dir("/").env("OPTS", &opts));
    assert!(caged.contains("kernel line 29"), "{caged}");
    let _ = std::fs::remove_dir_all(&dir);
}
