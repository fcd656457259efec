//! The application's headers for one build, laid out under their own paths in a private
//! folder the driver can read (see the shim's `includes` module for why). The folder is named
//! after the headers' contents, so an unchanged set of headers gives the driver the same build
//! options as last time and its kernel cache still hits; an edited header gives a new folder.

use std::hash::{Hash, Hasher};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cloister_ipc::cl::*;
use cloister_ipc::AppIncludes;

/// Staged header sets kept in the worker's cache; older ones are removed beyond this.
const KEEP: usize = 64;

/// `path` (absolute, from the application) inside `root`, or `None` if it tries to leave it.
fn inside(root: &Path, path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return None;
    }
    Some(root.join(p.strip_prefix("/").ok()?))
}

/// A name for the header set: the same for the same folders and contents.
fn content_name(inc: &AppIncludes) -> String {
    // SipHash with fixed keys: stable across runs, which is all a cache name needs.
    let mut h = std::hash::DefaultHasher::new();
    inc.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Writes the set into a fresh folder, then renames it into place (a concurrent build of the
/// same set may win the race; its copy is identical).
fn write_set(base: &Path, root: &Path, inc: &AppIncludes) -> Result<(), cl_int> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = base.join(format!(".new-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        for d in &inc.dirs {
            std::fs::create_dir_all(inside(&tmp, d).ok_or(CL_INVALID_BUILD_OPTIONS)?)
                .map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        }
        for (path, bytes) in &inc.files {
            let file = inside(&tmp, path).ok_or(CL_INVALID_VALUE)?;
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
            }
            std::fs::write(&file, bytes).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        }
        Ok(())
    })();
    if result.is_err() || std::fs::rename(&tmp, root).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Removes all but the `KEEP` most recently used header sets.
fn prune(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    let mut sets: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if sets.len() <= KEEP {
        return;
    }
    sets.sort();
    for (_, old) in &sets[..sets.len() - KEEP] {
        let _ = std::fs::remove_dir_all(old);
    }
}

/// Stages the headers (once per distinct set) and returns the build options with `-I`
/// pointing at the copies.
pub fn stage(inc: &AppIncludes, options: Option<&[u8]>) -> Result<Vec<u8>, cl_int> {
    let base = std::env::temp_dir().join("cloister-includes");
    std::fs::create_dir_all(&base).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
    let root = base.join(content_name(inc));
    if root.is_dir() {
        // Used again: keep it among the recent ones.
        let _ = std::fs::File::open(&root).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    } else {
        write_set(&base, &root, inc)?;
        prune(&base);
    }
    let mut flags = Vec::new();
    for d in &inc.dirs {
        flags.push(format!("-I{}", inside(&root, d).ok_or(CL_INVALID_BUILD_OPTIONS)?.display()));
    }
    let mut out = flags.join(" ").into_bytes();
    if let Some(o) = options.filter(|o| !o.is_empty()) {
        out.push(b' ');
        out.extend_from_slice(o);
    }
    Ok(out)
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
    fn same_headers_same_folder_edited_headers_new_folder() {
        let set = |text: &str| AppIncludes {
            dirs: vec!["/app/inc".into()],
            files: vec![("/app/inc/x.h".into(), text.as_bytes().to_vec())],
        };
        let dir_of = |opts: Vec<u8>| {
            let opts = String::from_utf8(opts).unwrap();
            assert!(opts.ends_with(" -DY"), "{opts}");
            opts.split_whitespace().next().unwrap().strip_prefix("-I").unwrap().to_string()
        };
        let a = dir_of(stage(&set("#define X 1"), Some(b"-DY")).unwrap());
        assert_eq!(std::fs::read(Path::new(&a).join("x.h")).unwrap(), b"#define X 1");
        assert_eq!(a, dir_of(stage(&set("#define X 1"), Some(b"-DY")).unwrap()));
        let b = dir_of(stage(&set("#define X 2"), Some(b"-DY")).unwrap());
        assert_ne!(a, b);
        assert_eq!(std::fs::read(Path::new(&b).join("x.h")).unwrap(), b"#define X 2");
    }
}
