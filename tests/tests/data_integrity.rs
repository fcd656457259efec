//! Data integrity of transfers and maps (`tests/c/data_integrity.c`): random bytes at odd sizes
//! and offsets, sub-buffers, overlapping maps, maps against kernels, host-pointer flags, and
//! thousands of large buffers under a low descriptor limit. The client checks every byte
//! against its own reference; it runs directly (to prove the client right), caged with zero-copy
//! buffers (pocl is host-unified), and caged with them turned off (`CLOISTER_ZERO_COPY=0`, the
//! staged path discrete GPUs take).

use cloister_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// What the shim did without the worker in a caged run (`shim/src/direct.rs`), and how often it
/// carved a slab of small buffers again.
#[derive(Debug, PartialEq, Eq)]
struct Direct {
    transfers: usize,
    /// How many transfers and maps the shim made had the event the application asked for made
    /// by the worker (`EnqueueDone`).
    transfer_events: usize,
    idle_finishes: usize,
    maps: usize,
    slabs_again: usize,
    /// How often a larger buffer's slab of its own was taken again.
    whole_slabs_again: usize,
    /// How many new buffers' contents the device wrote from pinned shared memory (the worker's
    /// `CLOISTER_DEBUG` log).
    uploads: usize,
}

/// Runs the client directly and caged (with `env`, and the shim's log of direct transfers on)
/// and counts from that log what the shim did without the worker.
fn passes(env: &[(&str, &str)]) -> Direct {
    let exe = c_client("data_integrity");
    let d = direct(&exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let mut env = env.to_vec();
    env.push(("CLOISTER_LOG", "cloister::direct=trace,cloister::conn::slabs=trace"));
    let c = caged(&[], &exe, &[], &env);
    let out = text(&c);
    assert!(c.status.success() && out.contains("data integrity ok"), "caged run failed:\n{out}");
    // The same findings directly and caged, line for line (the refusals' codes included).
    assert_eq!(String::from_utf8_lossy(&d.stdout), String::from_utf8_lossy(&c.stdout));
    let log = String::from_utf8_lossy(&c.stderr);
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    Direct {
        transfers: count("direct transfer"),
        transfer_events: count("direct command's event"),
        idle_finishes: count("direct finish of an idle queue"),
        maps: count("direct map"),
        slabs_again: count("slab carved again"),
        whole_slabs_again: count("slab of one buffer taken again"),
        uploads: count("new buffer's contents written by the device"),
    }
}

/// pocl is a host-unified CPU device: its buffers are zero-copy, and transfers and maps on an
/// idle in-order queue are the shim's own; every byte still lands where it belongs, every
/// refusal the driver makes is made, an unmap with a wait list or an event is a real unmap, and
/// the map count is the driver's.
#[test]
fn zero_copy_buffers_keep_every_byte() {
    let d = passes(&[]);
    assert!(d.transfers >= 100, "only {} transfers went the direct way", d.transfers);
    // `transfers_with_events`: for each of three sizes, three transfers, a map and an unmap with
    // an event where the queue is idle.
    assert!(d.transfer_events >= 15, "only {} commands with an event went the direct way", d.transfer_events);
    assert!(d.idle_finishes >= 1, "no clFinish of an idle queue was answered without the worker");
    assert!(d.maps >= 40, "only {} maps went the direct way", d.maps);
    assert!(d.slabs_again >= 2, "{} slabs of small buffers were carved again", d.slabs_again);
    assert!(d.whole_slabs_again >= 2, "{} slabs of larger buffers were taken again", d.whole_slabs_again);
}

/// The same without replay's journal, whose views of released buffers also keep their slab
/// from being carved again: here only the worker's word that the driver destroyed every buffer
/// in a slab lets it come back (`no_early_recycling` in the client fails if it comes back early).
#[test]
fn zero_copy_buffers_keep_every_byte_in_report_mode() {
    let d = passes(&[("CLOISTER_RECOVERY", "report")]);
    assert!(d.slabs_again >= 2, "{} slabs of small buffers were carved again", d.slabs_again);
    assert!(d.whole_slabs_again >= 2, "{} slabs of larger buffers were taken again", d.whole_slabs_again);
    assert!(d.maps >= 40, "only {} maps went the direct way", d.maps);
}

#[test]
fn staged_buffers_keep_every_byte() {
    let none = Direct {
        transfers: 0,
        transfer_events: 0,
        idle_finishes: 0,
        maps: 0,
        slabs_again: 0,
        whole_slabs_again: 0,
        uploads: 0,
    };
    assert_eq!(passes(&[("CLOISTER_ZERO_COPY", "0")]), none, "a staged buffer was copied or mapped directly");
}

/// Staged transfers with the shim's copies split across threads (`ipc::copy`; the default on
/// machines with 4 cores or more, forced here): every piece lands where it belongs.
#[test]
fn staged_buffers_keep_every_byte_with_parallel_copies() {
    passes(&[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_COPY_THREADS", "4")]);
}

/// Staged transfers with their shared memory pinned in the context (`CLOISTER_STAGING=pinned`,
/// forced on pocl; see worker/src/staging.rs).
#[test]
fn pinned_staging_keeps_every_byte() {
    let seen = passes(&[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_STAGING", "pinned"), ("CLOISTER_DEBUG", "1")]);
    // Buffers made with contents of 256 KiB or more, through segments pinned already, had them
    // written by the device (`CreateBuffer`'s upload), and kept every byte.
    assert!(seen.uploads >= 2, "{seen:?}");
}

/// The descriptors open in each worker started from this build.
fn worker_descriptors() -> Vec<usize> {
    let worker = cloister().with_file_name("cloister-worker");
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter(|p| std::fs::read_link(p.path().join("exe")).is_ok_and(|exe| exe == worker))
        .filter_map(|p| std::fs::read_dir(p.path().join("fd")).ok().map(|fds| fds.count()))
        .collect()
}

/// Neither side keeps a descriptor per zero-copy buffer: the client runs its 3000 buffers under
/// a limit of 256 descriptors (the shim's side), and while they are all alive the worker holds
/// far fewer descriptors than buffers.
#[test]
fn zero_copy_buffers_hold_no_descriptors() {
    let exe = c_client("data_integrity");
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(&exe)
        .env("HOLD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run cloister");
    let mut counted = None;
    let mut out = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("holding") {
            counted = Some(worker_descriptors());
        }
        out.push_str(&line);
        out.push('\n');
    }
    assert!(child.wait().unwrap().success() && out.contains("data integrity ok"), "{out}");
    let counted = counted.expect("the client never held its buffers");
    assert!(!counted.is_empty(), "no worker of this build found");
    assert!(counted.iter().all(|&n| n < 1000), "worker descriptors with 3000 buffers alive: {counted:?}");
}

/// Non-blocking writes that the cage posts without an event of its own
/// (`tests/c/eventless_writes.c`): every byte lands, and the shared segments they went through
/// come back to the pool whichever call says they completed (a clFinish, a blocking read, the
/// queue's release), with one thread posting and with two. Directly first, to prove the client
/// right; caged with staged buffers (the segment path), in report mode, and in strict mode.
#[test]
fn eventless_writes_keep_every_byte_and_give_their_segments_back() {
    let exe = c_client("eventless_writes");
    let d = direct(&exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let runs: [&[(&str, &str)]; 4] = [
        &[],
        &[("CLOISTER_ZERO_COPY", "0")],
        &[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_RECOVERY", "report")],
        &[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_SYNC", "1")],
    ];
    for env in runs {
        let c = caged(&[], &exe, &[], env);
        let out = text(&c);
        assert!(c.status.success() && out.contains("eventless writes ok"), "caged with {env:?}:\n{out}");
        assert_eq!(String::from_utf8_lossy(&d.stdout), String::from_utf8_lossy(&c.stdout), "caged with {env:?}");
    }
}
