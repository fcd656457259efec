//! The worker's cage: process hygiene, resource limits, a network namespace, landlock, every
//! capability dropped, and a seccomp allow-list, driven by per-driver profiles kept as reviewed data files in
//! `profiles/`. Each layer reports whether it is on, and why not, so `cloister info` can show it.

pub mod caps;
pub mod fs;
pub mod ioctl;
pub mod learn;
pub mod process;
pub mod profile;
pub mod seccomp;
#[cfg(target_arch = "x86_64")]
mod syscalls_x86_64;

use std::fmt;
use std::path::Path;

pub use process::close_fds_except;
pub use profile::Profile;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{0} failed: {1}")]
    Os(&'static str, std::io::Error),
    #[error("bad profile: {0}")]
    Profile(String),
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("landlock: {0}")]
    Landlock(String),
    #[error("{0}")]
    Unsupported(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerState {
    On,
    /// Not applied, and why.
    Off(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub name: &'static str,
    pub state: LayerState,
}

impl Layer {
    pub fn is_on(&self) -> bool {
        self.state == LayerState::On
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            LayerState::On => write!(f, "{}: on", self.name),
            LayerState::Off(why) => write!(f, "{}: off ({why})", self.name),
        }
    }
}

fn result_layer(name: &'static str, r: Result<LayerState, SandboxError>) -> Layer {
    Layer { name, state: r.unwrap_or_else(|e| LayerState::Off(e.to_string())) }
}

/// The environment variables a driver may see; everything else is dropped.
pub const ENV_PASSTHROUGH: &[&str] =
    &["PATH", "LANG", "LC_ALL", "POCL_DEBUG", "POCL_DEVICES", "POCL_MAX_PTHREAD_COUNT", "CUDA_VISIBLE_DEVICES"];

/// What to apply.
pub struct CageSpec<'a> {
    pub profile: &'a Profile,
    /// Read-write directories private to this worker (its cache and temp dir).
    pub private_dirs: &'a [&'a Path],
    /// Read-only places beyond the profile's: the driver library's own directory.
    pub extra_read: &'a [&'a Path],
    /// Fds to keep open (the channel, the flight recorder).
    pub keep_fds: &'a [i32],
    /// Off for `cloister policy learn` and `--no-sandbox`: hygiene only.
    pub confine: bool,
}

/// Applies every layer, in order, to the calling (still single-threaded) process, and reports
/// each. Seccomp goes last: the layers before it need calls it forbids. Returns the seccomp
/// listener the broker supervises violations through, when the kernel provides one.
pub fn apply(spec: &CageSpec) -> (Vec<Layer>, Option<std::os::fd::OwnedFd>) {
    let mut layers = vec![close_fds_except(spec.keep_fds)];
    layers.extend(process::hygiene());
    if !spec.confine {
        for name in ["rlimits", "network namespace", "landlock", "capabilities dropped", "seccomp"] {
            layers.push(Layer { name, state: LayerState::Off("sandbox disabled for this worker".into()) });
        }
        return (layers, None);
    }
    layers.extend(process::rlimits(spec.profile));
    layers.push(process::no_network());
    layers.push(result_layer("landlock", fs::apply(spec.profile, spec.private_dirs, spec.extra_read)));
    // Last before seccomp: the namespaces and landlock need privileges, capset and prctl are
    // not in any allow-list.
    layers.push(caps::drop_all());
    let mut listener = None;
    let filters = seccomp::build(spec.profile)
        .and_then(|f| Ok((f, seccomp::build_with(spec.profile, seccomp::Spawning::Unsupervised)?)));
    let seccomp = filters.and_then(|(f, fallback)| seccomp::install(&f, &fallback)).map(|l| {
        listener = l;
        LayerState::On
    });
    layers.push(result_layer("seccomp", seccomp));
    (layers, listener)
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_reports_errno_when_off() {
        // SAFETY: setting errno to a known value for the report.
        unsafe { *libc::__errno_location() = libc::EPERM };
        let l = process::layer("x", -1);
        assert!(matches!(l.state, LayerState::Off(ref why) if why.contains("not permitted")), "{l}");
        assert_eq!(process::layer("y", 0).to_string(), "y: on");
    }
}
