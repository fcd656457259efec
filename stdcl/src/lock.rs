//! `STD*_LOCK`: exclusive use of devices among processes that name the same lock id. Each device
//! has a lock file; a process holds `flock(LOCK_EX)` on it for as long as it lives, so the lock
//! goes away however the process ends (exit, crash, SIGKILL). The files live in a folder only
//! this user can write ($XDG_RUNTIME_DIR/stdcl, else /tmp/stdcl-UID), checked before use: a
//! folder or file someone else planted (or a symlink) is refused, not trusted.

use crate::error::{Error, Res};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The private folder for lock files, made if missing, opened (so that what was checked is what
/// is used: the files are opened relative to this descriptor).
fn lock_dir() -> Res<OwnedFd> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && open_private_dir(p, uid).is_ok())
        .map(|p| p.join("stdcl"))
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/stdcl-{uid}")));
    match std::fs::DirBuilder::new().mode(0o700).create(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Error::new(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("lock folder {}: {e}", base.display()),
            ))
        }
    }
    open_private_dir(&base, uid)
}

/// Opens a real folder (not a symlink) owned by `uid` that nobody else may write or read.
fn open_private_dir(p: &Path, uid: u32) -> Res<OwnedFd> {
    let refused = || {
        Error::new(
            libc::EPERM,
            format!("lock folder {} is not a private folder of uid {uid} (refusing it)", p.display()),
        )
    };
    let c = CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| refused())?;
    // SAFETY: a NUL-terminated path; O_NOFOLLOW refuses a symlink in the last component.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(refused());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let m = File::from(fd.try_clone().map_err(|_| refused())?).metadata().map_err(|_| refused())?;
    if !m.file_type().is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(refused());
    }
    Ok(fd)
}

/// A lock id as a file-name part: kept when it is plain, else replaced by a hash, so an id can
/// never name a path outside the lock folder.
fn id_part(id: &str) -> String {
    if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        id.to_string()
    } else {
        // FNV-1a, stable across runs and processes.
        let h = id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        format!("h{h:016x}")
    }
}

/// Tries to take the lock of device `index` of context kind `kind` for lock id `id`, without
/// waiting: `Ok(Some(file))` holds it (until the file is closed or the process ends),
/// `Ok(None)` means another process holds it.
pub fn try_lock(kind: &str, id: &str, index: usize) -> Res<Option<File>> {
    let dir = lock_dir()?;
    let path = PathBuf::from(format!("{kind}-{}-{index}.lock", id_part(id)));
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| Error::new(libc::EINVAL, "lock path"))?;
    // SAFETY: a NUL-terminated plain name inside the checked folder; O_NOFOLLOW refuses a
    // planted symlink.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("lock file {}: {e}", path.display())));
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    let m = file.metadata().map_err(|e| Error::new(libc::EIO, format!("lock file {}: {e}", path.display())))?;
    // SAFETY: geteuid has no preconditions.
    if !m.file_type().is_file() || m.uid() != unsafe { libc::geteuid() } {
        return Err(Error::new(libc::EPERM, format!("lock file {} is not ours (refusing it)", path.display())));
    }
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(Some(file))
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("lock file {}: {e}", path.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ids_never_name_paths() {
        assert_eq!(id_part("job-42_a"), "job-42_a");
        for bad in ["../../etc/passwd", "a/b", "", ".", "x y", &"z".repeat(65)] {
            let p = id_part(bad);
            assert!(
                p.starts_with('h') && p.len() == 17 && p.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{bad:?} -> {p}"
            );
        }
        assert_ne!(id_part("a/b"), id_part("a/c"));
    }

    #[test]
    fn a_folder_others_can_write_is_refused() {
        let d = std::env::temp_dir().join(format!("stdcl-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert_eq!(open_private_dir(&d, uid).unwrap_err().errno, libc::EPERM);
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        assert!(open_private_dir(&d, uid).is_ok());
        assert_eq!(open_private_dir(&d, uid + 1).unwrap_err().errno, libc::EPERM);
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert_eq!(open_private_dir(&link, uid).unwrap_err().errno, libc::EPERM, "a symlink is not trusted");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir(&d);
    }
}
