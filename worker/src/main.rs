//! `cloister-worker`: hosts one OpenCL driver for one application.
//!
//! Started by the broker with its end of the channel as fd 3. It cages itself first, then loads
//! the driver by path, answers the shim's hello with the platforms and devices it found, and
//! serves each lane on its own thread, so the driver sees the application's threading.

mod driver;
mod handler;
mod notify;
mod objects;
mod segments;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::handshake::{Hello, PROTOCOL_VERSION};
use cloister_ipc::lane::{Lane, LANE_BYTES};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::{channel, dispatch as dispatch_call, Enumerated, ShimMessage, WorkerMessage, WORKER_ID_BIT};

use handler::{LaneServer, Worker};
use objects::Kind;

const CHANNEL_FD: i32 = 3;

struct Args {
    library: String,
    name: String,
}

fn parse_args() -> Result<Args, String> {
    let mut library = None;
    let mut name = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--library" => library = it.next(),
            "--name" => name = it.next(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let library = library.ok_or("--library PATH is required")?;
    Ok(Args { name: name.unwrap_or_else(|| library.clone()), library })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cloister-worker: {e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: the broker passes the channel as fd 3; we take ownership once.
    let sock = unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) };
    let mut layers = vec![cloister_sandbox_policy::close_fds_except(&[0, 1, 2, CHANNEL_FD])];
    layers.extend(cloister_sandbox_policy::apply_process_hygiene());
    if std::env::var_os("CLOISTER_DEBUG").is_some() {
        for l in &layers {
            eprintln!("cloister-worker[{}]: {l}", args.name);
        }
    }
    match serve(&args, sock) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cloister-worker[{}]: {e}", args.name);
            ExitCode::from(1)
        }
    }
}

fn serve(args: &Args, sock: OwnedFd) -> Result<(), String> {
    let (hello, _) = channel::recv::<ShimMessage>(&sock).map_err(|e| format!("handshake: {e}"))?;
    let ShimMessage::Hello(hello) = hello else { return Err("handshake: expected hello".into()) };
    if let Err(reason) = hello.check() {
        let _ = channel::send(&sock, &WorkerMessage::Refused { reason: reason.clone() }, &[]);
        return Err(reason);
    }
    let _ = Hello::new();

    let worker = Arc::new(Worker::default());
    let (platforms, devices) = match driver::Driver::load(&args.library) {
        Ok(d) => enumerate(&worker, &d),
        Err(e) => {
            let reason = format!("cannot load driver {}: {}", args.library, e.0);
            let _ = channel::send(&sock, &WorkerMessage::Refused { reason: reason.clone() }, &[]);
            return Err(reason);
        }
    };
    let welcome = WorkerMessage::Welcome { version: PROTOCOL_VERSION, driver: args.name.clone(), platforms, devices };
    channel::send(&sock, &welcome, &[]).map_err(|e| e.to_string())?;
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
                std::thread::Builder::new()
                    .name(format!("lane-{lane}"))
                    .spawn(move || serve_lane(&w, &lane_obj))
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
    for &p in &d.platforms {
        let pid = next;
        next += 1;
        worker.objects.insert(pid, Kind::Platform, p);
        platforms.push(pid);
        // SAFETY: p is a live platform handle from the driver.
        let Some(get) = (unsafe { driver::dispatch(p) }).clGetDeviceIDs else { continue };
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
        }
    }
    (platforms, devices)
}

fn serve_lane(worker: &Worker, lane: &Lane) {
    let server = LaneServer { worker, lane };
    let alive = || true;
    while let Ok(bytes) = lane.wait_request(&alive) {
        let reply = match cloister_ipc::decode_request(&bytes) {
            Ok(req) => dispatch_call(&server, req).unwrap_or_default(),
            // An empty reply fails to decode in the shim, which treats it as a fault.
            Err(_) => Vec::new(),
        };
        if lane.post_reply(&reply).is_err() {
            break;
        }
    }
}
