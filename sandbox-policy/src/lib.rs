//! The worker's cage. This crate holds the layers the worker applies to itself before it loads
//! a driver, and reports each one's state so `cloister info` can show it.

use std::fmt;

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

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            LayerState::On => write!(f, "{}: on", self.name),
            LayerState::Off(why) => write!(f, "{}: off ({why})", self.name),
        }
    }
}

fn layer(name: &'static str, rc: libc::c_int) -> Layer {
    let state = if rc == 0 {
        LayerState::On
    } else {
        LayerState::Off(std::io::Error::last_os_error().to_string())
    };
    Layer { name, state }
}

/// Closes every fd above 2 except `keep`, so the driver inherits nothing of the broker's.
pub fn close_fds_except(keep: &[i32]) -> Layer {
    let mut rc = 0;
    let mut from = 3;
    let mut sorted: Vec<i32> = keep.iter().copied().filter(|&fd| fd >= 3).collect();
    sorted.sort_unstable();
    for k in sorted {
        if k > from {
            // SAFETY: close_range only closes descriptors; none of them are in use by Rust objects
            // this early in the worker's life except `keep`, which is excluded.
            rc |= unsafe { libc::syscall(libc::SYS_close_range, from as u32, (k - 1) as u32, 0) } as i32;
        }
        from = k + 1;
    }
    // SAFETY: as above.
    rc |= unsafe { libc::syscall(libc::SYS_close_range, from as u32, u32::MAX, 0) } as i32;
    layer("closed fds", rc)
}

/// Process hygiene: die with the parent, own session, no privilege gain, no core dumps.
pub fn apply_process_hygiene() -> Vec<Layer> {
    // SAFETY: prctl/setsid/setrlimit with constant, valid arguments.
    unsafe {
        let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        vec![
            layer("parent-death signal", libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0)),
            layer("own session", if libc::setsid() < 0 { -1 } else { 0 }),
            layer("no_new_privs", libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
            layer("rlimit core=0", libc::setrlimit(libc::RLIMIT_CORE, &core)),
        ]
    }
}

/// The environment variables a driver may see; everything else is dropped.
pub const ENV_PASSTHROUGH: &[&str] = &["PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "XDG_CACHE_HOME", "POCL_DEBUG", "POCL_CACHE_DIR"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_reports_errno_when_off() {
        // SAFETY: setting errno to a known value for the report.
        unsafe { *libc::__errno_location() = libc::EPERM };
        let l = layer("x", -1);
        assert!(matches!(l.state, LayerState::Off(ref why) if why.contains("not permitted")), "{l}");
        assert_eq!(layer("y", 0).to_string(), "y: on");
    }
}
