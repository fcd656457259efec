//! Finding drivers: the `.icd` files of the system's OpenCL vendor registry.

use std::path::{Path, PathBuf};

/// A driver the broker can host in a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// The `.icd` file's stem (`pocl`), or the library path for `--driver PATH`.
    pub name: String,
    /// What the `.icd` file names: a library name (searched by the loader) or a path.
    pub library: String,
}

pub const DEFAULT_VENDORS_DIR: &str = "/etc/OpenCL/vendors";

/// Where `cloister install --system` moves the caged drivers' `.icd` files, so that
/// applications (whose loader reads `DEFAULT_VENDORS_DIR`) see each driver once, through
/// cloister, while cloister still finds them.
pub const HIDDEN_VENDORS_DIR: &str = "/etc/cloister/vendors";

/// The vendor folders cloister reads (not the one it gives the application), first wins: the
/// `vendors_dir` setting (`CLOISTER_VENDORS_DIR`, the configuration files) alone when set, else
/// the hidden drivers and then the system registry.
pub fn vendors_dirs() -> Vec<PathBuf> {
    match cloister_ipc::settings::get("vendors_dir", None) {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![PathBuf::from(HIDDEN_VENDORS_DIR), PathBuf::from(DEFAULT_VENDORS_DIR)],
    }
}

/// Every driver of `vendors_dirs()`, one per name, sorted by name.
pub fn discover_all(shim: &Path) -> Vec<Driver> {
    let mut out: Vec<Driver> = Vec::new();
    for dir in vendors_dirs() {
        for d in discover(&dir, shim) {
            if !out.iter().any(|o| o.name == d.name) {
                out.push(d);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The drivers whose `.icd` files an application's loader sees beside cloister's own in the
/// system registry, where each is then listed twice, once not caged (after a driver package
/// upgrade or install put its `.icd` back). Empty when cloister is not registered there or
/// `vendors_dir` is set.
pub fn visible_beside_cloister(shim: &Path) -> Vec<String> {
    let dir = Path::new(DEFAULT_VENDORS_DIR);
    if cloister_ipc::settings::get("vendors_dir", None).is_some() || !dir.join("cloister.icd").exists() {
        return Vec::new();
    }
    discover(dir, shim).into_iter().map(|d| d.name).collect()
}

/// Every registered driver except cloister's own shim, sorted by name.
pub fn discover(dir: &Path, shim: &Path) -> Vec<Driver> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let shim_canon = std::fs::canonicalize(shim).ok();
    let mut out: Vec<Driver> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "icd"))
        .filter_map(|p| {
            let library = std::fs::read_to_string(&p).ok()?.lines().next()?.trim().to_string();
            let name = p.file_stem()?.to_string_lossy().into_owned();
            Some(Driver { name, library })
        })
        .filter(|d| !is_cloister(&d.library, shim_canon.as_deref()))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn is_cloister(library: &str, shim: Option<&Path>) -> bool {
    if Path::new(library).file_name().is_some_and(|f| f.to_string_lossy().starts_with("libcloister")) {
        return true;
    }
    match (std::fs::canonicalize(library).ok(), shim) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Resolves `--driver NAME|PATH` against the registry.
pub fn select(all: &[Driver], want: &str) -> Result<Driver, String> {
    if want.contains('/') {
        // Absolute before anything starts: the worker runs in its cache folder, where a relative
        // path names something else.
        let abs = std::fs::canonicalize(want).map_err(|e| format!("driver library {want}: {e}"))?;
        if !abs.is_file() {
            return Err(format!("driver library {want} is not a file"));
        }
        let abs = abs.to_string_lossy().into_owned();
        return Ok(Driver { name: want.to_string(), library: abs });
    }
    all.iter()
        .find(|d| d.name == want || d.library == want || Path::new(&d.library).file_name().is_some_and(|f| f == want))
        .cloned()
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
            format!(
                "no driver named {want}; registered: {}",
                if names.is_empty() { "none".into() } else { names.join(", ") }
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovers_icd_files_and_skips_cloister() {
        let dir = std::env::temp_dir().join(format!("cloister-drivers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pocl.icd"), "libpocl.so.2\n").unwrap();
        std::fs::write(dir.join("cloister.icd"), "/opt/x/libcloister.so\n").unwrap();
        std::fs::write(dir.join("README"), "not an icd").unwrap();
        let found = discover(&dir, Path::new("/nonexistent/libcloister.so"));
        assert_eq!(found, vec![Driver { name: "pocl".into(), library: "libpocl.so.2".into() }]);
        assert_eq!(select(&found, "pocl").unwrap().library, "libpocl.so.2");
        assert_eq!(select(&found, "libpocl.so.2").unwrap().name, "pocl");
        assert!(select(&found, "nvidia").unwrap_err().contains("registered: pocl"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
