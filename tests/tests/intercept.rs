//! Seeing what the application does (issue 14): the call log, the error-only log, host timing,
//! the Chrome trace, program dump and inject, appended build options and the leak report, each
//! checked on real C clients run through `cloister run` on pocl.

use cloister_tests::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

fn scratch(name: &str) -> PathBuf {
    let d = target_dir().join("intercept-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch folder");
    d
}

fn run_ok(args: &[&str], exe: &Path, env: &[(&str, &str)]) -> Output {
    let out = caged(args, exe, &[], env);
    assert!(out.status.success(), "cloister run {args:?} failed:\n{}", text(&out));
    out
}

/// The entry point names of a call log, in order.
fn logged_calls(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split_once("] ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once('(').map(|(name, _)| name.to_string()))
        .collect()
}

/// What `tests/c/api_smoke.c` calls, in its order, caged (CLOISTER_SOCKET set) and without
/// GARBAGE: read off its source.
const SMOKE_CALLS: &[&str] = &[
    "clGetPlatformIDs",
    "clGetDeviceIDs",
    "clCreateContext",
    "clCreateCommandQueue",
    "clCreateProgramWithSource",
    "clBuildProgram",
    "clCreateKernel",
    "clCreateBuffer",
    "clCreateBuffer",
    "clCreateBuffer",
    "clSetKernelArg",
    "clSetKernelArg",
    "clSetKernelArg",
    "clSetKernelArg",
    "clEnqueueNDRangeKernel",
    "clSetEventCallback",
    "clEnqueueReadBuffer",
    "clGetEventProfilingInfo",
    "clGetEventProfilingInfo",
    "clEnqueueMapBuffer",
    "clEnqueueUnmapMemObject",
    "clEnqueueReadBuffer",
    "clEnqueueMapBuffer",
    "clEnqueueUnmapMemObject",
    "clCreateKernel",
    "clCreateBuffer",
    "clCreateBuffer",
    "clSetKernelArg",
    "clSetKernelArg",
    "clSetKernelArg",
    "clEnqueueNDRangeKernel",
    "clEnqueueReadBuffer",
    "clCreateKernel",
    "clSetKernelArg",
    "clEnqueueReadBuffer",
    "clCreateProgramWithSource",
    "clBuildProgram",
    "clGetProgramBuildInfo",
    "clCreateUserEvent",
    "clEnqueueMarkerWithWaitList",
    "clGetEventInfo",
    "clSetUserEventStatus",
    "clWaitForEvents",
    "clFinish",
    "clCreateUserEvent",
    "clEnqueueWriteBuffer",
    "clEnqueueReadBuffer",
    "clSetUserEventStatus",
    "clWaitForEvents",
    "clEnqueueReadBuffer",
    "clFinish",
    "clEnqueueMarker",
    "clEnqueueBarrier",
    "clEnqueueWaitForEvents",
    "clFinish",
    "clGetEventInfo",
    "clReleaseEvent",
    "clGetDeviceAndHostTimer",
    "clGetHostTimer",
    "clGetContextInfo",
    "clGetContextInfo",
    "clGetContextInfo",
    "clReleaseEvent",
    "clReleaseMemObject",
    "clReleaseKernel",
    "clReleaseProgram",
    "clReleaseCommandQueue",
    "clReleaseContext",
];

/// Linked to cloister directly (`--drop-in`, no ICD loader calling in between), the smoke
/// client's call log is exactly the calls its source makes, with handles named per kind in
/// creation order, flags and errors by name, strings by their first bytes; the timing report
/// counts the same calls, and times its kernels as the client's own profiling does.
#[test]
fn call_log_lists_the_smoke_clients_calls_in_order_with_names() {
    let exe = c_client("api_smoke");
    let dir = scratch("call-log");
    let log = dir.join("calls.log");
    let timing = dir.join("timing.txt");
    let out = run_ok(
        &["--drop-in", &format!("--log-calls={}", log.display()), &format!("--timing={}", timing.display())],
        &exe,
        &[],
    );
    assert!(text(&out).contains("PASS"), "{}", text(&out));
    let log = std::fs::read_to_string(&log).expect("the call log was written");
    assert_eq!(logged_calls(&log), SMOKE_CALLS, "call log:\n{log}");
    for expected in [
        "clCreateContext(properties=NULL, num_devices=1, devices=[dev#1], pfn_notify=NULL, user_data=NULL) = ctx#1 CL_SUCCESS",
        "clCreateCommandQueue(context=ctx#1, device=dev#1, properties=CL_QUEUE_PROFILING_ENABLE) = queue#1 CL_SUCCESS",
        "clBuildProgram(program=prog#1, num_devices=1, device_list=[dev#1], options=\"-DFOO=1\"",
        "clCreateBuffer(context=ctx#1, flags=CL_MEM_COPY_HOST_PTR, size=4194304, ",
        ") = mem#3 CL_SUCCESS",
        "clCreateKernel(program=prog#1, kernel_name=\"nope\") = NULL CL_INVALID_KERNEL_NAME",
        "clEnqueueReadBuffer(command_queue=queue#1, buffer=mem#3, blocking_read=CL_TRUE, offset=0, size=4194304, ",
        "num_events_in_wait_list=1, event_wait_list=[ev#1], event=NULL) = CL_SUCCESS",
        "clGetEventProfilingInfo(event=ev#1, param_name=CL_PROFILING_COMMAND_START",
        "clReleaseContext(context=ctx#1) = CL_SUCCESS",
    ] {
        assert!(log.contains(expected), "the call log lacks {expected:?}:\n{log}");
    }
    // Every line is whole: a time, a thread, a call, a result and a duration.
    for line in log.lines() {
        assert!(line.starts_with('[') && line.contains(" tid ") && line.ends_with("us"), "odd line {line:?}");
    }
    let timing = std::fs::read_to_string(&timing).expect("the timing report was written");
    let (host, device) = timing.split_once("device time per command").expect("a device table");
    let counts: HashMap<&str, u64> = host
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect();
    let mut want: HashMap<&str, u64> = HashMap::new();
    for c in SMOKE_CALLS {
        *want.entry(c).or_default() += 1;
    }
    assert_eq!(counts, want, "timing report:\n{timing}");
    assert!(timing.contains(&format!("cloister timing: {} calls", SMOKE_CALLS.len())), "{timing}");
    // Each row's time splits into the driver's (the worker's own measure) and the cage's: they
    // add up, the driver's is never more than the whole, and a build is mostly the driver's.
    let mut split = 0;
    for l in host.lines().filter(|l| l.starts_with("cl") && !l.starts_with("cloister")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| f[i].parse::<f64>().unwrap_or_else(|_| panic!("field {i} of {l:?}"));
        let (total, cage, cage_pct) = (num(2), num(4), num(5));
        assert!((0.0..=100.0).contains(&cage_pct), "{l}");
        if f[3] == "-" {
            assert!((total - cage).abs() < 0.0015, "no split, all cage: {l}");
            continue;
        }
        split += 1;
        let driver = num(3);
        assert!(driver <= total && (driver + cage - total).abs() < 0.0015, "{l}");
        if f[0] == "clBuildProgram" {
            assert!(driver > 0.5 * total, "a build is the driver's work: {l}");
        }
    }
    assert!(split >= 20, "most calls waited for the worker and were split:\n{timing}");
    // The releases the shim posts (memory objects, kernels, events: nothing it does afterwards
    // depends on the worker's own release) wait for no reply, so their time is not split; the
    // others (program, queue, context) are calls. The smoke client leaves a kernel and buffers,
    // which keep its program and context (as the driver does): those two releases send nothing.
    for (name, posted) in [
        ("clReleaseMemObject", true),
        ("clReleaseKernel", true),
        ("clReleaseEvent", true),
        ("clReleaseProgram", true),
        ("clReleaseCommandQueue", false),
        ("clReleaseContext", true),
    ] {
        let row = host
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{timing}"));
        assert_eq!(row.split_whitespace().nth(3) == Some("-"), posted, "{name} posted: {posted}? {row}");
    }
    // Device time per kernel name and global size, from profiling: the client's own profiled
    // time of its `add` kernel is what the report says.
    let row = |label: &str| {
        device
            .lines()
            .find(|l| l.starts_with(label))
            .map(|l| l[label.len()..].split_whitespace().filter_map(|f| f.parse::<f64>().ok()).collect::<Vec<f64>>())
    };
    let add = row("NDRangeKernel add [1048576]").unwrap_or_else(|| panic!("no row for add:\n{timing}"));
    let own_ns: f64 = text(&out)
        .lines()
        .find_map(|l| l.strip_prefix("kernel ")?.strip_suffix(" ns")?.parse().ok())
        .expect("the client's own kernel time");
    assert_eq!(add[0], 1.0, "{timing}");
    assert!((add[3] - own_ns / 1e3).abs() < 0.2, "mean {} us vs the client's own {own_ns} ns:\n{timing}", add[3]);
    assert_eq!(row("NDRangeKernel red [1048576]").map(|r| r[0]), Some(1.0), "{timing}");
    assert_eq!(row("ReadBuffer").map(|r| r[0]), Some(5.0), "five reads succeeded:\n{timing}");
}

/// `--log-errors` shows the failing calls and nothing else: the smoke client's deliberate
/// mistakes (and the timers pocl does not have, which cloister answers CL_INVALID_OPERATION).
#[test]
fn error_log_shows_exactly_the_failing_calls() {
    let exe = c_client("api_smoke");
    let out = run_ok(&["--log-errors"], &exe, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failing: Vec<String> = stderr.lines().filter(|l| l.starts_with('[')).map(str::to_string).collect();
    let names = logged_calls(&failing.join("\n"));
    assert_eq!(
        names,
        [
            "clCreateKernel",
            "clSetKernelArg",
            "clEnqueueReadBuffer",
            "clBuildProgram",
            "clGetDeviceAndHostTimer",
            "clGetHostTimer"
        ],
        "stderr:\n{stderr}"
    );
    for (line, status) in failing.iter().zip([
        "CL_INVALID_KERNEL_NAME",
        "CL_INVALID_ARG_INDEX",
        "CL_INVALID_VALUE",
        "CL_BUILD_PROGRAM_FAILURE",
        "CL_INVALID_OPERATION",
        "CL_INVALID_OPERATION",
    ]) {
        assert!(line.contains(&format!(" {status} ")), "{line:?} should fail with {status}");
    }
    // The intercept client's two failing calls: a zero-size buffer, and a profiling query on a
    // queue made without profiling.
    let exe = c_client("intercept_client");
    let out = run_ok(&["--log-errors"], &exe, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failing: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(failing.len(), 2, "stderr:\n{stderr}");
    assert!(
        failing[0].contains(
            "clCreateBuffer(context=ctx#1, flags=CL_MEM_READ_WRITE, size=0, host_ptr=NULL) = NULL CL_INVALID_BUFFER_SIZE"
        ),
        "{stderr}"
    );
    assert!(
        failing[1].contains("clGetEventProfilingInfo(event=ev#1, param_name=CL_PROFILING_COMMAND_START, ")
            && failing[1].contains(" = CL_PROFILING_INFO_NOT_AVAILABLE "),
        "{stderr}"
    );
}

/// The trace is JSON Perfetto reads: one complete event per call (as many as the call log has
/// lines), on a track per application thread, nesting correctly on each; and the device
/// commands on a track per queue, from profiling the application's queries do not see.
#[test]
fn trace_is_json_with_one_event_per_call_on_each_threads_track() {
    let exe = c_client("intercept_client");
    let dir = scratch("trace");
    let trace = dir.join("trace.json");
    let log = dir.join("calls.log");
    let out = run_ok(
        &["--trace", trace.to_str().unwrap_or_default(), &format!("--log-calls={}", log.display())],
        &exe,
        &[("THREADS", "4")],
    );
    assert!(text(&out).contains("out 0 1 2 3"), "{}", text(&out));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("a traceEvents array");
    let calls: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "host").collect();
    let log = std::fs::read_to_string(&log).expect("call log written");
    assert_eq!(calls.len(), log.lines().count(), "one trace event per logged call");
    let mut per_thread: HashMap<u64, Vec<(f64, f64, String)>> = HashMap::new();
    for e in &calls {
        let tid = e["tid"].as_u64().expect("tid");
        let (ts, dur) = (e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"));
        assert!(dur >= 0.0, "{e}");
        per_thread.entry(tid).or_default().push((ts, ts + dur, e["name"].as_str().unwrap_or_default().to_string()));
    }
    // Four worker threads and the main thread, each with its own track and name.
    assert_eq!(per_thread.len(), 5, "tracks: {:?}", per_thread.keys());
    for tid in per_thread.keys() {
        assert!(
            events.iter().any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"].as_u64() == Some(*tid)),
            "thread {tid} has no name"
        );
    }
    let workers = per_thread.values().filter(|v| v.iter().filter(|c| c.2 == "clEnqueueNDRangeKernel").count() == 20);
    assert_eq!(workers.count(), 4, "each worker thread enqueued its 20 kernels on its own track");
    // The device commands, timed by profiling the application did not ask for: a track per
    // queue, within the host calls' span, the same commands as the host enqueued.
    let (first, last) = per_thread.values().flatten().fold((f64::MAX, 0f64), |(a, b), c| (a.min(c.0), b.max(c.1)));
    let mut per_queue: HashMap<u64, Vec<(f64, f64, String)>> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "device") {
        let (ts, dur) = (e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"));
        assert!(ts >= first && ts + dur <= last, "device command outside the host calls' span: {e}");
        let name = e["name"].as_str().unwrap_or_default().to_string();
        per_queue.entry(e["tid"].as_u64().expect("tid")).or_default().push((ts, ts + dur, name));
    }
    let kernels = |v: &Vec<(f64, f64, String)>| v.iter().filter(|c| c.2 == "NDRangeKernel fill [64]").count();
    let mut counts: Vec<usize> = per_queue.values().map(kernels).collect();
    counts.sort();
    assert_eq!(counts, [2, 20, 20, 20, 20], "kernels per queue track");
    for tid in per_queue.keys() {
        assert!(events.iter().any(|e| e["name"] == "thread_name" && e["tid"].as_u64() == Some(*tid)));
    }
    // The application's own view of its queues is unchanged: no profiling, as directly.
    let direct_run = direct(&exe, &[], &[]);
    let view = |t: &str| t.lines().find(|l| l.starts_with("profiling rc")).map(str::to_string);
    assert_eq!(view(&text(&out)), view(&text(&direct_run)));
    assert_eq!(view(&text(&out)).as_deref(), Some("profiling rc -7, queue properties 0"));
    per_thread.extend(per_queue);
    for (tid, mut evs) in per_thread {
        evs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (start, end, name) in evs {
            while open.last().is_some_and(|&e| e <= start) {
                open.pop();
            }
            if let Some(&outer) = open.last() {
                assert!(end <= outer, "{name} on thread {tid} overlaps its neighbour without nesting");
            }
            open.push(end);
        }
    }
}

/// The marker of a program built from source: its kernel writes `i * FOO`.
fn output(out: &Output) -> String {
    text(out).lines().find(|l| l.starts_with("out ")).unwrap_or_default().to_string()
}

/// A dumped binary injected into a second run gives the same results without its source being
/// compiled: that run appends `-DBROKEN`, which makes the source fail to compile (shown
/// first), yet the injected program builds. Appended options reach the driver (`-DFOO=3`), and
/// an injected source replaces the application's.
#[test]
fn dump_then_inject_skips_the_compiler_and_appended_options_reach_the_driver() {
    let exe = c_client("intercept_client");
    let dir = scratch("dump");
    let dump = dir.join("dump");
    let first = run_ok(&["--dump", dump.to_str().unwrap_or_default()], &exe, &[]);
    assert_eq!(output(&first), "out 0 1 2 3");
    let files: Vec<String> = std::fs::read_dir(&dump)
        .expect("dump folder")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let source = files.iter().find(|f| f.ends_with(".cl")).expect("a dumped source");
    let h = source.trim_end_matches(".cl");
    let text_cl = std::fs::read_to_string(dump.join(source)).expect("read source");
    assert!(text_cl.contains("__kernel void fill") && text_cl.contains("#ifdef BROKEN"), "{text_cl}");
    let bin = files.iter().find(|f| f.starts_with(&format!("{h}-")) && f.ends_with(".bin")).expect("a dumped binary");
    let stem = bin.trim_end_matches(".bin");
    assert_eq!(
        std::fs::read_to_string(dump.join(format!("{stem}.options.txt"))).ok().as_deref(),
        Some("-cl-std=CL1.2")
    );
    assert!(files.contains(&format!("{stem}.log.txt")), "{files:?}");
    assert!(std::fs::metadata(dump.join(bin)).map(|m| m.len()).unwrap_or(0) > 0);

    // Built from source, -DBROKEN fails: the option reaches the compiler.
    let broken = caged(&["--build-options-append=-DBROKEN"], &exe, &[], &[]);
    assert!(!broken.status.success() && text(&broken).contains("BROKEN is defined"), "{}", text(&broken));
    // From the injected binary, the same option changes nothing: no source was compiled.
    let injected =
        run_ok(&["--inject", dump.to_str().unwrap_or_default(), "--build-options-append=-DBROKEN"], &exe, &[]);
    assert_eq!(output(&injected), "out 0 1 2 3", "{}", text(&injected));
    assert!(text(&injected).contains(&format!("injected {}", dump.join(bin).display())), "{}", text(&injected));

    // Appended options change what the kernel computes, built or compiled (and linked).
    let foo = run_ok(&["--build-options-append=-DFOO=3"], &exe, &[]);
    assert_eq!(output(&foo), "out 0 3 6 9");
    let compiled = run_ok(&[], &exe, &[("COMPILE", "1")]);
    assert_eq!(output(&compiled), "out 0 1 2 3", "{}", text(&compiled));
    let foo = run_ok(&["--build-options-append=-DFOO=3"], &exe, &[("COMPILE", "1")]);
    assert_eq!(output(&foo), "out 0 3 6 9", "{}", text(&foo));
    let broken = caged(&["--build-options-append=-DBROKEN"], &exe, &[], &[("COMPILE", "1")]);
    assert!(!broken.status.success() && text(&broken).contains("BROKEN is defined"), "{}", text(&broken));

    // An injected source, named by the same hash, replaces the application's.
    let inject = dir.join("inject");
    std::fs::create_dir_all(&inject).expect("inject folder");
    std::fs::write(inject.join(source), text_cl.replace("#define FOO 1", "#define FOO 5")).expect("write source");
    let replaced = run_ok(&["--inject", inject.to_str().unwrap_or_default()], &exe, &[]);
    assert_eq!(output(&replaced), "out 0 5 10 15", "{}", text(&replaced));
}

/// `--leaks` names what a client left unreleased, per kind, and says so when nothing is.
#[test]
fn leaks_are_reported_per_kind_with_names() {
    let exe = c_client("intercept_client");
    let leaky = run_ok(&["--leaks"], &exe, &[("LEAK", "1")]);
    let t = text(&leaky);
    assert!(t.contains("cloister leaks: 3 objects not released at exit"), "{t}");
    // mem#1 was the work buffer (released); the two leaked are the next ones.
    assert!(t.contains("  Mem: 2 (mem#2, mem#3)"), "{t}");
    assert!(t.contains("  Kernel: 1 (kernel#2)"), "{t}");
    let clean = run_ok(&["--leaks"], &exe, &[]);
    assert!(text(&clean).contains("cloister leaks: none"), "{}", text(&clean));
}

/// With every feature on at once, the semantics client (non-blocking reads, maps, callbacks,
/// user events, out-of-order queues, profiling timestamps, the info-size protocol) finds exactly
/// what it finds without them, and the trace is still whole JSON.
#[test]
fn every_feature_on_changes_nothing_the_application_sees() {
    let exe = c_client("semantics");
    let dir = scratch("all-on");
    let plain = run_ok(&[], &exe, &[]);
    let trace = dir.join("trace.json");
    let observed = run_ok(
        &[
            "--trace",
            trace.to_str().unwrap_or_default(),
            &format!("--timing={}", dir.join("timing.txt").display()),
            &format!("--log-calls={}", dir.join("calls.log").display()),
            "--dump",
            dir.join("dump").to_str().unwrap_or_default(),
            "--leaks",
        ],
        &exe,
        &[],
    );
    assert_eq!(String::from_utf8_lossy(&plain.stdout), String::from_utf8_lossy(&observed.stdout));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).expect("the trace is JSON");
    assert!(json["traceEvents"].as_array().is_some_and(|e| e.len() > 50));
}

/// pyopencl, a large real client: its call log shows the build with the options it was given
/// (and the include folder pyopencl adds), the buffer flags by name and the kernel's global size,
/// and its trace parses. Needs Debian's python3-pyopencl (`scripts/pyopencl-suite.sh` installs it).
#[test]
fn pyopencl_call_log_and_trace() {
    let python = Path::new("/usr/bin/python3");
    let check = std::process::Command::new(python).args(["-c", "import pyopencl"]).output();
    assert!(
        check.is_ok_and(|o| o.status.success()),
        "this test needs python3-pyopencl: apt-get install python3-pyopencl"
    );
    let dir = scratch("pyopencl");
    let script = dir.join("scale.py");
    std::fs::write(
        &script,
        r#"import numpy as np, pyopencl as cl
ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
a = np.arange(16, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
src = "__kernel void scale(__global float *x) { int i = get_global_id(0); x[i] *= SCALE; }"
prg = cl.Program(ctx, src).build(options=["-DSCALE=2"])
prg.scale(q, a.shape, None, buf)
out = np.empty_like(a)
cl.enqueue_copy(q, out, buf)
print("sum", int(out.sum()))
"#,
    )
    .expect("write the script");
    let log = dir.join("calls.log");
    let trace = dir.join("trace.json");
    let out = caged(
        &[&format!("--log-calls={}", log.display()), "--trace", trace.to_str().unwrap_or_default()],
        python,
        &[script.to_str().unwrap_or_default()],
        &[("PYOPENCL_NO_CACHE", "1")],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("sum 240"), "{}", text(&out));
    let log = std::fs::read_to_string(&log).expect("call log written");
    for expected in [
        "clCreateBuffer(context=ctx#1, flags=CL_MEM_READ_WRITE|CL_MEM_COPY_HOST_PTR, size=64, ",
        "clBuildProgram(program=prog#1, num_devices=0, device_list=NULL, options=\"-DSCALE=2 -I ",
        "clEnqueueNDRangeKernel(command_queue=queue#1, kernel=kernel#1, work_dim=1, global_work_offset=NULL, global_work_size=[16], ",
    ] {
        assert!(log.contains(expected), "the call log lacks {expected:?}:\n{log}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("events");
    assert!(events.iter().any(|e| e["cat"] == "device" && e["name"] == "NDRangeKernel scale [16]"), "{json}");
}

/// The same features from the configuration file: `leaks = true` and `timing = "FILE"` (relative
/// to the file's folder) in the file `CLOISTER_CONFIG` names.
#[test]
fn features_come_from_the_configuration_file_too() {
    let exe = c_client("intercept_client");
    let dir = scratch("config");
    let file = dir.join("config.toml");
    std::fs::write(&file, "leaks = true\ntiming = \"timing.txt\"\n").expect("write the file");
    let out = run_ok(&[], &exe, &[("LEAK", "1"), ("CLOISTER_CONFIG", file.to_str().unwrap_or_default())]);
    assert!(text(&out).contains("cloister leaks: 3 objects not released at exit"), "{}", text(&out));
    let timing = std::fs::read_to_string(dir.join("timing.txt")).expect("the timing report, beside the file");
    assert!(timing.contains("clBuildProgram ") && timing.contains("NDRangeKernel fill [64]"), "{timing}");
}

/// An application `cloister run` started and the test ends, whatever happens to the test.
struct Running(Option<std::process::Child>);

impl Running {
    fn start(cloister_args: &[&str], exe: &Path, env: &[(&str, &Path)]) -> Self {
        let mut cmd = std::process::Command::new(cloister());
        cmd.arg("run").args(cloister_args).arg("--").arg(exe);
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        Running(Some(cmd.spawn().expect("start cloister run")))
    }

    fn finish(mut self) -> Output {
        self.0.take().expect("running").wait_with_output().expect("wait for cloister run")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The pid the client wrote once its first rounds were done.
fn ready_pid(ready: &Path) -> u32 {
    assert!(wait_for_path(ready, std::time::Duration::from_secs(120)), "the client never got ready");
    std::fs::read_to_string(ready).expect("read the ready file").trim().parse().expect("a pid")
}

/// The count of `entry`'s row in a timing report.
fn count_of(report: &str, entry: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == entry).then_some(())?;
        f.next()?.parse().ok()
    })
}

/// `cloister timing PID` asks a running application's shim, through its broker, for its timing
/// report as it stands: the calls so far, while the application goes on; told to stop, it then
/// finishes normally, and its report at exit counts every round it ran.
#[test]
fn timing_report_on_demand_while_the_application_runs() {
    let exe = c_client("long_running");
    let dir = scratch("on-demand");
    let (ready, stop, timing) = (dir.join("ready"), dir.join("stop"), dir.join("timing.txt"));
    let app = Running::start(
        &[&format!("--timing={}", timing.display())],
        &exe,
        &[("READY_FILE", &ready), ("STOP_FILE", &stop)],
    );
    let pid = ready_pid(&ready);
    let ask = || {
        let out = std::process::Command::new(cloister())
            .args(["timing", &pid.to_string()])
            .output()
            .expect("run cloister timing");
        assert!(out.status.success(), "cloister timing failed:\n{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = ask();
    assert!(first.starts_with(&format!("== long_running (pid {pid}) ==\ncloister timing: ")), "{first}");
    let enqueued = count_of(&first, "clEnqueueNDRangeKernel").unwrap_or_else(|| panic!("no enqueue row:\n{first}"));
    assert!(enqueued >= 5, "the five rounds before ready, at least:\n{first}");
    assert_eq!(count_of(&first, "clCreateBuffer"), Some(3), "{first}");
    assert_eq!(count_of(&first, "clReleaseContext"), None, "the application has not finished:\n{first}");
    // It goes on meanwhile: a later report counts more rounds.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let second = ask();
    assert!(count_of(&second, "clEnqueueNDRangeKernel") > Some(enqueued), "{first}\n{second}");
    // An application that serves no report is said so, with a failure.
    let out = std::process::Command::new(cloister()).args(["timing", "1"]).output().expect("run cloister timing");
    assert!(!out.status.success(), "{}", text(&out));
    std::fs::write(&stop, "").expect("write the stop file");
    let out = app.finish();
    assert!(out.status.success() && text(&out).contains("PASS"), "{}", text(&out));
    let rounds: u64 =
        text(&out).lines().find_map(|l| l.strip_prefix("rounds ")?.trim().parse().ok()).expect("the client's rounds");
    let at_exit = std::fs::read_to_string(&timing).expect("the report at exit");
    assert_eq!(count_of(&at_exit, "clEnqueueNDRangeKernel"), Some(rounds), "{at_exit}");
    assert_eq!(count_of(&at_exit, "clReleaseContext"), Some(1), "{at_exit}");
}

/// `--leaks` also says the peak of the bytes the application's memory objects held (the
/// long-running client's 4 MiB and 1 MiB buffers and 16 KiB image, live at once; its
/// sub-buffer holds none of its own; the 2 MiB one comes after the 4 MiB one went), what was
/// held at exit (nothing: it releases everything), and its calls per second.
/// (The client also forks a child and ends it by SIGTERM on the way.)
#[test]
fn statistics_at_exit_say_peak_memory_and_calls_per_second() {
    let exe = c_client("long_running");
    let dir = scratch("stats");
    let (ready, log) = (dir.join("ready"), dir.join("calls.log"));
    // The stop file is there from the start: the client stops after its first rounds.
    let stop = dir.join("stop");
    std::fs::write(&stop, "").expect("write the stop file");
    let ready_s = ready.display().to_string();
    let stop_s = stop.display().to_string();
    let out = run_ok(
        &["--leaks", &format!("--log-calls={}", log.display())],
        &exe,
        &[("READY_FILE", &ready_s), ("STOP_FILE", &stop_s), ("FORK_CHILD", "1")],
    );
    let t = text(&out);
    // Its forked child, ended by SIGTERM, ended alone: the shim's handler it inherited did not
    // have the parent write its reports and die.
    assert!(t.contains("child ended by signal 15"), "{t}");
    let line = t.lines().find(|l| l.starts_with("cloister stats: ")).unwrap_or_else(|| panic!("no stats:\n{t}"));
    let peak = (4 << 20) + (1 << 20) + 64 * 64 * 4;
    assert!(line.contains(&format!("peak memory objects {peak} bytes (5.0 MiB), 0 bytes at exit;")), "{line}");
    let calls = std::fs::read_to_string(&log).expect("the call log").lines().count();
    let (count, rate) = line
        .split_once("; ")
        .and_then(|(_, rest)| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.first()?.parse::<usize>().ok()?, f.get(5)?.trim_start_matches('(').parse::<f64>().ok()?))
        })
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(count, calls, "as many calls as the call log has lines: {line}");
    assert!(rate > 0.0, "{line}");
}

/// An application ended by SIGTERM (left at its default action) still leaves its reports: the
/// timing report, the statistics, a whole trace and the call log's last lines; and it still
/// ends by SIGTERM, as `cloister run` shows.
#[test]
fn reports_are_written_when_sigterm_ends_the_application() {
    use std::os::unix::process::ExitStatusExt;
    let exe = c_client("long_running");
    let dir = scratch("sigterm");
    let (ready, timing, trace, log) =
        (dir.join("ready"), dir.join("timing.txt"), dir.join("trace.json"), dir.join("calls.log"));
    let app = Running::start(
        &[
            &format!("--timing={}", timing.display()),
            "--leaks",
            "--trace",
            trace.to_str().unwrap_or_default(),
            &format!("--log-calls={}", log.display()),
        ],
        &exe,
        &[("READY_FILE", &ready)],
    );
    let pid = ready_pid(&ready);
    // SAFETY: signalling the client's own process, alive until it is reaped by `cloister run`.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let out = app.finish();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{}", text(&out));
    let report = std::fs::read_to_string(&timing).expect("the timing report, written on SIGTERM");
    let enqueued = count_of(&report, "clEnqueueNDRangeKernel").unwrap_or_else(|| panic!("{report}"));
    assert!(enqueued >= 5, "{report}");
    assert!(text(&out).contains("cloister stats: peak memory objects"), "{}", text(&out));
    assert!(text(&out).contains("cloister leaks: "), "{}", text(&out));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("the trace")).expect("a whole trace");
    let events = json["traceEvents"].as_array().expect("events");
    assert!(events.iter().filter(|e| e["name"] == "clEnqueueNDRangeKernel").count() as u64 >= enqueued);
    let log = std::fs::read_to_string(&log).expect("the call log");
    assert!(log.lines().filter(|l| l.contains("clEnqueueNDRangeKernel(")).count() as u64 >= enqueued, "{log}");
}

/// What a shim says on its report connection is untrusted: one that never answers is given up
/// on at the broker's deadline and forgotten (the next ask does not meet it again); an answer's
/// text reaches the terminal escaped. Two fake shims, made of the broker's own messages.
#[test]
fn report_connections_are_asked_within_a_deadline_and_their_text_is_escaped() {
    use cloister_ipc::{channel, handshake::Hello, BrokerReply, BrokerRequest};
    let dir = scratch("hostile-reports");
    let socket = dir.join("broker.sock");
    struct Broker(std::process::Child);
    impl Drop for Broker {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let broker = Broker(
        std::process::Command::new(cloister())
            .args(["broker", "--socket"])
            .arg(&socket)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a broker"),
    );
    assert!(wait_for_path(&socket, std::time::Duration::from_secs(10)), "the broker never listened");
    let silent = channel::connect_seqpacket(&socket).expect("connect");
    channel::send(&silent, &BrokerRequest::ServeReports(Hello::new()), &[]).expect("send");
    let talker = channel::connect_seqpacket(&socket).expect("connect");
    channel::send(&talker, &BrokerRequest::ServeReports(Hello::new()), &[]).expect("send");
    let answering = std::thread::spawn(move || {
        while let Ok((BrokerReply::Query, _)) = channel::recv::<BrokerReply>(&talker) {
            let timing = Some("rows\u{1b}[2J\n".to_string());
            if channel::send(&talker, &BrokerRequest::Report { timing }, &[]).is_err() {
                break;
            }
        }
    });
    let ask = || {
        std::process::Command::new(cloister())
            .args(["timing", "--socket"])
            .arg(&socket)
            .output()
            .expect("run cloister timing")
    };
    // Both registered (each on its own connection's thread in the broker, which says nothing
    // back: hence the pause and the retries): one report, one failure.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut first = ask();
    for _ in 0..50 {
        if text(&first).contains("no answer within") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        first = ask();
    }
    let t = text(&first);
    assert!(!first.status.success() && t.contains("no answer within 3 s"), "{t}");
    assert!(t.contains("rows\\u{1b}[2J") && !t.contains('\u{1b}'), "escaped: {t}");
    // The silent one is forgotten: the next ask meets only the one that answers.
    let second = ask();
    let t = text(&second);
    assert!(second.status.success() && !t.contains("no answer") && t.contains("rows\\u{1b}[2J"), "{t}");
    drop(broker);
    drop(silent);
    answering.join().expect("the answering thread");
}
