//! Driver profiles: reviewed data files (`sandbox-policy/profiles/*.toml`) saying what a driver
//! may read, write, execute and call. Chosen by the driver library's name, overridable with a
//! profile file.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SandboxError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub open_files: u64,
    /// 0: no limit.
    #[serde(default)]
    pub address_space_mib: u64,
    /// Most processes alive at once in the worker's cage (the worker itself included) when the
    /// profile allows spawning; the broker's supervisor answers EAGAIN to a vfork-style clone
    /// past it. RLIMIT_NPROC cannot do this: it does not bind root, and counts per user.
    #[serde(default = "default_processes")]
    pub processes: u64,
}

fn default_processes() -> u64 {
    16
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub execute: Vec<String>,
    #[serde(default)]
    pub write: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Seccomp {
    pub allow: Vec<String>,
    /// The `ioctl` requests the driver may make, by name (`TCGETS`) or number (`0x5401`, or a
    /// TOML integer), compared on the request's 32 bits as the kernel reads them. Only used when
    /// `allow` names `ioctl`; absent, only the harmless base set (`ioctl::BASE`) is allowed.
    #[serde(default)]
    pub ioctls: Vec<IoctlName>,
    /// `ioctl` type bytes allowed whatever the request's number, size and direction (NVIDIA's
    /// `_IOWR('F', nr, size)` requests on /dev/nvidia*): one character each.
    #[serde(default)]
    pub ioctl_types: Vec<String>,
    /// The `socket()` domains allowed when `allow` names `socket`: `AF_UNIX` when absent.
    #[serde(default)]
    pub socket_domains: Vec<String>,
}

/// An ioctl request as a profile writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IoctlName {
    Number(u64),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Socket domains a profile may name.
pub const SOCKET_DOMAINS: &[(&str, u64)] = &[
    ("AF_UNIX", libc::AF_UNIX as u64),
    ("AF_INET", libc::AF_INET as u64),
    ("AF_INET6", libc::AF_INET6 as u64),
    ("AF_NETLINK", libc::AF_NETLINK as u64),
];

/// The profiles shipped with cloister, as reviewed source files.
pub const BUILTIN: &[(&str, &str)] = &[
    ("pocl", include_str!("../profiles/pocl.toml")),
    ("nvidia", include_str!("../profiles/nvidia.toml")),
    ("generic", include_str!("../profiles/generic.toml")),
];

impl Profile {
    /// Parses a profile's text. Unknown keys are errors (a typo such as `spwan = false` must not
    /// silently mean "not set"); toml's message names the line and column, and serde's the keys
    /// that are known there.
    pub fn parse(text: &str) -> Result<Self, SandboxError> {
        let p: Profile =
            toml::from_str(text).map_err(|e| SandboxError::Profile(e.to_string().trim_end().to_string()))?;
        for name in &p.seccomp.allow {
            if crate::seccomp::syscall_number(name).is_none() {
                return Err(SandboxError::Profile(format!("profile {}: unknown system call {name}", p.name)));
            }
        }
        p.ioctl_requests()?;
        p.ioctl_type_bytes()?;
        p.socket_domain_numbers()?;
        Ok(p)
    }

    /// The ioctl requests this profile allows, with the base set; refuses unknown names and the
    /// requests no driver may have (terminal input injection).
    pub fn ioctl_requests(&self) -> Result<Vec<u32>, SandboxError> {
        let mut out: Vec<u32> =
            crate::ioctl::BASE.iter().map(|n| crate::ioctl::number(n).expect("base names")).collect();
        for i in &self.seccomp.ioctls {
            let nr = match i {
                IoctlName::Number(n) => u32::try_from(*n).ok(),
                IoctlName::Name(s) => crate::ioctl::number(s),
            }
            .ok_or_else(|| SandboxError::Profile(format!("profile {}: unknown ioctl {i:?}", self.name)))?;
            if crate::ioctl::NEVER.contains(&nr) {
                return Err(SandboxError::Profile(format!(
                    "profile {}: ioctl {} is never allowed (it injects terminal input)",
                    self.name,
                    crate::ioctl::name(nr).unwrap_or("?")
                )));
            }
            out.push(nr);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The ioctl type bytes allowed whole.
    pub fn ioctl_type_bytes(&self) -> Result<Vec<u8>, SandboxError> {
        self.seccomp
            .ioctl_types
            .iter()
            .map(|t| match t.as_bytes() {
                [b] => Ok(*b),
                _ => {
                    Err(SandboxError::Profile(format!("profile {}: ioctl type {t:?} is not one character", self.name)))
                }
            })
            .collect()
    }

    /// The socket domains allowed, as numbers.
    pub fn socket_domain_numbers(&self) -> Result<Vec<u64>, SandboxError> {
        let names: Vec<&str> = if self.seccomp.socket_domains.is_empty() {
            vec!["AF_UNIX"]
        } else {
            self.seccomp.socket_domains.iter().map(String::as_str).collect()
        };
        names
            .iter()
            .map(|n| {
                SOCKET_DOMAINS
                    .iter()
                    .find(|(name, _)| name == n)
                    .map(|&(_, v)| v)
                    .ok_or_else(|| SandboxError::Profile(format!("profile {}: unknown socket domain {n}", self.name)))
            })
            .collect()
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
            let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
            SandboxError::Profile(format!(
                "profile {name_or_path}: not a built-in profile ({}) and not a readable file: {e}",
                names.join(", ")
            ))
        })?;
        Self::parse(&text).map_err(|e| match e {
            SandboxError::Profile(m) => SandboxError::Profile(format!("profile file {name_or_path}: {m}")),
            other => other,
        })
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
    fn unknown_keys_are_refused_with_file_line_and_known_keys() {
        let good = BUILTIN.iter().find(|(n, _)| *n == "generic").unwrap().1;
        let dir = std::env::temp_dir().join(format!("cloister-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("typo.toml");
        std::fs::write(&file, good.replacen("spawn =", "spwan =", 1)).unwrap();
        let e = Profile::load(file.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("typo.toml") && e.contains("spwan") && e.contains("line"), "{e}");
        assert!(e.contains("`spawn`") && e.contains("`limits`"), "known keys missing: {e}");
        let nested = good.replacen("[filesystem]", "[filesystem]\nreadd = []", 1);
        let e = Profile::parse(&nested).unwrap_err().to_string();
        assert!(e.contains("readd") && e.contains("`read`"), "{e}");
        let e = Profile::load("nonexistent").unwrap_err().to_string();
        assert!(e.contains("nonexistent") && e.contains("pocl, nvidia, generic"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
