//! The benchmark client `cloister bench` runs twice, directly on the driver and through the cage.
//! It uses plain OpenCL through the system's `libOpenCL`, so both runs execute the same code.
//! Prints one JSON object: the device and one result per workload.

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
}

const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
const CL_DEVICE_NAME: u32 = 0x102B;
const CL_PLATFORM_NAME: u32 = 0x0902;
const CL_MEM_READ_WRITE: u64 = 1;
const CL_MAP_READ: u64 = 1;
const CL_MAP_WRITE: u64 = 2;

fn check(what: &str, rc: cl_int) {
    if rc != 0 {
        eprintln!("cloister-bench-client: {what} failed: {rc}");
        std::process::exit(1);
    }
}

struct Bench {
    budget: Duration,
    results: Vec<serde_json::Value>,
}

impl Bench {
    /// Runs `op` in batches for the time budget; records the median time per op of the batches.
    fn run(&mut self, name: &str, bytes: Option<usize>, batch: usize, mut op: impl FnMut()) {
        for _ in 0..batch.min(8) {
            op(); // warm up
        }
        let mut per_op = Vec::new();
        let start = Instant::now();
        while per_op.len() < 3 || (start.elapsed() < self.budget && per_op.len() < 200) {
            let t = Instant::now();
            for _ in 0..batch {
                op();
            }
            per_op.push(t.elapsed().as_secs_f64() / batch as f64);
        }
        per_op.sort_by(f64::total_cmp);
        let median = per_op[per_op.len() / 2];
        let (unit, value) = if median < 1e-4 { ("ns/op", median * 1e9) } else { ("us/op", median * 1e6) };
        let mut r = serde_json::json!({ "name": name, "unit": unit, "value": value, "ops": per_op.len() * batch });
        if let Some(b) = bytes {
            r["bytes_per_op"] = b.into();
            r["gb_per_s"] = (b as f64 / median / 1e9).into();
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut bench = Bench { budget: Duration::from_millis(if quick { 50 } else { 400 }), results: Vec::new() };
    // SAFETY (whole function): plain OpenCL calls with valid pointers to locals; every return
    // code is checked before the results are used.
    unsafe {
        let t = Instant::now();
        let mut platform: Handle = null_mut();
        check("clGetPlatformIDs", clGetPlatformIDs(1, &mut platform, null_mut()));
        let mut device: Handle = null_mut();
        check("clGetDeviceIDs", clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &mut device, null_mut()));
        let init = t.elapsed();
        bench.results.push(serde_json::json!({ "name": "platform_init", "unit": "us/op", "value": init.as_secs_f64() * 1e6, "ops": 1 }));
        let device_name = info_string(|s, v, r| clGetDeviceInfo(device, CL_DEVICE_NAME, s, v, r));
        let platform_name = info_string(|s, v, r| clGetPlatformInfo(platform, CL_PLATFORM_NAME, s, v, r));

        let mut err = 0;
        let ctx = clCreateContext(null(), 1, &device, null_mut(), null_mut(), &mut err);
        check("clCreateContext", err);
        let q = clCreateCommandQueueWithProperties(ctx, device, null(), &mut err);
        check("clCreateCommandQueue", err);
        let src = b"__kernel void empty(__global int *a, int b) { }\0";
        let srcp = src.as_ptr();
        let prog = clCreateProgramWithSource(ctx, 1, &srcp, null(), &mut err);
        check("clCreateProgramWithSource", err);
        check("clBuildProgram", clBuildProgram(prog, 1, &device, null(), null_mut(), null_mut()));
        let kernel = clCreateKernel(prog, c"empty".as_ptr(), &mut err);
        check("clCreateKernel", err);
        let small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, null_mut(), &mut err);
        check("clCreateBuffer", err);

        let mut name = [0u8; 256];
        bench.run("info_query", None, 1000, || {
            check(
                "clGetDeviceInfo",
                clGetDeviceInfo(device, CL_DEVICE_NAME, name.len(), name.as_mut_ptr().cast(), null_mut()),
            );
        });
        let mut v = 0i32;
        bench.run("set_kernel_arg", None, 1000, || {
            v += 1;
            check(
                "clSetKernelArg",
                clSetKernelArg(kernel, 0, std::mem::size_of::<Handle>(), (&small as *const Handle).cast()),
            );
            check("clSetKernelArg", clSetKernelArg(kernel, 1, 4, (&v as *const i32).cast()));
        });
        let one = 1usize;
        bench.run("enqueue_empty_kernel", None, 200, || {
            check(
                "clEnqueueNDRangeKernel",
                clEnqueueNDRangeKernel(q, kernel, 1, null(), &one, null(), 0, null(), null_mut()),
            );
        });
        check("clFinish", clFinish(q));
        bench.run("enqueue_finish_roundtrip", None, 20, || {
            check(
                "clEnqueueNDRangeKernel",
                clEnqueueNDRangeKernel(q, kernel, 1, null(), &one, null(), 0, null(), null_mut()),
            );
            check("clFinish", clFinish(q));
        });
        for (label, size) in [("4k", 4usize << 10), ("1m", 1 << 20), ("64m", 64 << 20)] {
            let buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, null_mut(), &mut err);
            check("clCreateBuffer", err);
            let mut host = vec![1u8; size];
            let batch = if size > 1 << 20 { 1 } else { 20 };
            bench.run(&format!("write_{label}"), Some(size), batch, || {
                check(
                    "clEnqueueWriteBuffer",
                    clEnqueueWriteBuffer(q, buf, 1, 0, size, host.as_ptr().cast(), 0, null(), null_mut()),
                );
            });
            bench.run(&format!("read_{label}"), Some(size), batch, || {
                check(
                    "clEnqueueReadBuffer",
                    clEnqueueReadBuffer(q, buf, 1, 0, size, host.as_mut_ptr().cast(), 0, null(), null_mut()),
                );
            });
            if size == 64 << 20 {
                bench.run("map_unmap_64m", Some(size), 1, || {
                    let p = clEnqueueMapBuffer(
                        q,
                        buf,
                        1,
                        CL_MAP_READ | CL_MAP_WRITE,
                        0,
                        size,
                        0,
                        null(),
                        null_mut(),
                        &mut err,
                    );
                    check("clEnqueueMapBuffer", err);
                    let bytes = std::slice::from_raw_parts_mut(p.cast::<u8>(), size);
                    for page in bytes.chunks_mut(4096) {
                        page[0] = page[0].wrapping_add(1);
                    }
                    check("clEnqueueUnmapMemObject", clEnqueueUnmapMemObject(q, buf, p, 0, null(), null_mut()));
                    check("clFinish", clFinish(q));
                });
            }
        }
        let out = serde_json::json!({ "device": device_name, "platform": platform_name, "results": bench.results });
        println!("{out}");
    }
}
