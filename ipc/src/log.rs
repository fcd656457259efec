//! Diagnostic logs, for finding out what cloister did: which application connected, which
//! worker started for it, why one was replaced. They are off unless asked for, and separate from
//! the messages cloister says to its user (one line each, always on, on stderr).
//!
//! `CLOISTER_LOG` (the broker, the CLI and the worker also read `RUST_LOG` when it is unset; the
//! shim does not, since the application may use `RUST_LOG` for its own logs) is an env-filter:
//! `debug`, `info`, `cloister_broker=debug,warn`. Every line carries a UTC timestamp, the level,
//! the process (`broker[PID]`, `worker[PID]`, `shim[PID]`, `cli[PID]`) and fields naming the
//! client and worker it is about. Each line is formatted whole and written with one `write(2)`,
//! so lines of the broker, its workers and the application never cut into each other.

use std::sync::OnceLock;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

/// A timer that writes the time and the process, so that each line says where it comes from.
struct TimeAndProcess {
    process: &'static str,
    pid: u32,
}

impl FormatTime for TimeAndProcess {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        tracing_subscriber::fmt::time::SystemTime.format_time(w)?;
        write!(w, " {}[{}]", self.process, self.pid)
    }
}

/// The filter asked for, if any: the `log` setting (`CLOISTER_LOG`, or a configuration file),
/// then (where `rust_log`) `RUST_LOG`. A filter that does not parse is said once and logs stay
/// off.
fn filter(rust_log: bool) -> Option<tracing_subscriber::EnvFilter> {
    // `resolve`, not `get`: logs start before the program has checked its configuration
    // files, and a malformed one is for that check to say, once.
    let (name, text) = crate::settings::resolve("log", None)
        .value
        .map(|v| ("CLOISTER_LOG", v))
        .or_else(|| rust_log.then(|| std::env::var("RUST_LOG").ok().map(|v| ("RUST_LOG", v))).flatten())?;
    match tracing_subscriber::EnvFilter::try_new(&text) {
        Ok(f) => Some(f),
        Err(e) => {
            crate::settings::say_once(&format!("{name}={text:?} is not a log filter ({e}); logs stay off"));
            None
        }
    }
}

/// The dispatcher for `process`'s logs, if logs were asked for.
fn dispatch(process: &'static str, rust_log: bool) -> Option<tracing::Dispatch> {
    let filter = filter(rust_log)?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(TimeAndProcess { process, pid: std::process::id() })
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .finish();
    Some(tracing::Dispatch::new(subscriber))
}

/// Turns logs on for a whole program of cloister's own (the broker, the CLI, the worker): its
/// threads all log through the global dispatcher.
pub fn init_program(process: &'static str) {
    if let Some(d) = dispatch(process, true) {
        let _ = tracing::dispatcher::set_global_default(d);
    }
}

/// The shim's dispatcher: the shim lives in someone else's program, whose global dispatcher
/// (if it uses `tracing` itself) is not ours to take, so the shim logs through `in_shim`.
fn shim_dispatch() -> Option<&'static tracing::Dispatch> {
    static SHIM: OnceLock<Option<tracing::Dispatch>> = OnceLock::new();
    SHIM.get_or_init(|| dispatch("shim", false)).as_ref()
}

/// Runs `log` (which emits `tracing` events) with the shim's dispatcher, if its logs are on.
pub fn in_shim(log: impl FnOnce()) {
    if let Some(d) = shim_dispatch() {
        tracing::dispatcher::with_default(d, log);
    }
}
