//! Plain C programs linked with `-lOpenCL`, run unchanged directly and through the cage.

use cloister_tests::*;
use std::path::Path;
use std::process::Output;

/// Runs a C client directly and caged; each run must succeed (a failing direct run means the
/// client itself is wrong).
fn both_ways(exe: &Path) -> (Output, Output) {
    let d = direct(exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let c = caged(&[], exe, &[], &[]);
    assert!(c.status.success(), "caged run failed:\n{}", text(&c));
    (d, c)
}

#[test]
fn api_smoke_passes_directly_and_caged() {
    let exe = c_client("api_smoke");
    let (d, c) = both_ways(&exe);
    let out = text(&c);
    assert!(out.contains("PASS") && out.contains("nonblocking ok") && out.contains("callbacks 1"), "{out}");
    // Timers answer as the driver does, whatever that is.
    let timers = |t: &str| t.lines().find(|l| l.starts_with("1.1 sync ok")).map(str::to_string);
    assert_eq!(timers(&text(&d)), timers(&out), "direct:\n{}\ncaged:\n{out}", text(&d));
}

/// Images, samplers, sub-buffers, rectangles, binaries, compile/link, sub-devices, destructor
/// callbacks: the same checks pass directly and caged, with the same findings, except that the
/// cage does not advertise native kernels or SVM (it does not forward them).
#[test]
fn api_full_passes_directly_and_caged_with_the_same_results() {
    let exe = c_client("api_full");
    let (d, c) = both_ways(&exe);
    let findings =
        |t: &str| t.lines().filter(|l| !l.starts_with("native kernels")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(findings(&text(&d)), findings(&text(&c)));
    assert!(text(&c).contains("native kernels no, svm no"), "{}", text(&c));
}

/// The semantics a naive forwarder gets wrong (`tests/c/semantics.c`): where non-blocking reads
/// land, what an unmap writes back, USE_HOST_PTR memory, callbacks, user events across queues,
/// out-of-order queues, events across contexts, profiling timestamps, the info-size protocol and
/// kernel arguments set in a loop.
/// Every finding must be the same directly and caged, except where the spec leaves the answer to
/// the implementation ("impl:" lines): there the cage's documented choice must show.
#[test]
fn semantics_match_directly_and_caged() {
    let exe = c_client("semantics");
    let (d, c) = both_ways(&exe);
    assert_eq!(findings(&d), findings(&c));
    let out = text(&c);
    // pocl is a CPU device: every buffer is zero-copy, so a read map is the buffer's memory, as
    // with pocl directly.
    assert!(out.contains("impl: read map scribble written back"), "{out}");
    assert!(out.contains("impl: after a blocking read host_ptr holds the device's results"), "{out}");
    released_while_mapped_as_pocl(&out);
    writes_from_memory_a_read_fills_carry_its_bytes(&out);
}

/// A write whose source is memory a read enqueued before it fills carries the read's bytes, as
/// the commands' order says (pocl does so, NVIDIA's driver now and then carries the old bytes;
/// before, the cage always did): fourteen cases, buffer and rectangle writes, blocking or not, at two sizes.
fn writes_from_memory_a_read_fills_carry_its_bytes(out: &str) {
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("write from memory a read fills")).collect();
    assert_eq!(lines.len(), 14, "{out}");
    assert!(lines.iter().all(|l| l.ends_with(": the read's bytes")), "{lines:#?}");
}

/// A buffer released while mapped lives until its unmap, as with pocl directly: the unmap
/// succeeds, and the memory is given back then (before, it was kept for the process's life and
/// the unmap refused: "released while mapped" in `tests/c/semantics.c`).
fn released_while_mapped_as_pocl(out: &str) {
    for n in [4096, 64 << 10, 1 << 20] {
        assert!(out.contains(&format!("impl: unmap of a released {n}-byte buffer -> success")), "{out}");
    }
    assert!(out.contains("impl: unmaps of 200 released buffers that failed: 0"), "{out}");
    assert!(out.contains("impl: 200 buffers released while mapped, then unmapped: their memory given back"), "{out}");
}

/// The same semantics with staged buffers (`CLOISTER_ZERO_COPY=0`, the path of discrete GPUs),
/// where a read map is a copy whose scribbles are dropped.
#[test]
fn semantics_match_with_staged_buffers() {
    let exe = c_client("semantics");
    let d = direct(&exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let c = caged(&[], &exe, &[], &[("CLOISTER_ZERO_COPY", "0")]);
    assert!(c.status.success(), "caged run failed:\n{}", text(&c));
    assert_eq!(findings(&d), findings(&c));
    assert!(text(&c).contains("impl: read map scribble not written back"), "{}", text(&c));
    released_while_mapped_as_pocl(&text(&c));
    writes_from_memory_a_read_fills_carry_its_bytes(&text(&c));
}

/// A semantics transcript without its "impl:" lines (where the spec leaves the answer to the
/// implementation and the cage documents its own).
fn findings(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.starts_with("impl:")).map(str::to_string).collect()
}

/// Without a loader dereferencing handles first, a garbage, NULL or released handle of every
/// object type gets its own `CL_INVALID_*`.
#[test]
fn drop_in_mode_answers_bad_handles_of_every_type() {
    let exe = c_client("semantics");
    let c = caged(&["--drop-in"], &exe, &[], &[("GARBAGE", "1")]);
    assert!(c.status.success(), "caged drop-in run failed:\n{}", text(&c));
    assert!(text(&c).contains("garbage handles: every type answers its CL_INVALID_*"), "{}", text(&c));
}

#[test]
fn drop_in_mode_validates_garbage_and_released_handles() {
    let exe = c_client("api_smoke");
    // GARBAGE=1 makes the client pass a made-up queue and release a context twice; without a
    // loader in the way, cloister must answer CL_INVALID_* for both.
    let c = caged(&["--drop-in"], &exe, &[], &[("GARBAGE", "1")]);
    assert!(c.status.success(), "caged drop-in run failed:\n{}", text(&c));
    assert!(text(&c).contains("PASS"));
}

#[test]
fn eight_threads_enqueue_at_once() {
    let exe = c_client("threads");
    let c = caged(&[], &exe, &[], &[]);
    assert!(c.status.success(), "caged run failed:\n{}", text(&c));
    assert!(text(&c).contains("PASS"));
}

#[test]
fn exit_status_and_signals_pass_through() {
    let c = caged(&[], Path::new("/bin/sh"), &["-c", "exit 7"], &[]);
    assert_eq!(c.status.code(), Some(7));
    let c = caged(&[], Path::new("/bin/sh"), &["-c", "kill -TERM $$"], &[]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(c.status.signal(), Some(libc_sigterm()), "{:?}", c.status);
}

fn libc_sigterm() -> i32 {
    15
}

#[test]
fn without_any_broker_the_shim_says_what_to_do() {
    ensure_built();
    let exe = c_client("survivor");
    // A shim with no `cloister` beside it cannot start a private broker.
    let alone = std::env::temp_dir().join(format!("cloister-lonely-shim-{}", std::process::id()));
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(target_dir().join("libcloister.so"), alone.join("libcloister.so")).unwrap();
    let vendors = vendors_dir_for(&alone.join("libcloister.so"));
    let runtime = alone.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    let out = direct(
        &exe,
        &[],
        &[("OCL_ICD_VENDORS", vendors.to_str().unwrap()), ("XDG_RUNTIME_DIR", runtime.to_str().unwrap())],
    );
    let t = text(&out);
    assert!(t.contains("no broker: set CLOISTER_SOCKET, run `cloister broker`") && t.contains("cloister run"), "{t}");
    assert!(t.contains("code=-1001"), "{t}");
    let _ = std::fs::remove_dir_all(&alone);
}

#[test]
fn unknown_driver_is_a_clear_error() {
    let c = caged(&["--driver", "no-such-driver"], Path::new("/bin/true"), &[], &[]);
    assert_eq!(c.status.code(), Some(125));
    assert!(text(&c).contains("no driver named no-such-driver"), "{}", text(&c));
}

/// cl_khr_command_buffer through `clGetExtensionFunctionAddressForPlatform`: recorded fills,
/// kernels, copies (buffer, rect, image), barriers and sync points, run twice; the same lines
/// directly and caged. Caged, misuse that crashes pocl directly gets the error code instead.
#[test]
fn command_buffers_run_directly_and_caged_with_the_same_results() {
    let exe = c_client("command_buffer");
    let (d, c) = both_ways(&exe);
    assert_eq!(text(&d), text(&c));
    let g = caged(&[], &exe, &[], &[("GARBAGE", "1")]);
    assert!(g.status.success() && text(&g).contains("PASS"), "caged run with garbage handles failed:\n{}", text(&g));
}

/// A `CL_COMPLETE` callback has run by the time a wait on its event returns (clWaitForEvents,
/// clFinish, a blocking read), 20 times out of 20, as directly on pocl; a wait called from
/// inside a callback on the shim's notifier thread does not deadlock.
#[test]
fn event_callbacks_run_before_the_wait_returns() {
    let exe = c_client("callbacks_before_wait");
    let (d, c) = both_ways(&exe);
    assert_eq!(String::from_utf8_lossy(&d.stdout), String::from_utf8_lossy(&c.stdout));
    let out = text(&c);
    for how in ["clWaitForEvents", "clFinish", "blocking read"] {
        assert!(out.contains(&format!("callback ran before {how} returned: 20/20")), "{out}");
    }
    assert!(out.contains("a wait inside a callback returned: 0"), "{out}");
}

/// A driver that calls event callbacks late (the fault driver's `callback:late`, 3 s after it
/// would have; NVIDIA's 580 calls them some microseconds after a wait returns): a wait on a
/// complete event does not wait for the driver, its callbacks have run by then (or, after a
/// status query that says complete, on the notifier thread at once), each once, with the status
/// it was registered for. Before the worker sent them itself, each wait took the driver's 3 s.
#[test]
fn late_driver_callbacks_are_sent_once_the_event_is_known_complete() {
    let exe = c_client("late_callbacks");
    let c = caged_on_faultcl(&exe, &[], &[("CLOISTER_FAULT", "callback:late")]);
    let out = text(&c);
    assert!(c.status.success(), "{out}");
    for how in ["clWaitForEvents", "clFinish", "a status query"] {
        assert!(out.contains(&format!("callbacks ran by {how}: 5/5")), "{out}");
    }
    assert!(out.contains("slowest wait: under 2000 ms"), "{out}");
    assert!(
        out.contains("callbacks run once: 30/30, more than once: 0, with the status registered for: 30/30"),
        "{out}"
    );
}

/// `clSetEventCallback` is posted (the shim makes every check but the driver's memory): a
/// driver that refuses the registration anyway (the fault driver's `callback:refuse`,
/// `CL_OUT_OF_HOST_MEMORY`) has the callback run once, with that code as the event's status, so
/// an application waiting for it does not wait forever. Directly the call itself fails.
#[test]
fn a_refused_callback_registration_runs_the_callback_with_the_error() {
    let exe = c_client("late_callbacks");
    let env = [("CLOISTER_FAULT", "callback:refuse")];
    let c = caged_on_faultcl(&exe, &["refused"], &env);
    let out = text(&c);
    assert!(c.status.success(), "{out}");
    assert!(out.contains("registration returned 0; the callback ran 1 times, with status -6"), "{out}");
    // Strict mode waits for the driver's answer: the call fails as it does directly.
    let strict = caged_on_faultcl(&exe, &["refused"], &[env[0], ("CLOISTER_SYNC", "1")]);
    let out = text(&strict);
    assert!(out.contains("registration returned -6; the callback ran 0 times"), "{out}");
}

/// A user event's callbacks come once the application sets its status, with no wait to bring
/// them: pocl calls a `CL_COMPLETE` callback of a user event set to an error never (the CTS's
/// `callback_on_error_simple` fails directly), so the worker sends them itself, once, with the
/// error as the status (`late_callbacks.c user`).
#[test]
fn a_user_events_callbacks_run_when_it_is_set_complete_or_failed() {
    let exe = c_client("late_callbacks");
    let c = caged(&[], &exe, &["user"], &[]);
    let out = text(&c);
    assert!(c.status.success(), "{out}");
    for line in [
        "user event set to 0: CL_COMPLETE callback ran 1 times with status 0, CL_SUBMITTED 1 times with status 2",
        "user event set to -30: CL_COMPLETE callback ran 1 times with status -30, CL_SUBMITTED 1 times with status",
    ] {
        assert!(out.contains(line), "{out}");
    }
}

/// Pinned staging (worker/src/staging.rs) is on by default only for discrete GPUs; forced on
/// here, pocl runs the same path: the driver copies through shared memory it also holds as
/// `CL_MEM_USE_HOST_PTR` buffers, and every finding must still be the same as direct.
#[test]
fn semantics_hold_with_pinned_staging() {
    let exe = c_client("semantics");
    let d = direct(&exe, &[], &[]);
    assert!(d.status.success(), "direct run failed (the test itself is wrong):\n{}", text(&d));
    let c = caged(&[], &exe, &[], &[("CLOISTER_STAGING", "pinned"), ("CLOISTER_DEBUG", "1")]);
    assert!(c.status.success(), "caged run failed:\n{}", text(&c));
    assert_eq!(findings(&d), findings(&c));
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(err.contains("staging: pinning") && err.contains("status 0"), "the path was not taken:\n{err}");
}

/// Pointer-sized values that are none of the application's objects (a released buffer, its own
/// memory's address, a made-up address) given to a buffer argument, and a value given to a
/// `__local` one, are refused as the spec says; before, the worker's driver dereferenced them
/// as its own objects' addresses and died, again on every replay, until the crash-loop policy
/// gave the device up (pocl takes them directly and crashes the application where nothing is
/// mapped). The kernel runs with good values after each, in the same worker. A buffer released
/// after it was the argument is refused too where the argument's shape is a buffer's already:
/// that loop case reads the handles' cells (`handle::cells`), which a release must clear.
#[test]
fn kernel_arguments_of_no_object_are_refused_without_the_driver_dying() {
    let exe = c_client("kernel_arg_values");
    for env in [&[][..], &[("CLOISTER_SYNC", "1")], &[("CLOISTER_ZERO_COPY", "0")]] {
        let c = caged(&[], &exe, &[], env);
        let out = text(&c);
        assert!(c.status.success() && !out.contains("died"), "{env:?}:\n{out}");
        for line in [
            "ARG released buffer: -38",
            "ARG own memory's address: -38",
            "ARG made-up address: -38",
            "ARG value for __local: -50",
            "run 0: ok",
            "run 1: ok",
            "run 2: ok",
            "run 3: ok",
            "ARG buffer released since: -38",
            "ARG released sampler: -41",
            "done",
        ] {
            assert!(out.lines().any(|l| l == line), "{env:?}: no line {line:?}:\n{out}");
        }
    }
}

/// Non-blocking transfers past 64 MiB on an idle in-order queue, clpeak's pattern: the cage
/// makes each before the call returns, pipelined through pooled segments (README, "posted"), so
/// a read's data is in place when its call returns. Staged (`CLOISTER_ZERO_COPY=0`, the
/// discrete-GPU path) every one went through a segment of its own size instead, created and
/// faulted in for that call ("landed at the call: 0 of 3"; clpeak on the H200 0.9-2.0 GB/s
/// against 20 blocking): the check of an idle queue counted the call's own command.
#[test]
fn large_non_blocking_transfers_on_an_idle_queue_are_made_in_the_call() {
    let exe = c_client("large_nonblocking");
    for env in [&[][..], &[("CLOISTER_ZERO_COPY", "0")], &[("CLOISTER_ZERO_COPY", "0"), ("CLOISTER_SYNC", "1")]] {
        let c = caged(&[], &exe, &["70", "3"], env);
        let out = text(&c);
        assert!(c.status.success() && out.contains("PASS"), "{env:?}:\n{out}");
        assert!(out.contains("landed at the call: 3 of 3"), "{env:?}: posted, not made in the call:\n{out}");
    }
}

/// Handle cells handed out again (`handle::cells`): another thread creates and releases
/// 140 000 buffers and kernels, twice round the quarantine, while the main thread runs a kernel
/// with a new buffer and value each time through `clSetKernelArg`'s loop case and checks what
/// it wrote, and hands it buffers it released, which must be refused. A cell that kept a
/// freed argument record when used again crashed it (malloc's check of a double free).
#[test]
fn handle_cells_used_again_keep_kernel_arguments_right() {
    let exe = c_client("cell_reuse");
    let c = caged(&[], &exe, &["500"], &[]);
    let out = text(&c);
    assert!(c.status.success() && out.contains("PASS") && out.contains("churned 140000"), "{:?}:\n{out}", c.status);
}

/// Callbacks registered on 2 000 complete events, each event released by the application at
/// once (its callback's release is the last), after another thread of the application enqueued
/// once: directly they all run; caged this deadlocked the application and its worker (the
/// thread running callbacks waited, in that release, for the worker to take the main thread's
/// commands, while the worker's thread serving them waited to hand it a notification).
#[test]
fn callbacks_on_many_complete_events_do_not_deadlock() {
    let exe = c_client("callback_flood");
    for (mode, value) in [("1", "value 2002"), ("2", "value 2001")] {
        let out = std::process::Command::new("timeout")
            .args(["120", cloister().to_str().unwrap(), "run", "--"])
            .arg(&exe)
            .args(["2000", mode])
            .output()
            .unwrap();
        let t = text(&out);
        assert!(out.status.success(), "mode {mode}: hung or failed ({:?}):\n{t}", out.status);
        assert!(t.contains("callbacks 2000 of 2000") && t.contains(value), "mode {mode}:\n{t}");
    }
}
