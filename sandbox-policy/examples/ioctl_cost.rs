//! What a profile's seccomp filter costs an `ioctl`: the time of one on `/dev/null` (which
//! answers ENOTTY at once) with a driver-type request (`'F'`, NVIDIA's resource manager) and a
//! bare request number (75, one of NVIDIA's UVM numbers), best of five runs of a million, and of
//! `getppid` (a call the kernel answers from its seccomp cache) beside them.
//!
//! `cargo run --release -p cloister-sandbox-policy --example ioctl_cost -- [PROFILE] [none]`:
//! PROFILE's filters (default `nvidia`) applied to this process first, unless `none`. The profile
//! must allow both requests (`nvidia` does; under `pocl`'s filter the first ioctl is a violation,
//! and the process ends with SIGSYS).

use std::time::Instant;

fn best_ns(n: u32, call: impl Fn()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            (0..n).for_each(|_| call());
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let profile = args.next().unwrap_or_else(|| "nvidia".into());
    let confined = args.next().as_deref() != Some("none");
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        return Err("cannot open /dev/null".into());
    }
    if confined {
        let p = cloister_sandbox_policy::Profile::load(&profile).map_err(|e| e.to_string())?;
        // SAFETY: prctl with constant arguments (seccomp needs no_new_privs without CAP_SYS_ADMIN).
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        for f in cloister_sandbox_policy::seccomp::build(&p).map_err(|e| e.to_string())? {
            seccompiler::apply_filter(&f).map_err(|e| e.to_string())?;
        }
    }
    let driver_type: libc::c_ulong = (3 << 30) | (16 << 16) | ((b'F' as libc::c_ulong) << 8) | 42;
    // SAFETY (the calls below): scalar arguments; the point is what seccomp adds to them.
    let f = best_ns(1_000_000, || unsafe {
        libc::ioctl(fd, driver_type, 0usize);
    });
    let uvm = best_ns(1_000_000, || unsafe {
        libc::ioctl(fd, 75, 0usize);
    });
    let getppid = best_ns(1_000_000, || unsafe {
        libc::getppid();
    });
    let how = if confined { profile.as_str() } else { "unconfined" };
    println!("{how}: ioctl 'F' {f:.1} ns, ioctl 75 {uvm:.1} ns, getppid {getppid:.1} ns");
    Ok(())
}
