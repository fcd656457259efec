//! The shim and worker carried inside the `cloister` binary (see `build.rs`), for an install
//! that has only the binary (`cargo install --path broker`). They are unpacked on first use into
//! `~/.local/lib/cloister/embedded/<hash>/`, a folder of this user that no one else can enter
//! or change, named by the pieces' content, and compared byte for byte with the embedded copies
//! before each use (a half-written or altered file is written again).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The unpacked shim and worker, written or checked now. `Ok(None)` if the binary carries none.
pub fn unpack() -> Result<Option<(PathBuf, PathBuf)>, String> {
    let Some((hash, shim, worker)) = PIECES else { return Ok(None) };
    let home =
        cloister_ipc::private::home_dir().ok_or("no home folder (set HOME) to unpack the shim and worker into")?;
    let dir = folder(&home, hash)?;
    let (shim_path, worker_path) = (dir.join("libcloister.so"), dir.join("cloister-worker"));
    place(&shim_path, shim, 0o644)?;
    place(&worker_path, worker, 0o755)?;
    // The shim starts a private broker with the `cloister` beside it (shim/src/runtime.rs).
    if let Ok(exe) = std::env::current_exe() {
        let link = dir.join("cloister");
        if std::fs::read_link(&link).ok().as_deref() != Some(exe.as_path()) {
            let tmp = dir.join(format!(".cloister.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&exe, &tmp)
                .and_then(|()| std::fs::rename(&tmp, &link))
                .map_err(|e| format!("cannot link {} to {}: {e}", link.display(), exe.display()))?;
        }
    }
    Ok(Some((shim_path, worker_path)))
}

/// `~/.local/lib/cloister/embedded/<hash>`: the folders up to `cloister` may be shared ones
/// (`~/.local/lib`), but none may be writable by anyone else; `embedded` and `<hash>` are ours
/// and private (0700).
fn folder(home: &Path, hash: &str) -> Result<PathBuf, String> {
    let parent = home.join(".local/lib/cloister");
    std::fs::create_dir_all(&parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let mut at = PathBuf::new();
    for c in parent.components() {
        at.push(c);
        let m = std::fs::metadata(&at).map_err(|e| format!("{}: {e}", at.display()))?;
        let us = cloister_ipc::private::euid();
        if (m.uid() != us && m.uid() != 0) || (m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0) {
            return Err(format!(
                "{} can be changed by another user (owner uid {}, mode {:o}): not unpacking the shim and worker under it",
                at.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
    }
    let dir = parent.join("embedded").join(hash);
    cloister_ipc::private::ensure_private_under(&parent, &dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Writes `bytes` to `path` (through a temporary file and a rename, so a concurrent reader sees
/// the old file or the new one) unless it already holds exactly them.
fn place(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    if std::fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    crate::install::replace_file(path, &tmp, bytes, mode).map_err(|e| format!("cannot unpack {}: {e}", path.display()))
}
