//! The lane's own cost, without a driver: one process plays the application, another the
//! worker's lane thread, and they exchange what an enqueue + `clFinish` sends (a posted frame,
//! then a call) or a bare call, as fast as they can.
//!
//! `cargo run --release -p cloister-ipc --example lane_pingpong [ROUNDS]`: prints, per pattern,
//! the median and the quartiles of ROUNDS batches (5 by default) of 20 000 exchanges, in ns per
//! exchange. What the hand-over between two cores costs is the machine's (the cache line's trip
//! between them); what the lane adds is how many such trips an exchange takes.

use std::time::Instant;

use cloister_ipc::lane::{Lane, WorkKind, LANE_BYTES};
use cloister_ipc::shm::SharedRegion;

const EXCHANGES: usize = 20_000;

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let client = Lane::create().expect("lane");
    let fd = client.region().fd().try_clone().expect("fd");
    let server = Lane::from_region(SharedRegion::from_fd(fd, LANE_BYTES).expect("map")).expect("lane");
    // The worker's side in a process of its own, as in the cage: two threads of one process
    // would also share the lanes' own (non-shared) counters' cache lines.
    // SAFETY: the child only runs the lane loop below on memory it owns, then exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        let mut request = Vec::new();
        let alive = || true;
        while let Ok(kind) = server.next_into(&alive, &mut request) {
            match kind {
                WorkKind::Posted => server.posted_done(),
                WorkKind::Call => server.post_reply(&request[..request.len().min(16)]).expect("reply"),
            }
        }
        std::process::exit(0);
    }
    drop(server);
    let frame = [7u8; 96];
    let call = [9u8; 24];
    let mut reply = Vec::new();
    let alive = || true;
    let patterns: [(&str, bool); 2] = [("call", false), ("post+call", true)];
    for (name, post) in patterns {
        let mut per_exchange = Vec::new();
        for round in 0..=rounds {
            let start = Instant::now();
            for _ in 0..EXCHANGES {
                if post {
                    client.post(&frame, &alive).expect("post");
                }
                client.post_request(&call).expect("call");
                client.wait_reply_into(&alive, &mut reply).expect("reply");
            }
            // Round 0 warms up (the spin budgets learn the pace).
            if round > 0 {
                per_exchange.push(start.elapsed().as_nanos() as f64 / EXCHANGES as f64);
            }
        }
        per_exchange.sort_by(f64::total_cmp);
        let at = |q: f64| per_exchange[((per_exchange.len() - 1) as f64 * q).round() as usize];
        println!("{name:>10}: {:7.0} ns median ({:.0}-{:.0} quartiles)", at(0.5), at(0.25), at(0.75));
    }
    client.close();
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
}
