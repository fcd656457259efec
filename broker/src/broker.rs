//! The broker: accepts shims on a Unix socket, checks they run as our user, and starts one
//! worker per driver for each, handing the shim its end of each worker's channel.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cloister_crash_reports::{Cause, CrashReport, RecordedCall};

use crate::watchdog::Deadlines;
use cloister_ipc::handshake::PROTOCOL_VERSION;
use cloister_ipc::recorder::{FlightRecorder, RECORDER_FD};
use cloister_ipc::{channel, BrokerReply, BrokerRequest, IpcError, WorkerGrant};
use cloister_sandbox_policy::learn::Supervision;

use crate::drivers::Driver;

/// How the broker starts workers.
#[derive(Clone)]
pub struct WorkerOptions {
    pub worker: PathBuf,
    /// `--no-sandbox`: hygiene only (for debugging and `policy learn`). The profile and
    /// `require_sandbox` are settings, per driver (`--profile` and `--require-sandbox` are
    /// their flags): see `DriverChoices`.
    pub no_sandbox: bool,
    /// `cloister policy learn`: workers run observed, and what they did is collected here.
    pub learn: Option<std::sync::Arc<LearnSink>>,
    /// A start-up check (`probe`): its death is no crash to report; the check says the cause.
    pub probe: bool,
}

/// What learning workers did, per driver.
#[derive(Default)]
pub struct LearnSink {
    pub results: std::sync::Mutex<Vec<(Driver, cloister_sandbox_policy::learn::Observed)>>,
    pub observers: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Where the worker finds the socket it hands its seccomp listener over.
const SUPERVISOR_FD: i32 = 5;

pub struct BrokerConfig {
    pub options: WorkerOptions,
    pub drivers: Vec<Driver>,
}

/// A listening `SOCK_SEQPACKET` socket.
pub fn listen(path: &Path) -> std::io::Result<OwnedFd> {
    channel::listen_seqpacket(path)
}

/// A worker, and what the broker says of its death once it has written the report.
pub struct WorkerNote {
    pub pid: u32,
    pub death: std::sync::Mutex<Option<Death>>,
}

/// A worker's death as the broker told it: the sentence, and the report's file if one was
/// written.
#[derive(Clone)]
pub struct Death {
    pub said: String,
    pub report: Option<PathBuf>,
}

pub type DeathNote = Arc<WorkerNote>;

impl WorkerNote {
    /// What was said of the death, if the worker died and was reported.
    pub fn said(&self) -> Option<String> {
        self.death.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|d| d.said.clone())
    }

    /// Waits up to `limit` for the death to be reported.
    pub fn wait(&self, limit: std::time::Duration) -> Option<Death> {
        let end = std::time::Instant::now() + limit;
        loop {
            let death = self.death.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if death.is_some() || std::time::Instant::now() >= end {
                return death;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// A started worker: the shim's end of its channel, what the broker will say of its death, and
/// how to dismiss it.
pub type Spawned = (OwnedFd, DeathNote, Option<Dismissal>);

/// Ends a worker whose client has gone: a pidfd (never a pid: one that was reaped may have been
/// reused), and a flag that tells its reaper the end is no crash to report.
pub struct Dismissal {
    pidfd: OwnedFd,
    dismissed: Arc<AtomicBool>,
}

impl Dismissal {
    /// Ends the worker now: it was only started to be looked at.
    pub fn now(&self) {
        self.dismissed.store(true, Ordering::Release);
        // SAFETY: pidfd_send_signal on a pidfd we own; a worker already gone gives ESRCH.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0)
        };
    }
}

/// How long a worker whose client has gone may take to exit on its own (it sees its channel
/// close) before it is killed.
const DISMISS_GRACE_MS: i32 = 1000;

type SpawnRequest = (Driver, ForApp, std::sync::mpsc::Sender<std::io::Result<Spawned>>);

/// What a worker is started with for one application: where its output goes, and who the
/// application is (for its crash report).
#[derive(Default)]
pub struct ForApp {
    pub stdio: Option<AppStdio>,
    pub app: Option<cloister_crash_reports::Application>,
}

/// Where a worker's stdout and stderr go: the write ends of two pipes the shim sent with its
/// hello, which the shim relays to the application's stdout and stderr (kernel `printf`, driver
/// messages) even when this broker serves many applications. Never a terminal: a driver holding
/// one could read what the user types, or inject input with TIOCSTI.
pub struct AppStdio {
    out: OwnedFd,
    err: OwnedFd,
}

/// Whether `fd` is a terminal.
fn is_terminal(fd: &OwnedFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd.as_raw_fd()) == 1 }
}

impl AppStdio {
    /// The two descriptors a shim's hello carries, if it carried them and neither is a
    /// terminal (a shim of this build sends pipes).
    fn from_hello(fds: Vec<OwnedFd>) -> Option<Self> {
        let mut fds = fds.into_iter();
        let stdio = AppStdio { out: fds.next()?, err: fds.next()? };
        if is_terminal(&stdio.out) || is_terminal(&stdio.err) {
            eprintln!("cloister broker: a client sent a terminal as its output; its workers write nowhere");
            return None;
        }
        Some(stdio)
    }

    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(AppStdio { out: self.out.try_clone()?, err: self.err.try_clone()? })
    }
}

/// Workers die with the thread that forked them (`PR_SET_PDEATHSIG` follows the parent
/// *thread*), so all of them are started by one thread that lives as long as the broker.
fn spawner(options: WorkerOptions) -> std::sync::mpsc::Sender<SpawnRequest> {
    let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("worker-spawner".into())
        .spawn(move || {
            for (driver, for_app, reply) in rx {
                let _ = reply.send(spawn_worker(&options, &driver, for_app));
            }
        })
        .expect("cannot start the worker-spawner thread");
    tx
}

/// Serves shims forever (until the process exits).
pub fn serve(listener: OwnedFd, config: BrokerConfig) {
    let spawn = spawner(config.options.clone());
    let config = std::sync::Arc::new(config);
    loop {
        // SAFETY: accept4 on a listening socket; NULL address is allowed.
        let raw = unsafe {
            libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
        };
        if raw < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // SAFETY: raw is a fresh connection fd.
        let client = unsafe { OwnedFd::from_raw_fd(raw) };
        let config = config.clone();
        let spawn = spawn.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve_client(&client, &config, &spawn) {
                eprintln!("cloister broker: {e}");
            }
        });
    }
}

/// Refuses a client that runs inside a cage: a worker, or anything a worker started, may not
/// ask the broker for anything (it could have it start workers without end, or pose as an
/// application). Every caged process lives in its worker's own network namespace and cannot
/// leave it (it holds no capabilities), so a peer outside the broker's namespace is refused.
/// The peer is pinned by a pidfd taken at connect time (`SO_PEERPIDFD`), so its pid cannot be
/// reused between the look and the answer. A genuine application in another network namespace
/// than its broker is refused too; it can use a broker of its own (`cloister run`).
fn not_caged(fd: RawFd) -> Result<u32, String> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: pidfd/len are valid out pointers of the right size.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, SO_PEERPIDFD, (&mut pidfd as *mut libc::c_int).cast(), &mut len)
    };
    // SAFETY: a fresh pidfd from the kernel, or none.
    let pidfd = (rc == 0 && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    let pid = match &pidfd {
        Some(p) => std::fs::read_to_string(format!("/proc/self/fdinfo/{}", p.as_raw_fd()))
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("Pid:").map(|v| v.trim().to_string())))
            .ok_or("cannot identify the client's process")?,
        // Kernels before 6.5: the pid from SO_PEERCRED.
        None => {
            cloister_ipc::private::peer_cred(fd).map(|c| c.pid).map_err(|e| format!("SO_PEERCRED: {e}"))?.to_string()
        }
    };
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).map_err(|e| format!("client's namespace: {e}"))?;
    let ours = std::fs::read_link("/proc/self/ns/net").map_err(|e| format!("own namespace: {e}"))?;
    if let Some(p) = &pidfd {
        // SAFETY: signal 0 through a valid pidfd only checks that the process still lives.
        if unsafe { libc::syscall(libc::SYS_pidfd_send_signal, p.as_raw_fd(), 0, std::ptr::null::<u8>(), 0) } != 0 {
            return Err("the client is gone".into());
        }
    }
    if theirs != ours {
        return Err(format!(
            "client (pid {pid}) runs in another network namespace than this broker: a caged driver may not ask the broker for anything"
        ));
    }
    pid.parse().map_err(|_| format!("the client's pid {pid:?} is not a number"))
}

fn serve_client(
    client: &OwnedFd,
    config: &BrokerConfig,
    spawn: &std::sync::mpsc::Sender<SpawnRequest>,
) -> Result<(), String> {
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    let uid = cloister_ipc::private::peer_uid(client.as_raw_fd()).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    if uid != me {
        let reason = format!("client runs as uid {uid}, this broker serves uid {me} only");
        // Read the client's hello first: closing a socket with unread data resets it, and the
        // client would see a reset instead of the reason.
        let _ = channel::recv::<BrokerRequest>(client);
        let _ = channel::send(client, &BrokerReply::Refused { reason: reason.clone() }, &[]);
        return Err(reason);
    }
    let app = match not_caged(client.as_raw_fd()) {
        Ok(pid) => {
            let app = cloister_crash_reports::Application::of_pid(pid);
            let name = app.as_ref().map(|a| a.name.as_str()).unwrap_or("?");
            tracing::info!(client = pid, app = %cloister_crash_reports::escape(name, false), "client connected");
            app
        }
        Err(reason) => {
            let _ = channel::recv::<BrokerRequest>(client);
            let _ = channel::send(client, &BrokerReply::Refused { reason: reason.clone() }, &[]);
            return Err(reason);
        }
    };
    let (hello, fds) = match channel::recv::<BrokerRequest>(client).map_err(|e| e.to_string())? {
        (BrokerRequest::Hello(hello), fds) => (hello, fds),
        (BrokerRequest::ServeReports(hello), _) => {
            hello.check()?;
            let (pid, name) = app.as_ref().map(|a| (a.pid, a.name.clone())).ok_or("cannot identify the client")?;
            let sock = client.try_clone().map_err(|e| format!("cannot keep a report connection: {e}"))?;
            crate::reports::register(pid, name, sock);
            return Ok(());
        }
        (BrokerRequest::AskReports { hello, pid }, _) => {
            if let Err(reason) = hello.check() {
                let _ = channel::send(client, &BrokerReply::Refused { reason: reason.clone() }, &[]);
                return Err(reason);
            }
            let reports = crate::reports::ask(pid);
            return channel::send(client, &BrokerReply::Reports { reports }, &[]).map_err(|e| e.to_string());
        }
        _ => return Err("the first message must be a hello".into()),
    };
    let stdio = AppStdio::from_hello(fds);
    if let Err(reason) = hello.check() {
        let _ = channel::send(client, &BrokerReply::Refused { reason: reason.clone() }, &[]);
        return Err(reason);
    }
    let mut notes: Vec<Granted> = Vec::new();
    // Every worker started for this client ends when the client's connection closes (it
    // exited, or died), whatever the worker is doing: a per-user broker outlives its clients.
    let mut workers = ClientWorkers::default();
    let who = Who { stdio: stdio.as_ref(), app: app.as_ref() };
    grant(client, &config.drivers, spawn, &mut notes, &mut workers, who)?;
    // The connection stays open: the shim asks here for replacements of workers that died.
    loop {
        let request = match channel::recv::<BrokerRequest>(client) {
            Ok((r, _)) => r,
            Err(IpcError::PeerGone) => {
                tracing::info!(client = who.app.map(|a| a.pid), "client left");
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        match request {
            BrokerRequest::Respawn { driver } => {
                tracing::info!(client = who.app.map(|a| a.pid), driver = %driver, "replacement worker asked for");
                let wanted: Vec<Driver> = config.drivers.iter().filter(|d| d.name == driver).cloned().collect();
                if wanted.is_empty() {
                    let reason = format!("no driver {driver} in this broker");
                    channel::send(client, &BrokerReply::Refused { reason }, &[]).map_err(|e| e.to_string())?;
                    continue;
                }
                grant(client, &wanted, spawn, &mut notes, &mut workers, who)?;
            }
            BrokerRequest::WhyDied { driver } => {
                let note = notes.iter().rev().find(|g| g.driver == driver);
                // The reaper writes the report right after the worker is gone; wait for it.
                let answer = note.and_then(|g| g.note.wait(std::time::Duration::from_secs(2))).map(|d| d.said);
                channel::send(client, &BrokerReply::Death { note: answer }, &[]).map_err(|e| e.to_string())?;
            }
            BrokerRequest::CarriedOver(carried) => crate::carried::record(&mut notes, carried),
            BrokerRequest::Hello(_) => return Err("a second hello on one connection".into()),
            _ => return Err("a request out of turn".into()),
        }
    }
}

/// A worker granted to one client.
pub struct Granted {
    pub driver: String,
    pub note: DeathNote,
    /// Its death's report already says the application was carried over.
    pub carried: bool,
}

/// The workers started for one client, ended when it goes (on drop).
#[derive(Default)]
struct ClientWorkers(Vec<Dismissal>);

impl Drop for ClientWorkers {
    fn drop(&mut self) {
        let end = std::time::Instant::now() + std::time::Duration::from_millis(DISMISS_GRACE_MS as u64);
        for w in &self.0 {
            // A pidfd reads as ready once its process has exited.
            let mut pfd = libc::pollfd { fd: w.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let left = end.saturating_duration_since(std::time::Instant::now()).as_millis() as i32;
            // SAFETY: one valid pollfd, as counted.
            if unsafe { libc::poll(&mut pfd, 1, left) } == 1 {
                continue;
            }
            w.now();
        }
    }
}

/// The client a worker is granted to: its output and who it is.
#[derive(Clone, Copy)]
struct Who<'a> {
    stdio: Option<&'a AppStdio>,
    app: Option<&'a cloister_crash_reports::Application>,
}

/// Starts a worker for each of `drivers` and hands the client its ends of their channels.
fn grant(
    client: &OwnedFd,
    drivers: &[Driver],
    spawn: &std::sync::mpsc::Sender<SpawnRequest>,
    notes: &mut Vec<Granted>,
    workers: &mut ClientWorkers,
    who: Who,
) -> Result<(), String> {
    let mut grants = Vec::new();
    let mut fds = Vec::new();
    let mut errors = Vec::new();
    for d in drivers {
        let (tx, rx) = std::sync::mpsc::channel();
        let stdio = who
            .stdio
            .map(AppStdio::try_clone)
            .transpose()
            .map_err(|e| format!("dup of the application's stdio: {e}"))?;
        let for_app = ForApp { stdio, app: who.app.cloned() };
        spawn.send((d.clone(), for_app, tx)).map_err(|_| "worker spawner is gone")?;
        let spawned = rx.recv().map_err(|_| "worker spawner is gone")?;
        match spawned {
            Ok((fd, note, dismissal)) => {
                workers.0.extend(dismissal);
                grants.push(WorkerGrant { driver: d.name.clone(), library: d.library.clone() });
                fds.push(fd);
                notes.push(Granted { driver: d.name.clone(), note, carried: false });
            }
            Err(e) => errors.push(format!("cannot start a worker for {}: {e}", d.name)),
        }
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    channel::send(client, &BrokerReply::Workers { version: PROTOCOL_VERSION, grants, errors }, &raw)
        .map_err(|e| e.to_string())
}

/// The `CLOISTER_FAULT*` variables steer the fault-injecting test driver (`tests/fault-driver`)
/// and mean nothing to real drivers; they pass through as they are. cloister's own settings a
/// worker reads are given as the values in effect for its driver (`settings::worker_env`).
/// `RUST_LOG` passes too: the worker logs with it when `CLOISTER_LOG` is unset (see `log`).
const FAULT_DRIVER_VARS: &[&str] = &[
    "CLOISTER_FAULT",
    "CLOISTER_FAULT_REAL",
    "CLOISTER_FAULT_FILE",
    "CLOISTER_FAULT_PORT",
    "CLOISTER_FAULT_SKIP",
    "RUST_LOG",
];

/// What the settings say of one driver's worker.
pub struct DriverChoices {
    /// The profile: a built-in name, or an absolute profile file; `None`: by library name.
    pub profile: Option<String>,
    pub require_sandbox: bool,
}

impl DriverChoices {
    pub fn of(driver: &Driver) -> Self {
        use cloister_ipc::settings;
        // A profile file named in the environment is relative to where cloister started; the
        // worker runs in its cache folder, so it gets the absolute path.
        let profile =
            settings::get("profile", Some(&driver.name)).map(|p| match p.contains('/') || p.ends_with(".toml") {
                true => std::fs::canonicalize(&p).map_or(p, |a| a.to_string_lossy().into_owned()),
                false => p,
            });
        Self { profile, require_sandbox: settings::get("require_sandbox", Some(&driver.name)).as_deref() == Some("1") }
    }
}

/// The environment a driver's worker gets: nothing of the broker's or the application's but
/// the base variables (`ENV_PASSTHROUGH`), the fault driver's, the settings the worker reads
/// (with the values in effect for the driver), and the driver's own `pass_env` (from the
/// broker's environment, which is the application's for `cloister run`) and `env` (set here:
/// they win). Another driver's variables never reach it; `HOME`, `XDG_CACHE_HOME` and
/// `TMPDIR`, set after, are the worker's private folders (a file cannot set them).
pub fn worker_environment(driver: &Driver) -> Vec<(String, std::ffi::OsString)> {
    let files = cloister_ipc::settings::files();
    let passed = files.driver_pass_env(&driver.name).into_iter().map(|(name, _)| name);
    let mut out: Vec<(String, std::ffi::OsString)> = cloister_sandbox_policy::ENV_PASSTHROUGH
        .iter()
        .chain(FAULT_DRIVER_VARS)
        .map(|k| k.to_string())
        .chain(passed)
        .filter_map(|k| std::env::var_os(&k).map(|v| (k, v)))
        .collect();
    let mut set = |k: String, v: std::ffi::OsString| match out.iter_mut().find(|(n, _)| *n == k) {
        Some(slot) => slot.1 = v,
        None => out.push((k, v)),
    };
    for (k, v) in cloister_ipc::settings::worker_env(&driver.name) {
        set(k.to_string(), v.into());
    }
    for (k, v, _) in files.driver_env(&driver.name) {
        set(k, v.into());
    }
    out
}

/// The worker's private, persistent cache directory: its only writable place (the driver's
/// kernel cache lives there between runs), also its `HOME` and `TMPDIR`. It holds the
/// applications' kernel sources and binaries, so every folder from `cloister` down is 0700 and
/// ours. Without `XDG_CACHE_HOME` or `HOME` it is under the password database's home, else a
/// per-user private folder in /tmp: never one shared by users.
///
/// What it shares: one folder per (user, driver), used by every application of that user that
/// the driver serves, so the driver's own kernel cache hits across applications. The worker
/// can write all of it; what cloister itself puts there is checked before use (the worker's
/// `tmp` is made again, staged header sets are compared with what they are named after), but
/// the driver's own compiled-kernel cache is the driver's: a driver compromised in one
/// application can change the kernels later applications of the same user get from it.
pub fn cache_dir(driver: &Driver) -> std::io::Result<PathBuf> {
    use cloister_ipc::private;
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => match private::home_dir() {
            Some(h) => h.join(".cache"),
            None => private::per_user_tmp("cache")?,
        },
    };
    std::fs::create_dir_all(&base)?;
    let name: String =
        driver.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    let dir = base.join("cloister").join("workers").join(name);
    private::ensure_private_under(&base, &dir)?;
    Ok(dir)
}

/// `<cache>/tmp`, the worker's `TMPDIR`: the worker may have replaced it with a file or a link
/// (it owns its cache); whatever is there that is not our private folder is removed and the
/// folder made again, so one hostile run cannot stop later workers of the driver.
fn worker_tmp(cache: &Path) -> std::io::Result<PathBuf> {
    let tmp = cache.join("tmp");
    if cloister_ipc::private::check_private(&tmp).is_err() {
        match std::fs::symlink_metadata(&tmp) {
            Ok(m) if m.file_type().is_dir() => std::fs::remove_dir_all(&tmp)?,
            Ok(_) => std::fs::remove_file(&tmp)?,
            Err(_) => {}
        }
    }
    cloister_ipc::private::ensure_private(&tmp)?;
    Ok(tmp)
}

/// Starts a worker for `driver`; returns the shim's end of its channel. A thread waits for the
/// worker and, if it dies, writes a crash report naming the cause.
pub fn spawn_worker(options: &WorkerOptions, driver: &Driver, for_app: ForApp) -> std::io::Result<Spawned> {
    let (ours, theirs) = channel::seqpacket_pair().map_err(|e| std::io::Error::other(e.to_string()))?;
    let recorder = FlightRecorder::create().map_err(|e| std::io::Error::other(e.to_string()))?;
    let cache = cache_dir(driver)?;
    let tmp = worker_tmp(&cache)?;
    let theirs_raw = theirs.as_raw_fd();
    let recorder_raw = recorder.region().fd().as_raw_fd();
    let mut cmd = Command::new(&options.worker);
    cmd.arg("--library").arg(&driver.library).arg("--name").arg(&driver.name).arg("--cache").arg(&cache);
    // A learning worker runs observed, not confined: no profile, nothing to require.
    let choices = match options.learn {
        Some(_) => DriverChoices { profile: None, require_sandbox: false },
        None => DriverChoices::of(driver),
    };
    if let Some(p) = &choices.profile {
        cmd.arg("--profile").arg(p);
    }
    if options.no_sandbox {
        cmd.arg("--no-sandbox");
    } else if choices.require_sandbox {
        cmd.arg("--require-sandbox");
    }
    if options.learn.is_some() {
        cmd.arg("--learn");
    }
    // The worker hands its seccomp listener over this socket: we supervise its violations
    // (or, learning, observe every call).
    let (sup_ours, sup_theirs) = channel::seqpacket_pair().map_err(|e| std::io::Error::other(e.to_string()))?;
    let sup_raw = sup_theirs.as_raw_fd();
    // Not the application's folder (the driver may not read it): relative paths the driver opens,
    // like a build's `-I.`, resolve in its own cache, and the application's headers come staged.
    cmd.current_dir(&cache);
    cmd.env_clear();
    cmd.envs(worker_environment(driver));
    cmd.env("HOME", &cache).env("XDG_CACHE_HOME", &cache).env("TMPDIR", &tmp);
    // Every broker read the settings at its start and said what was wrong with them.
    cmd.env(cloister_ipc::settings::ALREADY_SAID, "1");
    // Never the broker's own stdio, which may be the user's terminal.
    cmd.stdin(Stdio::null());
    let ForApp { stdio, app } = for_app;
    match stdio {
        Some(AppStdio { out, err }) => cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err)),
        None => cmd.stdout(Stdio::null()).stderr(Stdio::null()),
    };
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in [(Some(theirs_raw), 3), (Some(recorder_raw), RECORDER_FD), (Some(sup_raw), SUPERVISOR_FD)]
            {
                let Some(from) = from else { continue };
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let flags = libc::fcntl(to, libc::F_GETFD);
                libc::fcntl(to, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    tracing::info!(
        worker = child.id(),
        driver = %driver.name,
        client = app.as_ref().map(|a| a.pid),
        probe = options.probe,
        "worker started"
    );
    // Opened before the reaper can reap the child, so it names this worker.
    // SAFETY: pidfd_open on our unreaped child's pid; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
    // SAFETY: a fresh fd we own, when the call succeeded.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) });
    let dismissed = Arc::new(AtomicBool::new(false));
    let dismissal = pidfd.map(|pidfd| Dismissal { pidfd, dismissed: dismissed.clone() });
    drop(theirs);
    drop(sup_theirs);
    let recorder = std::sync::Arc::new(recorder);
    let pid = child.id();
    let verdict = Arc::new(Verdict::default());
    // The worker's own profile, for its spawn limit (a profile file that no longer parses
    // means no spawning: the worker refuses to start with it anyway).
    let max_processes = match &choices.profile {
        Some(p) => cloister_sandbox_policy::Profile::load(p).ok(),
        None => Some(cloister_sandbox_policy::Profile::for_library(&driver.library)),
    }
    .filter(|p| p.spawn)
    .map(|p| p.limits.processes);
    let supervisor = {
        let (verdict, learn, d) = (verdict.clone(), options.learn.clone(), driver.clone());
        std::thread::spawn(move || {
            let Ok(Some((_, mut fds))) = channel::recv_raw(sup_ours.as_raw_fd()) else { return };
            let Some(listener) = fds.pop() else { return };
            match learn {
                Some(sink) => {
                    let seen = cloister_sandbox_policy::learn::observe(listener);
                    sink.results.lock().unwrap_or_else(|e| e.into_inner()).push((d, seen));
                }
                None => {
                    let mut on_violation = |nr: i64| {
                        verdict.trapped(nr);
                        // SAFETY: killing our own child, whose pid we hold until we reap it.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    };
                    cloister_sandbox_policy::learn::supervise(
                        listener,
                        Supervision::Enforce { on_violation: &mut on_violation, max_processes },
                    );
                }
            }
        })
    };
    if let Some(sink) = &options.learn {
        sink.observers.lock().unwrap_or_else(|e| e.into_inner()).push(supervisor);
    }
    let driver = driver.clone();
    let profile =
        choices.profile.unwrap_or_else(|| cloister_sandbox_policy::Profile::for_library(&driver.library).name);
    let exited = Arc::new(AtomicBool::new(false));
    let probe = options.probe;
    if options.learn.is_none() {
        let (recorder, exited, deadlines, verdict) =
            (recorder.clone(), exited.clone(), Deadlines::for_driver(Some(&driver.name)), verdict.clone());
        std::thread::spawn(move || crate::watchdog::watch(pid, recorder, exited, deadlines, verdict));
    }
    LIVE_WORKERS.fetch_add(1, Ordering::AcqRel);
    let note: DeathNote = Arc::new(WorkerNote { pid, death: std::sync::Mutex::new(None) });
    let note_for_reaper = note.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        exited.store(true, Ordering::Release);
        let _last = LiveWorker;
        let Ok(status) = status else { return };
        tracing::info!(worker = pid, driver = %driver.name, %status, "worker ended");
        if dismissed.load(Ordering::Acquire) {
            if !probe {
                eprintln!(
                    "cloister: the worker for driver {} (pid {pid}) outlived its application: killed",
                    driver.name
                );
            }
            return;
        }
        if let Some(cause) = death_cause(status, &verdict, &driver.name) {
            // A start-up check's worker that refused its driver (not a library, not an ICD, no
            // platform) exits with a status: that is a setup mistake the check says itself. One
            // that crashed, hung or broke the cage is a driver fault, reported as any other.
            let death = if probe && matches!(cause, Cause::Exit { .. }) {
                Death { said: cause.describe(), report: None }
            } else {
                report_death(&driver, &profile, pid, cause, &recorder, app)
            };
            *note_for_reaper.death.lock().unwrap_or_else(|e| e.into_inner()) = Some(death);
        }
    });
    Ok((ours, note, dismissal))
}

/// Workers not yet reaped (and reported).
static LIVE_WORKERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts a worker out when its reaper is done, report written or not.
pub struct LiveWorker;

/// Makes `drain_workers` wait for a report being written or amended until the result is
/// dropped.
pub fn report_pending() -> LiveWorker {
    LIVE_WORKERS.fetch_add(1, Ordering::AcqRel);
    LiveWorker
}

impl Drop for LiveWorker {
    fn drop(&mut self) {
        LIVE_WORKERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits (at most `limit`) for every worker to be reaped, so that the reports of workers that
/// died with the application are written before `cloister run` exits.
pub fn drain_workers(limit: std::time::Duration) {
    let end = std::time::Instant::now() + limit;
    while LIVE_WORKERS.load(Ordering::Acquire) > 0 && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// What the broker itself saw of a worker's end, kept in broker memory: the call its watchdog
/// killed it for, the system call its seccomp supervisor killed it for. The report's cause comes
/// from here and from the wait status, never from the worker-writable flight recorder.
#[derive(Default)]
pub struct Verdict {
    hung: std::sync::OnceLock<&'static str>,
    trapped: std::sync::OnceLock<i64>,
}

impl Verdict {
    /// The watchdog kills the worker for this call.
    pub fn hung(&self, op: &'static str) {
        let _ = self.hung.set(op);
    }

    /// The seccomp supervisor kills the worker for this system call.
    pub fn trapped(&self, nr: i64) {
        let _ = self.trapped.set(nr);
    }
}

/// Why a worker ended, or `None` for a clean exit (its application went away).
fn death_cause(status: std::process::ExitStatus, verdict: &Verdict, driver: &str) -> Option<Cause> {
    use std::os::unix::process::ExitStatusExt;
    if let Some(&call) = verdict.hung.get() {
        let deadline_ms = Deadlines::for_driver(Some(driver)).for_op(call);
        return Some(Cause::Hang { call: call.to_string(), deadline_ms });
    }
    if let Some(&trapped) = verdict.trapped.get() {
        let name = cloister_sandbox_policy::seccomp::syscall_name(trapped).map(str::to_string);
        return Some(Cause::TrappedSyscall { number: trapped, name });
    }
    if let Some(signal) = status.signal() {
        return Some(Cause::Signal { signal, fault_address: None });
    }
    match status.code() {
        Some(0) | None => None,
        Some(code) => Some(Cause::Exit { status: code }),
    }
}

fn recorded(c: cloister_ipc::recorder::CallRecord) -> RecordedCall {
    RecordedCall { op: c.op.to_string(), lane: c.lane as u64, start_ns: c.start_ns, end_ns: c.end_ns }
}

/// Writes the report, says so on stderr, and returns what was said (for the application) and
/// where the report is.
fn report_death(
    driver: &Driver,
    profile: &str,
    pid: u32,
    cause: Cause,
    recorder: &FlightRecorder,
    application: Option<cloister_crash_reports::Application>,
) -> Death {
    let mut report = CrashReport::new(&driver.name, &driver.library, profile, pid, cause);
    report.application = application;
    let w = &mut report.worker;
    w.in_flight = recorder.in_flight().into_iter().next().map(recorded);
    w.last_calls = recorder.last_calls(32).into_iter().map(recorded).collect();
    let h = recorder.header();
    w.device = h.device.get();
    w.program_source = h.program_source.get();
    w.build_options = h.build_options.get();
    w.trapped_syscall = Some(h.trapped_syscall.load(Ordering::Acquire)).filter(|&nr| nr >= 0);
    w.signal_from_outside = cloister_crash_reports::OutsideSignal::from_word(h.outside_signal.load(Ordering::Acquire));
    // The call in flight groups repeats (a hang's cause names it already). Its name is one of
    // OP_NAMES (the recorder bounds it), so the worker cannot put text of its own here.
    if let (Some(call), false) = (&report.worker.in_flight, matches!(report.cause, Cause::Hang { .. })) {
        report.signature = format!("{}:{}", report.signature, call.op);
    }
    let saved = cloister_crash_reports::crash_dir().map(|dir| {
        let written = report.write(&dir);
        // Old reports go as new ones come (`CLOISTER_CRASH_KEEP`, `CLOISTER_CRASH_KEEP_DAYS`).
        let keep = cloister_crash_reports::Retention::from_settings();
        let pruned = cloister_crash_reports::prune(&dir, keep, cloister_crash_reports::now());
        tracing::debug!(worker = pid, pruned, "crash report written");
        written
    });
    let place = match &saved {
        Some(Ok(path)) => format!("report: {}", path.display()),
        Some(Err(e)) => format!("the report could not be written: {e}"),
        None => "no state directory for a report (set HOME or XDG_STATE_HOME)".into(),
    };
    let during = report.worker.in_flight.as_ref().map(|c| format!(" during {}", c.op)).unwrap_or_default();
    // The signal the broker saw, when the worker says another process sent it.
    let sent = match (&report.cause, report.worker.signal_from_outside) {
        (Cause::Signal { signal, .. }, Some(o)) if o.signal == *signal => {
            " (sent from outside the worker, by another process, says the worker)"
        }
        _ => "",
    };
    let said = cloister_crash_reports::escape(
        &format!(
            "the worker for driver {} (pid {pid}) died{during}: {}{sent}; {place}",
            driver.name,
            report.cause.describe()
        ),
        false,
    );
    eprintln!("cloister: {said}");
    Death { said, report: saved.and_then(Result::ok) }
}
