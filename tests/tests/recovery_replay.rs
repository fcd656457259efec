//! Recovery by replay (`CLOISTER_RECOVERY=replay`): an application that never recreates its
//! context runs through a driver crash, a `kill -9` of its worker, and a restart of the broker,
//! and ends with exactly the results of an undisturbed run; a kernel that crashes the driver
//! every time is dropped after a bounded number of retries, with a clear error.

use cloister_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ITERATIONS: &str = "24";

/// The checksum line of a replay client's output.
fn checksum(t: &str) -> Option<String> {
    t.lines().find(|l| l.starts_with("checksum ")).map(str::to_string)
}

/// The undisturbed run's checksum: the client run directly on pocl.
fn undisturbed() -> String {
    undisturbed_run("replay")
}

fn undisturbed_run(client: &str) -> String {
    undisturbed_run_with(client, &[])
}

/// `undisturbed_run` with `env` in the client's environment.
fn undisturbed_run_with(client: &str, env: &[(&str, &str)]) -> String {
    let out = direct(&c_client(client), &[ITERATIONS, "20"], env);
    let t = text(&out);
    assert!(out.status.success(), "the client fails even directly:\n{t}");
    checksum(&t).unwrap_or_else(|| panic!("no checksum:\n{t}"))
}

/// Asserts a caged replay run ended as the undisturbed one, and was carried over `times`
/// times at least.
fn assert_carried_over(status: std::process::ExitStatus, t: &str, expected: &str) {
    assert!(status.success(), "the application did not survive ({status:?}):\n{t}");
    assert!(!t.contains("ERROR step="), "a call failed:\n{t}");
    assert_eq!(checksum(t).as_deref(), Some(expected), "results differ from the undisturbed run:\n{t}");
    // replay.c's event callbacks, waiting or not when the worker died, all ran once, complete.
    if t.contains("callbacks ") {
        assert!(t.contains(&format!("callbacks {ITERATIONS} complete, 0 failed")), "{t}");
    }
    assert!(
        t.lines().any(|l| l.starts_with("context notified (replay)") && l.contains("carried over")),
        "the context did not hear that it was carried over:\n{t}"
    );
}

/// Asserts every crash report under `state` says the application was carried over (as the
/// shim told the broker), as `cloister crashes` and `cloister crashes show` print them; returns
/// the reports' JSON.
fn assert_reports_say_carried_over(state: &std::path::Path) -> Vec<String> {
    let dir = state.join("cloister/crashes");
    let reports: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("no crash reports in {}: {e}", dir.display()))
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    for json in &reports {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        let c = &v["carried_over_says_the_application"];
        assert!(c["objects_rebuilt"].as_u64().is_some_and(|n| n > 0), "the report does not say so: {json}");
        assert!(c["to_worker"].as_u64().is_some_and(|p| p > 0 && p != v["pid"].as_u64().unwrap()), "{json}");
        assert!(c["commands_replayed"].is_u64() && c["dropped"].is_array(), "{json}");
    }
    let crashes = |args: &[&str]| {
        let out = Command::new(cloister()).arg("crashes").args(args).env("XDG_STATE_HOME", state).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    };
    let listed = crashes(&[]);
    assert!(listed.contains("carried over to worker") && listed.contains("objects rebuilt"), "{listed}");
    let shown = crashes(&["show", "latest"]);
    assert!(shown.contains("recovery:  carried over to worker") && shown.contains("(says the application)"), "{shown}");
    reports
}

/// Runs the replay client caged on the fault-injecting driver with `fault` after `skip` calls
/// of its point, and checks it ends as the undisturbed run.
fn assert_survives_fault(fault: &str, skip: &str) {
    assert_survives_fault_with(fault, skip, true)
}

/// As `assert_survives_fault`; `had_objects`: the application had objects to carry over when
/// the fault fired (its context heard it).
fn assert_survives_fault_with(fault: &str, skip: &str, had_objects: bool) {
    assert_client_survives_fault("replay", fault, skip, had_objects)
}

fn assert_client_survives_fault(client: &str, fault: &str, skip: &str, had_objects: bool) {
    assert_client_survives_fault_with(client, fault, skip, had_objects, &[])
}

/// As `assert_client_survives_fault`, with `extra` in the caged run's environment.
fn assert_client_survives_fault_with(client: &str, fault: &str, skip: &str, had_objects: bool, extra: &[(&str, &str)]) {
    // The caged run sleeps 20 ms an iteration (the results do not depend on it), so a crash
    // the driver schedules for a moment later still lands mid-run.
    survives_fault_pausing(client, fault, skip, had_objects, extra, "20")
}

/// As `assert_client_survives_fault_with`, the client pausing `pause_ms` each iteration.
fn survives_fault_pausing(
    client: &str,
    fault: &str,
    skip: &str,
    had_objects: bool,
    extra: &[(&str, &str)],
    pause_ms: &str,
) {
    let expected = undisturbed_run_with(client, extra);
    // A fresh cache directory per run, so a `:once` fault fires once; named by the client too,
    // as tests running at once may inject the same fault (and remove their folder at the end).
    let tag = fault.replace(':', "-");
    let cache =
        std::env::temp_dir().join(format!("cloister-replay-{client}-{tag}-{skip}-{pause_ms}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let state = cache.with_extension("state");
    let _ = std::fs::remove_dir_all(&state);
    let mut env = vec![
        ("CLOISTER_RECOVERY", "replay"),
        ("CLOISTER_FAULT", fault),
        ("CLOISTER_FAULT_SKIP", skip),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    let out = caged_on_faultcl(&c_client(client), &[ITERATIONS, pause_ms], &env);
    let _ = std::fs::remove_dir_all(&cache);
    let t = text(&out);
    assert!(t.contains("died"), "{fault}: the fault did not fire:\n{t}");
    if had_objects {
        assert_carried_over(out.status, &t, &expected);
        let reports = assert_reports_say_carried_over(&state);
        assert_eq!(reports.len(), 1, "{fault}: one death, one report:\n{t}");
        let _ = std::fs::remove_dir_all(&state);
    } else {
        assert!(out.status.success() && !t.contains("ERROR step="), "{fault}:\n{t}");
        assert_eq!(checksum(&t), Some(expected), "{fault}: results differ:\n{t}");
    }
}

/// The 31st NDRange crashes the driver, once: mid-run, with commands in flight.
#[test]
fn an_injected_crash_mid_run_changes_nothing() {
    assert_survives_fault("enqueue:segv:once", "30");
}

/// The 32nd NDRange crashes the driver, once, right after the 31st (a kernel updating a
/// zero-copy buffer in place, `acc[i] = acc[i] * 31 + ...`) completed: replay runs that kernel
/// again on the buffer as it was before it, so it counts once.
#[test]
fn a_kernel_that_completed_before_the_crash_counts_once() {
    assert_survives_fault("enqueue:segv:once", "31");
}

/// The same crash in a run without pauses where each iteration's kernel rewrites a 32 MiB
/// zero-copy buffer, whose copy (taken before the first kernel after a checkpoint) takes long
/// against an iteration: checkpoints that read nothing back are spaced (`free_checkpoint_due`),
/// the journal spans several iterations, and all of them run again from the last copy.
#[test]
fn a_crash_mid_run_without_pauses_runs_the_longer_journal_again() {
    survives_fault_pausing("replay", "enqueue:segv:once", "30", true, &[("REPLAY_BIG_MIB", "32")], "0");
}

/// The two above with staged buffers (`CLOISTER_ZERO_COPY=0`, the path of discrete GPUs): the
/// journal keeps copies of what was written and read instead of the buffers' own memory.
#[test]
fn staged_buffers_run_through_a_crash_mid_run() {
    for skip in ["30", "31"] {
        assert_client_survives_fault_with("replay", "enqueue:segv:once", skip, true, &[("CLOISTER_ZERO_COPY", "0")]);
    }
}

/// Large writes (5 MiB blocking, pipelined) and a writing map each iteration into a staged buffer (zero-copy off, as on a
/// discrete GPU), whose data the journal keeps in the segments they were staged in rather than
/// copying it: the 11th NDRange crashes the driver, and replay writes that data again.
#[test]
fn staged_writes_kept_in_their_segments_run_through_a_crash() {
    assert_client_survives_fault_with("replay_staged", "enqueue:segv:once", "10", true, &[("CLOISTER_ZERO_COPY", "0")]);
}

/// Two hundred small buffers rewritten by a kernel each iteration, staged (zero-copy off): the
/// checkpoints read them back many in one call (`ReadBack`), and the crash in iteration 10
/// (the 2 037th NDRange) replays from what they read.
#[test]
fn many_small_buffers_read_back_together_run_through_a_crash() {
    assert_client_survives_fault_with("replay_many", "enqueue:segv:once", "2037", true, &[("CLOISTER_ZERO_COPY", "0")]);
}

/// Images (initial data, row writes, a kernel reading through a sampler, image copies, whole
/// blocking reads) are rebuilt with their contents.
#[test]
fn an_image_filter_runs_through_a_crash_mid_run() {
    assert_client_survives_fault("replay_image", "enqueue:segv:once", "10", true);
}

/// Kernels from `clCreateKernelsInProgram` and `clCloneKernel`, and buffers written through
/// maps (whole and partial) each iteration: the 31st NDRange (iteration 10) crashes the driver.
#[test]
fn kernels_in_program_clones_and_mapped_writes_run_through_a_crash() {
    assert_client_survives_fault("replay_more", "enqueue:segv:once", "30", true);
}

/// Writes (a buffer's and a rectangle's) from memory a non-blocking read under way fills, held
/// back by a user event: replay's journal must hold the read's bytes, which reach the shim's
/// staging only once the read lands, not the memory's bytes at the call; the 11th NDRange
/// crashes the driver. Zero-copy and staged buffers.
#[test]
fn writes_from_memory_a_read_fills_run_through_a_crash() {
    assert_client_survives_fault("replay_readfill", "enqueue:segv:once", "10", true);
    assert_client_survives_fault_with(
        "replay_readfill",
        "enqueue:segv:once",
        "10",
        true,
        &[("CLOISTER_ZERO_COPY", "0")],
    );
}

/// A program compiled with a header program and linked (`clCompileProgram`, `clLinkProgram`),
/// every program released once its kernel exists: the 21st NDRange crashes the driver.
#[test]
fn compiled_and_linked_programs_run_through_a_crash() {
    assert_client_survives_fault("replay_link", "enqueue:segv:once", "20", true);
}

/// The driver crashes (the 21st NDRange, iteration 10) while the application holds a writing
/// map of one buffer and a reading map of a zero-copy one: it reads and writes through them
/// after the death, unmaps, and the results are those of an undisturbed run.
#[test]
fn mappings_held_across_a_crash_keep_working() {
    assert_client_survives_fault("replay_heldmap", "enqueue:segv:once", "20", true);
}

/// The driver crashes (the 21st NDRange, iteration 10) while the application holds a writing
/// map of a box of one image and a reading map of all of another: the images are carried over
/// with their mappings, it reads and writes through them after the death, and the unmap writes
/// the box to the rebuilt image: the results are those of an undisturbed run.
#[test]
fn image_mappings_held_across_a_crash_keep_working() {
    assert_client_survives_fault("replay_imagemap", "enqueue:segv:once", "20", true);
}

/// The driver crashes (the 22nd NDRange, iteration 10) while a write, a kernel, a non-blocking
/// read and a non-blocking map wait on a user event the application sets only afterwards: the
/// replacement gets them without the rebuild waiting for them (it would wait for ever), and the
/// read and the map land once the event is set. Zero-copy and staged buffers.
#[test]
fn commands_held_by_a_user_event_run_through_a_crash() {
    assert_client_survives_fault("replay_userevent", "enqueue:segv:once", "21", true);
    assert_client_survives_fault_with(
        "replay_userevent",
        "enqueue:segv:once",
        "21",
        true,
        &[("CLOISTER_ZERO_COPY", "0")],
    );
}

/// As above, the crash asynchronous (150 ms after the 22nd NDRange returned): it lands where it
/// lands (a map, an unmap, a read, with mappings held or not) and changes nothing.
#[test]
fn an_asynchronous_crash_around_maps_changes_nothing() {
    assert_client_survives_fault("replay_heldmap", "enqueue:async-segv:once", "21", true);
}

/// An image made from a buffer (`CL_MEM_OBJECT_IMAGE1D_BUFFER`) read by one kernel while
/// another writes its buffer: the 21st NDRange crashes the driver.
#[test]
fn an_image_made_from_a_buffer_runs_through_a_crash() {
    assert_client_survives_fault("replay_imagebuf", "enqueue:segv:once", "20", true);
}

/// A context and queue on a sub-device (`CL_DEVICE_PARTITION_EQUALLY`): the sub-devices are made
/// again under their handles (the other's info still answers), the 21st NDRange crashes.
#[test]
fn a_context_on_a_sub_device_runs_through_a_crash() {
    assert_client_survives_fault("replay_subdev", "enqueue:segv:once", "20", true);
}

/// A command buffer (made before what it records; a fill, a kernel, a copy with sync points),
/// run every iteration after a plain kernel: the 11th plain NDRange crashes the driver.
#[test]
fn a_command_buffer_runs_through_a_crash() {
    assert_client_survives_fault("replay_cmdbuf", "enqueue:segv:once", "10", true);
}

/// A crash a moment after an enqueue returned, while the kernel may be running.
#[test]
fn an_asynchronous_crash_mid_run_changes_nothing() {
    assert_survives_fault("enqueue:async-segv:once", "20");
}

/// The application's clBuildProgram meets the death, and runs again once the context is back.
#[test]
fn a_crash_in_the_build_changes_nothing() {
    assert_survives_fault("build:abort:once", "0");
}

/// A clFinish mid-run (the client's last ones) meets the death.
#[test]
fn a_crash_in_finish_changes_nothing() {
    assert_survives_fault("finish:segv:once", "0");
}

/// clCreateContext itself meets the death (nothing to carry over: the call runs again).
#[test]
fn a_crash_in_context_creation_changes_nothing() {
    assert_survives_fault_with("context:segv:once", "0", false);
}

/// The pids of `cloister-worker` processes descended from `root`.
fn workers_under(root: u32) -> Vec<u32> {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(1)?.parse().ok()
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "cloister-worker" {
            continue;
        }
        let mut p = pid;
        for _ in 0..32 {
            match parent(p) {
                Some(pp) if pp == root => {
                    out.push(pid);
                    break;
                }
                Some(pp) if pp > 1 => p = pp,
                _ => break,
            }
        }
    }
    out
}

/// `kill -9` of the application's worker and the processes of its cage, all at once, as of a
/// process group.
fn kill_workers_under(child: &Child) {
    let workers = workers_under(child.id());
    assert!(!workers.is_empty(), "no worker under {}", child.id());
    for pid in workers {
        // SAFETY: kill(2) on a process this test found in the application's worker's cage.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

/// Reads `child`'s stdout until a line starting with `prefix`, returning what was read.
fn read_until(lines: &mut impl Iterator<Item = std::io::Result<String>>, prefix: &str, seen: &mut String) -> bool {
    read_until_line(lines, seen, |line| line.starts_with(prefix))
}

/// Reads `lines` until one is `found` (true) or they end (false), keeping what was read.
fn read_until_line(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    seen: &mut String,
    found: impl Fn(&str) -> bool,
) -> bool {
    for line in lines.by_ref() {
        let Ok(line) = line else { return false };
        seen.push_str(&line);
        seen.push('\n');
        if found(&line) {
            return true;
        }
    }
    false
}

/// Waits for `child` with a deadline (a hang fails the test instead of blocking it).
fn wait_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            panic!("the application hung after the crash");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_worker_killed_with_sigkill_mid_run_changes_nothing() {
    let expected = undisturbed();
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(c_client("replay"))
        .args([ITERATIONS, "40"])
        .env("CLOISTER_RECOVERY", "replay")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(read_until(&mut lines, "iteration 5", &mut seen), "the run did not get going:\n{seen}");
    kill_workers_under(&child);
    read_until(&mut lines, "done", &mut seen);
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let t = format!("{seen}{err}");
    assert!(t.contains("SIGKILL") || t.contains("signal 9"), "the worker was not killed:\n{t}");
    assert_carried_over(status, &t, &expected);
}

/// A per-user broker (`cloister broker`) listening under `runtime`, as `XDG_RUNTIME_DIR`.
fn start_user_broker(runtime: &std::path::Path) -> Child {
    let b = Command::new(cloister())
        .arg("broker")
        .env("XDG_RUNTIME_DIR", runtime)
        .stderr(Stdio::null())
        .spawn()
        .expect("start cloister broker");
    let socket = runtime.join("cloister/broker.sock");
    assert!(wait_for_path(&socket, Duration::from_secs(5)), "the broker does not listen");
    b
}

/// Kills `broker` and its `workers`, as `systemctl --user restart` stops the unit's whole
/// control group, and starts a new one in its place.
fn restart_user_broker(mut broker: Child, workers: Vec<u32>, runtime: &std::path::Path) -> Child {
    broker.kill().unwrap();
    broker.wait().unwrap();
    for pid in workers {
        // SAFETY: kill(2) on a worker of the broker this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let _ = std::fs::remove_file(runtime.join("cloister/broker.sock"));
    start_user_broker(runtime)
}

#[test]
fn restarting_the_broker_mid_run_changes_nothing() {
    let expected = undisturbed();
    let runtime = std::env::temp_dir().join(format!("cloister-rt-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime);
    std::fs::create_dir_all(&runtime).unwrap();
    let broker = start_user_broker(&runtime);
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    let mut child = Command::new(c_client("replay"))
        .args([ITERATIONS, "40"])
        .env("OCL_ICD_VENDORS", &vendors)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("CLOISTER_SOCKET")
        .env("CLOISTER_RECOVERY", "replay")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(read_until(&mut lines, "iteration 5", &mut seen), "the run did not get going:\n{seen}");
    // The broker goes with its workers, as `systemctl --user restart` stops the unit's whole
    // control group, and a new one takes its place.
    let workers = workers_under(broker.id());
    assert!(!workers.is_empty(), "the broker has no worker");
    let mut broker = restart_user_broker(broker, workers, &runtime);
    read_until(&mut lines, "done", &mut seen);
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let _ = broker.kill();
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(&runtime);
    let t = format!("{seen}{err}");
    assert!(!t.contains("Broken pipe"), "the shim did not find the new broker:\n{t}");
    assert_carried_over(status, &t, &expected);
}

/// Without replay (the default, `report`), a broker restart is a driver fault as any other: the
/// application's context answers `CL_DEVICE_NOT_AVAILABLE`, and the next context it makes gets
/// its worker from the new broker (the shim reconnects; it used to fail with "Broken pipe").
#[test]
fn restarting_the_broker_gives_a_reporting_application_its_next_context() {
    let runtime = std::env::temp_dir().join(format!("cloister-rt-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime);
    std::fs::create_dir_all(&runtime).unwrap();
    let broker = start_user_broker(&runtime);
    let vendors = vendors_dir_for(&target_dir().join("libcloister.so"));
    // Rounds of a second each: once the attempt has its context it runs for 3 s and more, so
    // the broker's restart meets it even when this thread is slow to see it running.
    let mut child = Command::new(c_client("recover"))
        .args(["3", "1000"])
        .env("OCL_ICD_VENDORS", &vendors)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("CLOISTER_SOCKET")
        .env("CLOISTER_RECOVERY", "report")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first attempt has made its context (on the first broker's worker) and runs its
    // rounds, the broker goes: the attempt meets it. (Gone before the context was made, the
    // context came from the new broker and the attempt never met a fault: CI, twice.)
    let mut out_lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(read_until(&mut out_lines, "attempt 1 running", &mut seen), "the application never started:\n{seen}");
    let workers = workers_under(broker.id());
    assert!(!workers.is_empty(), "the broker has no worker");
    let mut broker = restart_user_broker(broker, workers, &runtime);
    let status = wait_within(&mut child, Duration::from_secs(120));
    for line in out_lines.map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
    }
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut seen).unwrap();
    let t = seen;
    let _ = broker.kill();
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(&runtime);
    assert!(!t.contains("Broken pipe"), "the shim did not find the new broker:\n{t}");
    assert!(t.contains("attempt 1: CL_DEVICE_NOT_AVAILABLE"), "the first context was not lost:\n{t}");
    assert!(t.contains("attempt 2 succeeded after 1 faults; results correct"), "{t}");
    assert!(status.success(), "{t}");
}

#[test]
fn a_kernel_that_crashes_every_time_is_dropped_after_bounded_retries() {
    let state = std::env::temp_dir().join(format!("cloister-replay-crasher-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(c_client("crasher"))
        // Replay is the default: nothing asks for it.
        .env("CLOISTER_RECOVERY", "replay")
        .env("XDG_STATE_HOME", &state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut t = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut t).unwrap();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut t).unwrap();
    assert!(status.success(), "{t}");
    assert!(t.contains("good 1: 0"), "{t}");
    // The crashing kernel's event fails, the buffer it wrote is unavailable, the rest works.
    assert!(t.contains("crash event status -2"), "{t}");
    assert!(t.contains("read after crash: -2"), "{t}");
    assert!(t.contains("after: ok"), "{t}");
    let told = t.lines().find(|l| l.starts_with("context notified") && l.contains("carried over"));
    let told = told.unwrap_or_else(|| panic!("no notification of the carry-over:\n{t}"));
    assert!(told.contains("kernel 'crash'") && told.contains("dropped"), "{told}");
    // Run at most 1 + RETRIES times: three deaths, and no crash-loop stop.
    let deaths =
        t.lines().filter(|l| l.starts_with("cloister: the worker for driver") && l.contains("SIGSEGV")).count();
    assert_eq!(deaths, 3, "{t}");
    assert!(!t.contains("not restarting it"), "{t}");
    // Each death's report says where the application went and what was dropped.
    let reports = assert_reports_say_carried_over(&state);
    assert_eq!(reports.len(), 3, "{t}");
    for json in &reports {
        assert!(json.contains("kernel 'crash'") && json.contains("dropped"), "{json}");
    }
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn report_mode_loses_the_context() {
    let out = caged(&[], &c_client("crasher"), &[], &[("CLOISTER_RECOVERY", "report")]);
    let t = text(&out);
    assert!(t.contains("finish: -2"), "with CLOISTER_RECOVERY=report the context is lost as before:\n{t}");
    assert!(t.contains("create a new context"), "{t}");
    assert!(!t.contains("carried over"), "{t}");
}

/// A pyopencl program as people write them: arrays in, a kernel in a loop, results out with
/// blocking copies, one context for the whole run.
const PYOPENCL_PROGRAM: &str = r#"
import hashlib, sys, time
import numpy as np
import pyopencl as cl

iterations, sleep_ms = int(sys.argv[1]), int(sys.argv[2])
dev = cl.get_platforms()[0].get_devices()[0]
ctx = cl.Context([dev], properties=None)
queue = cl.CommandQueue(ctx)
prg = cl.Program(ctx, """
__kernel void blend(__global const float *a, __global float *b, float t) {
  size_t i = get_global_id(0);
  b[i] = b[i] * (1.0f - t) + a[i] * t + (float)(i % 13);
}
""").build()
blend = prg.blend
a = np.arange(50000, dtype=np.float32) * 0.25
b = np.zeros_like(a)
mf = cl.mem_flags
a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
b_buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=b)
digest = hashlib.sha256()
for it in range(iterations):
    blend(queue, a.shape, None, a_buf, b_buf, np.float32(0.1 + 0.01 * it))
    cl.enqueue_copy(queue, b, b_buf)
    digest.update(b.tobytes())
    print("iteration", it, flush=True)
    time.sleep(sleep_ms / 1000)
queue.finish()
print("checksum", digest.hexdigest(), flush=True)
print("done", flush=True)
"#;

/// `/usr/bin/python3` if it has pyopencl and numpy.
fn python_with_pyopencl() -> Option<&'static std::path::Path> {
    let python = std::path::Path::new("/usr/bin/python3");
    let probe = Command::new(python).args(["-c", "import pyopencl, numpy"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: /usr/bin/python3 has no pyopencl (scripts/pyopencl-suite.sh installs it)");
        return None;
    }
    Some(python)
}

/// Writes `PYOPENCL_PROGRAM` out and runs it directly (20 iterations) with a fresh pyopencl
/// cache: the script, the cache folder (the caged run gets it too) and the run's checksum.
/// pyopencl keeps built binaries in its cache; a fresh one makes both runs build from source.
fn pyopencl_direct_run(python: &std::path::Path, tag: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let tmp = std::env::temp_dir();
    let script = tmp.join(format!("cloister-replay-{tag}-{}.py", std::process::id()));
    std::fs::write(&script, PYOPENCL_PROGRAM).unwrap();
    let cache = tmp.join(format!("cloister-replay-{tag}-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let plain = direct(python, &[script.to_str().unwrap(), "20", "0"], &[("XDG_CACHE_HOME", cache.to_str().unwrap())]);
    let expected = checksum(&text(&plain)).unwrap_or_else(|| panic!("directly:\n{}", text(&plain)));
    (script, cache, expected)
}

/// The pyopencl program with the driver crashing in the 11th NDRange (iteration 10 of 20): it
/// finishes, told it was carried over, with the checksum of the direct run.
#[test]
fn a_pyopencl_program_runs_through_a_driver_crash() {
    let Some(python) = python_with_pyopencl() else { return };
    let (script, cache, expected) = pyopencl_direct_run(python, "crash");
    let script_arg = script.to_str().unwrap();
    let _ = std::fs::remove_dir_all(&cache);
    let env = [
        ("CLOISTER_RECOVERY", "replay"),
        ("CLOISTER_FAULT", "enqueue:segv:once"),
        ("CLOISTER_FAULT_SKIP", "10"),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
    ];
    let run = caged_on_faultcl(python, &[script_arg, "20", "0"], &env);
    let _ = std::fs::remove_file(&script);
    let _ = std::fs::remove_dir_all(&cache);
    let t = text(&run);
    assert!(run.status.success(), "{t}");
    assert!(t.contains("SIGSEGV") && t.contains("carried over"), "{t}");
    assert_eq!(checksum(&t), Some(expected), "results differ from the undisturbed run:\n{t}");
}

#[test]
fn a_pyopencl_program_runs_through_a_kill_of_its_worker() {
    let Some(python) = python_with_pyopencl() else { return };
    let (script, cache, expected) = pyopencl_direct_run(python, "kill");
    let script_arg = script.to_str().unwrap();
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(python)
        .args([script_arg, "20", "60"])
        .env("CLOISTER_RECOVERY", "replay")
        .env("XDG_CACHE_HOME", &cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(read_until(&mut lines, "iteration 5", &mut seen), "the run did not get going:\n{seen}");
    kill_workers_under(&child);
    read_until(&mut lines, "done", &mut seen);
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let _ = std::fs::remove_file(&script);
    let _ = std::fs::remove_dir_all(&cache);
    let t = format!("{seen}{err}");
    assert!(status.success(), "{t}");
    assert!(t.contains("carried over"), "the worker's death went unnoticed:\n{t}");
    assert_eq!(checksum(&t), Some(expected), "results differ from the undisturbed run:\n{t}");
}

/// ffmpeg's `avgblur_opencl` filter (Debian's ffmpeg, unmodified): frames uploaded to OpenCL
/// images, blurred by two kernels, downloaded; written raw so outputs compare byte for byte.
const AVGBLUR: &str = "avgblur_opencl=sizeX=3";

/// ffmpeg's arguments for 40 frames through the OpenCL `filter`.
fn ffmpeg_args(out: &std::path::Path, realtime: bool, filter: &str) -> Vec<String> {
    let mut a: Vec<String> =
        ["-v", "error", "-init_hw_device", "opencl=gpu:0.0", "-filter_hw_device", "gpu"].map(String::from).to_vec();
    if realtime {
        a.push("-re".into());
    }
    a.extend(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=10", "-frames:v", "40", "-vf"].map(String::from));
    a.push(format!("format=rgba,hwupload,{filter},hwdownload,format=rgba"));
    a.extend(["-f", "rawvideo", "-y"].map(String::from));
    a.push(out.to_str().unwrap().into());
    a
}

/// ffmpeg's output through `filter` run directly on pocl, or `None` when ffmpeg is not
/// installed.
fn ffmpeg_undisturbed(tag: &str, filter: &str) -> Option<(std::path::PathBuf, Vec<u8>)> {
    let ffmpeg = std::path::PathBuf::from("/usr/bin/ffmpeg");
    if !ffmpeg.exists() {
        eprintln!("skipped: no /usr/bin/ffmpeg (apt-get install ffmpeg)");
        return None;
    }
    let out = std::env::temp_dir().join(format!("cloister-ffmpeg-{tag}-direct-{}.raw", std::process::id()));
    let args = ffmpeg_args(&out, false, filter);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = direct(&ffmpeg, &args, &[]);
    assert!(run.status.success(), "ffmpeg fails directly:\n{}", text(&run));
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(bytes.len(), 320 * 240 * 4 * 40, "ffmpeg wrote {} bytes", bytes.len());
    Some((ffmpeg, bytes))
}

/// ffmpeg through `filter`, caged, with the driver crashing in the NDRange after `skip`
/// (mid-run): it finishes, told it was carried over, and its output is byte-identical.
fn ffmpeg_survives_a_driver_crash(tag: &str, filter: &str, skip: &str) {
    let Some((ffmpeg, expected)) = ffmpeg_undisturbed(tag, filter) else { return };
    let out = std::env::temp_dir().join(format!("cloister-ffmpeg-{tag}-{}.raw", std::process::id()));
    let cache = std::env::temp_dir().join(format!("cloister-ffmpeg-{tag}-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let env = [
        ("CLOISTER_RECOVERY", "replay"),
        ("CLOISTER_FAULT", "enqueue:segv:once"),
        ("CLOISTER_FAULT_SKIP", skip),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
    ];
    let args = ffmpeg_args(&out, false, filter);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = caged_on_faultcl(&ffmpeg, &args, &env);
    let t = text(&run);
    let got = std::fs::read(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_dir_all(&cache);
    assert!(run.status.success(), "ffmpeg did not survive:\n{t}");
    assert!(t.contains("SIGSEGV") && t.contains("carried over"), "{t}");
    assert!(got == expected, "the output differs from the undisturbed run ({} bytes):\n{t}", got.len());
}

/// Two kernels a frame: the 41st NDRange is in frame 21 of 40.
#[test]
fn ffmpeg_avgblur_opencl_runs_through_a_driver_crash_byte_identical() {
    ffmpeg_survives_a_driver_crash("avgblur", AVGBLUR, "40");
}

/// `unsharp_opencl`: the 21st NDRange crashes the driver, mid-run.
#[test]
fn ffmpeg_unsharp_opencl_runs_through_a_driver_crash_byte_identical() {
    ffmpeg_survives_a_driver_crash("unsharp", "unsharp_opencl=lx=5:ly=5:la=1.5", "20");
}

/// `program_opencl` with the application's own kernel (`tests/c/ffmpeg_invert.cl`, built from
/// source by ffmpeg, with the frame's number as an argument): the 21st NDRange crashes the
/// driver, in frame 21 of 40.
#[test]
fn ffmpeg_program_opencl_runs_through_a_driver_crash_byte_identical() {
    let source = workspace_root().join("tests/c/ffmpeg_invert.cl");
    let filter = format!("program_opencl=source={}:kernel=invert", source.display());
    ffmpeg_survives_a_driver_crash("program", &filter, "20");
}

#[test]
fn ffmpeg_avgblur_opencl_runs_through_a_kill_of_its_worker_byte_identical() {
    let Some((ffmpeg, expected)) = ffmpeg_undisturbed("kill", AVGBLUR) else { return };
    let out = std::env::temp_dir().join(format!("cloister-ffmpeg-kill-{}.raw", std::process::id()));
    // In real time (-re, 10 frames a second): the kill lands mid-run.
    let mut child = Command::new(cloister())
        .args(["run", "--"])
        .arg(&ffmpeg)
        .args(ffmpeg_args(&out, true, AVGBLUR))
        .env("CLOISTER_RECOVERY", "replay")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    kill_workers_under(&child);
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut t = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut t).unwrap();
    let got = std::fs::read(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    assert!(status.success(), "ffmpeg did not survive:\n{t}");
    assert!(t.contains("carried over"), "the worker's death went unnoticed (ffmpeg done too soon?):\n{t}");
    assert!(got == expected, "the output differs from the undisturbed run ({} bytes):\n{t}", got.len());
}

/// A non-blocking read queued behind a long kernel when the driver crashes: it is read again in
/// the replacement, its data lands where the application asked, and its event completes.
#[test]
fn a_non_blocking_read_in_flight_lands_after_the_crash() {
    let plain = direct(&c_client("pending_read"), &[], &[]);
    let expected = checksum(&text(&plain)).unwrap_or_else(|| panic!("directly:\n{}", text(&plain)));
    let cache = std::env::temp_dir().join(format!("cloister-replay-pending-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    // The driver crashes 150 ms after the kernel's enqueue: the kernel runs for seconds.
    let env = [
        ("CLOISTER_RECOVERY", "replay"),
        ("CLOISTER_FAULT", "enqueue:async-segv:once"),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
    ];
    let out = caged_on_faultcl(&c_client("pending_read"), &[], &env);
    let _ = std::fs::remove_dir_all(&cache);
    let t = text(&out);
    assert!(out.status.success() && !t.contains("ERROR step="), "{t}");
    assert!(t.contains("2 commands run again"), "the kernel and the read should run again:\n{t}");
    assert_eq!(checksum(&t), Some(expected), "the read's data differs:\n{t}");
}

/// An OpenCV T-API script as people write them (`cv2.UMat`, OpenCL on): a generated image
/// blurred, resized down and up, turned grey, thresholded and blended back, 20 times, each
/// result fetched; the last written as PNG. pocl is a CPU device, which OpenCV leaves out unless
/// `OPENCV_OPENCL_DEVICE=:CPU:` says otherwise.
const OPENCV_PROGRAM: &str = r#"
import hashlib, sys, time
import numpy as np
import cv2

iterations, sleep_ms, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cv2.ocl.setUseOpenCL(True)
if not (cv2.ocl.haveOpenCL() and cv2.ocl.useOpenCL()):
    sys.exit("OpenCV's OpenCL path is off")
print("device", cv2.ocl.Device.getDefault().name(), flush=True)
y, x = np.mgrid[0:480, 0:640]
img = np.dstack([(x * 255 // 639), (y * 255 // 479), ((x ^ y) & 0xFF)]).astype(np.uint8)
frame = cv2.UMat(img)
digest = hashlib.sha256()
for it in range(iterations):
    blurred = cv2.GaussianBlur(frame, (7, 7), 1.5)
    small = cv2.resize(blurred, (320, 240), interpolation=cv2.INTER_LINEAR)
    big = cv2.resize(small, (640, 480), interpolation=cv2.INTER_LINEAR)
    gray = cv2.cvtColor(big, cv2.COLOR_BGR2GRAY)
    edges = cv2.threshold(gray, 100 + it, 255, cv2.THRESH_BINARY)[1]
    frame = cv2.addWeighted(big, 0.9, cv2.cvtColor(edges, cv2.COLOR_GRAY2BGR), 0.1, 1.0)
    digest.update(frame.get().tobytes())
    print("iteration", it, flush=True)
    time.sleep(sleep_ms / 1000)
cv2.imwrite(out_path, frame.get())
print("still OpenCL", cv2.ocl.useOpenCL(), flush=True)
print("checksum", digest.hexdigest(), flush=True)
print("done", flush=True)
"#;

/// An OpenCV run: the script and its folders (program cache, output), removed on drop.
struct OpenCv {
    dir: std::path::PathBuf,
}

impl OpenCv {
    /// None (the test is skipped, said on stderr) when /usr/bin/python3 has no cv2.
    fn new(tag: &str) -> Option<Self> {
        let probe = Command::new("/usr/bin/python3").args(["-c", "import cv2, numpy"]).output();
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!("skipped: /usr/bin/python3 has no cv2 (apt-get install python3-opencv; scripts/test.sh does)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("cloister-opencv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tapi.py"), OPENCV_PROGRAM).unwrap();
        Some(OpenCv { dir })
    }

    /// `cloister run [args] -- python3 tapi.py 20 SLEEP_MS OUT.png` with `env`. The runs share
    /// a cache folder of their own: the undisturbed run builds OpenCV's programs from source
    /// (minutes on a loaded 2-core machine), the others find them built, as a user's would.
    fn command(&self, cloister_args: &[&str], sleep_ms: &str, out: &str, env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(cloister());
        c.arg("run").args(cloister_args).arg("--").arg("/usr/bin/python3").arg(self.dir.join("tapi.py"));
        c.args(["20", sleep_ms]).arg(self.dir.join(out));
        let cache = self.dir.join("cache");
        c.env("OPENCV_OPENCL_DEVICE", ":CPU:").env("XDG_CACHE_HOME", cache).env("CLOISTER_RECOVERY", "replay");
        c.envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// The undisturbed caged run: its checksum and PNG. The call log shows the kernels went
    /// through cloister to the caged driver.
    fn undisturbed(&self) -> (String, Vec<u8>) {
        let calls = self.dir.join("calls.log");
        let out = self.command(&[], "0", "plain.png", &[("CLOISTER_LOG_CALLS", calls.to_str().unwrap())]);
        let out = { out }.output().unwrap();
        let t = text(&out);
        assert!(out.status.success() && t.contains("still OpenCL True"), "undisturbed:\n{t}");
        assert!(t.contains("device pthread-"), "OpenCV did not use pocl:\n{t}");
        let log = std::fs::read_to_string(&calls).unwrap_or_default();
        let kernels = log.matches("] clEnqueueNDRangeKernel(").count();
        assert!(kernels >= 100, "{kernels} kernels went through cloister:\n{t}");
        (checksum(&t).unwrap_or_else(|| panic!("{t}")), std::fs::read(self.dir.join("plain.png")).unwrap())
    }

    /// Asserts a disturbed run ended as the undisturbed one, on OpenCL throughout.
    fn assert_same(&self, status: std::process::ExitStatus, t: &str, out: &str, expected: &(String, Vec<u8>)) {
        assert!(status.success(), "the script did not survive ({status:?}):\n{t}");
        assert!(t.contains("carried over"), "the worker's death went unnoticed:\n{t}");
        assert!(t.contains("still OpenCL True") && !t.contains("ERROR"), "OpenCV left OpenCL:\n{t}");
        assert_eq!(checksum(t).as_ref(), Some(&expected.0), "results differ from the undisturbed run:\n{t}");
        let png = std::fs::read(self.dir.join(out)).unwrap_or_default();
        assert!(png == expected.1, "the PNG differs from the undisturbed run's:\n{t}");
    }
}

impl Drop for OpenCv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn an_opencv_tapi_script_runs_through_a_kill_of_its_worker_byte_identical() {
    let Some(cv) = OpenCv::new("kill") else { return };
    let expected = cv.undisturbed();
    let mut child = cv.command(&[], "100", "killed.png", &[]).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    assert!(read_until(&mut lines, "iteration 5", &mut seen), "the run did not get going:\n{seen}");
    kill_workers_under(&child);
    read_until(&mut lines, "done", &mut seen);
    let status = wait_within(&mut child, Duration::from_secs(120));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let t = format!("{seen}{err}");
    assert!(t.contains("SIGKILL"), "the worker was not killed:\n{t}");
    cv.assert_same(status, &t, "killed.png", &expected);
}

#[test]
fn an_opencv_tapi_script_runs_through_a_driver_crash_byte_identical() {
    let Some(cv) = OpenCv::new("fault") else { return };
    let expected = cv.undisturbed();
    let driver = fault_driver();
    let state = cv.dir.join("state");
    // The 31st NDRange (of 160) crashes the driver, once.
    let env = [
        ("CLOISTER_FAULT", "enqueue:segv:once"),
        ("CLOISTER_FAULT_SKIP", "30"),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
    ];
    let args = ["--driver", driver.to_str().unwrap(), "--profile", "pocl"];
    let out = cv.command(&args, "0", "crashed.png", &env).output().unwrap();
    let t = text(&out);
    assert!(t.contains("SIGSEGV"), "the fault did not fire:\n{t}");
    cv.assert_same(out.status, &t, "crashed.png", &expected);
    assert_eq!(assert_reports_say_carried_over(&state).len(), 1, "{t}");
}
