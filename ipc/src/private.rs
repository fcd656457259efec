//! Places only this user may own: the broker's socket folder, a run's cage, the worker cache,
//! the crash reports. No guessable shared path is trusted: a folder is either made fresh with a
//! random name (`mkdtemp`, 0700) or, when its name is fixed, checked to be a real folder owned
//! by us that nobody else can enter. And a socket is only spoken to once its peer is known to
//! run as us (`SO_PEERCRED`), so another user listening on a path we would try learns nothing.

use std::ffi::OsString;
use std::io::{Error, ErrorKind, Result};
use std::os::fd::RawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Our effective uid: what the kernel checks file access and `SO_PEERCRED` against.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// A new folder `<base>/<prefix>XXXXXX` with a random name, created 0700 by `mkdtemp` (which
/// fails rather than reuse anything already there), and checked after the fact.
pub fn fresh_dir(base: &Path, prefix: &str) -> Result<PathBuf> {
    let mut template = base.join(format!("{prefix}XXXXXX")).into_os_string().into_vec();
    template.push(0);
    // SAFETY: template is a writable NUL-terminated buffer ending in XXXXXX, as mkdtemp needs.
    let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(Error::new(
            Error::last_os_error().kind(),
            format!("cannot create a private folder in {}: {}", base.display(), Error::last_os_error()),
        ));
    }
    template.pop();
    let dir = PathBuf::from(OsString::from_vec(template));
    check_private(&dir)?;
    Ok(dir)
}

/// `path` is a real folder (not a link), owned by us, that no one else may enter or change.
pub fn check_private(path: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let why = if !m.file_type().is_dir() {
        Some("it is not a folder".to_string())
    } else if m.uid() != euid() {
        Some(format!("it belongs to uid {}, not to this user (uid {})", m.uid(), euid()))
    } else if m.mode() & 0o077 != 0 {
        Some(format!("its mode is {:o}, not private (0700)", m.mode() & 0o7777))
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("{} is not a private folder of this user: {why}", path.display()),
        )),
        None => Ok(()),
    }
}

/// `path`, a folder with a fixed name: created 0700 if missing; if it exists it must be ours
/// and private already (ours but too open is tightened; someone else's is refused).
pub fn ensure_private(path: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::new(e.kind(), format!("cannot create {}: {e}", path.display()))),
    }
    let m = std::fs::symlink_metadata(path)?;
    if m.file_type().is_dir() && m.uid() == euid() && m.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    }
    check_private(path)
}

/// Like `ensure_private`, for `path` and every folder between `base` (trusted, not checked)
/// and it.
pub fn ensure_private_under(base: &Path, path: &Path) -> Result<()> {
    each_folder_under(base, path, ensure_private)
}

/// Runs `check` on every folder from `base` (exclusive) down to `path` (inclusive).
fn each_folder_under(base: &Path, path: &Path, check: fn(&Path) -> Result<()>) -> Result<()> {
    let rel = path
        .strip_prefix(base)
        .map_err(|_| Error::other(format!("{} is not under {}", path.display(), base.display())))?;
    let mut at = base.to_path_buf();
    for c in rel.components() {
        at.push(c);
        check(&at)?;
    }
    Ok(())
}

/// The credentials (`SO_PEERCRED`: pid, uid, gid at connect time) of the process at the other
/// end of a connected Unix socket.
pub fn peer_cred(fd: RawFd) -> Result<libc::ucred> {
    // SAFETY: zeroed ucred is valid; getsockopt fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred/len are valid out pointers of the right size.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(Error::last_os_error());
    }
    Ok(cred)
}

/// The uid of the process at the other end of a connected Unix socket.
pub fn peer_uid(fd: RawFd) -> Result<u32> {
    peer_cred(fd).map(|c| c.uid)
}

/// Refuses a socket whose listener is not us: nothing may be sent to another user's process.
pub fn check_peer_is_us(fd: RawFd, what: &Path) -> std::result::Result<(), String> {
    let uid = peer_uid(fd).map_err(|e| format!("cannot tell who listens on {}: {e}", what.display()))?;
    if uid != euid() {
        return Err(format!(
            "the broker at {} runs as uid {uid}, not as this user (uid {}): not talking to it",
            what.display(),
            euid()
        ));
    }
    Ok(())
}

/// This user's home folder: `$HOME`, else the password database's entry (cron, `env -i`,
/// containers). `None` when neither names an existing folder owned by us.
pub fn home_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out value; getpwuid_r fills it, pointing into buf.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc = unsafe { libc::getpwuid_r(euid(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir is a NUL-terminated string inside buf, which is still alive.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()));
    let m = std::fs::metadata(&dir).ok()?;
    (m.is_dir() && m.uid() == euid()).then_some(dir)
}

/// A per-user folder in the shared temporary folder (`/tmp/cloister-<uid>-<what>`), for when
/// there is no home: reused while it is ours and private, else a fresh random one (another user
/// who took the name first only costs us the reuse).
pub fn per_user_tmp(what: &str) -> Result<PathBuf> {
    let tmp = std::env::temp_dir();
    let fixed = tmp.join(format!("cloister-{}-{what}", euid()));
    match ensure_private(&fixed) {
        Ok(()) => Ok(fixed),
        Err(_) => fresh_dir(&tmp, &format!("cloister-{}-{what}-", euid())),
    }
}

/// The per-user broker's socket: `$XDG_RUNTIME_DIR/cloister/broker.sock`, else
/// `/tmp/cloister-<uid>/cloister/broker.sock`. Returns the trusted base and the socket; every
/// folder between them must be private to us (`ensure_private_under` makes them so, the shim
/// only checks).
pub fn user_socket() -> (PathBuf, PathBuf) {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => {
            let base = PathBuf::from(d);
            let sock = base.join("cloister").join("broker.sock");
            (base, sock)
        }
        None => {
            let base = std::env::temp_dir();
            let sock = base.join(format!("cloister-{}", euid())).join("cloister").join("broker.sock");
            (base, sock)
        }
    }
}

/// Checks (without creating anything) that every folder between `base` and `path` is private.
pub fn check_private_under(base: &Path, path: &Path) -> Result<()> {
    each_folder_under(base, path, check_private)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_folders_are_private_and_fixed_ones_are_checked() {
        let base = fresh_dir(&std::env::temp_dir(), "cloister-private-test-").unwrap();
        let a = fresh_dir(&base, "x-").unwrap();
        let b = fresh_dir(&base, "x-").unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o700);
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private(&open).unwrap();
        assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o700);
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(ensure_private(&file).is_err());
        let link = base.join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(check_private(&link).is_err(), "a link is not a private folder");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
