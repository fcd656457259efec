//! The benchmark client `cloister bench` runs twice, directly on the driver and through the cage.
//! It uses plain OpenCL through the system's `libOpenCL`, so both runs execute the same code.
//! Prints one JSON object: the device, and per workload the min / median / max time per operation
//! over the repeats (README, Benchmarks, lists the workloads).
//!
//! `--quick` shortens every workload, `--only A,B` runs the workloads whose names contain A or B,
//! `--names A,B` those named A or B exactly (how `cloister bench` runs its further draws of the
//! short rows), and `--spin` makes this process one of `cloister bench --load`'s busy threads
//! instead.
//!
//! `--rounds N --lockstep` is how `cloister bench` runs it: each workload is measured in N blocks
//! of a time budget's Nth part, and before each block the client says so and waits for a line on
//! its standard input (the protocol is `lockstep`'s), so that `cloister bench` can let the
//! direct and the caged client take turns block by block (`bench::interleave`). The time per operation of both runs is then measured
//! in the same stretch of time, on a shared machine whose speed changes from one second to the
//! next.

/// The lines spoken with `cloister bench` (its parser is unused here).
#[allow(dead_code)]
#[path = "../lockstep.rs"]
mod lockstep;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

#[allow(non_camel_case_types)]
type cl_int = i32;
type Handle = *mut c_void;

#[link(name = "OpenCL")]
extern "C" {
    fn clGetPlatformIDs(n: u32, p: *mut Handle, num: *mut u32) -> cl_int;
    fn clGetDeviceIDs(p: Handle, t: u64, n: u32, d: *mut Handle, num: *mut u32) -> cl_int;
    fn clGetDeviceInfo(d: Handle, param: u32, size: usize, value: *mut c_void, ret: *mut usize) -> cl_int;
    fn clGetPlatformInfo(p: Handle, param: u32, size: usize, value: *mut c_void, ret: *mut usize) -> cl_int;
    fn clCreateContext(
        props: *const isize,
        n: u32,
        d: *const Handle,
        f: *mut c_void,
        u: *mut c_void,
        e: *mut cl_int,
    ) -> Handle;
    fn clCreateCommandQueueWithProperties(c: Handle, d: Handle, props: *const u64, e: *mut cl_int) -> Handle;
    fn clCreateBuffer(c: Handle, flags: u64, size: usize, host: *mut c_void, e: *mut cl_int) -> Handle;
    fn clCreateProgramWithSource(c: Handle, n: u32, s: *const *const u8, l: *const usize, e: *mut cl_int) -> Handle;
    fn clBuildProgram(p: Handle, n: u32, d: *const Handle, o: *const u8, f: *mut c_void, u: *mut c_void) -> cl_int;
    fn clCreateKernel(p: Handle, name: *const std::ffi::c_char, e: *mut cl_int) -> Handle;
    fn clReleaseKernel(k: Handle) -> cl_int;
    fn clSetKernelArg(k: Handle, i: u32, size: usize, v: *const c_void) -> cl_int;
    fn clEnqueueNDRangeKernel(
        q: Handle,
        k: Handle,
        dim: u32,
        off: *const usize,
        g: *const usize,
        l: *const usize,
        n: u32,
        w: *const Handle,
        e: *mut Handle,
    ) -> cl_int;
    fn clEnqueueWriteBuffer(
        q: Handle,
        m: Handle,
        b: u32,
        off: usize,
        size: usize,
        p: *const c_void,
        n: u32,
        w: *const Handle,
        e: *mut Handle,
    ) -> cl_int;
    fn clEnqueueReadBuffer(
        q: Handle,
        m: Handle,
        b: u32,
        off: usize,
        size: usize,
        p: *mut c_void,
        n: u32,
        w: *const Handle,
        e: *mut Handle,
    ) -> cl_int;
    fn clEnqueueMapBuffer(
        q: Handle,
        m: Handle,
        b: u32,
        flags: u64,
        off: usize,
        size: usize,
        n: u32,
        w: *const Handle,
        e: *mut Handle,
        err: *mut cl_int,
    ) -> *mut c_void;
    fn clEnqueueUnmapMemObject(
        q: Handle,
        m: Handle,
        p: *mut c_void,
        n: u32,
        w: *const Handle,
        e: *mut Handle,
    ) -> cl_int;
    fn clFinish(q: Handle) -> cl_int;
    fn clReleaseMemObject(m: Handle) -> cl_int;
    fn clEnqueueMarkerWithWaitList(q: Handle, n: u32, w: *const Handle, e: *mut Handle) -> cl_int;
    fn clSetEventCallback(e: Handle, status: cl_int, f: EventCallback, user: *mut c_void) -> cl_int;
    fn clWaitForEvents(n: u32, e: *const Handle) -> cl_int;
    fn clReleaseEvent(e: Handle) -> cl_int;
}

type EventCallback = extern "C" fn(Handle, cl_int, *mut c_void);

/// How many `event_callback` callbacks ran (checked against the commands that asked for one).
static CALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn count_callback(_: Handle, _: cl_int, _: *mut c_void) {
    CALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Release);
}

const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
const CL_DEVICE_NAME: u32 = 0x102B;
const CL_DEVICE_HOST_UNIFIED_MEMORY: u32 = 0x1035;
const CL_PLATFORM_NAME: u32 = 0x0902;
const CL_MEM_READ_WRITE: u64 = 1;
const CL_MEM_COPY_HOST_PTR: u64 = 1 << 5;
const CL_MAP_READ: u64 = 1;
const CL_MAP_WRITE_INVALIDATE_REGION: u64 = 4;
const CL_TRUE: u32 = 1;
const CL_FALSE: u32 = 0;
const CL_COMPLETE: cl_int = 0;
/// The page size the map workloads touch: one access per page makes every page fault in.
const PAGE: usize = 4096;

fn check(what: &str, rc: cl_int) {
    if rc != 0 {
        eprintln!("cloister-bench-client: {what} failed: {rc}");
        std::process::exit(1);
    }
}

/// A buffer of `size` bytes on `ctx`, with the host memory it was written from. It holds data
/// before anything is timed, whichever workloads `--only` picks: memory never written reads as
/// the kernel's zero page on a host-unified device (pocl: a 64 MiB map for read took 112 us
/// directly with `--only map_`, 170-180 us once the buffer was written), which is not what an
/// application reads.
///
/// # Safety
/// `ctx` and `q` are a live context and a queue of it.
unsafe fn written_buffer(ctx: Handle, q: Handle, size: usize) -> (Handle, Vec<u8>) {
    let mut err = 0;
    // SAFETY: live handles (the caller's contract); `host` holds `size` bytes.
    unsafe {
        let buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, null_mut(), &mut err);
        check("clCreateBuffer", err);
        let host = vec![1u8; size];
        let fill = clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, size, host.as_ptr().cast(), 0, null(), null_mut());
        check("clEnqueueWriteBuffer", fill);
        (buf, host)
    }
}

/// `clEnqueueWriteBuffer` (`write`) or `clEnqueueReadBuffer` of `host` whole, at offset 0 of
/// `buf`, without a wait list; `event` is NULL or where the command's event goes.
///
/// # Safety
/// `q` and `buf` are live; `buf` holds at least `host.len()` bytes; a non-blocking read leaves
/// `host` alone until it completes.
unsafe fn transfer(q: Handle, buf: Handle, write: bool, blocking: u32, host: &mut [u8], event: *mut Handle) -> cl_int {
    let (size, at) = (host.len(), host.as_mut_ptr().cast());
    // SAFETY: per the caller; `at` holds `size` bytes.
    unsafe {
        match write {
            true => clEnqueueWriteBuffer(q, buf, blocking, 0, size, at, 0, null(), event),
            false => clEnqueueReadBuffer(q, buf, blocking, 0, size, at, 0, null(), event),
        }
    }
}

/// How long each workload is measured: at least `min_repeats` timed repeats, more while the
/// time budget lasts (up to `MAX_REPEATS`), so min / median / max mean something.
struct Plan {
    quick: bool,
    min_repeats: usize,
    budget: Duration,
    /// Substrings of the workload names to run (`--only`); empty: all.
    only: Vec<String>,
    /// Whole workload names to run (`--names`); empty: all.
    names: Vec<String>,
    /// Blocks each workload is measured in (`--rounds`), each with its share of the repeats.
    rounds: usize,
    /// Wait for a line on standard input before each block (`--lockstep`).
    lockstep: bool,
}

const MAX_REPEATS: usize = 200;

/// What a workload's throughput counts, if it has one.
#[derive(Clone, Copy)]
enum Throughput {
    None,
    /// Bytes moved per operation: GB/s.
    Bytes(usize),
    /// Operations per second (the enqueue stream): M ops/s.
    Ops,
}

struct Bench {
    plan: Plan,
    results: Vec<serde_json::Value>,
}

impl Bench {
    fn wanted(&self, name: &str) -> bool {
        (self.plan.only.is_empty() || self.plan.only.iter().any(|p| name.contains(p.as_str())))
            && (self.plan.names.is_empty() || self.plan.names.iter().any(|n| n == name))
    }

    /// Times `repeat(ops)` (which performs `ops` operations, waiting for them to complete)
    /// after one small warm-up call; records min / median / max time per operation over the
    /// repeats, taken in `rounds` blocks.
    fn measure(&mut self, name: &str, throughput: Throughput, ops: usize, mut repeat: impl FnMut(usize)) {
        if !self.wanted(name) {
            return;
        }
        let rounds = self.plan.rounds;
        let (min_repeats, budget) = (self.plan.min_repeats.div_ceil(rounds), self.plan.budget / rounds as u32);
        let max_repeats = (MAX_REPEATS / rounds).max(min_repeats);
        let mut per_op = Vec::new();
        for round in 0..rounds {
            self.wait_turn(name);
            if round == 0 {
                repeat(ops.min(8));
            }
            let (start, before) = (Instant::now(), per_op.len());
            loop {
                let taken = per_op.len() - before;
                if taken >= min_repeats && (start.elapsed() >= budget || taken >= max_repeats) {
                    break;
                }
                let t = Instant::now();
                repeat(ops);
                per_op.push(t.elapsed().as_nanos() as f64 / ops as f64);
            }
        }
        self.record(name, throughput, ops, per_op);
    }

    /// With `--lockstep`: says that the next block of `name` is ready, and waits for the word
    /// to run it (any line; end of input: `cloister bench` is gone, and so is this client).
    fn wait_turn(&self, name: &str) {
        if !self.plan.lockstep {
            return;
        }
        use std::io::{BufRead, Write};
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{}", lockstep::wait_line(name)).and_then(|()| out.flush()).is_err() {
            std::process::exit(1);
        }
        let mut line = String::new();
        if !matches!(std::io::stdin().lock().read_line(&mut line), Ok(n) if n > 0) {
            std::process::exit(1);
        }
    }

    fn record(&mut self, name: &str, throughput: Throughput, ops: usize, mut per_op_ns: Vec<f64>) {
        per_op_ns.sort_by(f64::total_cmp);
        let median = per_op_ns[per_op_ns.len() / 2];
        let mut r = serde_json::json!({
            "name": name,
            "ops_per_repeat": ops,
            "repeats": per_op_ns.len(),
            "min_ns": per_op_ns[0],
            "median_ns": median,
            "max_ns": per_op_ns[per_op_ns.len() - 1],
        });
        match throughput {
            Throughput::None => {}
            Throughput::Bytes(b) => {
                r["bytes_per_op"] = b.into();
                r["throughput"] = (b as f64 / median).into();
                r["throughput_unit"] = "GB/s".into();
            }
            Throughput::Ops => {
                r["throughput"] = (1e3 / median).into();
                r["throughput_unit"] = "M ops/s".into();
            }
        }
        self.results.push(r);
    }
}

fn info_string(f: impl Fn(usize, *mut c_void, *mut usize) -> cl_int) -> String {
    let mut size = 0;
    check("info size", f(0, null_mut(), &mut size));
    let mut buf = vec![0u8; size];
    check("info", f(size, buf.as_mut_ptr().cast(), null_mut()));
    String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string()
}

/// `--load`'s busy thread: spins until killed (by `cloister bench`, or by the kernel when
/// `cloister bench` dies: it sets the parent-death signal).
fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut quick, mut lockstep, mut rounds) = (false, false, 1);
    let (mut only, mut names) = (Vec::new(), Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--lockstep" => lockstep = true,
            "--rounds" => match args.next().and_then(|n| n.parse::<usize>().ok()).filter(|&n| n > 0) {
                Some(n) => rounds = n,
                None => {
                    eprintln!("cloister-bench-client: --rounds wants a number of at least 1");
                    std::process::exit(2);
                }
            },
            "--spin" => spin(),
            "--only" => only.extend(args.next().unwrap_or_default().split(',').map(str::to_string)),
            "--names" => names.extend(args.next().unwrap_or_default().split(',').map(str::to_string)),
            other => {
                eprintln!("cloister-bench-client: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    only.retain(|p| !p.is_empty());
    names.retain(|n| !n.is_empty());
    let (min_repeats, budget) = if quick { (3, Duration::from_millis(30)) } else { (5, Duration::from_millis(400)) };
    let plan = Plan { quick, min_repeats, budget, only, names, rounds, lockstep };
    let mut bench = Bench { plan, results: Vec::new() };
    // SAFETY (whole function): plain OpenCL calls with valid pointers to locals and buffers of
    // the sizes passed; every return code is checked before the results are used.
    unsafe {
        let t = Instant::now();
        let mut platform: Handle = null_mut();
        check("clGetPlatformIDs", clGetPlatformIDs(1, &mut platform, null_mut()));
        let mut device: Handle = null_mut();
        check("clGetDeviceIDs", clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &mut device, null_mut()));
        let init = t.elapsed().as_nanos() as f64;
        if bench.wanted("platform_init") {
            bench.record("platform_init", Throughput::None, 1, vec![init]);
        }
        let device_name = info_string(|s, v, r| clGetDeviceInfo(device, CL_DEVICE_NAME, s, v, r));
        let platform_name = info_string(|s, v, r| clGetPlatformInfo(platform, CL_PLATFORM_NAME, s, v, r));
        // Whether host and device share memory (pocl): the map targets differ (see `bench.rs`).
        let mut unified: u32 = 0;
        let host_unified = clGetDeviceInfo(
            device,
            CL_DEVICE_HOST_UNIFIED_MEMORY,
            std::mem::size_of::<u32>(),
            (&mut unified as *mut u32).cast(),
            null_mut(),
        ) == 0
            && unified != 0;

        let mut err = 0;
        let ctx = clCreateContext(null(), 1, &device, null_mut(), null_mut(), &mut err);
        check("clCreateContext", err);
        let q = clCreateCommandQueueWithProperties(ctx, device, null(), &mut err);
        check("clCreateCommandQueue", err);
        let src = b"__kernel void empty(__global int *a, int b) { }\n\
            __kernel void fill(__global int *a, int b) { a[get_global_id(0)] = b; }\0";
        let srcp = src.as_ptr();
        let prog = clCreateProgramWithSource(ctx, 1, &srcp, null(), &mut err);
        check("clCreateProgramWithSource", err);
        check("clBuildProgram", clBuildProgram(prog, 1, &device, null(), null_mut(), null_mut()));
        let kernel = clCreateKernel(prog, c"empty".as_ptr(), &mut err);
        check("clCreateKernel", err);
        let small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, null_mut(), &mut err);
        check("clCreateBuffer", err);

        let mut name = [0u8; 256];
        bench.measure("info_query", Throughput::None, 1000, |n| {
            for _ in 0..n {
                check(
                    "clGetDeviceInfo",
                    clGetDeviceInfo(device, CL_DEVICE_NAME, name.len(), name.as_mut_ptr().cast(), null_mut()),
                );
            }
        });
        bench.measure("create_release_4k", Throughput::None, 100, |n| {
            for _ in 0..n {
                let b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, null_mut(), &mut err);
                check("clCreateBuffer", err);
                check("clReleaseMemObject", clReleaseMemObject(b));
            }
        });
        // With contents: the memory they are copied into is touched (fresh pages cost a fault
        // each; a zero-copy buffer's come from a slab carved again once its buffers are gone).
        // A 1 MiB zero-copy buffer takes a slab of its own, taken again once its buffer is gone
        // (fresh, its pages cost 850 us on 2 pocl cores).
        for (name, len, ops) in
            [("create_release_64k_data", 64usize << 10, 100), ("create_release_1m_data", 1 << 20, 20)]
        {
            let contents = vec![7u8; len];
            bench.measure(name, Throughput::None, ops, |n| {
                for _ in 0..n {
                    let flags = CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR;
                    let b = clCreateBuffer(ctx, flags, contents.len(), contents.as_ptr() as *mut c_void, &mut err);
                    check("clCreateBuffer", err);
                    check("clReleaseMemObject", clReleaseMemObject(b));
                }
            });
        }
        let mut v = 0i32;
        let set_args = |v: i32| {
            check(
                "clSetKernelArg",
                clSetKernelArg(kernel, 0, std::mem::size_of::<Handle>(), (&small as *const Handle).cast()),
            );
            check("clSetKernelArg", clSetKernelArg(kernel, 1, 4, (&v as *const i32).cast()));
        };
        bench.measure("set_kernel_arg", Throughput::None, 1000, |n| {
            for _ in 0..n {
                v += 1;
                set_args(v);
            }
        });
        set_args(0);
        let one = 1usize;
        let enqueue = || {
            check(
                "clEnqueueNDRangeKernel",
                clEnqueueNDRangeKernel(q, kernel, 1, null(), &one, null(), 0, null(), null_mut()),
            );
        };
        let stream = if bench.plan.quick { 2_000 } else { 20_000 };
        bench.measure(&format!("enqueue_stream_{stream}"), Throughput::Ops, stream, |n| {
            for _ in 0..n {
                enqueue();
            }
            check("clFinish", clFinish(q));
        });
        bench.measure("enqueue_finish_roundtrip", Throughput::None, 10, |n| {
            for _ in 0..n {
                enqueue();
                check("clFinish", clFinish(q));
            }
        });
        // A command whose completion the application hears of by a callback, then waits for, up
        // to the callback having run: what a framework that tracks each command this way pays
        // (the cage delivers the driver's callback from the worker). OpenCL does not promise
        // that the callback has run when the wait returns, and NVIDIA's runs about 10 us after
        // it (`tools/measure/cblat.c`): without the spin below the direct run counted less
        // work than the caged one, whose wait returns once the callback ran.
        let mut asked = 0;
        let heard = || CALLBACKS.load(std::sync::atomic::Ordering::Acquire);
        bench.measure("event_callback", Throughput::None, 10, |n| {
            for _ in 0..n {
                let mut ev: Handle = null_mut();
                check("clEnqueueMarkerWithWaitList", clEnqueueMarkerWithWaitList(q, 0, null(), &mut ev));
                check("clSetEventCallback", clSetEventCallback(ev, CL_COMPLETE, count_callback, null_mut()));
                check("clWaitForEvents", clWaitForEvents(1, &ev));
                asked += 1;
                let deadline = Instant::now() + Duration::from_secs(5);
                while heard() < asked && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                if heard() < asked {
                    eprintln!("event_callback: the callback of command {asked} did not run within 5 s of its wait");
                    std::process::exit(1);
                }
                check("clReleaseEvent", clReleaseEvent(ev));
            }
        });
        check("clFinish", clFinish(q));
        // Every command heard of once: none twice.
        let heard = heard();
        if heard != asked {
            eprintln!("event_callback: {heard} callbacks ran for {asked} commands");
            std::process::exit(1);
        }
        for (label, size, ops) in [("4k", 4usize << 10, 50), ("1m", 1 << 20, 10), ("64m", 64 << 20, 1)] {
            let names = ["write_", "read_", "map_read_", "map_write_"].map(|op| format!("{op}{label}"));
            if !names.iter().any(|n| bench.wanted(n) || bench.wanted(&format!("{n}_nb"))) {
                continue;
            }
            let (buf, mut host) = written_buffer(ctx, q, size);
            for (blocking, suffix) in [(CL_TRUE, ""), (CL_FALSE, "_nb")] {
                // Non-blocking: `ops` enqueues, then one clFinish waits for them all.
                let nb_ops = if blocking == CL_TRUE { ops } else { ops.max(2) };
                for (write, op, entry) in
                    [(true, "write", "clEnqueueWriteBuffer"), (false, "read", "clEnqueueReadBuffer")]
                {
                    bench.measure(&format!("{op}_{label}{suffix}"), Throughput::Bytes(size), nb_ops, |n| {
                        for _ in 0..n {
                            check(entry, transfer(q, buf, write, blocking, &mut host, null_mut()));
                        }
                        if blocking == CL_FALSE {
                            check("clFinish", clFinish(q));
                        }
                    });
                }
            }
            if size != 64 << 20 {
                check("clReleaseMemObject", clReleaseMemObject(buf));
                continue;
            }
            // Maps: a blocking map of the whole buffer, the application touching every page
            // (reading one word of each, or writing one), the unmap, and a clFinish.
            let map = |flags: u64, touch: &mut dyn FnMut(&mut [u8])| {
                let mut err = 0;
                let p = clEnqueueMapBuffer(q, buf, CL_TRUE, flags, 0, size, 0, null(), null_mut(), &mut err);
                check("clEnqueueMapBuffer", err);
                touch(std::slice::from_raw_parts_mut(p.cast::<u8>(), size));
                check("clEnqueueUnmapMemObject", clEnqueueUnmapMemObject(q, buf, p, 0, null(), null_mut()));
                check("clFinish", clFinish(q));
            };
            let mut sum = 0u64;
            bench.measure("map_read_64m", Throughput::Bytes(size), 1, |n| {
                for _ in 0..n {
                    map(CL_MAP_READ, &mut |bytes| {
                        sum = bytes.iter().step_by(PAGE).fold(sum, |s, &b| s.wrapping_add(b as u64));
                    });
                }
            });
            std::hint::black_box(sum);
            let mut stamp = 0u8;
            bench.measure("map_write_64m", Throughput::Bytes(size), 1, |n| {
                for _ in 0..n {
                    stamp = stamp.wrapping_add(1);
                    map(CL_MAP_WRITE_INVALIDATE_REGION, &mut |bytes| {
                        bytes.iter_mut().step_by(PAGE).for_each(|b| *b = stamp);
                    });
                }
            });
            check("clReleaseMemObject", clReleaseMemObject(buf));
        }
        // Non-blocking transfers past 64 MiB, as clpeak's (two back to back, then one clFinish):
        // the cage makes each in the call where its queue is idle, pipelined through pooled
        // segments; posted, each would take a shared segment of its own size, created for that
        // call. The 64 MiB rows take the pooled way, so they did not show when every one went
        // the posted way (f3c0d62). No target.
        if bench.wanted("write_128m_nb") || bench.wanted("read_128m_nb") {
            let size = 128usize << 20;
            let (buf, mut host) = written_buffer(ctx, q, size);
            for write in [true, false] {
                let name = if write { "write_128m_nb" } else { "read_128m_nb" };
                bench.measure(name, Throughput::Bytes(size), 2, |n| {
                    for _ in 0..n {
                        check(name, transfer(q, buf, write, CL_FALSE, &mut host, null_mut()));
                    }
                    check("clFinish", clFinish(q));
                });
            }
            check("clReleaseMemObject", clReleaseMemObject(buf));
        }
        // Blocking 1 MiB and 16 MiB transfers that each ask for their event, as pyopencl's do,
        // and release it: the cage takes another way for a transfer with an event (its event
        // must be the transfer's, complete when the call returns).
        for (label, size) in [("1m", 1usize << 20), ("16m", 16 << 20)] {
            let (write_name, read_name) = (format!("write_{label}_event"), format!("read_{label}_event"));
            if !bench.wanted(&write_name) && !bench.wanted(&read_name) {
                continue;
            }
            let (buf, mut host) = written_buffer(ctx, q, size);
            for write in [true, false] {
                let name = if write { write_name.as_str() } else { read_name.as_str() };
                let ops = if size < (4 << 20) { 10 } else { 1 };
                bench.measure(name, Throughput::Bytes(size), ops, |n| {
                    for _ in 0..n {
                        let mut ev: Handle = null_mut();
                        check(name, transfer(q, buf, write, CL_TRUE, &mut host, &mut ev));
                        check("clReleaseEvent", clReleaseEvent(ev));
                    }
                });
            }
            check("clReleaseMemObject", clReleaseMemObject(buf));
        }
        // A kernel rewriting all of a 64 MiB buffer, then clFinish: what recovery costs an
        // application that rewrites its working set between waits. Then the same kernel on one
        // item: a short kernel whose argument is a large buffer (replay's copy of it spaces the
        // checkpoints, so the journal grows long between them, and a clFinish must not cost
        // more for that).
        if bench.wanted("kernel_finish_64m") || bench.wanted("roundtrip_64m_arg") {
            let size = 64usize << 20;
            let buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, null_mut(), &mut err);
            check("clCreateBuffer", err);
            let fill = clCreateKernel(prog, c"fill".as_ptr(), &mut err);
            check("clCreateKernel", err);
            check(
                "clSetKernelArg",
                clSetKernelArg(fill, 0, std::mem::size_of::<Handle>(), (&buf as *const Handle).cast()),
            );
            let items = size / 4;
            let mut value = 0i32;
            let mut run = |name: &str, throughput: Throughput, ops: usize, items: usize| {
                bench.measure(name, throughput, ops, |n| {
                    for _ in 0..n {
                        value += 1;
                        check("clSetKernelArg", clSetKernelArg(fill, 1, 4, (&value as *const i32).cast()));
                        check(
                            "clEnqueueNDRangeKernel",
                            clEnqueueNDRangeKernel(q, fill, 1, null(), &items, null(), 0, null(), null_mut()),
                        );
                        check("clFinish", clFinish(q));
                    }
                })
            };
            run("kernel_finish_64m", Throughput::Bytes(size), 1, items);
            run("roundtrip_64m_arg", Throughput::None, 10, 1);
            check("clReleaseKernel", clReleaseKernel(fill));
            check("clReleaseMemObject", clReleaseMemObject(buf));
        }
        let out = serde_json::json!({
            "device": device_name,
            "platform": platform_name,
            "host_unified": host_unified,
            "quick": bench.plan.quick,
            "rounds": bench.plan.rounds,
            "results": bench.results,
        });
        match bench.plan.lockstep {
            true => println!("{}", lockstep::result_line(&out.to_string())),
            false => println!("{out}"),
        }
    }
}
