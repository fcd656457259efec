//! The application's headers for one build, laid out under their own paths in a private
//! folder the driver can read (see the shim's `includes` module for why). The folder is named
//! after the headers' contents, so an unchanged set of headers gives the driver the same build
//! options as last time and its kernel cache still hits; an edited header gives a new folder.
//!
//! The folders live in the driver's cache, which every application of this user shares with
//! that driver, and which a compromised worker can write. So a folder is reused only when it
//! holds exactly the set it is named after (same folders, same files, same bytes, no links, no
//! extra files); anything else is moved aside and staged afresh.

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
        for d in inc.folders() {
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

/// Whether `root` holds exactly `inc`: every folder and file it names, with the same bytes,
/// and nothing else (a planted extra header would shadow a system one); no links anywhere.
fn holds_exactly(root: &Path, inc: &AppIncludes) -> bool {
    use std::collections::BTreeMap;
    let mut expected: BTreeMap<PathBuf, Option<&[u8]>> = BTreeMap::new();
    let add_dirs = |p: &Path, expected: &mut BTreeMap<PathBuf, Option<&[u8]>>| {
        for a in p.ancestors().take_while(|a| a.starts_with(root) && *a != root) {
            expected.entry(a.to_path_buf()).or_insert(None);
        }
    };
    for d in inc.folders() {
        let Some(p) = inside(root, d) else { return false };
        add_dirs(&p, &mut expected);
    }
    for (path, bytes) in &inc.files {
        let Some(p) = inside(root, path) else { return false };
        if let Some(parent) = p.parent() {
            add_dirs(parent, &mut expected);
        }
        expected.insert(p, Some(bytes));
    }
    let mut seen = 0usize;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { return false };
        for entry in entries {
            let Ok(entry) = entry else { return false };
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { return false };
            match expected.get(&path) {
                Some(None) if meta.file_type().is_dir() => stack.push(path),
                Some(Some(bytes)) if meta.file_type().is_file() => {
                    if std::fs::read(&path).ok().as_deref() != Some(*bytes) {
                        return false;
                    }
                }
                _ => return false,
            }
            seen += 1;
        }
    }
    seen == expected.len()
}

/// `<TMPDIR>/cloister-includes`, made again if something else took its place.
fn staging_base() -> Result<PathBuf, cl_int> {
    let base = std::env::temp_dir().join("cloister-includes");
    match std::fs::symlink_metadata(&base) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => std::fs::remove_file(&base).map_err(|_| CL_OUT_OF_HOST_MEMORY)?,
        Err(_) => {}
    }
    std::fs::create_dir_all(&base).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
    Ok(base)
}

/// Stages the headers (once per distinct set, checked on reuse) and returns the build options
/// with `-I` pointing at the copies.
pub fn stage(inc: &AppIncludes, options: Option<&[u8]>) -> Result<Vec<u8>, cl_int> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = staging_base()?;
    let root = base.join(content_name(inc));
    let exists = std::fs::symlink_metadata(&root).is_ok();
    if exists && holds_exactly(&root, inc) {
        // Used again: keep it among the recent ones.
        let _ = std::fs::File::open(&root).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    } else {
        if exists {
            // Not what its name says: move it out of the way (a rename works on a file, a
            // link or a folder alike) and stage the set again.
            let aside = base.join(format!(".bad-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
            if std::fs::rename(&root, &aside).is_ok() {
                let _ = std::fs::remove_dir_all(&aside).or_else(|_| std::fs::remove_file(&aside));
            }
        }
        write_set(&base, &root, inc)?;
        if !holds_exactly(&root, inc) {
            return Err(CL_OUT_OF_HOST_MEMORY);
        }
        prune(&base);
    }
    let mut flags = Vec::new();
    for d in &inc.dirs {
        flags.push(format!("-I{}", inside(&root, d).ok_or(CL_INVALID_BUILD_OPTIONS)?.display()));
    }
    for (name, d) in &inc.macro_dirs {
        // A name that could carry another option (blanks, `=`) is no macro name.
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(CL_INVALID_BUILD_OPTIONS);
        }
        flags.push(format!("-D{name}={}", inside(&root, d).ok_or(CL_INVALID_BUILD_OPTIONS)?.display()));
    }
    let mut out = flags.join(" ").into_bytes();
    if let Some(o) = options.filter(|o| !o.is_empty()) {
        out.push(b' ');
        out.extend_from_slice(o);
    }
    Ok(out)
}

/// `text` (a build log) with every path into a staged header set given back as the
/// application's own: `<staging base>/<set>/tmp/app/inc/a.h` becomes `/tmp/app/inc/a.h`, so a
/// log names the application's files, not the worker's copies of them.
pub fn unstaged(text: &[u8]) -> Vec<u8> {
    let base = std::env::temp_dir().join("cloister-includes");
    unstaged_under(text, base.as_os_str().as_encoded_bytes())
}

fn unstaged_under(text: &[u8], base: &[u8]) -> Vec<u8> {
    /// `/` and a set's name (`content_name`: 16 hexadecimal digits).
    const SET: usize = 17;
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let set = rest.strip_prefix(base).and_then(|r| r.get(..SET));
        if let Some(set) = set.filter(|s| s[0] == b'/' && s[1..].iter().all(u8::is_ascii_hexdigit)) {
            debug_assert_eq!(set.len(), SET);
            i += base.len() + SET;
            continue;
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_logs_name_the_applications_headers() {
        let base = b"/cache/tmp/cloister-includes";
        let log = b"/cache/tmp/cloister-includes/0123456789abcdef/app/inc/bad.h:2:23: error\n\
                    In file included from /cache/tmp/cloister-includes/fedcba9876543210/app/a.h:1:";
        let want = b"/app/inc/bad.h:2:23: error\n\
                    In file included from /app/a.h:1:";
        assert_eq!(unstaged_under(log, base), want.to_vec());
        // Not a set's name (too short, not hexadecimal), or another folder: left alone.
        for kept in [
            &b"/cache/tmp/cloister-includes/0123/x.h"[..],
            b"/cache/tmp/cloister-includes/0123456789abcdeg/x.h",
            b"/other/0123456789abcdef/x.h",
        ] {
            assert_eq!(unstaged_under(kept, base), kept.to_vec());
        }
        assert_eq!(unstaged_under(b"/cache/tmp/cloister-includes", base), b"/cache/tmp/cloister-includes".to_vec());
    }

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
            macro_dirs: vec![],
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
        // Tampered with (as another application's compromised worker could): staged afresh.
        std::fs::write(Path::new(&a).join("x.h"), b"#define X 666").unwrap();
        assert_eq!(a, dir_of(stage(&set("#define X 1"), Some(b"-DY")).unwrap()));
        assert_eq!(std::fs::read(Path::new(&a).join("x.h")).unwrap(), b"#define X 1");
        std::fs::write(Path::new(&a).join("stdio.h"), b"planted").unwrap();
        assert_eq!(a, dir_of(stage(&set("#define X 1"), Some(b"-DY")).unwrap()));
        assert!(!Path::new(&a).join("stdio.h").exists(), "an extra header is not kept");
    }
}
