//! The landlock layer: read-only access to what the profile lists, read-write only to the
//! worker's private cache (and the profile's `write` list), execution only of the profile's
//! `execute` list. Paths that do not exist on this machine are skipped.

use std::path::Path;

use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::profile::Profile;
use crate::{LayerState, SandboxError};

/// `path`, or when its last component ends in `*`, the entries of its folder that start with
/// the rest and are not folders themselves (device nodes whose count differs between machines:
/// `/dev/nvidia*`; a folder matched, like /dev/nvidia-caps, would give rights to create
/// files in it).
fn expand(path: &str) -> Vec<String> {
    let Some(prefix) = path.strip_suffix('*') else { return vec![path.to_string()] };
    let (dir, start) = prefix.rsplit_once('/').unwrap_or(("", prefix));
    let Ok(entries) = std::fs::read_dir(if dir.is_empty() { "/" } else { dir }) else { return vec![] };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(start))
        .map(|n| format!("{dir}/{n}"))
        .filter(|p| !Path::new(p).is_dir())
        .collect();
    out.sort();
    out
}

/// `/proc/self` resolves to the worker's own /proc/PID directory, and landlock rules hold on to
/// inodes: the rule covers this process's entries (and its threads'), nobody else's. procfs
/// may drop and recreate an unused /proc/PID dentry with a new inode, which would silently end
/// the rule (the driver would be denied, never granted more); an open O_PATH descriptor keeps
/// the directory in use for the worker's life.
fn pin_proc_self(path: &str) {
    if path == "/proc/self" {
        if let Ok(fd) = PathFd::new(path) {
            std::mem::forget(fd);
        }
    }
}

fn add(
    mut ruleset: landlock::RulesetCreated,
    path: &str,
    access: landlock::BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, SandboxError> {
    if path.ends_with('*') {
        for p in expand(path) {
            ruleset = add(ruleset, &p, access)?;
        }
        return Ok(ruleset);
    }
    pin_proc_self(path);
    let Ok(fd) = PathFd::new(path) else {
        return Ok(ruleset);
    };
    // Files take only file rights; directories take them all.
    let access = if Path::new(path).is_dir() { access } else { access & AccessFs::from_file(ABI) };
    ruleset.add_rule(PathBeneath::new(fd, access)).map_err(|e| SandboxError::Landlock(e.to_string()))
}

/// Confines the calling process (and its future threads and children).
/// The newest landlock ABI we use: V2 adds `Refer` (without it, landlock refuses every rename
/// across directories, and pocl renames finished kernels into its cache), V3 `Truncate`, V5
/// device ioctls. On older kernels the crate degrades to what the kernel has.
const ABI: ABI = ABI::V5;

pub fn apply(profile: &Profile, private_dirs: &[&Path], extra_read: &[&Path]) -> Result<LayerState, SandboxError> {
    let abi = ABI;
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let exec = AccessFs::from_read(abi);
    let write = AccessFs::from_all(abi) & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| SandboxError::Landlock(e.to_string()))?
        // Landlock ABI 6 (Linux 6.12): no signals to processes outside the cage, and no
        // abstract Unix sockets made outside it, whatever seccomp allows (kernels without it
        // skip this: seccomp's pid rules still hold).
        .scope(Scope::from_all(ABI::V6))
        .map_err(|e| SandboxError::Landlock(e.to_string()))?
        .create()
        .map_err(|e| SandboxError::Landlock(e.to_string()))?;
    for p in &profile.filesystem.read {
        ruleset = add(ruleset, p, read)?;
    }
    for p in extra_read.iter().filter_map(|p| p.to_str()) {
        ruleset = add(ruleset, p, read)?;
    }
    for p in &profile.filesystem.execute {
        ruleset = add(ruleset, p, exec)?;
    }
    for p in &profile.filesystem.write {
        ruleset = add(ruleset, p, write | read)?;
    }
    for d in private_dirs {
        if let Some(s) = d.to_str() {
            ruleset = add(ruleset, s, write | read)?;
        }
    }
    let status = ruleset.restrict_self().map_err(|e| SandboxError::Landlock(e.to_string()))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => LayerState::On,
        RulesetStatus::PartiallyEnforced => LayerState::On, // an older ABI: still confining
        RulesetStatus::NotEnforced => LayerState::Off("the kernel does not enforce landlock".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landlock_abi() -> i64 {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        // SAFETY: the version query takes no ruleset and returns a number.
        unsafe {
            libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0, LANDLOCK_CREATE_RULESET_VERSION)
        }
    }

    #[test]
    fn a_trailing_star_matches_the_entries_present() {
        let dir = std::env::temp_dir().join(format!("cloister-expand-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in ["nvidia0", "nvidiactl", "other"] {
            std::fs::write(dir.join(n), "").unwrap();
        }
        std::fs::create_dir_all(dir.join("nvidia-caps")).unwrap();
        let d = dir.display().to_string();
        assert_eq!(expand(&format!("{d}/nvidia*")), vec![format!("{d}/nvidia0"), format!("{d}/nvidiactl")]);
        assert_eq!(expand(&format!("{d}/none*")), Vec::<String>::new());
        assert_eq!(expand("/dev/null"), vec!["/dev/null".to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// In a child confined by the pocl profile: its own /proc entries and the CPU facts read,
    /// its parent's environment (same uid: only landlock stands in the way), /etc/shadow and
    /// programs in /usr/bin do not.
    #[test]
    fn proc_is_the_workers_own_and_programs_are_unreadable() {
        let profile = Profile::builtin("pocl").unwrap();
        let parent = std::process::id();
        let r = crate::testutil::in_child(move || {
            // SAFETY: prctl with constant arguments.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            if apply(&profile, &[], &[]).map_err(|e| e.to_string())? != LayerState::On {
                return Err("landlock not enforced".into());
            }
            for ok in ["/proc/self/status", "/proc/self/maps", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/mounts"] {
                std::fs::read(ok).map_err(|e| format!("{ok} should be readable: {e}"))?;
            }
            // A thread's view too.
            std::thread::spawn(|| std::fs::read("/proc/thread-self/status").map(|_| ()))
                .join()
                .map_err(|_| "thread panicked".to_string())?
                .map_err(|e| format!("/proc/thread-self/status: {e}"))?;
            let parent_env = format!("/proc/{parent}/environ");
            for denied in [
                parent_env.as_str(),
                "/proc/1/environ",
                "/proc/kallsyms",
                "/etc/shadow",
                "/usr/bin/dash",
                "/bin/sh",
                "/sys/bus/pci/devices/0000:00:00.0/config",
                "/sys/kernel/notes",
            ] {
                if std::fs::read(denied).is_ok() {
                    return Err(format!("{denied} should be denied"));
                }
            }
            std::fs::read("/sys/devices/system/cpu/online").map_err(|e| format!("CPU topology: {e}"))?;
            std::fs::read("/usr/bin/ld").map_err(|e| format!("the linker should stay readable: {e}"))?;
            // Signals stay inside the cage (landlock scope, on kernels from 6.12).
            // SAFETY: signal 0 only checks permission.
            if unsafe { libc::kill(parent as i32, 0) } == 0 && landlock_abi() >= 6 {
                return Err("a signal to the parent was allowed".into());
            }
            Ok(())
        });
        assert_eq!(r, Ok(()));
    }

    /// In a child confined by the `generic` profile: no kernel log, terminals, disks, root's
    /// secrets, or files planted in /dev/shm; the harmless devices stay open.
    #[test]
    fn generic_keeps_devices_and_etc_to_the_listed_few() {
        let profile = Profile::builtin("generic").unwrap();
        let r = crate::testutil::in_child(move || {
            // SAFETY: prctl with constant arguments.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            apply(&profile, &[], &[]).map_err(|e| e.to_string())?;
            let open = |p: &str, write: bool| std::fs::OpenOptions::new().read(true).write(write).open(p);
            for (p, write) in [("/dev/null", true), ("/dev/urandom", false), ("/etc/ld.so.cache", false)] {
                open(p, write).map_err(|e| format!("{p} should open: {e}"))?;
            }
            for (p, write) in [
                ("/dev/kmsg", false),
                ("/dev/tty1", true),
                ("/dev/loop0", true),
                ("/etc/shadow", false),
                ("/dev/tty", true),
            ] {
                if open(p, write).is_ok() {
                    return Err(format!("{p} should be denied"));
                }
            }
            let planted = format!("/dev/shm/cloister-unit-{}", std::process::id());
            if std::fs::write(&planted, "x").is_ok() {
                let _ = std::fs::remove_file(&planted);
                return Err("a file was planted in /dev/shm".into());
            }
            Ok(())
        });
        assert_eq!(r, Ok(()));
    }
}
