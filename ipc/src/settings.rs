//! The settings in effect in this process: each from a flag, its `CLOISTER_*` variable, the
//! user's or the system's configuration file, or its default (see `config`, which holds the
//! table and the layers). A value that does not parse, or is out of range, is not silently
//! ignored: the process says once, on stderr, what was wrong and which value it uses instead
//! (`CLOISTER_SPIN_US=abc` used to mean "50" without a word).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::config::{setting, Files, Resolved};

/// Set by `cloister run` in the application's environment, and by the broker in each worker's:
/// cloister has read the same settings and said what was wrong, so the shim inside the
/// application and the workers do not say it again.
pub const ALREADY_SAID: &str = "CLOISTER_SETTINGS_SAID";

/// Says `message` on stderr, once per process (and not at all where cloister said it before).
pub fn say_once(message: &str) {
    warn_once(message, message);
}

/// Says `message` about `name` on stderr, once per process and name.
fn warn_once(name: &str, message: &str) {
    if std::env::var_os(ALREADY_SAID).is_some() {
        return;
    }
    static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.get_or_insert_with(HashSet::new).insert(name.to_string()) {
        eprintln!("cloister: {message}");
    }
}

static ENVIRONMENT_ONLY: AtomicBool = AtomicBool::new(false);

/// The worker reads its settings from the environment only: the broker puts there the value in
/// effect for its driver, and a file under the worker's `HOME` (its own, driver-writable cache)
/// must not steer it. Called before any setting is read.
pub fn environment_only() {
    ENVIRONMENT_ONLY.store(true, Ordering::Release);
}

static FLAGS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// A command-line flag's value for the setting `key`: above every other layer. Set before the
/// settings are used (`cloister` sets its flags first thing).
pub fn set_flag(key: &str, value: &str) {
    FLAGS.lock().unwrap_or_else(|e| e.into_inner()).insert(setting(key).key.to_string(), value.to_string());
}

/// The configuration files, read once per process.
pub fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| if ENVIRONMENT_ONLY.load(Ordering::Acquire) { Files::default() } else { Files::read() })
}

/// Says once what is wrong with the files (a process that cannot stop, like the shim, goes on
/// without the malformed ones: with the defaults).
fn say_file_problems() {
    let f = files();
    for w in &f.warnings {
        say_once(w);
    }
    for e in &f.errors {
        say_once(&format!("{e} (the file is not used)"));
    }
}

/// The value of setting `key` for `driver` (or all drivers), and where it came from; nothing said.
pub fn resolve(key: &str, driver: Option<&str>) -> Resolved {
    let flags = FLAGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    files().resolve(setting(key), driver, &flags, &|name| std::env::var_os(name))
}

/// The value of setting `key` for `driver` (or all drivers), checked; a bad value is said once.
pub fn get(key: &str, driver: Option<&str>) -> Option<String> {
    say_file_problems();
    let r = resolve(key, driver);
    if let Some(p) = &r.problem {
        warn_once(setting(key).env, p);
    }
    r.value
}

/// A number setting (its value is checked against its range; every number setting has a default).
pub fn number(key: &str, driver: Option<&str>) -> u64 {
    get(key, driver).and_then(|v| v.parse().ok()).unwrap_or_default()
}

/// An on/off setting.
pub fn switch(key: &str) -> bool {
    get(key, None).as_deref() == Some("1")
}

/// `crash_loop = "K/T"`: K crashes within T seconds stop the restarts (default 3/60).
pub fn crash_loop(driver: Option<&str>) -> (usize, u64) {
    let v = get("crash_loop", driver).unwrap_or_default();
    let (k, t) = v.split_once('/').unwrap_or(("3", "60"));
    (k.parse().unwrap_or(3), t.parse().unwrap_or(60))
}

/// `staging`: how the worker stages transfers (see the worker's `staging`).
pub fn staging() -> String {
    get("staging", None).unwrap_or_default()
}

/// `sync = 1`: strict mode, every enqueue and buffer creation waits for its reply (see the shim's `Conn::post`).
pub fn sync_mode() -> bool {
    switch("sync")
}

/// `zero_copy`: whether buffers of host-unified devices share their memory (`1`, the default)
/// or are staged like any other (`0`).
pub fn zero_copy() -> bool {
    switch("zero_copy")
}

/// `recovery`: what the shim does when a worker dies: `replay` (the default) rebuilds the application's
/// objects and memory contents in the replacement and reruns what was lost; `report` makes the
/// lost objects answer `CL_DEVICE_NOT_AVAILABLE`; `auto` is `replay` for a driver whose devices
/// all share the host's memory and `report` for others. `replay` is the default.
pub fn recovery() -> String {
    get("recovery", None).unwrap_or_default()
}

/// `recovery_budget_mb`: how much memory (MiB) replay mode may keep per worker for known buffer
/// contents and the journal of commands since.
pub fn recovery_budget_mb() -> u64 {
    number("recovery_budget_mb", None)
}

/// `debug = 1`: the worker says what its cage is.
pub fn debug() -> bool {
    switch("debug")
}

/// `quiet = 1`: the shim says nothing.
pub fn quiet() -> bool {
    switch("quiet")
}

/// The settings a worker reads, with the values in effect for `driver`: the broker gives them
/// to the worker, which reads no file.
pub fn worker_env(driver: &str) -> Vec<(&'static str, String)> {
    crate::config::SETTINGS
        .iter()
        .filter(|s| s.worker)
        .filter_map(|s| get(s.key, Some(driver)).map(|v| (s.env, v)))
        .collect()
}

/// Checks the configuration files and reads every setting once, so that `cloister run` says
/// what is wrong before the application starts (the application's shim and the workers then
/// stay quiet about it). A malformed file is the error: `FILE:LINE: reason`.
pub fn check_all() -> Result<(), String> {
    if let Some(e) = files().errors.first() {
        return Err(e.clone());
    }
    for s in crate::config::SETTINGS {
        get(s.key, None);
    }
    Ok(())
}
