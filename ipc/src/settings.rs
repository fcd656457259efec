//! `CLOISTER_*` settings read from the environment. A value that does not parse, or is out of
//! range, is not silently ignored: the process says once, on stderr, what was wrong and which
//! value it uses instead (`CLOISTER_SPIN_US=abc` used to mean "50" without a word).

use std::collections::HashSet;
use std::fmt::Display;
use std::str::FromStr;
use std::sync::Mutex;

/// Set by `cloister run` in the application's environment: cloister has read the same variables
/// and said what was wrong, so the shim inside the application does not say it again.
pub const ALREADY_SAID: &str = "CLOISTER_SETTINGS_SAID";

/// Says `message` about `name` on stderr, once per process and variable.
pub fn warn_once(name: &str, message: &str) {
    if std::env::var_os(ALREADY_SAID).is_some() {
        return;
    }
    static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.get_or_insert_with(HashSet::new).insert(name.to_string()) {
        eprintln!("cloister: {message}");
    }
}

/// The value of `name` checked by `parse`; unset or empty gives `default`, a bad value gives
/// `default` and one warning naming `expected`.
pub fn parsed<T: Display + Clone>(name: &str, default: T, expected: &str, parse: impl Fn(&str) -> Option<T>) -> T {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => default,
        Ok(v) => parse(v.trim()).unwrap_or_else(|| {
            warn_once(name, &format!("{name}={v:?} is not {expected}; using {default}"));
            default
        }),
        Err(std::env::VarError::NotPresent) => default,
        Err(std::env::VarError::NotUnicode(_)) => {
            warn_once(name, &format!("{name} is not valid UTF-8; using {default}"));
            default
        }
    }
}

/// A number within `range`.
pub fn number<T>(name: &str, default: T, range: std::ops::RangeInclusive<T>) -> T
where
    T: FromStr + Display + Clone + PartialOrd,
{
    let expected = format!("a whole number from {} to {}", range.start(), range.end());
    parsed(name, default, &expected, |v| v.parse::<T>().ok().filter(|n| range.contains(n)))
}

/// One of `choices` (the default must be one of them).
pub fn choice(name: &str, default: &'static str, choices: &[&'static str]) -> &'static str {
    let expected = format!("one of {}", choices.join(", "));
    parsed(name, default, &expected, |v| choices.iter().copied().find(|c| *c == v))
}

/// `CLOISTER_CRASH_LOOP=K/T`: K crashes within T seconds stop the restarts (default 3/60).
pub fn crash_loop() -> (usize, u64) {
    #[derive(Clone, Copy)]
    struct CrashLoop(usize, u64);
    impl Display for CrashLoop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}/{}", self.0, self.1)
        }
    }
    let expected = "K/T (K crashes, 1 or more, within T seconds, 1 or more)";
    let c = parsed("CLOISTER_CRASH_LOOP", CrashLoop(3, 60), expected, |v| {
        let (k, t) = v.split_once('/')?;
        let (k, t) = (k.trim().parse().ok()?, t.trim().parse().ok()?);
        (k >= 1 && t >= 1).then_some(CrashLoop(k, t))
    });
    (c.0, c.1)
}

/// `CLOISTER_STAGING`: how the worker stages transfers (see the worker's `staging`).
pub fn staging() -> &'static str {
    choice("CLOISTER_STAGING", "auto", &["auto", "plain", "pinned"])
}

/// `CLOISTER_SYNC=1`: strict mode, every enqueue waits for its reply (see the shim's `Conn::post`).
pub fn sync_mode() -> bool {
    number("CLOISTER_SYNC", 0u8, 0..=1) == 1
}

/// `CLOISTER_ZERO_COPY`: whether buffers of host-unified devices share their memory (`1`, the
/// default) or are staged like any other (`0`).
pub fn zero_copy() -> bool {
    choice("CLOISTER_ZERO_COPY", "1", &["0", "1"]) == "1"
}

/// Reads every setting once, so that `cloister run` says what is wrong before the application
/// starts (the application's shim and the workers then stay quiet about it).
pub fn check_all() {
    crate::deadlines::Deadlines::from_env();
    crash_loop();
    staging();
    zero_copy();
    crate::copy::threads();
    crate::lane::spin_budget();
    sync_mode();
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each test uses its own variable: tests run in parallel threads of one process.
    #[test]
    fn good_values_are_used_and_bad_ones_fall_back() {
        std::env::set_var("CLOISTER_TEST_SETTING_A", "250");
        assert_eq!(number("CLOISTER_TEST_SETTING_A", 10u64, 0..=1000), 250);
        std::env::set_var("CLOISTER_TEST_SETTING_A", "-5");
        assert_eq!(number("CLOISTER_TEST_SETTING_A", 10u64, 0..=1000), 10);
        std::env::set_var("CLOISTER_TEST_SETTING_A", "5000");
        assert_eq!(number("CLOISTER_TEST_SETTING_A", 10u64, 0..=1000), 10);
        std::env::set_var("CLOISTER_TEST_SETTING_A", "");
        assert_eq!(number("CLOISTER_TEST_SETTING_A", 10u64, 0..=1000), 10);
        std::env::remove_var("CLOISTER_TEST_SETTING_A");
        assert_eq!(number("CLOISTER_TEST_SETTING_A", 10u64, 0..=1000), 10);
    }

    #[test]
    fn choices_are_matched_exactly() {
        std::env::set_var("CLOISTER_TEST_SETTING_B", "pinned");
        assert_eq!(choice("CLOISTER_TEST_SETTING_B", "auto", &["auto", "plain", "pinned"]), "pinned");
        std::env::set_var("CLOISTER_TEST_SETTING_B", "Pinned!");
        assert_eq!(choice("CLOISTER_TEST_SETTING_B", "auto", &["auto", "plain", "pinned"]), "auto");
    }
}
