//! A hostile worker for the tests: it speaks the protocol well enough to be accepted, then
//! answers its lane with what `CLOISTER_FAULT=hostile:MODE` says. The application and the broker
//! must treat each as a dead worker, never crash or hang. Modes: garbage, truncated, oversized,
//! scribble (the whole lane header overwritten), wrong-type (a well-formed reply of another call),
//! twice (two replies to one request), exit (dies mid-call), silent (never answers).
//!
//! Scripted modes answer every call well-formed, as a driver that accepts everything would,
//! and lie in one field each (issue 11, class 1: the worker never decides how many bytes land
//! in the application's memory): long-binary (binaries longer than the sizes it gave),
//! huge-num-args (a kernel of 0xFFFFFFFF arguments), wide-pitch (a mapped image's row pitch
//! far past the packed rows), huge-welcome (40 000 platforms and devices), accept-all (no lie:
//! the driver accepts out-of-range transfers the shim itself must refuse), die-on-finish
//! (exits at the first `clFinish`, for the callback lifetime tests of class 3), zero-copy (a
//! host-unified device that accepts everything and scribbles over every shared segment it gets,
//! zero-copy buffers' memory included), few-statuses (answers a status query for N events with
//! fewer statuses), group-size (a kernel's required work-group size of zero and of 2^64 - 1
//! work-items, which only chooses which NDRanges the shim posts).

use std::os::fd::{FromRawFd, OwnedFd};

use cloister_ipc::cl::*;
use cloister_ipc::lane::{self, Lane, LANE_BYTES};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::spill;
use cloister_ipc::{
    channel, BinariesReply, BuildReply, Enumerated, IdsReply, InfoReply, KernelReply, KernelsReply, MapImageReply,
    Request, ShimMessage, StatusesReply, WorkerMessage, WORKER_ID_BIT,
};

const SCRIPTED: &[&str] = &[
    "long-binary",
    "huge-num-args",
    "wide-pitch",
    "huge-welcome",
    "accept-all",
    "die-on-finish",
    "zero-copy",
    "few-statuses",
    "group-size",
];

/// The size every binary is said to have (`CL_PROGRAM_BINARY_SIZES`).
const TOLD_BINARY: usize = 16;

fn main() {
    let mode = std::env::var("CLOISTER_FAULT").unwrap_or_default().trim_start_matches("hostile:").to_string();
    // SAFETY: the broker passes the channel as fd 3.
    let sock = unsafe { OwnedFd::from_raw_fd(3) };
    let Ok((ShimMessage::Hello(_), _)) = channel::recv::<ShimMessage>(&sock) else { return };
    let welcome = WorkerMessage::Welcome {
        version: cloister_ipc::handshake::PROTOCOL_VERSION,
        driver: "hostile".into(),
        profile: "none".into(),
        layers: vec![],
        platforms: vec![WORKER_ID_BIT],
        devices: vec![Enumerated { id: WORKER_ID_BIT | 1, platform: WORKER_ID_BIT }],
    };
    // Small ids (short varints), so as many as possible fit one frame.
    let welcome = match (mode.as_str(), welcome) {
        ("huge-welcome", WorkerMessage::Welcome { version, driver, profile, layers, .. }) => WorkerMessage::Welcome {
            version,
            driver,
            profile,
            layers,
            platforms: (1..20_000).collect(),
            devices: (20_000..40_000).map(|id| Enumerated { id, platform: 1 + id % 100 }).collect(),
        },
        (_, w) => w,
    };
    if channel::send(&sock, &welcome, &[]).is_err() {
        return;
    }
    let mut scribbled = Vec::new();
    while let Ok((msg, mut fds)) = channel::recv::<ShimMessage>(&sock) {
        if let (ShimMessage::NewSegment { .. }, Some(fd), "zero-copy") = (&msg, fds.last(), mode.as_str()) {
            let Ok(region) = SharedRegion::from_fd(fd.try_clone().expect("dup"), 1) else { continue };
            // SAFETY: the whole mapping is ours to write.
            unsafe { std::ptr::write_bytes(region.as_ptr(), 0xEE, region.len()) };
            scribbled.push(region);
        }
        if let (ShimMessage::NewLane { .. }, Some(fd)) = (msg, fds.pop()) {
            let Ok(region) = SharedRegion::from_fd(fd, LANE_BYTES) else { continue };
            let Ok(lane) = Lane::from_region(region) else { continue };
            let mode = mode.clone();
            std::thread::spawn(move || serve(&lane, &mode));
        }
    }
}

/// Encodes one reply.
macro_rules! enc {
    ($v:expr) => {
        postcard::to_allocvec(&$v).expect("a reply encodes")
    };
}

/// A well-formed answer to `req`, with the lie `mode` tells.
fn scripted(mode: &str, req: Request) -> Vec<u8> {
    match req {
        Request::GetInfo(r) => {
            let value = match r.param {
                CL_PROGRAM_BINARY_SIZES => TOLD_BINARY.to_ne_bytes().to_vec(),
                CL_PROGRAM_NUM_DEVICES => 1u32.to_ne_bytes().to_vec(),
                CL_EVENT_COMMAND_EXECUTION_STATUS => CL_COMPLETE.to_ne_bytes().to_vec(),
                CL_PLATFORM_VERSION | 0x102F /* CL_DEVICE_VERSION */ => b"OpenCL 3.0 hostile\0".to_vec(),
                CL_PLATFORM_EXTENSIONS => b"cl_khr_icd\0".to_vec(),
                CL_DEVICE_TYPE => CL_DEVICE_TYPE_GPU.to_ne_bytes().to_vec(),
                CL_DEVICE_AVAILABLE => 1u32.to_ne_bytes().to_vec(),
                CL_DEVICE_HOST_UNIFIED_MEMORY => 1u32.to_ne_bytes().to_vec(),
                CL_CONTEXT_DEVICES => (WORKER_ID_BIT | 1).to_ne_bytes().to_vec(),
                CL_KERNEL_COMPILE_WORK_GROUP_SIZE if mode == "group-size" => {
                    [0u64, u64::MAX, 3].iter().flat_map(|v| v.to_ne_bytes()).collect()
                }
                _ => b"hostile\0".to_vec(),
            };
            enc!(InfoReply { status: 0, value_status: 0, value })
        }
        Request::GetDeviceIds(_) => enc!(IdsReply { status: 0, ids: vec![WORKER_ID_BIT | 1] }),
        Request::BuildProgram(_) | Request::CompileProgram(_) => enc!(BuildReply { status: 0, callback_sent: false }),
        Request::GetProgramBinaries(_) => {
            let len = if mode == "long-binary" { 1 << 16 } else { TOLD_BINARY };
            enc!(BinariesReply { status: 0, binaries: vec![vec![0xAB; len]] })
        }
        Request::CreateKernel(_) => {
            let num_args = if mode == "huge-num-args" { u32::MAX } else { 1 };
            enc!(KernelReply { status: 0, num_args })
        }
        Request::CreateKernelsInProgram(r) => {
            let n = if mode == "huge-num-args" { u32::MAX } else { 1 };
            let count = r.ids.len().max(1) as u32;
            enc!(KernelsReply { status: 0, count, num_args: vec![n; r.ids.len()] })
        }
        Request::EnqueueMapImage(r) => {
            let row = r.region[0] * 4;
            let row_pitch = if mode == "wide-pitch" { 1 << 20 } else { row };
            enc!(MapImageReply { status: 0, row_pitch, slice_pitch: 0 })
        }
        Request::FlushOrFinish(r) if r.finish && mode == "die-on-finish" => std::process::exit(7),
        Request::EventStatuses(r) => {
            let n = if mode == "few-statuses" { r.events.len() / 2 } else { r.events.len() };
            enc!(StatusesReply { status: 0, statuses: vec![CL_COMPLETE; n] })
        }
        // Every other call answers a plain CL_SUCCESS.
        _ => enc!(0i32),
    }
}

fn serve(lane: &Lane, mode: &str) {
    if SCRIPTED.contains(&mode) {
        while let Ok(request) = lane.wait_request(&|| true) {
            let Ok(cloister_ipc::Frame::Inline(request)) = spill::decode(&request) else { return };
            let Ok(req) = cloister_ipc::decode_request(request.0) else { return };
            if lane.post_reply(&spill::inline(&scripted(mode, req))).is_err() {
                return;
            }
        }
        return;
    }
    while let Ok(_request) = lane.wait_request(&|| true) {
        let good =
            postcard::to_allocvec(&InfoReply { status: 0, value_status: 0, value: b"hostile\0".to_vec() }).unwrap();
        match mode {
            "garbage" => drop(lane.post_reply(&[0xFF; 37])),
            "truncated" => drop(lane.post_reply(&spill::inline(&good[..good.len() / 2]))),
            "oversized" => {
                // A reply length past the message area (the shim must not read past it), then
                // the call answered: the lane header's words by their offsets (`ipc::lane`).
                let word = |at: usize| {
                    // SAFETY: the offsets are of u32 atomics in the header of a page-aligned mapping.
                    unsafe { &*(lane.region().as_ptr().add(at) as *const std::sync::atomic::AtomicU32) }
                };
                let calls = word(lane::CALLS_AT).load(std::sync::atomic::Ordering::SeqCst);
                word(lane::REP_LEN_AT).store(u32::MAX, std::sync::atomic::Ordering::SeqCst);
                word(lane::REPLIES_AT).store(calls, std::sync::atomic::Ordering::SeqCst);
                lane.nudge();
            }
            "scribble" => {
                // Every word of the header, the application's included, and the room of the
                // short messages: a call count that matches none, ring counters out of range.
                // SAFETY: the header's bytes lie at the start of the mapping.
                unsafe { std::ptr::write_bytes(lane.region().as_ptr(), 0xEE, lane::HEADER_BYTES) };
                lane.nudge();
            }
            "wrong-type" => {
                let other =
                    postcard::to_allocvec(&KernelsReply { status: 0, count: 1, num_args: vec![5, 6, 7] }).unwrap();
                drop(lane.post_reply(&spill::inline(&other)));
            }
            "twice" => {
                let _ = lane.post_reply(&spill::inline(&good));
                let _ = lane.post_reply(&[0xAB; 3]);
            }
            "exit" => std::process::exit(3),
            "silent" => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            _ => drop(lane.post_reply(&spill::inline(&good))),
        }
    }
}
