//! The capability layer: once the namespaces and landlock are in place (they need privileges),
//! the worker gives up every capability it holds: bounding, ambient, inheritable, permitted and
//! effective sets, and locks the securebits so that uid 0 regains nothing on `execve`.
//!
//! Why all five: started by root the worker holds every capability (reading any process's
//! memory and environment, kernel addresses, raw devices); started by a user it holds every
//! capability of the user namespace it creates for its network namespace (`CAP_NET_ADMIN`
//! there opens nf_tables and packet sockets). Clearing effective and permitted takes them away
//! now; clearing the bounding set and ambient set, with `SECBIT_NOROOT` locked, keeps an
//! `execve` by uid 0 from getting them back.
//!
//! What stays: the uid. Root without capabilities still owns root's files (`/etc/shadow` is
//! root's, mode 0640), so landlock's read list is what keeps those away, not this layer.

use crate::{Layer, LayerState};

const CAP_VERSION_3: u32 = 0x2008_0522;
/// `SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED
/// | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED`.
const SECURE_BITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The five capability sets of the calling thread, from `/proc/thread-self/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSets {
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    pub bounding: u64,
    pub ambient: u64,
}

impl CapSets {
    pub fn read() -> std::io::Result<Self> {
        let status = std::fs::read_to_string("/proc/thread-self/status")?;
        Ok(Self::parse(&status))
    }

    pub fn parse(status: &str) -> Self {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(u64::MAX)
        };
        CapSets {
            inheritable: field("CapInh:"),
            permitted: field("CapPrm:"),
            effective: field("CapEff:"),
            bounding: field("CapBnd:"),
            ambient: field("CapAmb:"),
        }
    }

    pub fn all_empty(&self) -> bool {
        *self == CapSets::default()
    }
}

/// Drops every capability of the calling (single-threaded) process; the layer is on only when
/// all five sets read back empty.
pub fn drop_all() -> Layer {
    let name = "capabilities dropped";
    // SAFETY: prctl with constant arguments; capset with a valid header and two data structs
    // (version 3 takes two).
    unsafe {
        // The bounding set first: dropping from it needs CAP_SETPCAP, which capset removes.
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) < 0 {
                break; // past the kernel's last capability
            }
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        // Needs CAP_SETPCAP as well; fails harmlessly (EPERM) for a user without it, who has no
        // capabilities for uid 0 rules to give back anyway.
        libc::prctl(libc::PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0);
        let mut header = CapHeader { version: CAP_VERSION_3, pid: 0 };
        let data = [CapData::default(); 2];
        if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
            return Layer { name, state: LayerState::Off(format!("capset: {}", std::io::Error::last_os_error())) };
        }
    }
    match CapSets::read() {
        Ok(c) if c.all_empty() => Layer { name, state: LayerState::On },
        Ok(c) => Layer {
            name,
            state: LayerState::Off(format!(
                "still held: CapInh {:016x} CapPrm {:016x} CapEff {:016x} CapBnd {:016x} CapAmb {:016x}",
                c.inheritable, c.permitted, c.effective, c.bounding, c.ambient
            )),
        },
        Err(e) => Layer { name, state: LayerState::Off(format!("cannot read the capability sets back: {e}")) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_status_lines() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n\
                 CapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\n";
        let c = CapSets::parse(s);
        assert_eq!(c.effective, 0x1fffeffffff);
        assert_eq!(c.inheritable, 0);
        assert!(!c.all_empty());
        assert!(!CapSets::parse("").all_empty(), "missing lines must not read as empty");
    }

    /// In a forked child (the test process keeps its own capabilities): after the drop every set
    /// is empty, and a privileged operation that needs a capability fails.
    #[test]
    fn a_dropped_process_holds_nothing() {
        let child = crate::testutil::in_child(|| {
            let layer = drop_all();
            if !layer.is_on() {
                return Err(layer.to_string());
            }
            // CAP_SYS_ADMIN (or a user namespace) would let this succeed; neither remains... for
            // uid 0 in the initial user namespace: EPERM now.
            // SAFETY: unshare has no memory preconditions.
            if unsafe { libc::unshare(libc::CLONE_NEWUTS) } == 0 && unsafe { libc::geteuid() } == 0 {
                return Err("unshare(CLONE_NEWUTS) still works as root".into());
            }
            Ok(())
        });
        assert_eq!(child, Ok(()));
    }
}
