//! Embeds the shim (`libcloister.so`) and the worker (`cloister-worker`) in the `cloister`
//! binary, so that `cargo install --path broker`, which installs binaries only, gives a working
//! cloister: on first use it unpacks them into a private folder of the user (`src/embedded.rs`).
//!
//! They are built by a nested `cargo build` into a target folder of their own under OUT_DIR
//! (the outer cargo holds the lock on its own target folder for the whole build). This is done
//! for release builds, which `cargo install` makes, and skipped for debug builds, where the
//! workspace build puts the pieces beside the binary anyway: the everyday `cargo build` and
//! `cargo test` pay nothing. `CLOISTER_EMBED=1` forces it (e.g. `cargo install --debug`),
//! `CLOISTER_EMBED=0` skips it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("broker/ is inside the workspace").to_path_buf();
    println!("cargo:rerun-if-env-changed=CLOISTER_EMBED");
    println!("cargo:rerun-if-changed=build.rs");
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let embed = match std::env::var("CLOISTER_EMBED").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => profile == "release",
    };
    let generated = out.join("embedded.rs");
    if !embed {
        write(&generated, "pub const PIECES: Option<(&str, &[u8], &[u8])> = None;\n");
        return;
    }
    // What the pieces are made of: a change anywhere there rebuilds them (the nested cargo is
    // incremental, so an unchanged tree costs one fingerprint check).
    for dir in ["shim", "worker", "ipc", "sandbox-policy", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let target_dir = out.join("pieces-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "-p", "cloister-shim", "-p", "cloister-worker", "--target-dir"])
        .arg(&target_dir)
        // The outer build's own target folder and profile variables are not ours to inherit.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    let mut built = target_dir.clone();
    let target = std::env::var("TARGET").unwrap_or_default();
    if target != std::env::var("HOST").unwrap_or_default() {
        cmd.args(["--target", &target]);
        built.push(&target);
    }
    if profile == "release" {
        cmd.arg("--release");
    }
    built.push(if profile == "release" { "release" } else { "debug" });
    let status = cmd.status().expect("cannot run the nested cargo build of the shim and worker");
    assert!(status.success(), "the nested cargo build of the shim and worker failed");
    let shim = std::fs::read(built.join("libcloister.so")).expect("the nested build made no libcloister.so");
    let worker = std::fs::read(built.join("cloister-worker")).expect("the nested build made no cloister-worker");
    // Copies of their own: the nested target folder is rebuilt in place later.
    let (shim_copy, worker_copy) = (out.join("libcloister.so"), out.join("cloister-worker"));
    std::fs::write(&shim_copy, &shim).expect("cannot copy libcloister.so into OUT_DIR");
    std::fs::write(&worker_copy, &worker).expect("cannot copy cloister-worker into OUT_DIR");
    // Names the unpacked folder: another build's pieces go to another folder.
    let hash = fnv1a(&worker, fnv1a(&shim, 0xcbf2_9ce4_8422_2325));
    write(
        &generated,
        &format!(
            "pub const PIECES: Option<(&str, &[u8], &[u8])> = Some((\"{hash:016x}\", include_bytes!({:?}), include_bytes!({:?})));\n",
            shim_copy.display().to_string(),
            worker_copy.display().to_string()
        ),
    );
}

/// FNV-1a, 64 bits: a name for the pieces, not a security check (the unpacked files are compared
/// byte for byte with the embedded ones before use).
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
