//! Finding a broker: `CLOISTER_SOCKET`, else the per-user `cloister broker`, else a private
//! broker the shim starts itself. A broker serves its own user only (SO_PEERCRED).

use cloister_tests::*;
use std::process::{Command, Stdio};

fn cloister_only_registry() -> std::path::PathBuf {
    ensure_built();
    vendors_dir_for(&target_dir().join("libcloister.so"))
}

#[test]
fn the_shim_starts_a_private_broker_when_none_runs() {
    let exe = c_client("survivor");
    let runtime = std::env::temp_dir().join(format!("cloister-rt-private-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    let vendors = cloister_only_registry();
    let out = direct(
        &exe,
        &[],
        &[("OCL_ICD_VENDORS", vendors.to_str().unwrap()), ("XDG_RUNTIME_DIR", runtime.to_str().unwrap())],
    );
    let t = text(&out);
    assert!(out.status.success() && t.contains("completed without fault"), "{t}");
    let _ = std::fs::remove_dir_all(&runtime);
}

#[test]
fn a_per_user_broker_serves_applications_and_refuses_other_users() {
    let exe = c_client("survivor");
    let runtime = std::env::temp_dir().join(format!("cloister-rt-user-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    let mut broker = Command::new(cloister())
        .arg("broker")
        .env("XDG_RUNTIME_DIR", &runtime)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cloister broker");
    let socket = runtime.join("cloister/broker.sock");
    wait_for_path(&socket, std::time::Duration::from_millis(5000));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(runtime.join("cloister")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the socket folder must be private");
    let vendors = cloister_only_registry();
    let env = [("OCL_ICD_VENDORS", vendors.to_str().unwrap()), ("XDG_RUNTIME_DIR", runtime.to_str().unwrap())];
    let out = direct(&exe, &[], &env);
    assert!(out.status.success() && text(&out).contains("completed without fault"), "{}", text(&out));

    // A second broker on the same socket is refused while the first lives.
    let second = Command::new(cloister()).arg("broker").env("XDG_RUNTIME_DIR", &runtime).output().unwrap();
    assert!(String::from_utf8_lossy(&second.stderr).contains("already listening"), "{second:?}");

    // Another user: given a way to the socket, it is still refused by the peer-uid check.
    // (Only when the tests run as root, which can switch users.)
    // SAFETY: getuid cannot fail.
    if unsafe { libc_getuid() } == 0 && std::path::Path::new("/usr/bin/setpriv").exists() {
        std::fs::set_permissions(runtime.join("cloister"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe_copy = std::env::temp_dir().join(format!("cloister-survivor-{}", std::process::id()));
        std::fs::copy(&exe, &exe_copy).unwrap();
        std::fs::set_permissions(&exe_copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let other = Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe_copy)
            .env("OCL_ICD_VENDORS", &vendors)
            .env("CLOISTER_SOCKET", &socket)
            .env("HOME", "/tmp")
            .output()
            .unwrap();
        let t = text(&other);
        // The shim checks the broker's credentials before it sends anything, so it refuses
        // first; the broker would refuse it too.
        assert!(t.contains("runs as uid 0, not as this user (uid 65534)"), "{t}");
        assert!(t.contains("code=-1001"), "{t}");
        let _ = std::fs::remove_file(&exe_copy);
    }
    let _ = broker.kill();
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(&runtime);
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}
