//! Crash reports: what the broker writes when a worker dies, where it keeps them, and how many
//! it keeps. The model and the storage are here so the broker, the CLI and the tests share them.

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
    /// The application the worker served, as the broker saw it in `/proc` when it connected
    /// (its own text: printed escaped). Absent for a start-up check's worker, and in reports
    /// written before cloister recorded it.
    #[serde(default)]
    pub application: Option<Application>,
    /// The cloister that wrote the report.
    #[serde(default)]
    pub cloister_version: String,
    /// The file the driver's library name resolved to when the broker read it (on most systems
    /// its name carries the driver's version: `libpocl.so.2.11.0`).
    #[serde(default)]
    pub library_file: Option<String>,
    /// What replay recovery did after this death, as the application's shim told the broker
    /// (the application's word: bounded and printed escaped). Absent in report mode, when the
    /// application was not carried over (yet), and in older reports.
    #[serde(default, rename = "carried_over_says_the_application", skip_serializing_if = "Option::is_none")]
    pub carried_over: Option<CarriedOver>,
}

/// The application was carried over to a new worker after this death (replay recovery).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedOver {
    /// The worker the application was carried over to.
    pub to_worker: u32,
    pub objects_rebuilt: u32,
    pub commands_replayed: u32,
    /// Objects that could not be restored (they answer `CL_DEVICE_NOT_AVAILABLE`).
    pub objects_lost: u32,
    /// Commands and objects given up, and why.
    pub dropped: Vec<String>,
}

impl CarriedOver {
    /// One line for people.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "carried over to worker {}: {} objects rebuilt, {} commands run again",
            self.to_worker, self.objects_rebuilt, self.commands_replayed
        );
        if self.objects_lost > 0 {
            s.push_str(&format!(", {} objects lost", self.objects_lost));
        }
        if !self.dropped.is_empty() {
            s.push_str(&format!(", {} dropped", self.dropped.len()));
        }
        s
    }
}

/// An application as its broker saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Application {
    pub pid: u32,
    /// The executable's name (`/proc/PID/comm`).
    pub name: String,
    /// Its command line, one entry per argument (`/proc/PID/cmdline`), at most 4 KiB in all.
    pub cmdline: Vec<String>,
}

impl Application {
    /// The application with process id `pid`, read from `/proc` (`None` if it is gone).
    pub fn of_pid(pid: u32) -> Option<Self> {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim_end().to_string();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let raw = &raw[..raw.len().min(4096)];
        let cmdline =
            raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        Some(Self { pid, name, cmdline })
    }
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
        let time = now();
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
            application: None,
            cloister_version: env!("CARGO_PKG_VERSION").to_string(),
            library_file: std::fs::canonicalize(library).ok().map(|p| p.display().to_string()),
            carried_over: None,
        }
    }

    /// Adds `carried` to the report stored at `path` (one the broker wrote: replaced whole,
    /// through a temporary file, so a reader sees the old report or the new one).
    pub fn amend(path: &Path, carried: CarriedOver) -> std::io::Result<()> {
        let bytes = std::fs::read(path)?;
        let mut report: CrashReport = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        report.carried_over = Some(carried);
        report.store(path)
    }

    /// Writes the report as `<dir>/<time>-<pid>.json` (0600: it holds the application's kernel
    /// source) in a folder only this user can enter, and returns its path.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        // A folder made by an older cloister (0755) is closed too.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join(format!("{}-{}.json", self.time, self.pid));
        self.store(&path)?;
        Ok(path)
    }

    /// Writes the report to `path` (0600) through a temporary file beside it.
    fn store(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let written = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, path)
        })();
        // A full disk (or any other failure) leaves no half-written file behind.
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
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

/// A `.json` file in the reports' folder that is not a readable report.
#[derive(Debug, Clone)]
pub struct Corrupt {
    pub id: String,
    pub path: PathBuf,
    /// Why it could not be read, for people.
    pub error: String,
}

/// Every report in `dir`: the readable ones newest first, and the files that are not reports.
pub fn scan(dir: &Path) -> (Vec<Stored>, Vec<Corrupt>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return (Vec::new(), Vec::new()) };
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let read = std::fs::read(&path).map_err(|e| e.to_string());
        match read.and_then(|b| serde_json::from_slice::<CrashReport>(&b).map_err(|e| e.to_string())) {
            Ok(report) => good.push(Stored { id, path, report }),
            Err(error) => bad.push(Corrupt { id, path, error }),
        }
    }
    good.sort_by(|a: &Stored, b: &Stored| (b.report.time, &b.id).cmp(&(a.report.time, &a.id)));
    bad.sort_by(|a, b| a.id.cmp(&b.id));
    (good, bad)
}

/// Every readable report in `dir`, newest first. Unreadable files are left out (`scan` names
/// them).
pub fn list(dir: &Path) -> Vec<Stored> {
    scan(dir).0
}

/// How many reports to keep: the newest `last`, and none older than `days` (0: no age limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub last: usize,
    pub days: u64,
}

impl Retention {
    /// The `crash_keep` (default 200 reports) and `crash_keep_days` (default 90) settings.
    pub fn from_settings() -> Self {
        use cloister_ipc::settings::number;
        Retention { last: number("crash_keep", None) as usize, days: number("crash_keep_days", None) }
    }
}

/// Removes the reports `keep` does not keep, and half-written `.json.tmp` files older than a
/// minute (a writer that died mid-write); returns how many files went. Corrupt `.json` files
/// are left for `clear`: they may be someone's evidence.
pub fn prune(dir: &Path, keep: Retention, now: u64) -> usize {
    let mut removed = 0;
    let (all, _) = scan(dir);
    let cutoff = (keep.days > 0).then(|| now.saturating_sub(keep.days * 86_400));
    for (i, s) in all.iter().enumerate() {
        if (i >= keep.last || cutoff.is_some_and(|c| s.report.time < c)) && std::fs::remove_file(&s.path).is_ok() {
            removed += 1;
        }
    }
    removed + remove_stale_tmp(dir, std::time::Duration::from_secs(60))
}

fn remove_stale_tmp(dir: &Path, age: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json.tmp"))
        .filter(|e| e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a >= age)))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Removes every report in `dir` (corrupt ones and leftovers too), or with `older_than_days`
/// only the readable reports older than that; returns how many files went.
pub fn clear(dir: &Path, older_than_days: Option<u64>, now: u64) -> std::io::Result<usize> {
    let (good, bad) = scan(dir);
    let mut removed = 0;
    match older_than_days {
        Some(days) => {
            let cutoff = now.saturating_sub(days * 86_400);
            for s in good.iter().filter(|s| s.report.time < cutoff) {
                std::fs::remove_file(&s.path)?;
                removed += 1;
            }
        }
        None => {
            for p in good.iter().map(|s| &s.path).chain(bad.iter().map(|c| &c.path)) {
                std::fs::remove_file(p)?;
                removed += 1;
            }
            removed += remove_stale_tmp(dir, std::time::Duration::ZERO);
        }
    }
    Ok(removed)
}

/// Seconds since the Unix epoch now.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `secs` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the civil-from-days algorithm of
/// Howard Hinnant's date library; no time-zone database is read).
pub fn human_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
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
        "crash {}\n  time:      {} ({})\n  driver:    {} ({})\n",
        e(&s.id),
        human_time(r.time),
        r.time,
        e(&r.driver),
        e(&r.library),
    );
    if let Some(file) = &r.library_file {
        out.push_str(&format!("  library:   {}\n", e(file)));
    }
    if let Some(app) = &r.application {
        out.push_str(&format!("  application: {} (pid {})\n", e(&app.name), app.pid));
        if !app.cmdline.is_empty() {
            let words: Vec<String> = app.cmdline.iter().map(|a| e(a)).collect();
            out.push_str(&format!("  command:   {}\n", words.join(" ")));
        }
    }
    out.push_str(&format!(
        "  profile:   {}\n  worker:    pid {}\n  cause:     {}\n  signature: {}\n",
        e(&r.profile),
        r.pid,
        e(&r.cause.describe()),
        e(&r.signature)
    ));
    if !r.cloister_version.is_empty() {
        out.push_str(&format!("  cloister:  {}\n", e(&r.cloister_version)));
    }
    if let Some(c) = &r.carried_over {
        out.push_str(&format!("  recovery:  {} (says the application)\n", e(&c.describe())));
        for d in &c.dropped {
            out.push_str(&format!("    dropped: {}\n", e(d)));
        }
    }
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
        r.application = Some(Application { pid: 7, name: hostile.into(), cmdline: vec![hostile.into(), "-x".into()] });
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

#[cfg(test)]
mod retention_tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cloister-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn report_at(time: u64, pid: u32) -> CrashReport {
        let mut r = CrashReport::new("pocl", "libpocl.so", "pocl", pid, Cause::Exit { status: 1 });
        r.time = time;
        r
    }

    #[test]
    fn human_dates_are_utc_calendar_dates() {
        assert_eq!(human_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(human_time(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(human_time(1_795_459_723), "2026-11-23 18:48:43 UTC");
        assert_eq!(human_time(4_107_542_399), "2100-02-28 23:59:59 UTC");
    }

    #[test]
    fn pruning_keeps_the_newest_and_the_young() {
        let d = dir("prune");
        let day = 86_400;
        let now = 1000 * day;
        for (i, age) in [1u64, 2, 3, 50, 100].iter().enumerate() {
            report_at(now - age * day, i as u32).write(&d).unwrap();
        }
        // The newest three of the young ones.
        assert_eq!(prune(&d, Retention { last: 3, days: 0 }, now), 2);
        assert_eq!(list(&d).iter().map(|s| s.report.pid).collect::<Vec<_>>(), vec![0, 1, 2]);
        // Then by age: two days and younger.
        assert_eq!(prune(&d, Retention { last: 10, days: 2 }, now), 1);
        assert_eq!(list(&d).len(), 2);
        // Nothing more to do: an off-by-one keeps the two-day-old report.
        assert_eq!(prune(&d, Retention { last: 2, days: 2 }, now), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupt_files_are_named_and_cleared() {
        let d = dir("corrupt");
        report_at(10, 1).write(&d).unwrap();
        report_at(20, 2).write(&d).unwrap();
        std::fs::write(d.join("30-3.json"), "{ not json").unwrap();
        std::fs::write(d.join("40-4.json.tmp"), "half").unwrap();
        let (good, bad) = scan(&d);
        assert_eq!(good.len(), 2);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].id, "30-3");
        assert!(!bad[0].error.is_empty());
        // Pruning leaves the corrupt file and a young leftover alone.
        assert_eq!(prune(&d, Retention { last: 10, days: 0 }, 100), 0);
        assert_eq!(clear(&d, Some(1), 86_400 + 15).unwrap(), 1, "only the report older than a day");
        assert_eq!(clear(&d, None, 0).unwrap(), 3, "the rest, the corrupt file and the leftover");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_application_is_read_from_proc() {
        let me = Application::of_pid(std::process::id()).unwrap();
        assert!(!me.name.is_empty());
        assert!(!me.cmdline.is_empty());
        assert!(Application::of_pid(u32::MAX).is_none());
    }
}
