//! Asynchronous enqueues (`tests/c/async_enqueue.c`): cloister posts the enqueues it can vouch
//! for and returns at once. Results must be what they are directly; an error the driver finds
//! later must surface as OpenCL's asynchronous errors do; `CLOISTER_SYNC=1` must give the
//! driver's error from the call itself; a worker that dies with enqueues queued must leave no
//! call hanging.

use cloister_tests::*;

const STRICT: (&str, &str) = ("CLOISTER_SYNC", "1");

fn lines(o: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()
}

/// 2 x 20 000 posted kernels on two threads' queues, then a kernel, a copy and a barrier behind
/// them, and another thread's 5 000 enqueues read on this one: the same numbers as directly.
#[test]
fn posted_enqueues_run_in_order_with_the_right_results() {
    let exe = c_client("async_enqueue");
    let d = direct(&exe, &["stream"], &[]);
    let c = caged(&[], &exe, &["stream"], &[]);
    let s = caged(&[], &exe, &["stream"], &[STRICT]);
    assert!(d.status.success(), "{}", text(&d));
    let want = lines(&d);
    assert!(want.iter().any(|l| l == "stream 0: 20000 increments then double, copy back: right (40000, 40000)"));
    assert!(want.iter().any(|l| l == "another thread's 5000 enqueues, then a read here: 5000"), "{want:?}");
    assert_eq!(lines(&c), want, "caged:\n{}", text(&c));
    assert_eq!(lines(&s), want, "strict:\n{}", text(&s));
}

/// An NDRange the driver refuses though it took one of the same shape (the fault driver refuses
/// odd global sizes with CL_OUT_OF_RESOURCES, as a driver short of resources would): directly
/// (and in strict mode) the call says so; posted, the call succeeds and the error comes late,
/// as OpenCL's asynchronous errors do.
#[test]
fn a_rejected_enqueue_reports_late_and_strict_mode_reports_at_once() {
    let exe = c_client("async_enqueue");
    let vendors = vendors_dir_for(&fault_driver());
    let vendors = ("OCL_ICD_VENDORS", vendors.to_str().unwrap());
    const REFUSE: (&str, &str) = ("CLOISTER_FAULT", "enqueue:refuse-odd");
    let d = direct(&exe, &["late"], &[REFUSE, vendors]);
    let s = caged_on_faultcl(&exe, &["late"], &[REFUSE, STRICT]);
    let c = caged_on_faultcl(&exe, &["late"], &[REFUSE]);
    for o in [&d, &s, &c] {
        assert!(o.status.success(), "{}", text(o));
    }
    let code = CL_OUT_OF_RESOURCES;
    assert_eq!(lines(&d)[0], format!("rejected NDRange -> {code}"), "{}", text(&d));
    assert_eq!(lines(&s), lines(&d), "strict mode must answer as the driver does:\n{}", text(&s));

    let out = lines(&c);
    let t = text(&c);
    let expected = [
        "rejected NDRange -> 0".to_string(),
        format!("late: clFinish -> {code}"),
        format!("late: event status {code}"),
        "late: wait on its event -> -14".to_string(),
        "late: a marker waiting on it: wait -> -14, status negative".to_string(),
        // The marker failed too (its wait list held a failed event): reported the same way.
        "late: clFinish again -> -14".to_string(),
        format!("late: then a blocking map -> {code} (NULL)"),
        format!("late: then a blocking read -> {code}"),
        "late: and the next one -> 0".to_string(),
        // A blocking write meeting a late error is made and returns it, small and large alike.
        format!("late: then a blocking write -> {code}, clFinish -> 0, read back 7"),
        format!("late: then an 8 MiB blocking write -> {code}, clFinish -> 0, read back the same"),
    ];
    assert_eq!(out[..expected.len()], expected, "{t}");
    // With other contexts on the same worker, made before and after, the same (each enqueue's
    // objects are checked to be of its queue's context). Before, every enqueue went as
    // a call once a second context had been made, and the NDRange failed at once.
    let others = caged_on_faultcl(&exe, &["late"], &[REFUSE, ("OTHER_CONTEXTS", "1")]);
    assert!(others.status.success(), "{}", text(&others));
    assert_eq!(lines(&others)[..expected.len()], expected, "with other contexts:\n{}", text(&others));
    // Staged: the small write is posted (the clFinish after it returns the late error), the
    // large one pipelined; both land.
    let staged = caged_on_faultcl(&exe, &["late"], &[REFUSE, ("CLOISTER_ZERO_COPY", "0")]);
    assert!(staged.status.success(), "{}", text(&staged));
    let mut staged_expected = expected.clone();
    staged_expected[9] = format!("late: then a blocking write -> 0, clFinish -> {code}, read back 7");
    assert_eq!(lines(&staged)[..expected.len()], staged_expected, "staged:\n{}", text(&staged));
    let heard = out.iter().find(|l| l.starts_with("late: notify heard: ")).expect("a notify line");
    assert!(
        heard.contains("clEnqueueNDRangeKernel") && heard.contains("CL_OUT_OF_RESOURCES (-5)"),
        "the context's callback must name the call and the error: {heard}"
    );
    // The queue and the kernel's arguments survive: the next NDRange works.
    assert!(out.contains(&"afterwards a good NDRange: 1 1".to_string()), "{t}");
    // Overlapping copies of sub-buffers fail at the call, as directly.
    let overlap =
        "overlapping copies: sub-buffer to sub-buffer -8, buffer to its sub-buffer -8; disjoint 0; clFinish 0";
    assert!(lines(&d).iter().any(|l| l == overlap), "{}", text(&d));
    assert!(out.iter().any(|l| l == overlap), "{t}");
    assert_eq!(out.last().map(String::as_str), Some("done"), "{t}");
}

/// Work-group sizes the driver refuses are refused at the call, as directly, the second time
/// too: the first NDRange of each launch shape goes as a call, and only a shape the driver took
/// is posted after (`launch_shapes`). Before, every one was posted once the kernel's arguments
/// were set, and the error came late (the Khronos CTS's test_api failed
/// `kernel_required_group_size` and `consistency_non_uniform_work_group` caged).
#[test]
fn work_group_sizes_the_driver_refuses_are_refused_at_the_call() {
    let exe = c_client("async_enqueue");
    let d = direct(&exe, &["shapes"], &[]);
    assert!(d.status.success(), "{}", text(&d));
    let want = lines(&d);
    // What the test stands on: pocl refuses each of these, at the call and the second time.
    for refused in [
        "shapes: a work-group larger than the kernel allows -> -54, again -54, clFinish 0",
        "shapes: required 8, groups of 4 -> -54, again -54, clFinish 0",
        "shapes: the kernel's largest work-group -> 0, again 0, clFinish 0",
        "shapes: required 8, groups of 8 -> 0, again 0, clFinish 0",
    ] {
        assert!(want.iter().any(|l| l == refused), "directly, no {refused:?}:\n{}", text(&d));
    }
    for env in [&[][..], &[STRICT][..], &[("OTHER_CONTEXTS", "1")][..]] {
        let c = caged(&[], &exe, &["shapes"], env);
        assert_eq!(lines(&c), want, "caged with {env:?}:\n{}", text(&c));
    }
}

/// The fault driver crashes the worker in the second NDRange (the first, of a new launch shape,
/// is a call), with the other 2 998 queued behind it: every later call returns
/// CL_DEVICE_NOT_AVAILABLE, events included, and nothing hangs.
#[test]
fn a_worker_dying_with_posted_enqueues_queued_leaves_nothing_hanging() {
    let exe = c_client("async_enqueue");
    let started = std::time::Instant::now();
    let env = [("CLOISTER_FAULT", "enqueue:segv"), ("CLOISTER_FAULT_SKIP", "1"), ("CLOISTER_RECOVERY", "report")];
    let c = caged_on_faultcl(&exe, &["death"], &env);
    let t = text(&c);
    assert!(c.status.success(), "{t}");
    let out = lines(&c);
    // Enqueues posted before the worker died returned CL_SUCCESS; the first one after it (if
    // the loop got there) returned CL_DEVICE_NOT_AVAILABLE.
    let first = &out[0];
    assert!(first.starts_with("death: ") && (first.ends_with("then 0") || first.ends_with("then -2")), "{t}");
    for want in ["death: clFinish -> -2", "death: wait on event 0 -> -2, status -2", "death: blocking read -> -2"] {
        assert!(out.iter().any(|l| l == want), "missing {want:?}:\n{t}");
    }
    // Events of enqueues made after the death were never handed out; those made before fail.
    for i in 1..3 {
        let line = out.iter().find(|l| {
            l.starts_with(&format!("death: wait on event {i}")) || l.starts_with(&format!("death: event {i} "))
        });
        let line = line.unwrap_or_else(|| panic!("no line for event {i}:\n{t}"));
        assert!(line.ends_with("-> -2, status -2") || line.ends_with("was never returned"), "{t}");
    }
    assert!(out.iter().any(|l| l == "death: still running"), "{t}");
    assert!(t.contains("died during EnqueueNdRange"), "the report names the posted call in flight:\n{t}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
}

/// A buffer whose allocation the driver fails (the fault driver fails odd sizes): in strict mode
/// the creation says so; posted, the creation succeeds and each use of the buffer that reaches
/// the driver returns the driver's code (a posted one as the queue's late error), the context's
/// callback hears it, its release succeeds
/// and the next buffer works. With zero-copy buffers and without (the staged path).
#[test]
fn a_buffer_the_driver_cannot_allocate_fails_at_its_uses() {
    let exe = c_client("async_enqueue");
    const FAIL: (&str, &str) = ("CLOISTER_FAULT", "create:fail-odd");
    let strict = caged_on_faultcl(&exe, &["alloc"], &[FAIL, STRICT]);
    let t = text(&strict);
    assert!(strict.status.success(), "{t}");
    assert_eq!(
        lines(&strict),
        [
            "odd-sized buffer -> -4",
            "odd-sized buffer with contents -> -4",
            "afterwards a buffer the driver could make: 1",
            "done"
        ],
        "strict mode must answer as the driver does:\n{t}"
    );
    for zero_copy in ["1", "0"] {
        let c = caged_on_faultcl(&exe, &["alloc"], &[FAIL, ("CLOISTER_ZERO_COPY", zero_copy)]);
        let t = text(&c);
        assert!(c.status.success(), "{t}");
        let out = lines(&c);
        let expected = [
            "odd-sized buffer -> 0",
            "alloc: as a kernel's argument -> -4",
            // The fill was posted too: its failure is the queue's late error.
            "alloc: a fill of it -> 0",
            "alloc: clFinish -> -4",
            "alloc: blocking map -> -4 (NULL)",
            "alloc: clFinish again -> 0",
        ];
        // On the idle queue: a zero-copy buffer's transfers are the shim's own, which asks the
        // worker whether the buffer exists and returns its code (before, the write landed in
        // memory no buffer owned, the read read it back, and both said 0). Otherwise a small
        // blocking write is posted (the shim copied the data) and fails late, as the fill: the
        // read fails with its own error, and the write's is the next blocking call's.
        let transfers = match zero_copy {
            "1" => ["alloc: blocking write -> -4", "alloc: blocking read -> -4", "alloc: clFinish after them -> 0"],
            _ => ["alloc: blocking write -> 0", "alloc: blocking read -> -4", "alloc: clFinish after them -> -4"],
        };
        // Pipelined (staged: its chunks posted, one clFinish at the end) or through the buffer's
        // own memory: the driver's code from the call, once.
        let big = ["alloc: a 4 MiB blocking write -> -4, clFinish after it -> 0", "alloc: release -> 0"];
        let expected = [&expected[..], &transfers[..], &big[..]].concat();
        assert_eq!(out[..expected.len()], expected, "zero-copy {zero_copy}:\n{t}");
        let heard = out.iter().find(|l| l.starts_with("alloc: notify heard: ")).expect("a notify line");
        assert!(
            heard.contains("clCreateBuffer") && heard.contains("CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)"),
            "the context's callback must name the call and the error: {heard}"
        );
        let with_contents = [
            "odd-sized buffer with contents -> 0",
            "alloc: with contents, as a kernel's argument -> -4",
            "alloc: with contents, release -> 0",
        ];
        assert_eq!(out[out.len() - 5..out.len() - 2], with_contents, "zero-copy {zero_copy}:\n{t}");
        assert_eq!(out[out.len() - 2..], ["afterwards a buffer the driver could make: 1", "done"], "{t}");
    }
}

const CL_OUT_OF_RESOURCES: i32 = -5;
