//! `cloister-worker`: hosts one OpenCL driver for one application.
//!
//! Started by the broker with its end of the channel as fd 3. It cages itself first, then loads
//! the driver by path, answers the shim's hello with the platforms and devices it found, and
//! serves each lane on its own thread, so the driver sees the application's threading.

mod driver;
mod handler;
mod includes;
mod notify;
mod objects;
mod segments;
mod signals;
mod staging;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::handshake::PROTOCOL_VERSION;
use cloister_ipc::lane::{Lane, WorkKind, LANE_BYTES};
use cloister_ipc::recorder::{FlightRecorder, RecorderHeader, RECORDER_FD};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::{channel, dispatch_into, Enumerated, Posted, ShimMessage, WorkerMessage, WORKER_ID_BIT};

use handler::{LaneServer, Worker};
use objects::Kind;

const CHANNEL_FD: i32 = 3;

/// Writes a line to stderr, which is the application's pipe: once the application has gone
/// the write fails, and that is no reason to die otherwise than planned (`eprintln!` panics).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Whether a channel error means the application left: then there is nothing to serve, and no
/// crash to report (a replacement started as its application exits meets this).
fn client_left(e: &cloister_ipc::IpcError) -> bool {
    match e {
        cloister_ipc::IpcError::PeerGone => true,
        cloister_ipc::IpcError::Os(_, io) => matches!(io.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)),
        _ => false,
    }
}

struct Args {
    library: String,
    name: String,
    /// A built-in profile name or a profile file; default: chosen by the library's name.
    profile: Option<String>,
    /// The worker's private, persistent cache directory (read-write under landlock).
    cache: Option<std::path::PathBuf>,
    /// Hygiene only: no rlimits, namespace, landlock or seccomp.
    no_sandbox: bool,
    /// Refuse to serve if any layer could not be applied.
    require_sandbox: bool,
    /// `cloister policy learn`: unconfined, every system call reported to the broker.
    learn: bool,
}

/// Where the worker hands its seccomp listener to the broker (which supervises violations, or
/// in learning mode observes every call).
const SUPERVISOR_FD: i32 = 5;

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        library: String::new(),
        name: String::new(),
        profile: None,
        cache: None,
        no_sandbox: false,
        require_sandbox: false,
        learn: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--library" => a.library = it.next().ok_or("--library needs a value")?,
            "--name" => a.name = it.next().ok_or("--name needs a value")?,
            "--profile" => a.profile = Some(it.next().ok_or("--profile needs a value")?),
            "--cache" => a.cache = Some(it.next().ok_or("--cache needs a value")?.into()),
            "--no-sandbox" => a.no_sandbox = true,
            "--require-sandbox" => a.require_sandbox = true,
            "--learn" => a.learn = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.library.is_empty() {
        return Err("--library PATH is required".into());
    }
    if a.name.is_empty() {
        a.name = a.library.clone();
    }
    Ok(a)
}

/// The cage as the worker applied it: the profile's name and one line per layer.
struct CageState {
    profile: String,
    layers: Vec<cloister_sandbox_policy::Layer>,
}

fn enter_cage(args: &Args) -> Result<CageState, String> {
    let profile = match &args.profile {
        Some(p) => cloister_sandbox_policy::Profile::load(p).map_err(|e| e.to_string())?,
        None => cloister_sandbox_policy::Profile::for_library(&args.library),
    };
    // The flight recorder comes as fd 4 when the broker provides one.
    // SAFETY: fcntl(F_GETFD) only probes whether the fd is open.
    let recorder = if unsafe { libc::fcntl(RECORDER_FD, libc::F_GETFD) } >= 0 {
        // SAFETY: fd 4 is the broker's recorder memfd, ours from now on.
        let fd = unsafe { OwnedFd::from_raw_fd(RECORDER_FD) };
        SharedRegion::from_fd(fd, cloister_ipc::recorder::RECORDER_BYTES)
            .ok()
            .and_then(|r| FlightRecorder::from_region(r).ok())
    } else {
        None
    };
    let private: Vec<&std::path::Path> = args.cache.iter().map(|p| p.as_path()).collect();
    // A driver given by path may live anywhere: its own directory stays readable.
    let library_dir = std::fs::canonicalize(&args.library).ok().and_then(|p| p.parent().map(|d| d.to_path_buf()));
    let extra_read: Vec<&std::path::Path> = library_dir.iter().map(|p| p.as_path()).collect();
    let spec = cloister_sandbox_policy::CageSpec {
        profile: &profile,
        private_dirs: &private,
        extra_read: &extra_read,
        keep_fds: &[0, 1, 2, CHANNEL_FD, RECORDER_FD, SUPERVISOR_FD],
        confine: !args.no_sandbox && !args.learn,
    };
    if let Some(r) = recorder {
        let header = r.leak();
        let _ = RECORDER.set(header);
        cloister_sandbox_policy::seccomp::install_trap_handler(&header.trapped_syscall).map_err(|e| e.to_string())?;
    }
    // Probe for the broker's supervisor socket now: once the learning observer is installed,
    // every call but sendmsg waits for the broker, who is not listening yet.
    // SAFETY: fcntl(F_GETFD) only probes whether fd 5 is open.
    let supervised = unsafe { libc::fcntl(SUPERVISOR_FD, libc::F_GETFD) } >= 0;
    let (layers, listener) = cloister_sandbox_policy::apply(&spec);
    let listener = if args.learn {
        Some(cloister_sandbox_policy::learn::install_observer().map_err(|e| e.to_string())?)
    } else {
        listener
    };
    if let (Some(l), true) = (listener, supervised) {
        // Only sendmsg here (see above); the fds are closed later, observed.
        channel::send_raw(SUPERVISOR_FD, b"listener", &[l.as_raw_fd()]).map_err(|e| e.to_string())?;
        // SAFETY: fd 5 is the broker's supervisor socket, ours from now on.
        drop(unsafe { OwnedFd::from_raw_fd(SUPERVISOR_FD) });
    }
    let profile = if args.learn { "learning (observed, not confined)".into() } else { profile.name };
    Ok(CageState { profile, layers })
}

fn main() -> ExitCode {
    // The broker gave this worker the settings in effect for its driver; no file is read here.
    cloister_ipc::settings::environment_only();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            say!("cloister-worker: {e}");
            return ExitCode::from(2);
        }
    };
    never_hold_a_terminal();
    cloister_ipc::log::init_program("worker");
    tracing::info!(driver = %args.name, library = %args.library, "worker starting");
    // First, while single-threaded: nothing the driver starts may outlive this worker.
    let pid_namespace = cloister_sandbox_policy::process::pid_namespace();
    // SAFETY: the broker passes the channel as fd 3; we take ownership once.
    let sock = unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) };
    let cage = match enter_cage(&args) {
        Ok(mut c) => {
            c.layers.insert(0, pid_namespace);
            c
        }
        Err(e) => {
            let _ =
                channel::send(&sock, &WorkerMessage::Refused { reason: format!("cannot build the cage: {e}") }, &[]);
            say!("cloister-worker[{}]: {e}", args.name);
            return ExitCode::from(1);
        }
    };
    for l in &cage.layers {
        tracing::debug!(driver = %args.name, layer = %l, "cage layer");
    }
    if cloister_ipc::settings::debug() {
        for l in &cage.layers {
            say!("cloister-worker[{}]: {l}", args.name);
        }
        // What the driver sees of the environment (names only): what the broker passes and
        // the driver's `env` and `pass_env` in the configuration, nothing else of the
        // application's.
        let mut names: Vec<String> = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
        names.sort();
        say!("cloister-worker[{}]: environment: {}", args.name, names.join(" "));
    }
    match serve(&args, &cage, sock) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("cloister-worker[{}]: {e}", args.name);
            ExitCode::from(1)
        }
    }
}

/// The driver must never reach a terminal (it could read what the user types, or inject input
/// with TIOCSTI): the broker gives the worker /dev/null and pipes, and any stdio descriptor
/// that is a terminal all the same becomes /dev/null here.
fn never_hold_a_terminal() {
    for fd in 0..=2 {
        // SAFETY: isatty/open/dup2/close on descriptor numbers; nothing is dereferenced.
        unsafe {
            if libc::isatty(fd) == 1 {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                if null >= 0 {
                    libc::dup2(null, fd);
                    libc::close(null);
                } else {
                    libc::close(fd);
                }
            }
        }
    }
}

fn serve(args: &Args, cage: &CageState, sock: OwnedFd) -> Result<(), String> {
    let (hello, _) = match channel::recv::<ShimMessage>(&sock) {
        Ok(m) => m,
        Err(e) if client_left(&e) => std::process::exit(0),
        Err(e) => return Err(format!("handshake: {e}")),
    };
    let ShimMessage::Hello(hello) = hello else {
        return Err("handshake: expected hello".into());
    };
    if let Err(reason) = hello.check() {
        let _ = channel::send(&sock, &WorkerMessage::Refused { reason: reason.clone() }, &[]);
        return Err(reason);
    }
    let off: Vec<String> = cage.layers.iter().filter(|l| !l.is_on()).map(|l| l.to_string()).collect();
    if args.require_sandbox && !args.no_sandbox && !off.is_empty() {
        let reason = format!("--require-sandbox: layers not applied: {}", off.join("; "));
        let _ = channel::send(&sock, &WorkerMessage::Refused { reason: reason.clone() }, &[]);
        return Err(reason);
    }

    let worker = Arc::new(Worker::default());
    // The driver's start is a call like any other to the watchdog: one that hangs loading or
    // enumerating is killed at its deadline, and the report names it.
    let recorder = RECORDER.get().copied();
    let init_op = cloister_ipc::deadlines::op_index(cloister_ipc::deadlines::INITIALIZE).unwrap_or_default();
    let init_slot = recorder.and_then(FlightRecorder::claim_slot);
    let init_start = recorder.map(|r| FlightRecorder::begin(r, init_slot, 0, init_op));
    let loaded = driver::Driver::load(&args.library).map(|d| enumerate(&worker, &d));
    if let (Some(r), Some(start)) = (recorder, init_start) {
        FlightRecorder::end(r, init_slot, 0, init_op, start);
    }
    // The driver's signal handlers are in place by now: the worker's go on top.
    if let Some(r) = recorder {
        signals::note_in(&r.outside_signal);
    }
    signals::ensure_last();
    let (platforms, devices) = match loaded {
        Ok(found) => found,
        Err(e) => {
            let reason = format!("cannot load driver {}: {}", args.library, e.0);
            let _ = channel::send(&sock, &WorkerMessage::Refused { reason: reason.clone() }, &[]);
            return Err(reason);
        }
    };
    tracing::info!(driver = %args.name, platforms = platforms.len(), devices = devices.len(), "driver loaded");
    let welcome = WorkerMessage::Welcome {
        version: PROTOCOL_VERSION,
        driver: args.name.clone(),
        profile: cage.profile.clone(),
        layers: cage.layers.iter().map(|l| l.to_string()).collect(),
        platforms,
        devices,
    };
    match channel::send(&sock, &welcome, &[]) {
        Err(e) if client_left(&e) => std::process::exit(0),
        sent => sent.map_err(|e| e.to_string())?,
    }
    notify::init(sock.as_raw_fd());

    let mut next_lane = 0u64;
    loop {
        let (msg, mut fds) = match channel::recv::<ShimMessage>(&sock) {
            Ok(m) => m,
            // The application is gone (or sent garbage): nothing left to serve.
            Err(_) => std::process::exit(0),
        };
        match msg {
            ShimMessage::NewLane { lane } => {
                let Some(fd) = fds.pop() else { continue };
                let region = SharedRegion::from_fd(fd, LANE_BYTES).map_err(|e| e.to_string())?;
                let lane_obj = Lane::from_region(region).map_err(|e| e.to_string())?;
                let w = worker.clone();
                next_lane = next_lane.max(lane);
                tracing::debug!(lane, "lane opened");
                std::thread::Builder::new()
                    .name(format!("lane-{lane}"))
                    .spawn(move || serve_lane(&w, &lane_obj, lane as u32))
                    .map_err(|e| e.to_string())?;
            }
            ShimMessage::NewSegment { segment } => {
                let Some(fd) = fds.pop() else { continue };
                if let Ok(region) = SharedRegion::from_fd(fd, 1) {
                    worker.segments.insert(segment, region);
                }
            }
            ShimMessage::Hello(_) => {}
        }
    }
}

/// Records the driver's platforms and devices under worker-allocated ids.
fn enumerate(worker: &Worker, d: &driver::Driver) -> (Vec<u64>, Vec<Enumerated>) {
    let mut next = WORKER_ID_BIT;
    let mut platforms = Vec::new();
    let mut devices = Vec::new();
    let mut names = Vec::new();
    for &p in &d.platforms {
        let pid = next;
        next += 1;
        worker.objects.insert(pid, Kind::Platform, p);
        platforms.push(pid);
        // SAFETY: p is a live platform handle from the driver.
        let Some(get) = (unsafe { driver::dispatch(p) }).clGetDeviceIDs else {
            continue;
        };
        let mut n = 0u32;
        // SAFETY: count query with valid out pointer.
        if unsafe { get(p as _, CL_DEVICE_TYPE_ALL, 0, std::ptr::null_mut(), &mut n) } != CL_SUCCESS {
            continue;
        }
        let mut devs = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: devs has room for n handles.
        if unsafe { get(p as _, CL_DEVICE_TYPE_ALL, n, devs.as_mut_ptr(), std::ptr::null_mut()) } != CL_SUCCESS {
            continue;
        }
        for dev in devs {
            let id = next;
            next += 1;
            worker.objects.insert(id, Kind::Device, dev as usize);
            devices.push(Enumerated { id, platform: pid });
            names.push(device_name(dev as usize));
        }
    }
    if let Some(r) = RECORDER.get() {
        r.device.set(names.join(", ").as_bytes());
    }
    (platforms, devices)
}

/// A device's name and its driver's version (`CL_DRIVER_VERSION`), for the flight recorder.
fn device_name(dev: usize) -> String {
    // SAFETY: dev is a live device handle from the driver.
    let Some(info) = (unsafe { driver::dispatch(dev) }).clGetDeviceInfo else { return String::new() };
    let text = |param| {
        let mut buf = [0u8; 128];
        // SAFETY: buf holds 128 writable bytes, as passed.
        let rc = unsafe { info(dev as _, param, buf.len(), buf.as_mut_ptr().cast(), std::ptr::null_mut()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        (rc == CL_SUCCESS).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
    };
    match (text(CL_DEVICE_NAME), text(CL_DRIVER_VERSION)) {
        (Some(name), Some(version)) => format!("{name} (driver {version})"),
        (Some(name), None) => name,
        _ => String::new(),
    }
}

/// The flight recorder the broker reads (absent when the worker runs without a broker).
pub(crate) static RECORDER: std::sync::OnceLock<&'static RecorderHeader> = std::sync::OnceLock::new();

/// Serves one lane in the application's order: calls are answered, posted requests (enqueues
/// the shim vouched for) run without an answer, and a posted request the driver rejects is
/// reported late (`LaneServer::late_failure`).
fn serve_lane(worker: &Worker, lane: &Lane, lane_id: u32) {
    let server = LaneServer { worker, lane, pin_memo: Default::default() };
    let recorder = RECORDER.get().copied();
    let slot = recorder.and_then(FlightRecorder::claim_slot);
    let alive = || true;
    let mut spill = cloister_ipc::spill::LaneSpill::default();
    // The request taken last and a posted request's encoded status, kept between requests:
    // taking and answering them allocates nothing once they have grown.
    let mut bytes = Vec::new();
    let mut status = Vec::new();
    loop {
        cloister_ipc::spill::reset_scratch(&mut bytes);
        match lane.next_into(&alive, &mut bytes) {
            Ok(WorkKind::Call) => {
                // The call stays in flight in the recorder until its reply is posted.
                let mut in_flight = None;
                let framed = spill.serve(
                    &bytes,
                    |id| worker.segments.get(id),
                    |bytes, out| {
                        // A request that does not decode, or a reply that cannot be encoded, is
                        // answered with an empty reply: the shim's decoding fails, and it treats
                        // that as a fault.
                        let Ok(req) = cloister_ipc::decode_request(bytes) else { return };
                        // Noted before the driver runs it, so a crash or hang inside names the call.
                        let op = cloister_ipc::deadlines::recorded_index(&req);
                        in_flight = recorder.map(|r| (r, op, FlightRecorder::begin(r, slot, lane_id, op)));
                        let build =
                            cloister_ipc::deadlines::class_of(req.op_name()) == cloister_ipc::deadlines::Class::Build;
                        let before = out.len();
                        if dispatch_into(&server, req, out).is_err() {
                            out.truncate(before);
                        }
                        if build {
                            // A build is where LLVM installs its signal handlers.
                            signals::ensure_last();
                        }
                    },
                );
                match framed.and_then(|f| lane.post_reply(f).map_err(|e| e.to_string())) {
                    Ok(()) => {
                        if let Some((r, op, start)) = in_flight {
                            FlightRecorder::end(r, slot, lane_id, op, start);
                        }
                    }
                    Err(why) => cannot_reply(lane_id, &why),
                }
            }
            Ok(WorkKind::Posted) => {
                // Only what may be posted runs; anything else (which the shim never posts) is
                // dropped, as nobody waits for its answer.
                if let Ok(req) = cloister_ipc::decode_request(&bytes) {
                    if let Some(posted) = req.posted() {
                        // A posted release's failure goes unreported: releases succeed.
                        enum Late {
                            Enqueue(cloister_ipc::ObjectId, cloister_ipc::EnqueueSync),
                            Create { context: cloister_ipc::ObjectId, id: cloister_ipc::ObjectId },
                            Callback(u64),
                            Unreported,
                        }
                        let late = match posted {
                            Posted::Enqueue { queue, sync } => Late::Enqueue(queue, sync.clone()),
                            Posted::Create { context, id } => Late::Create { context, id },
                            Posted::Release => Late::Unreported,
                            Posted::Callback { token } => Late::Callback(token),
                        };
                        let op = req.op_index();
                        // Noted before the driver runs it, so a crash or hang inside names the call.
                        let recorded = cloister_ipc::deadlines::recorded_index(&req);
                        let start = recorder.map(|r| FlightRecorder::begin(r, slot, lane_id, recorded));
                        status.clear();
                        let ran = dispatch_into(&server, req, &mut status);
                        if let (Some(r), Some(start)) = (recorder, start) {
                            FlightRecorder::end(r, slot, lane_id, recorded, start);
                        }
                        let code = match ran {
                            Ok(()) => cloister_ipc::decode_status(&status).unwrap_or(CL_OUT_OF_RESOURCES),
                            Err(_) => CL_OUT_OF_RESOURCES,
                        };
                        match late {
                            _ if code == CL_SUCCESS => {}
                            Late::Enqueue(queue, sync) => server.late_failure(queue, &sync, op, code),
                            Late::Create { context, id } => server.late_creation_failure(context, id, op, code),
                            Late::Callback(token) => notify::callback_refused(token, code),
                            Late::Unreported => {}
                        }
                    }
                }
                // Its failure, if any, is recorded: calls from other threads may go on.
                lane.posted_done();
            }
            Err(_) => break,
        }
    }
    // The lane's memory goes away with this thread: no driver may keep it pinned.
    worker.staging.forget_region(lane.bulk_ptr());
}

/// A lane that cannot post its reply is the worker's fault at once: the application must not
/// wait out its deadline, nor the worker live on with a dead lane. The call stays in flight in
/// the recorder, and the exit status tells the broker why (its report names both).
fn cannot_reply(lane_id: u32, why: &str) -> ! {
    say!("cloister-worker: lane {lane_id} cannot post its reply: {why}");
    std::process::exit(cloister_ipc::spill::EXIT_CANNOT_REPLY)
}
