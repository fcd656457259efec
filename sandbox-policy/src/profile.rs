//! Driver profiles: reviewed data files (`sandbox-policy/profiles/*.toml`) saying what a driver
//! may read, write, execute and call. Chosen by the driver library's name, overridable with a
//! profile file.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SandboxError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub open_files: u64,
    /// 0: no limit.
    #[serde(default)]
    pub address_space_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Filesystem {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub execute: Vec<String>,
    #[serde(default)]
    pub write: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Seccomp {
    pub allow: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    /// Library file-name prefixes this profile is chosen for.
    #[serde(default)]
    pub libraries: Vec<String>,
    /// May the driver start (vfork-style) child processes? Execution is still confined to
    /// `filesystem.execute`.
    #[serde(default)]
    pub spawn: bool,
    pub limits: Limits,
    #[serde(default)]
    pub filesystem: Filesystem,
    #[serde(default)]
    pub seccomp: Seccomp,
}

/// The profiles shipped with cloister, as reviewed source files.
pub const BUILTIN: &[(&str, &str)] = &[
    ("pocl", include_str!("../profiles/pocl.toml")),
    ("nvidia", include_str!("../profiles/nvidia.toml")),
    ("generic", include_str!("../profiles/generic.toml")),
];

impl Profile {
    pub fn parse(text: &str) -> Result<Self, SandboxError> {
        let p: Profile = toml::from_str(text).map_err(|e| SandboxError::Profile(e.to_string()))?;
        for name in &p.seccomp.allow {
            if crate::seccomp::syscall_number(name).is_none() {
                return Err(SandboxError::Profile(format!("profile {}: unknown system call {name}", p.name)));
            }
        }
        Ok(p)
    }

    pub fn builtin(name: &str) -> Option<Self> {
        BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, text)| Self::parse(text).expect("built-in profiles parse"))
    }

    /// A profile by built-in name or file path.
    pub fn load(name_or_path: &str) -> Result<Self, SandboxError> {
        if let Some(p) = Self::builtin(name_or_path) {
            return Ok(p);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| {
            SandboxError::Profile(format!("profile {name_or_path}: not a built-in profile and not readable: {e}"))
        })?;
        Self::parse(&text)
    }

    /// The built-in profile for a driver library, `generic` when none claims it.
    pub fn for_library(library: &str) -> Self {
        let file = Path::new(library).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        BUILTIN
            .iter()
            .filter_map(|(n, _)| Self::builtin(n))
            .find(|p| p.libraries.iter().any(|prefix| file.starts_with(prefix.as_str())))
            .unwrap_or_else(|| Self::builtin("generic").expect("generic profile"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_are_chosen_by_library_name() {
        for (name, _) in BUILTIN {
            assert_eq!(Profile::builtin(name).unwrap().name, *name);
        }
        assert_eq!(Profile::for_library("libpocl.so.2.10.0").name, "pocl");
        assert_eq!(Profile::for_library("/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1").name, "nvidia");
        assert_eq!(Profile::for_library("libmystery.so").name, "generic");
    }

    #[test]
    fn unknown_syscalls_are_rejected_with_their_name() {
        let text = include_str!("../profiles/pocl.toml").replace("\"brk\",", "\"brk\", \"no_such_call\",");
        let err = Profile::parse(&text).unwrap_err().to_string();
        assert!(err.contains("no_such_call"), "{err}");
    }
}
