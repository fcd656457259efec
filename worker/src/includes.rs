//! The application's headers for one build, laid out under their own paths in a private
//! folder the driver can read (see the shim's `includes` module for why), and removed when the
//! build returns.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cloister_ipc::cl::*;
use cloister_ipc::AppIncludes;

/// A staged header tree; dropping it removes the folder.
pub struct Staged {
    root: PathBuf,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `path` (absolute, from the application) inside `root`, or `None` if it tries to leave it.
fn inside(root: &Path, path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return None;
    }
    Some(root.join(p.strip_prefix("/").ok()?))
}

/// Writes the headers and returns the build options with `-I` pointing at the copies.
pub fn stage(inc: &AppIncludes, options: Option<&[u8]>) -> Result<(Staged, Vec<u8>), cl_int> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("cloister-includes-{}-{n}", std::process::id()));
    let staged = Staged { root: root.clone() };
    let mut flags = Vec::new();
    for d in &inc.dirs {
        let dir = inside(&root, d).ok_or(CL_INVALID_BUILD_OPTIONS)?;
        std::fs::create_dir_all(&dir).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        flags.push(format!("-I{}", dir.display()));
    }
    for (path, bytes) in &inc.files {
        let file = inside(&root, path).ok_or(CL_INVALID_VALUE)?;
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        }
        std::fs::write(&file, bytes).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
    }
    let mut out = flags.join(" ").into_bytes();
    if let Some(o) = options.filter(|o| !o.is_empty()) {
        out.push(b' ');
        out.extend_from_slice(o);
    }
    Ok((staged, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_leave_the_staging_folder() {
        let root = Path::new("/stage");
        assert_eq!(inside(root, "/a/b.h"), Some(PathBuf::from("/stage/a/b.h")));
        assert_eq!(inside(root, "/a/../../etc/passwd"), None);
        assert_eq!(inside(root, "relative.h"), None);
    }

    #[test]
    fn headers_are_staged_and_removed() {
        let inc = AppIncludes {
            dirs: vec!["/app/inc".into()],
            files: vec![("/app/inc/x.h".into(), b"#define X 1".to_vec())],
        };
        let (staged, opts) = stage(&inc, Some(b"-DY")).unwrap();
        let opts = String::from_utf8(opts).unwrap();
        let dir = opts.split_whitespace().next().unwrap().strip_prefix("-I").unwrap().to_string();
        assert_eq!(std::fs::read(Path::new(&dir).join("x.h")).unwrap(), b"#define X 1");
        assert!(opts.ends_with(" -DY"));
        drop(staged);
        assert!(!Path::new(&dir).exists());
    }
}
