//! Crash reports: what the broker writes when a worker dies, and where it keeps them.
//! (The flight recorder and the writer arrive with the crash-resilience work; the model and the
//! storage location are fixed here so the CLI and tests share them.)

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a worker ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    Signal { signal: i32, fault_address: Option<u64> },
    TrappedSyscall { number: i64, name: Option<String> },
    Exit { status: i32 },
    Hang { call: String, deadline_ms: u64 },
    MemoryLimit,
}

/// One call as the flight recorder saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedCall {
    pub op: String,
    pub lane: u64,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    /// Seconds since the Unix epoch.
    pub time: u64,
    pub pid: u32,
    pub driver: String,
    pub library: String,
    pub profile: String,
    /// What the broker itself saw: the wait status, its seccomp supervisor, its watchdog.
    pub cause: Cause,
    /// Groups repeats of the same crash.
    pub signature: String,
    /// What the worker wrote into its flight recorder. The worker may be hostile, so none of
    /// this is evidence, and text from here is printed with control characters escaped.
    #[serde(rename = "reported_by_the_worker_untrusted", default)]
    pub worker: WorkerReported,
}

/// The flight recorder's account, written by the worker (untrusted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReported {
    pub device: Option<String>,
    pub in_flight: Option<RecordedCall>,
    pub last_calls: Vec<RecordedCall>,
    /// The last program the driver was given to build, and its build options.
    #[serde(default)]
    pub program_source: Option<String>,
    #[serde(default)]
    pub build_options: Option<String>,
    /// The system call the worker's own SIGSYS handler says seccomp trapped.
    #[serde(default)]
    pub trapped_syscall: Option<i64>,
    /// A fatal signal the worker says a process sent it (`kill`), not a fault of its own code.
    #[serde(default)]
    pub signal_from_outside: Option<OutsideSignal>,
}

/// A signal sent to the worker by another process, as the worker noted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideSignal {
    pub signal: i32,
    /// The sender's pid as the worker saw it: 0 for a process outside its PID namespace.
    pub sender_pid: u32,
}

impl OutsideSignal {
    /// Decodes the flight recorder's `outside_signal` word (-1: none).
    pub fn from_word(word: i64) -> Option<Self> {
        (word >= 0).then_some(OutsideSignal { signal: (word >> 32) as i32, sender_pid: word as u32 })
    }
}

/// `text` safe to print on a terminal: control characters (escape sequences, carriage returns,
/// backspaces), bidirectional overrides and other invisible formatting are shown as `\u{..}`
/// escapes; `\n` is kept only where `keep_newlines` says so.
pub fn escape(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let invisible =
            matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
        if c == '\n' && keep_newlines {
            out.push(c);
        } else if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() || invisible {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

impl Cause {
    /// A one-line description for people.
    pub fn describe(&self) -> String {
        match self {
            Cause::Signal { signal, .. } => {
                format!("killed by signal {signal} ({})", signal_name(*signal))
            }
            Cause::TrappedSyscall { number, name } => {
                format!("seccomp trapped the forbidden system call `{}` ({number})", name.as_deref().unwrap_or("?"))
            }
            Cause::Exit { status: cloister_ipc::spill::EXIT_CANNOT_REPLY } => format!(
                "exited with status {}: one of its lanes could not post its reply (the worker's own account)",
                cloister_ipc::spill::EXIT_CANNOT_REPLY
            ),
            Cause::Exit { status } => format!("exited with status {status}"),
            Cause::Hang { call, deadline_ms } => {
                format!("hung in {call} for more than {deadline_ms} ms")
            }
            Cause::MemoryLimit => "hit its memory limit".into(),
        }
    }

    fn signature_part(&self) -> String {
        match self {
            Cause::Signal { signal, .. } => signal_name(*signal).to_string(),
            Cause::TrappedSyscall { name, number } => {
                format!("seccomp:{}", name.clone().unwrap_or_else(|| number.to_string()))
            }
            Cause::Exit { status } => format!("exit:{status}"),
            Cause::Hang { call, .. } => format!("hang:{call}"),
            Cause::MemoryLimit => "memory".into(),
        }
    }
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        31 => "SIGSYS",
        _ => "signal",
    }
}

impl CrashReport {
    pub fn new(driver: &str, library: &str, profile: &str, pid: u32, cause: Cause) -> Self {
        let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let signature = format!("{driver}:{}", cause.signature_part());
        Self {
            time,
            pid,
            driver: driver.into(),
            library: library.into(),
            profile: profile.into(),
            cause,
            signature,
            worker: WorkerReported::default(),
        }
    }

    /// Writes the report as `<dir>/<time>-<pid>.json` (0600: it holds the application's kernel
    /// source) in a folder only this user can enter, and returns its path.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        // A folder made by an older cloister (0755) is closed too.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join(format!("{}-{}.json", self.time, self.pid));
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(&json)?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}

/// `$XDG_STATE_HOME/cloister/crashes` (default `~/.local/state/cloister/crashes`, with the home
/// from the password database when `HOME` is unset).
pub fn crash_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| cloister_ipc::private::home_dir().map(|h| h.join(".local/state")))?;
    Some(state.join("cloister").join("crashes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_through_json() {
        let mut r = CrashReport::new(
            "pocl",
            "libpocl.so.2",
            "pocl",
            42,
            Cause::Signal { signal: 11, fault_address: Some(0x10) },
        );
        r.worker.in_flight = Some(RecordedCall { op: "BuildProgram".into(), lane: 1, start_ns: 5, end_ns: None });
        assert_eq!(r.signature, "pocl:SIGSEGV");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"signal\""), "{json}");
        assert_eq!(serde_json::from_str::<CrashReport>(&json).unwrap(), r);
        let dir = std::env::temp_dir().join(format!("cloister-report-test-{}", std::process::id()));
        let path = r.write(&dir).unwrap();
        assert_eq!(serde_json::from_slice::<CrashReport>(&std::fs::read(&path).unwrap()).unwrap(), r);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A stored report and its id (the file name without `.json`).
#[derive(Debug, Clone)]
pub struct Stored {
    pub id: String,
    pub path: PathBuf,
    pub report: CrashReport,
}

/// Every readable report in `dir`, newest first. Unreadable files are skipped, not fatal.
pub fn list(dir: &Path) -> Vec<Stored> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<Stored> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|path| {
            let report = serde_json::from_slice::<CrashReport>(&std::fs::read(&path).ok()?).ok()?;
            let id = path.file_stem()?.to_string_lossy().into_owned();
            Some(Stored { id, path, report })
        })
        .collect();
    out.sort_by(|a, b| (b.report.time, &b.id).cmp(&(a.report.time, &a.id)));
    out
}

/// Reports grouped by signature: (signature, count, newest report), newest group first.
pub fn group(reports: &[Stored]) -> Vec<(String, usize, &Stored)> {
    let mut groups: Vec<(String, usize, &Stored)> = Vec::new();
    for r in reports {
        match groups.iter_mut().find(|g| g.0 == r.report.signature) {
            Some(g) => g.1 += 1,
            None => groups.push((r.report.signature.clone(), 1, r)),
        }
    }
    groups
}

/// A report for people. Everything the worker wrote is under its own heading and escaped.
pub fn render(s: &Stored) -> String {
    let r = &s.report;
    let e = |t: &str| escape(t, false);
    let mut out = format!(
        "crash {}\n  driver:    {} ({})\n  profile:   {}\n  worker:    pid {}\n  time:      {} (Unix seconds)\n  cause:     {}\n  signature: {}\n",
        e(&s.id),
        e(&r.driver),
        e(&r.library),
        e(&r.profile),
        r.pid,
        r.time,
        e(&r.cause.describe()),
        e(&r.signature)
    );
    let w = &r.worker;
    out.push_str("  reported by the worker (untrusted):\n");
    if let Some(d) = &w.device {
        out.push_str(&format!("    device:    {}\n", e(d)));
    }
    if let Some(nr) = w.trapped_syscall {
        out.push_str(&format!("    says seccomp trapped system call {nr}\n"));
    }
    if let Some(c) = &w.in_flight {
        out.push_str(&format!("    in flight: {} on lane {}\n", e(&c.op), c.lane));
    }
    if let Some(o) = &w.build_options {
        out.push_str(&format!("    build options: {}\n", e(o)));
    }
    if let Some(src) = &w.program_source {
        out.push_str("    last program source:\n");
        for line in src.lines().take(40) {
            out.push_str(&format!("      | {}\n", e(line)));
        }
    }
    if !w.last_calls.is_empty() {
        out.push_str("    last calls (oldest first):\n");
        for c in &w.last_calls {
            let took = c
                .end_ns
                .map(|end| format!("{} us", end.saturating_sub(c.start_ns) / 1000))
                .unwrap_or_else(|| "unfinished".into());
            out.push_str(&format!("      {:<28} lane {:<4} {took}\n", e(&c.op), c.lane));
        }
    }
    out.push_str(&format!("  file:      {}\n", e(&s.path.display().to_string())));
    out
}

#[cfg(test)]
mod escape_tests {
    use super::*;

    #[test]
    fn worker_text_cannot_reach_the_terminal() {
        let hostile = "dev\x1b[2J\x1b[HPassword: \r\x08\u{202e}x\u{9b}31m\\";
        let shown = escape(hostile, false);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert_eq!(shown, "dev\\u{1b}[2J\\u{1b}[HPassword: \\u{d}\\u{8}\\u{202e}x\\u{9b}31m\\\\");
        assert_eq!(escape("a\nb", true), "a\nb");
        assert_eq!(escape("a\nb", false), "a\\u{a}b");
        let mut r = CrashReport::new("d", "l", "p", 1, Cause::Exit { status: 1 });
        r.worker.device = Some(hostile.into());
        r.worker.program_source = Some(format!("ok\n{hostile}"));
        r.worker.build_options = Some(hostile.into());
        let text = render(&Stored { id: "x".into(), path: "/r.json".into(), report: r });
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert!(text.contains("reported by the worker (untrusted)"), "{text}");
    }
}

#[cfg(test)]
mod listing_tests {
    use super::*;

    #[test]
    fn lists_newest_first_and_groups_by_signature() {
        let dir = std::env::temp_dir().join(format!("cloister-list-test-{}", std::process::id()));
        let mut a =
            CrashReport::new("pocl", "libpocl.so", "pocl", 1, Cause::Signal { signal: 11, fault_address: None });
        a.time = 100;
        let mut b = a.clone();
        b.pid = 2;
        b.time = 200;
        let mut c = CrashReport::new("pocl", "libpocl.so", "pocl", 3, Cause::Exit { status: 3 });
        c.time = 150;
        for r in [&a, &b, &c] {
            r.write(&dir).unwrap();
        }
        std::fs::write(dir.join("garbage.json"), "not json").unwrap();
        let all = list(&dir);
        assert_eq!(all.iter().map(|s| s.report.pid).collect::<Vec<_>>(), vec![2, 3, 1]);
        let groups = group(&all);
        assert_eq!(groups.len(), 2);
        assert_eq!((groups[0].0.as_str(), groups[0].1), ("pocl:SIGSEGV", 2));
        assert!(render(&all[0]).contains("killed by signal 11 (SIGSEGV)"));
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the reports' folder is private");
        assert_eq!(mode(&all[0].path), 0o600, "a report is private");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
