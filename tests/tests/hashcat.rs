//! hashcat (Debian's package), a third-party application nobody here wrote, runs its MD5
//! benchmark caged: its kernels build with headers named by a macro from a `-D` folder
//! (`#include M2S(INCLUDE_PATH/inc_vendor.h)`), and the pocl binaries it caches (about 6 MB
//! each) are read back and loaded again through the cage. Speeds are printed, not asserted
//! (the benchmark is the place for those).

use cloister_tests::*;
use std::process::Command;

/// The benchmark's speed line, or a failure with the whole output.
fn speed(out: &std::process::Output, how: &str) -> String {
    let t = text(out);
    assert!(out.status.success(), "hashcat {how} failed:\n{t}");
    t.lines()
        .find(|l| l.starts_with("Speed.#1"))
        .unwrap_or_else(|| panic!("hashcat {how} printed no speed:\n{t}"))
        .to_string()
}

#[test]
fn hashcat_benchmarks_md5_caged_building_and_loading_its_kernels() {
    let hashcat = std::path::Path::new("/usr/bin/hashcat");
    assert!(hashcat.exists(), "hashcat is not installed: run scripts/setup.sh");
    // A fresh kernel cache: the first run builds every kernel, the second loads the binaries.
    let cache = std::env::temp_dir().join(format!("cloister-hashcat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let env = [("XDG_CACHE_HOME", cache.to_str().unwrap())];
    let args = ["-b", "-m", "0", "--force"];
    let kernels = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("hashcat/kernels")).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    };
    let built = speed(&caged(&[], hashcat, &args, &env), "caged, building its kernels");
    let cached = kernels(&cache).expect("hashcat cached its kernels");
    let largest = cached.iter().filter_map(|p| p.metadata().ok()).map(|m| m.len()).max().unwrap_or(0);
    assert!(largest > 4 << 20, "the kernels hashcat cached are smaller than the case to test: {largest} bytes");
    let loaded = speed(&caged(&[], hashcat, &args, &env), "caged, loading its cached kernels");
    let direct = speed(&Command::new(hashcat).args(args).envs(env).output().unwrap(), "directly");
    eprintln!("hashcat -b -m 0: caged (built) {built}\ncaged (cached) {loaded}\ndirect (cached) {direct}");
    let _ = std::fs::remove_dir_all(&cache);
}
