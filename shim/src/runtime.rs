//! Process-wide state: the connection to the broker, and one slot per driver holding its
//! current worker. When a worker dies the slot asks the broker for a replacement and rebinds the
//! application's platform and device handles to it, unless the driver is crash-looping.
//!
//! Layer: the top. It may import every layer below (`conn`, `handle`, `pending`, `recovery`),
//! and joins them for the connections it makes (`layers::LAYERS`, the one `conn::Above`).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use cloister_ipc::handshake::Hello;
use cloister_ipc::private;
use cloister_ipc::{channel, BrokerReply, BrokerRequest};

use crate::conn::{Conn, DeathWatcher};

mod layers;

pub use layers::LAYERS;

/// One driver: its current worker, and the crash history that decides whether to restart it.
pub struct DriverSlot {
    pub driver: String,
    current: RwLock<Arc<Conn>>,
    crashes: Mutex<VecDeque<Instant>>,
    restarting: Mutex<bool>,
    restarted: Condvar,
    given_up: std::sync::atomic::AtomicBool,
}

pub struct Runtime {
    pub slots: Vec<Arc<DriverSlot>>,
    broker: Option<Mutex<OwnedFd>>,
    /// Where the broker listens, if it is a shared one (`CLOISTER_SOCKET` or the per-user
    /// socket): a restarted broker is found there again (`reconnect`).
    broker_path: Option<String>,
}

impl Runtime {
    /// Each driver's current worker.
    pub fn conns(&self) -> Vec<Arc<Conn>> {
        self.slots.iter().map(|s| s.current.read().unwrap_or_else(|e| e.into_inner()).clone()).collect()
    }

    /// Every platform handle, across workers, in order.
    pub fn platforms(&self) -> Vec<usize> {
        self.conns()
            .iter()
            .flat_map(|c| c.platforms.get().into_iter().flatten().map(|(p, _)| *p).collect::<Vec<_>>())
            .collect()
    }
}

/// Where the warnings of every layer go (`base`), under the name the shim's callers use.
pub use crate::base::warn;

static RT: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RT.get_or_init(|| match connect() {
        Ok(rt) => rt,
        Err(e) => {
            warn(&e);
            Runtime { slots: Vec::new(), broker: None, broker_path: None }
        }
    })
}

/// Waits (a bounded while) for replacements under way; true if one was.
pub fn await_restarts() -> bool {
    let Some(rt) = RT.get() else { return false };
    let mut waited = false;
    for slot in &rt.slots {
        let mut busy = slot.restarting.lock().unwrap_or_else(|e| e.into_inner());
        // A rebuild (`recovery`) builds programs and reruns commands again.
        let patience = if crate::recovery::on() { 120 } else { 10 };
        let deadline = Instant::now() + Duration::from_secs(patience);
        while *busy {
            waited = true;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            busy = slot.restarted.wait_timeout(busy, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
    waited
}

/// `CLOISTER_CRASH_LOOP=K/T` (or the driver's `crash_loop` in the configuration): K crashes
/// within T seconds stop the restarts (default 3/60).
fn crash_loop_limit(driver: &str) -> (usize, Duration) {
    let (k, t) = cloister_ipc::settings::crash_loop(Some(driver));
    (k, Duration::from_secs(t))
}

struct Restarter(Arc<DriverSlot>);

impl DeathWatcher for Restarter {
    fn dying(&self) {
        if !self.0.given_up.load(std::sync::atomic::Ordering::Acquire) {
            *self.0.restarting.lock().unwrap_or_else(|e| e.into_inner()) = true;
        }
    }

    fn account(&self) -> Option<String> {
        why_died(&self.0.driver)
    }

    fn died(&self, dead: Arc<Conn>) {
        let slot = &self.0;
        let serial = dead.serial();
        // Drops the notifier's reference to the dead connection first (see `DeathWatcher::died`).
        let finish = |dead: Arc<Conn>| {
            drop(dead);
            // Event callbacks kept for a rebuild that did not take them fire now, failed.
            crate::recovery::fire_kept_callbacks(serial);
            *slot.restarting.lock().unwrap_or_else(|e| e.into_inner()) = false;
            slot.restarted.notify_all();
            crate::recovery::conclude(serial);
        };
        if slot.given_up.load(std::sync::atomic::Ordering::Acquire) {
            return finish(dead);
        }
        let (k, window) = crash_loop_limit(&slot.driver);
        let looping = {
            let mut crashes = slot.crashes.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            crashes.push_back(now);
            while crashes.front().is_some_and(|&t| now.duration_since(t) > window) {
                crashes.pop_front();
            }
            crashes.len() >= k
        };
        if looping {
            slot.given_up.store(true, std::sync::atomic::Ordering::Release);
            warn(&format!(
                "driver {} crashed {k} times within {} s: not restarting it; its devices stay unavailable (CLOISTER_CRASH_LOOP)",
                slot.driver,
                window.as_secs()
            ));
            return finish(dead);
        }
        cloister_ipc::log::in_shim(|| tracing::info!(driver = %slot.driver, "worker died: asking for a replacement"));
        let replacement = match dead.replays() {
            true => respawn_and_rebuild(&slot.driver, &dead),
            false => respawn(&slot.driver, &dead),
        };
        match replacement {
            Ok(conn) => {
                let _ = conn.death_watcher.set(Arc::new(Restarter(slot.clone())));
                *slot.current.write().unwrap_or_else(|e| e.into_inner()) = conn;
            }
            Err(e) => warn(&format!("cannot restart the worker for {}: {e}", slot.driver)),
        }
        finish(dead);
    }
}

/// Tells the broker something it does not answer (`BrokerRequest::CarriedOver`); a broker that
/// is gone is not waited for.
pub fn tell_broker(request: &BrokerRequest) {
    let Some(broker) = RT.get().and_then(|rt| rt.broker.as_ref()) else { return };
    let sock = broker.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = channel::send(&*sock, request, &[]) {
        cloister_ipc::log::in_shim(|| tracing::info!("cannot tell the broker: {e}"));
    }
}

/// The broker's account of the driver's last death: the cause and the report's path.
fn why_died(driver: &str) -> Option<String> {
    let broker = RT.get()?.broker.as_ref()?;
    let sock = broker.lock().unwrap_or_else(|e| e.into_inner());
    channel::send(&*sock, &BrokerRequest::WhyDied { driver: driver.to_string() }, &[]).ok()?;
    match channel::recv::<BrokerReply>(&*sock).ok()?.0 {
        BrokerReply::Death { note } => note,
        _ => None,
    }
}

/// In replay mode: a new worker for `driver` with `dead`'s objects rebuilt in it and the
/// application's handles moved there (`recovery`). A replacement that dies during the rebuild
/// is replaced again, the step it died in counted (after `recovery::RETRIES` the step is
/// dropped); these deaths do not count towards the crash loop, as they are bounded so.
fn respawn_and_rebuild(driver: &str, dead: &Arc<Conn>) -> Result<Arc<Conn>, String> {
    let mut st = crate::recovery::journal_of(dead).take();
    let mut previous = dead.clone();
    // Each round either succeeds or adds one attempt to one step, and steps are finite; this
    // bound only guards against a rebuild that never ends.
    for _ in 0..64 {
        let conn = respawn(driver, &previous)?;
        conn.continue_ids_from(dead);
        // The dead worker was replayed; so is its replacement.
        conn.settle_replay(|| true);
        match crate::recovery::rebuild(&mut st, dead, &conn) {
            crate::recovery::Outcome::Done(rebuilt) => {
                crate::recovery::carry_over(dead, &conn, rebuilt, st, tell_broker);
                return Ok(conn);
            }
            crate::recovery::Outcome::Crashed(step) => {
                warn(&format!("the new worker for {driver} died too while cloister rebuilt the application's objects ({step}); trying again"));
                st.count_attempt(step);
                previous = conn;
            }
        }
    }
    Err("the rebuild did not finish".into())
}

/// Asks the broker for a new worker for `driver` and rebinds `dead`'s platforms and devices.
/// A broker that went away (restarted) is looked for again where it listened.
fn respawn(driver: &str, dead: &Arc<Conn>) -> Result<Arc<Conn>, String> {
    let rt = RT.get().ok_or("no runtime")?;
    let broker = rt.broker.as_ref().ok_or("no broker connection")?;
    let (grant_fd, grant_driver) = {
        let mut sock = broker.lock().unwrap_or_else(|e| e.into_inner());
        match ask_respawn(&sock, driver) {
            Ok(granted) => granted,
            Err(Asked::Refused(e)) => return Err(e),
            Err(Asked::Gone(e)) => {
                let path = rt.broker_path.as_deref().ok_or_else(|| format!("the broker is gone ({e})"))?;
                let (fresh, granted) = reconnect(path, driver).map_err(|r| format!("the broker is gone ({e}); {r}"))?;
                *sock = fresh;
                granted
            }
        }
    };
    let reuse = dead.platforms.get().cloned().unwrap_or_default();
    Conn::connect(grant_fd, &grant_driver, Some(&reuse), &LAYERS)
}

/// Why a respawn request got no worker: the broker said no, or it is not there any more.
enum Asked {
    Refused(String),
    Gone(String),
}

fn ask_respawn(sock: &OwnedFd, driver: &str) -> Result<(OwnedFd, String), Asked> {
    channel::send(sock, &BrokerRequest::Respawn { driver: driver.to_string() }, &[])
        .map_err(|e| Asked::Gone(e.to_string()))?;
    let (reply, mut fds) = channel::recv::<BrokerReply>(sock).map_err(|e| Asked::Gone(format!("broker: {e}")))?;
    match reply {
        BrokerReply::Workers { mut grants, errors, .. } => match (grants.pop(), fds.pop()) {
            (Some(g), Some(fd)) => Ok((fd, g.driver)),
            _ => Err(Asked::Refused(errors.join("; "))),
        },
        BrokerReply::Refused { reason } => Err(Asked::Refused(reason)),
        _ => Err(Asked::Refused("the broker answered out of turn".into())),
    }
}

/// How long a restarted broker is waited for.
const BROKER_RESTART_PATIENCE: Duration = Duration::from_secs(10);

/// Greets the broker listening at `path` again (it was restarted), as at start-up, and takes
/// its worker for `driver` (those for other drivers are dropped: their slots ask when their
/// own workers die).
fn reconnect(path: &str, driver: &str) -> Result<(OwnedFd, (OwnedFd, String)), String> {
    let deadline = Instant::now() + BROKER_RESTART_PATIENCE;
    let sock = loop {
        match connect_seqpacket(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(format!("no broker at {path}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    private::check_peer_is_us(sock.as_raw_fd(), std::path::Path::new(path))?;
    let (grants, fds) = hello(&sock)?;
    let fd = grants.iter().zip(fds).find(|(g, _)| g.driver == driver).map(|(_, fd)| fd);
    let fd = fd.ok_or_else(|| format!("the restarted broker has no driver {driver}"))?;
    Ok((sock, (fd, driver.to_string())))
}

/// Says hello to the broker on `sock` (with the pipes for the workers' output) and returns its
/// grants and their fds.
fn hello(sock: &OwnedFd) -> Result<(Vec<cloister_ipc::WorkerGrant>, Vec<OwnedFd>), String> {
    // Two pipes go with the hello, never our own stdout and stderr (a terminal the driver could
    // read or type into): the workers write kernel printf output and driver messages there,
    // and we relay it to our fd 1 and fd 2 (see `stdio_relay`).
    let pipes = crate::stdio_relay::start();
    let stdio: Vec<i32> = pipes.iter().flatten().map(|fd| fd.as_raw_fd()).collect();
    channel::send(sock, &BrokerRequest::Hello(Hello::new()), &stdio).map_err(|e| e.to_string())?;
    drop(pipes);
    let (reply, fds) = channel::recv::<BrokerReply>(sock).map_err(|e| format!("broker: {e}"))?;
    match reply {
        BrokerReply::Workers { version, grants, errors } => {
            if version != cloister_ipc::handshake::PROTOCOL_VERSION {
                return Err(format!(
                    "broker speaks protocol v{version}; shim and broker must come from the same build"
                ));
            }
            for e in errors {
                warn(&e);
            }
            Ok((grants, fds))
        }
        BrokerReply::Refused { reason } => Err(format!("broker refused: {reason}")),
        _ => Err("the broker answered out of turn".into()),
    }
}

/// The `cloister` binary beside this library (the shim finds its own file with dladdr).
fn cloister_binary() -> Option<std::path::PathBuf> {
    // SAFETY: dladdr on an address inside this library fills a Dl_info with static strings.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(cloister_binary as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader.
    let lib = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let bin = std::fs::canonicalize(lib).ok()?.parent()?.join("cloister");
    bin.exists().then_some(bin)
}

/// Starts a broker for this process alone, when neither `CLOISTER_SOCKET` nor a per-user
/// broker is there. It exits when this process does.
fn start_private_broker() -> Result<(OwnedFd, String), String> {
    let bin = cloister_binary().ok_or(
        "no broker: set CLOISTER_SOCKET, run `cloister broker`, or start the application with `cloister run -- APP`",
    )?;
    // A fresh folder with a random name (mkdtemp, 0700): no other user can have put a socket
    // where our broker will listen.
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|p| private::check_private(p).is_ok())
        .unwrap_or_else(std::env::temp_dir);
    let dir = private::fresh_dir(&base, "cloister-private-").map_err(|e| e.to_string())?;
    let path = dir.join("broker.sock");
    let mut child = std::process::Command::new(&bin)
        .args(["broker", "--exit-with-parent", "--socket"])
        .arg(&path)
        .env_remove("OCL_ICD_VENDORS")
        // This process has read the same settings and said what was wrong with them.
        .env(cloister_ipc::settings::ALREADY_SAID, "1")
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start a private broker ({}): {e}", bin.display()))?;
    let shown = path.display().to_string();
    for _ in 0..200 {
        if let Ok(sock) = connect_seqpacket(&shown) {
            private::check_peer_is_us(sock.as_raw_fd(), &path)?;
            std::thread::spawn(move || {
                let _ = child.wait();
            });
            return Ok((sock, shown));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("the private broker exited: {status}"));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err("the private broker did not start listening".into())
}

fn connect() -> Result<Runtime, String> {
    // `shared`: a broker that outlives us, found again at `path` if it restarts (`reconnect`).
    let (sock, path, shared) = match cloister_ipc::settings::get("socket", None) {
        Some(path) => {
            let sock = connect_seqpacket(&path).map_err(|e| format!("cannot reach the broker at {path}: {e}"))?;
            // Nothing (not even the hello with our stdio) goes to another user's process.
            private::check_peer_is_us(sock.as_raw_fd(), std::path::Path::new(&path))?;
            (sock, path, true)
        }
        None => match user_broker() {
            Some((sock, path)) => (sock, path, true),
            // A private broker exits with this process: there is nothing to find again.
            None => {
                let (sock, path) = start_private_broker()?;
                (sock, path, false)
            }
        },
    };
    cloister_ipc::log::in_shim(|| tracing::info!(broker = %path, "connected to the broker"));
    crate::intercept::serve_reports(&path);
    let broker_path = shared.then_some(path);
    let (grants, fds) = hello(&sock)?;
    let mut slots = Vec::new();
    for (grant, fd) in grants.iter().zip(fds) {
        match connect_with_retries(&sock, fd, &grant.driver) {
            Ok(c) => {
                cloister_ipc::log::in_shim(|| tracing::info!(driver = %grant.driver, "worker ready"));
                let slot = Arc::new(DriverSlot {
                    driver: grant.driver.clone(),
                    current: RwLock::new(c.clone()),
                    crashes: Mutex::new(VecDeque::new()),
                    restarting: Mutex::new(false),
                    restarted: Condvar::new(),
                    given_up: std::sync::atomic::AtomicBool::new(false),
                });
                let _ = c.death_watcher.set(Arc::new(Restarter(slot.clone())));
                slots.push(slot);
            }
            Err(e) => warn(&e),
        }
    }
    Ok(Runtime { slots, broker: Some(Mutex::new(sock)), broker_path })
}

/// The per-user broker (`cloister broker`), if one of ours listens: its folders must be private
/// to us and its process must run as us. One that is not is named once and passed over.
fn user_broker() -> Option<(OwnedFd, String)> {
    let (base, path) = private::user_socket();
    let shown = path.display().to_string();
    let dir = path.parent()?;
    if !path.exists() {
        return None;
    }
    if let Err(e) = private::check_private_under(&base, dir) {
        warn(&format!("ignoring the broker socket {shown}: {e}"));
        return None;
    }
    let sock = connect_seqpacket(&shown).ok()?;
    if let Err(e) = private::check_peer_is_us(sock.as_raw_fd(), &path) {
        warn(&e);
        return None;
    }
    Some((sock, shown))
}

/// Greets a new worker; one that dies before its welcome (a driver crashing while it
/// enumerates) is replaced, up to the crash-loop limit, so the application never sees it.
fn connect_with_retries(broker: &OwnedFd, fd: OwnedFd, driver: &str) -> Result<Arc<Conn>, String> {
    let (limit, _) = crash_loop_limit(driver);
    // Retries are for drivers that crash while they start; one that hangs there until the
    // watchdog's deadline would hang again, and the application would wait that long each time.
    let patience = Duration::from_millis(
        cloister_ipc::deadlines::Deadlines::for_driver(Some(driver)).for_op(cloister_ipc::deadlines::INITIALIZE),
    );
    let started = Instant::now();
    let mut fd = fd;
    let mut tries = 1;
    loop {
        match Conn::connect(fd, driver, None, &LAYERS) {
            Ok(c) => return Ok(c),
            Err(e) if tries >= limit || started.elapsed() >= patience => {
                return Err(format!("{e} (after {tries} tries)"))
            }
            Err(e) => warn(&format!("{e}; starting another worker")),
        }
        tries += 1;
        channel::send(broker, &BrokerRequest::Respawn { driver: driver.to_string() }, &[])
            .map_err(|e| e.to_string())?;
        let (reply, mut fds) = channel::recv::<BrokerReply>(broker).map_err(|e| format!("broker: {e}"))?;
        fd = match (reply, fds.pop()) {
            (BrokerReply::Workers { .. }, Some(next)) => next,
            (BrokerReply::Workers { errors, .. }, None) => return Err(errors.join("; ")),
            (BrokerReply::Refused { reason }, _) => return Err(reason),
            _ => return Err("the broker answered out of turn".into()),
        };
    }
}

fn connect_seqpacket(path: &str) -> std::io::Result<OwnedFd> {
    channel::connect_seqpacket(std::path::Path::new(path))
}
