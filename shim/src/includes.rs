//! `#include` and `-I` for a driver that cannot see the application's files. The worker's
//! landlock rules keep the driver out of the application's directories, so the shim finds the
//! headers a build needs (following `#include` lines from the source through the search path
//! the driver would use: the including file's folder, the `-I` folders, the working folder),
//! ships them with the build, and the worker lays them out under the same paths in a private
//! folder and points the `-I` options there. Both branches of a conditional include are
//! shipped; an include named by a macro is not found (the build log says so, as it would for a
//! missing file). An include by absolute path (`#include "/abs/x.h"`) would make the driver open
//! the application's file itself, so the driver is given `#include "abs/x.h"` instead (in the
//! program's source and in the shipped headers), found under the staged root (`/` joins the
//! search folders).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use cloister_ipc::AppIncludes;

/// Limits on what one build ships: headers are small, and a runaway search must not copy a disk.
const MAX_FILE: u64 = 16 << 20;
const MAX_TOTAL: u64 = 64 << 20;
const MAX_FILES: usize = 4096;

/// Build options split: the `-I` folders (absolute), the `-D NAME=FOLDER` macros whose value
/// is a folder (absolute), and everything else.
struct Options {
    dirs: Vec<PathBuf>,
    macro_dirs: Vec<(String, PathBuf)>,
    rest: String,
}

fn split_options(options: &str, cwd: &Path) -> Options {
    let mut out = Options { dirs: Vec::new(), macro_dirs: Vec::new(), rest: String::new() };
    let mut rest = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        if let Some(define) = w.strip_prefix("-D") {
            let (define, words_used) = match define {
                "" => (words.next().unwrap_or_default(), vec![w]),
                d => (d, vec![]),
            };
            let folder = define.split_once('=').and_then(|(name, value)| {
                let value = value.trim_matches('"');
                let dir = cwd.join(value);
                (!name.is_empty() && !value.is_empty() && dir.is_dir()).then(|| (name.to_string(), dir))
            });
            match folder {
                Some(m) => out.macro_dirs.push(m),
                None => {
                    rest.extend(words_used);
                    rest.push(if w == "-D" { define } else { w });
                }
            }
            continue;
        }
        let dir = if w == "-I" {
            words.next()
        } else if let Some(d) = w.strip_prefix("-I") {
            Some(d)
        } else {
            rest.push(w);
            continue;
        };
        if let Some(d) = dir {
            out.dirs.push(cwd.join(d.trim_matches('"')));
        }
    }
    out.rest = rest.join(" ");
    out
}

/// The files under `dir` (its subfolders too, not following links), in a stable order, at
/// most `MAX_FILES`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() && out.len() < MAX_FILES => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}

/// Where the name of an `#include` line sits: (start, end) byte offsets within `line`, and
/// whether it was quoted.
fn include_name_span(line: &[u8]) -> Option<(usize, usize, bool)> {
    let skip_blanks = |mut i: usize| {
        while line.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    let mut i = skip_blanks(0);
    if line.get(i) != Some(&b'#') {
        return None;
    }
    i = skip_blanks(i + 1);
    if !line[i..].starts_with(b"include") {
        return None;
    }
    i = skip_blanks(i + b"include".len());
    let (close, quoted) = match line.get(i) {
        Some(b'"') => (b'"', true),
        Some(b'<') => (b'>', false),
        _ => return None,
    };
    let end = i + 1 + line[i + 1..].iter().position(|&b| b == close)?;
    Some((i + 1, end, quoted))
}

/// The names in the `#include` lines of `text`, with whether they were quoted.
fn include_names(text: &[u8]) -> Vec<(String, bool)> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let (start, end, quoted) = include_name_span(line)?;
            Some((String::from_utf8_lossy(&line[start..end]).into_owned(), quoted))
        })
        .collect()
}

/// `text` with every absolute `#include` name made relative (leading `/` removed), or `None`
/// when it has none. Lines and their count stay as they were.
pub fn relative_includes(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut changed = false;
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        if n > 0 {
            out.push(b'\n');
        }
        match include_name_span(line) {
            Some((start, end, _)) if line[start..end].starts_with(b"/") => {
                let slashes = line[start..end].iter().take_while(|&&b| b == b'/').count();
                out.extend_from_slice(&line[..start]);
                out.extend_from_slice(&line[start + slashes..]);
                changed = true;
            }
            _ => out.extend_from_slice(line),
        }
    }
    changed.then_some(out)
}

/// What a build of `sources` with `options` needs from the application's files; `None` when
/// the build needs nothing (no `-I` and no `#include`).
pub fn gather(sources: &[u8], options: Option<&[u8]>) -> Option<(AppIncludes, Vec<u8>)> {
    let options = String::from_utf8_lossy(options.unwrap_or_default()).into_owned();
    if !options.contains("-I") && !sources.windows(8).any(|w| w == b"#include") {
        return None;
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let Options { dirs, macro_dirs, rest } = split_options(&options, &cwd);
    let mut search = dirs.clone();
    search.push(cwd.clone());
    let mut seen = HashSet::new();
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut absolute = false;
    let mut work: Vec<(Vec<u8>, Option<PathBuf>)> = vec![(sources.to_vec(), None)];
    // An include named by a macro cannot be followed here: every file of the macro's folder
    // goes (the application pointed the build there), within the same limits.
    let named_by_macro: Vec<(String, bool)> =
        macro_dirs.iter().flat_map(|(_, d)| files_under(d)).map(|p| (p.to_string_lossy().into_owned(), true)).collect();
    let mut first = Some(named_by_macro);
    while let Some((text, folder)) = work.pop() {
        for (name, quoted) in first.take().unwrap_or_default().into_iter().chain(include_names(&text)) {
            let here = folder.iter().filter(|_| quoted);
            let found = here.chain(search.iter()).map(|d| d.join(&name)).find(|p| p.is_file());
            let Some(path) = found else { continue };
            if !seen.insert(path.clone()) || files.len() >= MAX_FILES {
                continue;
            }
            let len = path.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            if len > MAX_FILE || total + len > MAX_TOTAL {
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else { continue };
            total += len;
            absolute |= Path::new(&name).is_absolute();
            let shipped = relative_includes(&bytes).unwrap_or_else(|| bytes.clone());
            work.push((bytes, path.parent().map(Path::to_path_buf)));
            files.push((path.to_string_lossy().into_owned(), shipped));
        }
    }
    let mut dirs: Vec<String> = dirs.iter().map(|d| d.to_string_lossy().into_owned()).collect();
    dirs.push(cwd.to_string_lossy().into_owned());
    if absolute {
        // The staged root, where the driver finds the includes that were absolute.
        dirs.push("/".into());
    }
    let macro_dirs = macro_dirs.into_iter().map(|(n, d)| (n, d.to_string_lossy().into_owned())).collect();
    Some((AppIncludes { dirs, files, macro_dirs }, rest.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_dirs_are_split_out_and_made_absolute() {
        let o = split_options("-DX=1 -I inc -I/abs -D Y=2 -cl-fast-relaxed-math", Path::new("/w"));
        assert_eq!(o.dirs, [PathBuf::from("/w/inc"), PathBuf::from("/abs")]);
        assert_eq!(o.rest, "-DX=1 -D Y=2 -cl-fast-relaxed-math");
        assert!(o.macro_dirs.is_empty());
        let o = split_options("-D INC=/usr/include -DT=\"/tmp\" -DZ=/no/such/dir", Path::new("/w"));
        assert_eq!(o.macro_dirs, [("INC".into(), PathBuf::from("/usr/include")), ("T".into(), PathBuf::from("/tmp"))]);
        assert_eq!(o.rest, "-DZ=/no/such/dir");
    }

    #[test]
    fn include_lines_are_found() {
        let src = b"  #  include \"a.h\"\n#include <b/c.h>\n// #include \"no\"\n#define X\n";
        assert_eq!(include_names(src), [("a.h".into(), true), ("b/c.h".into(), false)]);
    }

    #[test]
    fn absolute_includes_become_relative_and_nothing_else_changes() {
        let src = b"#include \"/abs/a.h\"\n  #  include </b.h>\n#include \"rel.h\"\nint x; // \"/no\"\n";
        let out = relative_includes(src).unwrap();
        assert_eq!(out, b"#include \"abs/a.h\"\n  #  include <b.h>\n#include \"rel.h\"\nint x; // \"/no\"\n");
        assert_eq!(relative_includes(b"#include \"rel.h\"\n"), None);
        assert_eq!(relative_includes(b"#include \"/unclosed\n"), None);
    }

    #[test]
    fn absolute_includes_are_shipped_rewritten_with_the_root_searched() {
        let dir = std::env::temp_dir().join(format!("cloister-abs-includes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inner = dir.join("inner.h");
        std::fs::write(&inner, "#define INNER 1\n").unwrap();
        std::fs::write(dir.join("outer.h"), format!("#include \"{}\"\n", inner.display())).unwrap();
        let src = format!("#include \"{}\"\n", dir.join("outer.h").display());
        let (inc, _) = gather(src.as_bytes(), None).unwrap();
        assert_eq!(inc.files.len(), 2, "{:?}", inc.files);
        assert!(inc.dirs.last().is_some_and(|d| d == "/"), "{:?}", inc.dirs);
        let outer = &inc.files[0].1;
        assert_eq!(outer, format!("#include \"{}\"\n", inner.display().to_string().trim_start_matches('/')).as_bytes());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nested_headers_are_gathered_once() {
        let dir = std::env::temp_dir().join(format!("cloister-includes-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.h"), "#include \"sub/b.h\"\n#include \"a.h\"\n").unwrap();
        std::fs::write(dir.join("sub/b.h"), "#define B 1\n").unwrap();
        let opts = format!("-I {}", dir.display());
        let (inc, rest) = gather(b"#include \"a.h\"\n", Some(opts.as_bytes())).unwrap();
        let names: Vec<&str> = inc.files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[1].ends_with("sub/b.h"));
        assert!(rest.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
