//! `ioctl` request numbers by name: what profiles may list, and what learning writes back.
//!
//! `ioctl` is the widest door a driver has into the kernel (every device and socket brings its
//! own), so profiles allow it by request number, as Chromium and Android do for GPU drivers.
//! The kernel reads the request as 32 bits (`unsigned int cmd`); the filter compares those.

/// Requests every profile that allows `ioctl` gets: they only read a descriptor's state or set
/// its own flags (isatty, non-blocking, close-on-exec, bytes ready).
pub const BASE: &[&str] = &["TCGETS", "FIONREAD", "FIONBIO", "FIOCLEX", "FIONCLEX"];

/// Requests refused in any profile: they make a terminal read input the driver chose.
pub const NEVER: &[u32] = &[0x5412 /* TIOCSTI */, 0x541C /* TIOCLINUX */];

/// Names a profile may use.
pub const NAMES: &[(&str, u32)] = &[
    ("TCGETS", 0x5401),
    ("TCSETS", 0x5402),
    ("TCSETSW", 0x5403),
    ("TCSETSF", 0x5404),
    ("TIOCGPGRP", 0x540F),
    ("TIOCSTI", 0x5412),
    ("TIOCGWINSZ", 0x5413),
    ("TIOCSWINSZ", 0x5414),
    ("FIONREAD", 0x541B),
    ("TIOCLINUX", 0x541C),
    ("FIONBIO", 0x5421),
    ("FIONCLEX", 0x5450),
    ("FIOCLEX", 0x5451),
    ("FIOASYNC", 0x5452),
    ("FIOQSIZE", 0x5460),
    ("TCGETS2", 0x802C_542A),
];

/// A request by name, or written as a number (`0x5401`, `21505`).
pub fn number(name: &str) -> Option<u32> {
    if let Some(&(_, n)) = NAMES.iter().find(|(n, _)| *n == name) {
        return Some(n);
    }
    match name.strip_prefix("0x").or_else(|| name.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => name.parse().ok(),
    }
}

pub fn name(nr: u32) -> Option<&'static str> {
    NAMES.iter().find(|&&(_, n)| n == nr).map(|&(name, _)| name)
}

/// How a profile writes `nr`: its name, or `0x…`.
pub fn display(nr: u32) -> String {
    name(nr).map(str::to_string).unwrap_or_else(|| format!("0x{nr:08x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(number("TCGETS"), Some(libc::TCGETS as u32));
        assert_eq!(number("TIOCSTI"), Some(libc::TIOCSTI as u32));
        assert_eq!(number("FIONBIO"), Some(libc::FIONBIO as u32));
        assert_eq!(number("FIOCLEX"), Some(libc::FIOCLEX as u32));
        assert_eq!(number("TIOCGWINSZ"), Some(libc::TIOCGWINSZ as u32));
        assert_eq!(number("0x30000001"), Some(0x3000_0001));
        assert_eq!(number("21505"), Some(0x5401));
        assert_eq!(number("NOT_AN_IOCTL"), None);
        assert_eq!(display(0x5401), "TCGETS");
        assert_eq!(display(0x3000_0001), "0x30000001");
    }
}
