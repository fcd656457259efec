//! The configuration: one table of every `CLOISTER_*` setting (its variable, its key in the
//! configuration file, what values it takes, its default and what it means), and the layers a
//! setting's value comes from. The README's table, `cloister config` and every check derive from
//! [`SETTINGS`], so a new setting is one row here.
//!
//! A value comes from the first of: a command-line flag of `cloister` (`--profile`,
//! `--require-sandbox`), the `CLOISTER_*` environment variable, the user's file
//! (`$XDG_CONFIG_HOME/cloister/config.toml`, else `~/.config/cloister/config.toml`), the system
//! file (`/etc/cloister/config.toml`), the default. Within a file, a driver's own section
//! (`[driver.NAME]`) comes before the file's top level. The lookup lives here, in the crate the
//! shim, the worker and the broker all use, so an application caged without `cloister run`
//! sees the same values as one started by it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What values a setting takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A whole number within the range (an integer in a file).
    Number { min: u64, max: u64 },
    /// One of these words (a string in a file).
    Choice(&'static [&'static str]),
    /// On or off: `1`/`0` (also `true`/`false`, `yes`/`no`, `on`/`off`) in the environment, a
    /// boolean in a file.
    Switch,
    /// `K/T`: K crashes within T seconds, both 1 or more (a string in a file).
    CrashLoop,
    /// A file or folder; relative in a file means relative to the file's folder.
    Path,
    /// A built-in profile name, or a profile file (relative in a file: to the file's folder).
    Profile,
    /// A log filter (`tracing`'s env-filter syntax, checked where logs start: `log::init_program`).
    LogFilter,
    /// Where a report goes: `-` (also `1` or `stderr`) for stderr, else a file (relative in a
    /// file: to the file's folder).
    Output,
    /// Free text (build options).
    Text,
}

impl Kind {
    /// What a value must be, said in messages and in the README's table.
    pub fn expected(&self) -> String {
        match self {
            Kind::Number { min, max } => format!("a whole number from {min} to {max}"),
            Kind::Choice(c) => format!("one of {}", c.join(", ")),
            Kind::Switch => "1 or 0 (true or false in a file)".into(),
            Kind::CrashLoop => "K/T (K crashes, 1 or more, within T seconds, 1 or more)".into(),
            Kind::Path => "a path".into(),
            Kind::LogFilter => "a log filter (`debug`, `info`, `cloister_worker=debug,warn`)".into(),
            Kind::Profile => "a built-in profile name (pocl, nvidia, generic) or a profile file".into(),
            Kind::Output => "`-` for stderr, or a file".into(),
            Kind::Text => "text".into(),
        }
    }

    /// The value in its one written form (`1`/`0` for a switch, `K/T` without blanks), or
    /// `None` when it is not a value of this kind.
    pub fn check(&self, v: &str) -> Option<String> {
        let v = v.trim();
        match self {
            Kind::Number { min, max } => {
                v.parse::<u64>().ok().filter(|n| (*min..=*max).contains(n)).map(|n| n.to_string())
            }
            Kind::Choice(c) => c.iter().find(|c| **c == v).map(|c| c.to_string()),
            Kind::Switch => match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Some("1".into()),
                "0" | "false" | "no" | "off" => Some("0".into()),
                _ => None,
            },
            Kind::CrashLoop => {
                let (k, t) = v.split_once('/')?;
                let (k, t): (u64, u64) = (k.trim().parse().ok()?, t.trim().parse().ok()?);
                (k >= 1 && t >= 1).then(|| format!("{k}/{t}"))
            }
            Kind::Path | Kind::Profile | Kind::LogFilter | Kind::Output | Kind::Text => {
                (!v.is_empty() && !v.contains('\0')).then(|| v.to_string())
            }
        }
    }

    /// The TOML type a file writes this kind as.
    fn toml_type(&self) -> &'static str {
        match self {
            Kind::Number { .. } => "integer",
            Kind::Switch => "boolean",
            _ => "string",
        }
    }
}

/// A setting's default.
#[derive(Clone, Copy)]
pub enum DefaultValue {
    /// This value (as the environment variable would write it).
    Value(&'static str),
    /// Worked out when read, as the README says.
    Computed { doc: &'static str, value: fn() -> String },
    /// None: the setting is off unless given (`doc` says what happens then).
    Unset(&'static str),
}

/// One setting.
pub struct Setting {
    /// Its key in a configuration file.
    pub key: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    pub kind: Kind,
    pub default: DefaultValue,
    /// What it means (Markdown, one line).
    pub doc: &'static str,
    /// Whether a `[driver.NAME]` section may set it for one driver.
    pub per_driver: bool,
    /// Whether a configuration file may set it at all (some only make sense in the environment).
    pub in_file: bool,
    /// Whether the worker reads it: the broker gives each worker the value in effect for its
    /// driver (the worker reads no configuration file: its `HOME` is its own cache).
    pub worker: bool,
}

const DEADLINE: Kind = Kind::Number { min: 1, max: 86_400_000 };

/// Every setting cloister reads.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "profile",
        env: "CLOISTER_PROFILE",
        kind: Kind::Profile,
        default: DefaultValue::Unset("chosen by the driver's library name"),
        doc: "the sandbox profile of the driver's worker (the flag is `--profile`)",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "require_sandbox",
        env: "CLOISTER_REQUIRE_SANDBOX",
        kind: Kind::Switch,
        default: DefaultValue::Value("0"),
        doc: "`1`: refuse a driver whose worker could not apply every sandbox layer (the flag is `--require-sandbox`)",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "deadline_info_ms",
        env: "CLOISTER_DEADLINE_INFO_MS",
        kind: DEADLINE,
        default: DefaultValue::Value("10000"),
        doc: "hang-watchdog deadline of the info calls, in ms (see \"Hang watchdog\")",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "deadline_build_ms",
        env: "CLOISTER_DEADLINE_BUILD_MS",
        kind: DEADLINE,
        default: DefaultValue::Value("600000"),
        doc: "hang-watchdog deadline of program builds, in ms",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "deadline_wait_ms",
        env: "CLOISTER_DEADLINE_WAIT_MS",
        kind: DEADLINE,
        default: DefaultValue::Value("600000"),
        doc: "hang-watchdog deadline of waits (`clFinish`, `clWaitForEvents`, releases), in ms",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "deadline_other_ms",
        env: "CLOISTER_DEADLINE_OTHER_MS",
        kind: DEADLINE,
        default: DefaultValue::Value("120000"),
        doc: "hang-watchdog deadline of every other call, in ms",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "crash_loop",
        env: "CLOISTER_CRASH_LOOP",
        kind: Kind::CrashLoop,
        default: DefaultValue::Value("3/60"),
        doc: "`K/T`: stop restarting a driver after K crashes within T seconds",
        per_driver: true,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "spin_us",
        env: "CLOISTER_SPIN_US",
        kind: Kind::Number { min: 0, max: 1_000_000 },
        default: DefaultValue::Value("200"),
        doc: "the longest a lane wait (and a wait for an event callback, and the callback notifier's) spins before sleeping, in µs (0 never spins); see \"How a call travels\"",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "sync",
        env: "CLOISTER_SYNC",
        kind: Kind::Switch,
        default: DefaultValue::Value("0"),
        doc: "`1`: strict mode, every enqueue and buffer creation waits for the driver's answer and returns its error itself (see \"Asynchronous enqueues\")",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "max_reply_mb",
        env: "CLOISTER_MAX_REPLY_MB",
        kind: Kind::Number { min: 1, max: 1 << 20 },
        default: DefaultValue::Value("1024"),
        doc: "the largest reply a worker may hold and the shim fetches, in MiB (both sides read it: a worker whose reply is larger ends with exit status 70, a shim told of one treats the worker as faulty)",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "staging",
        env: "CLOISTER_STAGING",
        kind: Kind::Choice(&["auto", "plain", "pinned"]),
        default: DefaultValue::Value("auto"),
        doc: "`auto`: the worker pins the shared memory it transfers through on discrete GPUs (NVIDIA: 55 GB/s DMA instead of 9-15 from pageable pages); `plain`: never; `pinned`: on every device",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "copy_threads",
        env: "CLOISTER_COPY_THREADS",
        kind: Kind::Number { min: 1, max: 64 },
        default: DefaultValue::Computed { doc: "half the cores, 1 to 4", value: default_copy_threads },
        doc: "threads a copy of 512 KiB and more is split across (a pool started at the first such copy)",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "zero_copy",
        env: "CLOISTER_ZERO_COPY",
        kind: Kind::Switch,
        default: DefaultValue::Value("1"),
        doc: "`0`: no zero-copy buffers, even on host-unified devices (every transfer and map is staged through shared segments)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "recovery",
        env: "CLOISTER_RECOVERY",
        kind: Kind::Choice(&["replay", "report", "auto"]),
        default: DefaultValue::Value("replay"),
        doc: "`replay`: after a worker's death the application's objects are rebuilt in the replacement and it carries on (see \"Recovery\"); `report`: its objects answer `CL_DEVICE_NOT_AVAILABLE`; `auto`: `replay` only for a driver whose every device shares the host's memory with zero-copy buffers on (the journal then keeps next to nothing), `report` for others",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "recovery_budget_mb",
        env: "CLOISTER_RECOVERY_BUDGET_MB",
        kind: Kind::Number { min: 0, max: 1 << 20 },
        default: DefaultValue::Value("256"),
        doc: "replay mode: the most memory kept per worker for buffer contents and journal data, in MiB",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "debug",
        env: "CLOISTER_DEBUG",
        kind: Kind::Switch,
        default: DefaultValue::Value("0"),
        doc: "`1`: the worker prints the state of each sandbox layer it applied and the names of the environment variables its driver sees",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "log",
        env: "CLOISTER_LOG",
        kind: Kind::LogFilter,
        default: DefaultValue::Unset("no diagnostic logs (the CLI, broker and worker read `RUST_LOG` then)"),
        doc: "diagnostic logs with timestamps, levels, client and worker: which to write (see \"Logs\")",
        per_driver: false,
        in_file: true,
        worker: true,
    },
    Setting {
        key: "crash_keep",
        env: "CLOISTER_CRASH_KEEP",
        kind: Kind::Number { min: 1, max: 1_000_000 },
        default: DefaultValue::Value("200"),
        doc: "how many crash reports are kept: the newest N (older ones go when a new one is written)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "crash_keep_days",
        env: "CLOISTER_CRASH_KEEP_DAYS",
        kind: Kind::Number { min: 0, max: 36_500 },
        default: DefaultValue::Value("90"),
        doc: "crash reports older than this many days go when a new one is written (0: no age limit)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "quiet",
        env: "CLOISTER_QUIET",
        kind: Kind::Switch,
        default: DefaultValue::Value("0"),
        doc: "`1`: the shim prints no warnings (broker unreachable, worker refused, ...)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "log_calls",
        env: "CLOISTER_LOG_CALLS",
        kind: Kind::Output,
        default: DefaultValue::Unset("no call log"),
        doc: "the call log: every OpenCL call with its arguments, result, thread and time (the flag is `--log-calls`; see \"Seeing what the application does\")",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "log_errors",
        env: "CLOISTER_LOG_ERRORS",
        kind: Kind::Output,
        default: DefaultValue::Unset("no call log"),
        doc: "the call log of the failing calls only (`--log-errors`; `log_calls` wins)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "timing",
        env: "CLOISTER_TIMING",
        kind: Kind::Output,
        default: DefaultValue::Unset("no timing report"),
        doc: "at exit, host time per entry point and device time per command (`--timing`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "trace",
        env: "CLOISTER_TRACE",
        kind: Kind::Path,
        default: DefaultValue::Unset("no trace"),
        doc: "a Chrome/Perfetto trace file of the host calls and device commands (`--trace`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "dump",
        env: "CLOISTER_DUMP",
        kind: Kind::Path,
        default: DefaultValue::Unset("no dump"),
        doc: "a folder to dump program sources, build options, build logs and binaries into (`--dump`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "inject",
        env: "CLOISTER_INJECT",
        kind: Kind::Path,
        default: DefaultValue::Unset("no injection"),
        doc: "a folder of program sources or binaries that replace the application's, named as `dump` names them (`--inject`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "build_options_append",
        env: "CLOISTER_BUILD_OPTIONS_APPEND",
        kind: Kind::Text,
        default: DefaultValue::Unset("nothing appended"),
        doc: "options appended to every `clBuildProgram`'s (`--build-options-append`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "leaks",
        env: "CLOISTER_LEAKS",
        kind: Kind::Switch,
        default: DefaultValue::Value("0"),
        doc: "`1`: at exit, the objects created and not released, per kind (`--leaks`)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "socket",
        env: "CLOISTER_SOCKET",
        kind: Kind::Path,
        default: DefaultValue::Unset("the per-user broker's socket, else a private broker"),
        doc: "the broker socket the shim connects to (`cloister run` sets it)",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "vendors_dir",
        env: "CLOISTER_VENDORS_DIR",
        kind: Kind::Path,
        default: DefaultValue::Unset(
            "`/etc/cloister/vendors` (where `cloister install --system` moves the drivers), then `/etc/OpenCL/vendors`",
        ),
        doc: "the ICD registry cloister reads drivers from",
        per_driver: false,
        in_file: true,
        worker: false,
    },
    Setting {
        key: "shim",
        env: "CLOISTER_SHIM",
        kind: Kind::Path,
        default: DefaultValue::Unset("see \"Where the pieces are\""),
        doc: "path of `libcloister.so` (environment only)",
        per_driver: false,
        in_file: false,
        worker: false,
    },
    Setting {
        key: "worker",
        env: "CLOISTER_WORKER",
        kind: Kind::Path,
        default: DefaultValue::Unset("see \"Where the pieces are\""),
        doc: "path of `cloister-worker` (environment only)",
        per_driver: false,
        in_file: false,
        worker: false,
    },
    Setting {
        key: "config",
        env: "CLOISTER_CONFIG",
        kind: Kind::Path,
        default: DefaultValue::Unset("`$XDG_CONFIG_HOME/cloister/config.toml`, else `~/.config/cloister/config.toml`"),
        doc: "the user's configuration file (environment only)",
        per_driver: false,
        in_file: false,
        worker: false,
    },
    Setting {
        key: "system_config",
        env: "CLOISTER_SYSTEM_CONFIG",
        kind: Kind::Path,
        default: DefaultValue::Value(SYSTEM_FILE),
        doc: "the system's configuration file, used only when owned by root and writable by no one else (environment only)",
        per_driver: false,
        in_file: false,
        worker: false,
    },
];

/// The system-wide file.
pub const SYSTEM_FILE: &str = "/etc/cloister/config.toml";

/// The keys of a `[driver.NAME]` section that are no setting: the driver's own environment.
const DRIVER_ENV_KEYS: [&str; 2] = ["env", "pass_env"];

fn default_copy_threads() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores / 2).clamp(1, 4).to_string()
}

/// The setting with this key.
pub fn setting(key: &str) -> &'static Setting {
    SETTINGS.iter().find(|s| s.key == key).unwrap_or_else(|| panic!("no setting {key}"))
}

impl Setting {
    /// The default value, if there is one.
    pub fn default_value(&self) -> Option<String> {
        match self.default {
            DefaultValue::Value(v) => Some(v.to_string()),
            DefaultValue::Computed { value, .. } => Some(value()),
            DefaultValue::Unset(_) => None,
        }
    }

    /// What an unset setting means (`cloister config` shows it for the value).
    pub fn unset_doc(&self) -> &'static str {
        match self.default {
            DefaultValue::Unset(doc) => doc,
            _ => "",
        }
    }

    fn default_doc(&self) -> String {
        match self.default {
            DefaultValue::Value(v) => format!("`{v}`"),
            DefaultValue::Computed { doc, .. } | DefaultValue::Unset(doc) => doc.to_string(),
        }
    }
}

/// The README's settings table.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| variable | file key | values | default | meaning |\n| --- | --- | --- | --- | --- |\n");
    for s in SETTINGS {
        let key = match (s.in_file, s.per_driver) {
            (false, _) => "(environment only)".to_string(),
            (true, true) => format!("`{}` (also per driver)", s.key),
            (true, false) => format!("`{}`", s.key),
        };
        out += &format!("| `{}` | {key} | {} | {} | {} |\n", s.env, s.kind.expected(), s.default_doc(), s.doc);
    }
    out
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File { path: PathBuf, line: usize },
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => write!(f, "flag"),
            Source::Env => write!(f, "environment"),
            Source::File { path, line } => write!(f, "{}:{line}", path.display()),
            Source::Default => write!(f, "default"),
        }
    }
}

/// A value and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// `None`: unset, and the setting has no default value.
    pub value: Option<String>,
    pub source: Source,
    /// A bad environment value passed over, said as a sentence naming the value used instead.
    pub problem: Option<String>,
}

/// Values of one file's level (its top, or one driver's section): key -> (value, line).
type Values = BTreeMap<String, (String, usize)>;

/// A driver's section of a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverSection {
    pub values: Values,
    /// `env = { VAR = "value" }`: (name, value, line).
    pub env: Vec<(String, String, usize)>,
    /// `pass_env = ["VAR"]`: (name, line).
    pub pass_env: Vec<(String, usize)>,
}

/// One configuration file, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct File {
    pub path: PathBuf,
    pub values: Values,
    pub drivers: BTreeMap<String, DriverSection>,
}

/// Environment variables a driver may not be given: they would undo the cage (the dynamic
/// loader's `LD_*` run code in the worker before its cage is up), steer cloister itself, or
/// are the worker's own private folders, which the broker sets.
pub fn forbidden_env(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Some("not a variable name");
    }
    if name.starts_with("LD_") {
        return Some("the dynamic loader's variables would run code in the worker before its cage is up");
    }
    if name.starts_with("CLOISTER_") {
        return Some("cloister's own settings are set as settings, not driver variables");
    }
    if ["HOME", "XDG_CACHE_HOME", "TMPDIR"].contains(&name) {
        return Some("the worker's private folders are set by the broker");
    }
    None
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of top-level `key`: top-level keys come before the first table header, each at the
/// start of its line (bare or quoted).
fn top_line(text: &str, key: &str) -> usize {
    let quoted = [format!("\"{key}\""), format!("'{key}'")];
    for (n, line) in text.lines().enumerate() {
        let l = line.trim_start();
        if l.starts_with('[') {
            break;
        }
        let rest = [key, &quoted[0], &quoted[1]].iter().find_map(|k| l.strip_prefix(*k));
        if rest.is_some_and(|r| r.trim_start().starts_with(['=', '.'])) {
            return n + 1;
        }
    }
    1
}

fn type_name(v: &toml::Value) -> &'static str {
    v.type_str()
}

impl File {
    /// Reads and checks the file at `path`: the first mistake is the error, as
    /// `FILE:LINE: reason`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::parse(path, &text)
    }

    /// Checks `text` as the file at `path` (whose folder relative paths in it are taken from).
    pub fn parse(path: &Path, text: &str) -> Result<Self, String> {
        let at = |line: usize, why: String| format!("{}:{line}: {why}", path.display());
        let syntax = |e: toml::de::Error| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            at(line, e.message().trim_end().replace('\n', ", "))
        };
        // toml's spans do not reach through a dotted table header (`[driver.pocl]`), so the top
        // level is read without them and its keys found in the text (see `top_line`); the
        // driver sections are read again, with the place of each of their values.
        let top: BTreeMap<String, toml::Value> = toml::from_str(text).map_err(syntax)?;
        #[derive(serde::Deserialize)]
        struct Sections {
            #[serde(default)]
            driver: BTreeMap<String, BTreeMap<String, toml::Spanned<toml::Value>>>,
        }
        let folder = path.parent().unwrap_or(Path::new("/"));
        let mut file = File { path: path.to_path_buf(), ..Default::default() };
        for (key, value) in &top {
            if key == "driver" {
                continue;
            }
            let line = top_line(text, key);
            let s = known(key, false).map_err(|why| at(line, why))?;
            file.values.insert(key.clone(), (checked(s, value, folder).map_err(|why| at(line, why))?, line));
        }
        let sections: Sections = toml::from_str(text).map_err(syntax)?;
        for (driver, entries) in sections.driver {
            let section = file.drivers.entry(driver.clone()).or_default();
            for (key, value) in entries {
                let line = line_of(text, value.span().start);
                let bad = |why: String| at(line, format!("[driver.{driver}] {why}"));
                match (key.as_str(), value.get_ref()) {
                    ("env", toml::Value::Table(t)) => {
                        for (name, v) in t {
                            if let Some(why) = forbidden_env(name) {
                                return Err(bad(format!("env: {name} may not be set for a driver: {why}")));
                            }
                            let Some(v) = v.as_str() else {
                                return Err(bad(format!("env: {name} must be a string, not {}", type_name(v))));
                            };
                            section.env.push((name.clone(), v.to_string(), line));
                        }
                    }
                    ("pass_env", toml::Value::Array(a)) => {
                        for v in a {
                            let Some(name) = v.as_str() else {
                                return Err(bad(format!("pass_env: names must be strings, not {}", type_name(v))));
                            };
                            if let Some(why) = forbidden_env(name) {
                                return Err(bad(format!("pass_env: {name} may not be passed to a driver: {why}")));
                            }
                            section.pass_env.push((name.to_string(), line));
                        }
                    }
                    ("env", v) => return Err(bad(format!("env must be a table of strings, not {}", type_name(v)))),
                    ("pass_env", v) => {
                        return Err(bad(format!("pass_env must be an array of names, not {}", type_name(v))))
                    }
                    (key, v) => {
                        let s = known(key, true).map_err(bad)?;
                        section.values.insert(key.to_string(), (checked(s, v, folder).map_err(bad)?, line));
                    }
                }
            }
        }
        Ok(file)
    }
}

/// The setting a file's `key` names, or why there is none (listing the keys there are).
fn known(key: &str, in_driver: bool) -> Result<&'static Setting, String> {
    let allowed = |s: &&Setting| s.in_file && (!in_driver || s.per_driver);
    if let Some(s) = SETTINGS.iter().filter(allowed).find(|s| s.key == key) {
        return Ok(s);
    }
    let mut keys: Vec<String> = SETTINGS.iter().filter(allowed).map(|s| format!("`{}`", s.key)).collect();
    if in_driver {
        keys.extend(DRIVER_ENV_KEYS.iter().map(|k| format!("`{k}`")));
    } else {
        keys.push("`driver`".into());
    }
    let place = if in_driver { "in a driver section" } else { "at the top level" };
    let also = if !in_driver && SETTINGS.iter().any(|s| s.key == key && !s.in_file) {
        " (it is set in the environment only)"
    } else {
        ""
    };
    Err(format!("unknown key `{key}`{also} {place}, expected one of {}", keys.join(", ")))
}

/// A file's value for `s`, in its written form; a relative path is made absolute against the
/// file's folder (a profile file too, but not a built-in profile's name).
fn checked(s: &Setting, v: &toml::Value, folder: &Path) -> Result<String, String> {
    let raw = match (s.kind, v) {
        (Kind::Number { .. }, toml::Value::Integer(i)) => i.to_string(),
        (Kind::Switch, toml::Value::Boolean(b)) => (if *b { "1" } else { "0" }).to_string(),
        (
            Kind::Choice(_)
            | Kind::CrashLoop
            | Kind::Path
            | Kind::Profile
            | Kind::LogFilter
            | Kind::Output
            | Kind::Text,
            toml::Value::String(s),
        ) => s.clone(),
        (k, v) => {
            return Err(format!("`{}` must be {} ({}), not {}", s.key, k.expected(), k.toml_type(), type_name(v)))
        }
    };
    let value = s.kind.check(&raw).ok_or_else(|| format!("`{}` = {v} is not {}", s.key, s.kind.expected()))?;
    let is_path = match s.kind {
        Kind::Path => true,
        Kind::Output => !matches!(value.as_str(), "-" | "1" | "stderr"),
        Kind::Profile => value.contains('/') || value.ends_with(".toml"),
        _ => false,
    };
    Ok(if is_path && Path::new(&value).is_relative() {
        folder.join(&value).to_string_lossy().into_owned()
    } else {
        value
    })
}

/// Every layer below the environment and the flags: the files read, and what was wrong with the
/// ones that were not.
#[derive(Clone, Debug, Default)]
pub struct Files {
    /// The user's file first, then the system's.
    pub files: Vec<File>,
    /// Files that could not be used because they are malformed: the run stops (`cloister run`)
    /// or goes on with the defaults (the shim), saying it.
    pub errors: Vec<String>,
    /// Files skipped because they are not trusted: said, and passed over.
    pub warnings: Vec<String>,
}

/// Where the user's file is: `CLOISTER_CONFIG`, else `$XDG_CONFIG_HOME/cloister/config.toml`
/// (an absolute `XDG_CONFIG_HOME` only, as the XDG specification says), else
/// `~/.config/cloister/config.toml`.
pub fn user_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CLOISTER_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| crate::private::home_dir().map(|h| h.join(".config")))?;
    Some(base.join("cloister").join("config.toml"))
}

/// Where the system's file is: `CLOISTER_SYSTEM_CONFIG`, else [`SYSTEM_FILE`].
pub fn system_file() -> PathBuf {
    std::env::var_os("CLOISTER_SYSTEM_CONFIG")
        .filter(|p| !p.is_empty())
        .map_or(PathBuf::from(SYSTEM_FILE), PathBuf::from)
}

/// Why the file at `path` (and its folder) may not be trusted, if it may not: it must belong
/// to one of `owners` and be writable by no one else (others, or a group other than `groups`:
/// root's, and for the user's file the user's own, as with a user-private group and umask
/// 002), or another user could choose what cloister does.
fn untrusted(path: &Path, owners: &[u32], groups: &[u32]) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    for p in [Some(path), path.parent()].into_iter().flatten() {
        let m = match std::fs::metadata(p) {
            Ok(m) => m,
            Err(e) => return Some(format!("{}: {e}", p.display())),
        };
        if !owners.contains(&m.uid()) {
            return Some(format!("{} belongs to uid {}", p.display(), m.uid()));
        }
        if m.mode() & 0o002 != 0 || (m.mode() & 0o020 != 0 && !groups.contains(&m.gid())) {
            return Some(format!("{} is writable by others (mode {:o})", p.display(), m.mode() & 0o7777));
        }
    }
    None
}

impl Files {
    /// Reads the user's and the system's files, those that exist.
    pub fn read() -> Self {
        let me = crate::private::euid();
        // SAFETY: getegid cannot fail.
        let my_group = unsafe { libc::getegid() };
        let mut out = Files::default();
        let places =
            [(user_file(), vec![me, 0], vec![my_group, 0], "user"), (Some(system_file()), vec![0], vec![0], "system")];
        for (path, owners, groups, whose) in places {
            let Some(path) = path.filter(|p| p.exists()) else { continue };
            if let Some(why) = untrusted(&path, &owners, &groups) {
                out.warnings.push(format!(
                    "{}: not used: a {whose} configuration file must belong to {} and be writable by no one else ({why})",
                    path.display(),
                    if whose == "user" { "you (or root)" } else { "root" }
                ));
                continue;
            }
            match File::load(&path) {
                Ok(f) => out.files.push(f),
                Err(e) => out.errors.push(e),
            }
        }
        out
    }

    /// The value of `s` for `driver` (or for all drivers): from `flags` (key -> value), the
    /// environment as `env` reads it, these files, the default.
    pub fn resolve(
        &self,
        s: &Setting,
        driver: Option<&str>,
        flags: &BTreeMap<String, String>,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Resolved {
        if let Some(v) = flags.get(s.key) {
            return Resolved { value: Some(v.clone()), source: Source::Flag, problem: None };
        }
        let mut problem = None;
        match env(s.env).map(|v| v.into_string()) {
            Some(Ok(v)) if v.trim().is_empty() => {}
            Some(Ok(v)) => match s.kind.check(&v) {
                Some(v) => return Resolved { value: Some(v), source: Source::Env, problem: None },
                None => problem = Some(format!("{}={v:?} is not {}", s.env, s.kind.expected())),
            },
            Some(Err(_)) => problem = Some(format!("{} is not valid UTF-8", s.env)),
            None => {}
        }
        let (value, source) = self.below_env(s, driver);
        let problem = problem.map(|p| match &value {
            Some(v) => format!("{p}; using {v} ({source})"),
            None => format!("{p}; ignored"),
        });
        Resolved { value, source, problem }
    }

    /// The value the files or the default give.
    fn below_env(&self, s: &Setting, driver: Option<&str>) -> (Option<String>, Source) {
        for f in &self.files {
            let section = driver.and_then(|d| f.drivers.get(d)).map(|d| &d.values);
            for values in section.into_iter().chain([&f.values]) {
                if let Some((v, line)) = values.get(s.key) {
                    return (Some(v.clone()), Source::File { path: f.path.clone(), line: *line });
                }
            }
        }
        (s.default_value(), Source::Default)
    }

    /// The variables a driver's worker is given (`env`: the user's file over the system's),
    /// each with where it was set.
    pub fn driver_env(&self, driver: &str) -> Vec<(String, String, Source)> {
        let mut out: Vec<(String, String, Source)> = Vec::new();
        for f in &self.files {
            for (name, value, line) in f.drivers.get(driver).map(|d| d.env.as_slice()).unwrap_or_default() {
                if !out.iter().any(|(n, ..)| n == name) {
                    out.push((name.clone(), value.clone(), Source::File { path: f.path.clone(), line: *line }));
                }
            }
        }
        out
    }

    /// The application's variables a driver's worker is given (`pass_env` of every file).
    pub fn driver_pass_env(&self, driver: &str) -> Vec<(String, Source)> {
        let mut out: Vec<(String, Source)> = Vec::new();
        for f in &self.files {
            for (name, line) in f.drivers.get(driver).map(|d| d.pass_env.as_slice()).unwrap_or_default() {
                if !out.iter().any(|(n, _)| n == name) {
                    out.push((name.clone(), Source::File { path: f.path.clone(), line: *line }));
                }
            }
        }
        out
    }

    /// The drivers the files have sections for.
    pub fn driver_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.files.iter().flat_map(|f| f.drivers.keys().cloned()).collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> Result<File, String> {
        File::parse(Path::new(name), text)
    }

    fn no_env(_: &str) -> Option<std::ffi::OsString> {
        None
    }

    #[test]
    fn values_are_checked_with_file_and_line() {
        let f = file("/c/u.toml", "spin_us = 10\nstaging = \"plain\"\nsync = true\n").unwrap();
        assert_eq!(f.values["spin_us"], ("10".into(), 1));
        assert_eq!(f.values["staging"], ("plain".into(), 2));
        assert_eq!(f.values["sync"], ("1".into(), 3));
        let e = file("/c/u.toml", "spin_us = 10\n\nspinus = 5\n").unwrap_err();
        assert!(e.starts_with("/c/u.toml:3: unknown key `spinus`"), "{e}");
        assert!(e.contains("`spin_us`") && e.contains("`driver`"), "known keys missing: {e}");
        let e = file("/c/u.toml", "spin_us = \"abc\"\n").unwrap_err();
        assert!(e.starts_with("/c/u.toml:1:") && e.contains("integer") && e.contains("string"), "{e}");
        let e = file("/c/u.toml", "\ncrash_loop = \"0/0\"\n").unwrap_err();
        assert!(e.starts_with("/c/u.toml:2:") && e.contains("K/T"), "{e}");
        let e = file("/c/u.toml", "deadline_info_ms = -5\n").unwrap_err();
        assert!(e.contains("from 1 to 86400000"), "{e}");
        let e = file("/c/u.toml", "a = [\n").unwrap_err();
        assert!(e.starts_with("/c/u.toml:"), "{e}");
        // Quoted keys, and keys after a driver section, are found on their line.
        let f = file("/c/u.toml", "# note\n\"spin_us\" = 10\n[driver.pocl]\nprofile = \"generic\"\n").unwrap();
        assert_eq!(f.values["spin_us"].1, 2);
        assert_eq!(f.drivers["pocl"].values["profile"].1, 4);
        let e = file("/c/u.toml", "shim = \"/x\"\n").unwrap_err();
        assert!(e.contains("environment only"), "{e}");
    }

    #[test]
    fn driver_sections_take_per_driver_settings_and_variables() {
        let text =
            "[driver.pocl]\nprofile = \"my.toml\"\nenv = { POCL_DEBUG = \"all\" }\npass_env = [\"POCL_DEVICES\"]\n";
        let f = file("/etc/c/config.toml", text).unwrap();
        let d = &f.drivers["pocl"];
        assert_eq!(d.values["profile"], ("/etc/c/my.toml".into(), 2));
        assert_eq!(d.env, vec![("POCL_DEBUG".into(), "all".into(), 3)]);
        assert_eq!(d.pass_env, vec![("POCL_DEVICES".into(), 4)]);
        // The other ways TOML writes the same section.
        for text in ["driver.pocl.crash_loop = \"5/9\"\n", "[driver]\npocl = { crash_loop = \"5/9\" }\n"] {
            let f = file("/c/u.toml", text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(f.drivers["pocl"].values["crash_loop"].0, "5/9", "{text:?}");
        }
        // A built-in profile name stays a name.
        let f = file("/c/u.toml", "[driver.pocl]\nprofile = \"generic\"\n").unwrap();
        assert_eq!(f.drivers["pocl"].values["profile"].0, "generic");
        // Only per-driver settings there.
        let e = file("/c/u.toml", "[driver.pocl]\nspin_us = 5\n").unwrap_err();
        assert!(e.contains("`spin_us`") && e.contains("`pass_env`") && e.contains(":2:"), "{e}");
        for bad in ["LD_PRELOAD", "LD_LIBRARY_PATH", "CLOISTER_DEBUG", "HOME"] {
            let e = file("/c/u.toml", &format!("[driver.pocl]\nenv = {{ {bad} = \"x\" }}\n")).unwrap_err();
            assert!(e.contains(bad) && e.contains(":2:") && e.contains("may not"), "{e}");
            let e = file("/c/u.toml", &format!("[driver.pocl]\npass_env = [\"{bad}\"]\n")).unwrap_err();
            assert!(e.contains(bad) && e.contains("may not"), "{e}");
        }
    }

    #[test]
    fn layers_go_flag_env_user_system_default() {
        let user =
            file("/u.toml", "spin_us = 10\nstaging = \"pinned\"\n[driver.pocl]\ncrash_loop = \"5/9\"\n").unwrap();
        let system =
            file("/s.toml", "spin_us = 20\ncopy_threads = 3\ncrash_loop = \"7/7\"\nstaging = \"plain\"\n").unwrap();
        let files = Files { files: vec![user, system], ..Default::default() };
        let flags: BTreeMap<String, String> = [("staging".to_string(), "auto".to_string())].into();
        let env = |n: &str| (n == "CLOISTER_SYNC").then(|| "1".into());
        let get = |key: &str, driver: Option<&str>| files.resolve(setting(key), driver, &flags, &env);
        let at = |p: &str, line| Source::File { path: p.into(), line };
        assert_eq!(get("staging", None).source, Source::Flag);
        assert_eq!((get("sync", None).value, get("sync", None).source), (Some("1".into()), Source::Env));
        assert_eq!((get("spin_us", None).value, get("spin_us", None).source), (Some("10".into()), at("/u.toml", 1)));
        assert_eq!(get("copy_threads", None).value, Some("3".into()));
        assert_eq!(get("copy_threads", None).source, at("/s.toml", 2));
        assert_eq!(get("zero_copy", None).source, Source::Default);
        // A driver's section before its file's top level; the user's file before the system's.
        assert_eq!(get("crash_loop", Some("pocl")).value, Some("5/9".into()));
        assert_eq!(get("crash_loop", Some("other")).value, Some("7/7".into()));
        assert_eq!(get("crash_loop", None).source, at("/s.toml", 3));
        assert_eq!(get("profile", None).value, None);
    }

    #[test]
    fn a_bad_environment_value_falls_to_the_next_layer_and_says_so() {
        let files = Files { files: vec![file("/u.toml", "spin_us = 10\n").unwrap()], ..Default::default() };
        let env = |n: &str| (n == "CLOISTER_SPIN_US").then(|| "abc".into());
        let r = files.resolve(setting("spin_us"), None, &BTreeMap::new(), &env);
        assert_eq!(r.value, Some("10".into()));
        let p = r.problem.unwrap();
        assert!(p.contains("CLOISTER_SPIN_US=\"abc\"") && p.contains("using 10 (/u.toml:1)"), "{p}");
        let r = Files::default().resolve(setting("deadline_info_ms"), None, &BTreeMap::new(), &|_| Some("-5".into()));
        assert_eq!(r.value, Some("10000".into()));
        assert!(r.problem.unwrap().contains("using 10000 (default)"));
        assert_eq!(Files::default().resolve(setting("spin_us"), None, &BTreeMap::new(), &no_env).problem, None);
    }

    #[test]
    fn untrusted_files_are_named() {
        let dir = std::env::temp_dir().join(format!("cloister-config-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("config.toml");
        std::fs::write(&f, "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let me = crate::private::euid();
        use std::os::unix::fs::MetadataExt;
        let group = std::fs::metadata(&f).unwrap().gid();
        assert_eq!(untrusted(&f, &[me], &[]), None);
        assert!(untrusted(&f, &[me + 1], &[]).unwrap().contains("belongs to uid"));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o664)).unwrap();
        assert!(untrusted(&f, &[me], &[group + 1]).unwrap().contains("writable by others"));
        assert_eq!(untrusted(&f, &[me], &[group]), None, "writable by its own group only");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(untrusted(&f, &[me], &[group]).unwrap().contains("writable by others"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
