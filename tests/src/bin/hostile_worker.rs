//! A hostile worker for the tests: it speaks the protocol well enough to be accepted, then
//! answers its lane with what `CLOISTER_FAULT=hostile:MODE` says. The application and the broker
//! must treat each as a dead worker, never crash or hang. Modes: garbage, truncated, oversized,
//! scribble (a state word that means nothing), wrong-type (a well-formed reply of another call),
//! twice (two replies to one request), exit (dies mid-call), silent (never answers).

use std::os::fd::{FromRawFd, OwnedFd};

use cloister_ipc::lane::{Lane, LANE_BYTES};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::{channel, Enumerated, InfoReply, KernelsReply, ShimMessage, WorkerMessage, WORKER_ID_BIT};

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
    if channel::send(&sock, &welcome, &[]).is_err() {
        return;
    }
    while let Ok((msg, mut fds)) = channel::recv::<ShimMessage>(&sock) {
        if let (ShimMessage::NewLane { .. }, Some(fd)) = (msg, fds.pop()) {
            let Ok(region) = SharedRegion::from_fd(fd, LANE_BYTES) else { continue };
            let Ok(lane) = Lane::from_region(region) else { continue };
            let mode = mode.clone();
            std::thread::spawn(move || serve(&lane, &mode));
        }
    }
}

fn serve(lane: &Lane, mode: &str) {
    while let Ok(_request) = lane.wait_request(&|| true) {
        let good =
            postcard::to_allocvec(&InfoReply { status: 0, value_status: 0, value: b"hostile\0".to_vec() }).unwrap();
        match mode {
            "garbage" => drop(lane.post_reply(&[0xFF; 37])),
            "truncated" => drop(lane.post_reply(&good[..good.len() / 2])),
            "oversized" => {
                // A reply length past the message area (the shim must not read past it), then
                // the REPLY state (2): words 2 and 0 of the lane header (see ipc::lane).
                let word = |i: usize| {
                    // SAFETY: the header's first words are u32 atomics in a page-aligned mapping.
                    unsafe { &*(lane.region().as_ptr().add(4 * i) as *const std::sync::atomic::AtomicU32) }
                };
                word(2).store(u32::MAX, std::sync::atomic::Ordering::SeqCst);
                word(0).store(2, std::sync::atomic::Ordering::SeqCst);
                lane.nudge();
            }
            "scribble" => {
                // SAFETY: the first word is the state; 77 is no state at all.
                unsafe { *(lane.region().as_ptr() as *mut u32) = 77 };
                lane.nudge();
            }
            "wrong-type" => {
                let other =
                    postcard::to_allocvec(&KernelsReply { status: 0, count: 1, num_args: vec![5, 6, 7] }).unwrap();
                drop(lane.post_reply(&other));
            }
            "twice" => {
                let _ = lane.post_reply(&good);
                let _ = lane.post_reply(&[0xAB; 3]);
            }
            "exit" => std::process::exit(3),
            "silent" => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            _ => drop(lane.post_reply(&good)),
        }
    }
}
