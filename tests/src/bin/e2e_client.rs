//! An OpenCL application written with the `opencl3` crate, run directly and through the cage by
//! the end-to-end tests. `cloister-e2e-client SCENARIO` runs one scenario, checks every result
//! itself, prints `ok SCENARIO` and exits 0, or says what went wrong and exits 1.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use cl3::types::{cl_event, cl_int};
use opencl3::command_queue::{CommandQueue, CL_QUEUE_PROFILING_ENABLE};
use opencl3::context::Context;
use opencl3::device::{get_all_devices, Device, CL_DEVICE_TYPE_ALL};
use opencl3::kernel::{ExecuteKernel, Kernel};
use opencl3::memory::{
    Buffer, ClMem, CL_MEM_ALLOC_HOST_PTR, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE, CL_MEM_USE_HOST_PTR,
};
use opencl3::program::Program;
use opencl3::types::{CL_BLOCKING, CL_NON_BLOCKING};

type Res = Result<(), String>;

#[link(name = "OpenCL")]
extern "C" {
    fn clGetDeviceInfo(d: cl3::types::cl_device_id, p: u32, size: usize, v: *mut c_void, ret: *mut usize) -> cl_int;
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

fn e<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err:?}")
}

struct Env {
    device: Device,
    context: Context,
    queue: CommandQueue,
}

fn env() -> Result<Env, String> {
    let id = *get_all_devices(CL_DEVICE_TYPE_ALL).map_err(e("get_all_devices"))?.first().ok_or("no OpenCL device")?;
    let device = Device::new(id);
    let context = Context::from_device(&device).map_err(e("context"))?;
    // SAFETY: a valid context and device.
    let queue = unsafe { CommandQueue::create_with_properties(&context, id, CL_QUEUE_PROFILING_ENABLE, 0) }
        .map_err(e("queue"))?;
    Ok(Env { device, context, queue })
}

const SOURCE: &str = r#"
kernel void vadd(global const float *a, global const float *b, global float *c) {
    size_t i = get_global_id(0); c[i] = a[i] + b[i];
}
kernel void reduce(global const int *in, global int *partial, local int *scratch) {
    size_t l = get_local_id(0), n = get_local_size(0);
    scratch[l] = in[get_global_id(0)];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (size_t s = n / 2; s > 0; s >>= 1) {
        if (l < s) scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) partial[get_group_id(0)] = scratch[0];
}
kernel void scale(global int *x, int k) { size_t i = get_global_id(0); x[i] = x[i] * k + OFFSET; }
"#;

fn program(env: &Env) -> Result<Program, String> {
    Program::create_and_build_from_source(&env.context, SOURCE, "-DOFFSET=1").map_err(|log| format!("build: {log}"))
}

fn vecadd() -> Res {
    let env = env()?;
    let prog = program(&env)?;
    let k = Kernel::create(&prog, "vadd").map_err(e("kernel"))?;
    let n = 1 << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let mut c = vec![0f32; n];
    // SAFETY (block): buffers of n floats, host slices of n floats.
    unsafe {
        let mut ba = Buffer::<f32>::create(&env.context, CL_MEM_READ_WRITE, n, ptr::null_mut()).map_err(e("buffer"))?;
        let mut bb = Buffer::<f32>::create(&env.context, CL_MEM_READ_WRITE, n, ptr::null_mut()).map_err(e("buffer"))?;
        let bc = Buffer::<f32>::create(&env.context, CL_MEM_READ_WRITE, n, ptr::null_mut()).map_err(e("buffer"))?;
        env.queue.enqueue_write_buffer(&mut ba, CL_BLOCKING, 0, &a, &[]).map_err(e("write"))?;
        let wb = env.queue.enqueue_write_buffer(&mut bb, CL_NON_BLOCKING, 0, &b, &[]).map_err(e("write nb"))?;
        let ev = ExecuteKernel::new(&k)
            .set_arg(&ba)
            .set_arg(&bb)
            .set_arg(&bc)
            .set_global_work_size(n)
            .set_wait_event(&wb)
            .enqueue_nd_range(&env.queue)
            .map_err(e("enqueue"))?;
        let rd = env.queue.enqueue_read_buffer(&bc, CL_NON_BLOCKING, 0, &mut c, &[ev.get()]).map_err(e("read"))?;
        rd.wait().map_err(e("wait"))?;
        let (start, end) =
            (ev.profiling_command_start().map_err(e("prof"))?, ev.profiling_command_end().map_err(e("prof"))?);
        ensure!(end >= start && start > 0, "profiling: start {start} end {end}");
    }
    for i in 0..n {
        ensure!(c[i] == a[i] + b[i], "c[{i}] = {} != {}", c[i], a[i] + b[i]);
    }
    Ok(())
}

fn reduction() -> Res {
    let env = env()?;
    let prog = program(&env)?;
    let k = Kernel::create(&prog, "reduce").map_err(e("kernel"))?;
    let (n, wg) = (1 << 16, 64);
    let input: Vec<i32> = (0..n).map(|i| (i % 97) as i32).collect();
    let mut partial = vec![0i32; n / wg];
    // SAFETY (block): sizes match the buffers.
    unsafe {
        let bin = Buffer::<i32>::create(&env.context, CL_MEM_COPY_HOST_PTR, n, input.as_ptr() as *mut c_void)
            .map_err(e("buffer"))?;
        let bp =
            Buffer::<i32>::create(&env.context, CL_MEM_READ_WRITE, n / wg, ptr::null_mut()).map_err(e("buffer"))?;
        ExecuteKernel::new(&k)
            .set_arg(&bin)
            .set_arg(&bp)
            .set_arg_local_buffer(wg * 4)
            .set_global_work_size(n)
            .set_local_work_size(wg)
            .enqueue_nd_range(&env.queue)
            .map_err(e("enqueue"))?;
        env.queue.enqueue_read_buffer(&bp, CL_BLOCKING, 0, &mut partial, &[]).map_err(e("read"))?;
    }
    let got: i64 = partial.iter().map(|&x| x as i64).sum();
    let want: i64 = input.iter().map(|&x| x as i64).sum();
    ensure!(got == want, "sum {got} != {want}");
    Ok(())
}

fn many() -> Res {
    let env = env()?;
    let mut programs = Vec::new();
    for p in 0..16 {
        let src = format!("kernel void k{p}(global int *x) {{ x[get_global_id(0)] += {p}; }}");
        programs.push(
            Program::create_and_build_from_source(&env.context, &src, "").map_err(|l| format!("build {p}: {l}"))?,
        );
    }
    let n = 1024;
    let mut buffers = Vec::new();
    for b in 0..64 {
        let init = vec![b; n];
        // SAFETY: n ints copied from init.
        buffers.push(
            unsafe { Buffer::<i32>::create(&env.context, CL_MEM_COPY_HOST_PTR, n, init.as_ptr() as *mut c_void) }
                .map_err(e("buffer"))?,
        );
    }
    for (p, prog) in programs.iter().enumerate() {
        let k = Kernel::create(prog, &format!("k{p}")).map_err(e("kernel"))?;
        for buf in &buffers {
            // SAFETY: the kernel takes one buffer of n ints.
            unsafe { ExecuteKernel::new(&k).set_arg(buf).set_global_work_size(n).enqueue_nd_range(&env.queue) }
                .map_err(e("enqueue"))?;
        }
    }
    let added: i32 = (0..16).sum();
    for (b, buf) in buffers.iter().enumerate() {
        let mut out = vec![0i32; n];
        // SAFETY: n ints.
        unsafe { env.queue.enqueue_read_buffer(buf, CL_BLOCKING, 0, &mut out, &[]) }.map_err(e("read"))?;
        ensure!(out.iter().all(|&v| v == b as i32 + added), "buffer {b}: {:?}", &out[..4]);
    }
    Ok(())
}

static CALLBACKS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_complete(_ev: cl_event, status: cl_int, user_data: *mut c_void) {
    if status == 0 && user_data as usize == 0xC10 {
        CALLBACKS.fetch_add(1, Ordering::SeqCst);
    }
}

fn families() -> Res {
    let env = env()?;
    let dev = env.device.id();
    // Device info of every kind: strings, arrays, bitfields, scalars.
    ensure!(!env.device.name().map_err(e("name"))?.is_empty(), "empty device name");
    let sizes = env.device.max_work_item_sizes().map_err(e("sizes"))?;
    ensure!(sizes.len() == env.device.max_work_item_dimensions().map_err(e("dims"))? as usize, "work item sizes");
    ensure!(env.device.dev_type().map_err(e("type"))? != 0, "device type");
    // Context from type, queue with properties.
    let ctx2 =
        Context::from_device_type(CL_DEVICE_TYPE_ALL, &[], None, ptr::null_mut()).map_err(e("context from type"))?;
    ensure!(ctx2.num_devices() >= 1, "context from type has no device");
    let q2 = CommandQueue::create_default_with_properties(&env.context, CL_QUEUE_PROFILING_ENABLE, 0)
        .map_err(e("queue with properties"))?;
    // Build options are honoured, kernels all created, their info readable.
    let prog = program(&env)?;
    let kernels = opencl3::kernel::create_program_kernels(&prog).map_err(e("create all"))?;
    ensure!(kernels.len() == 3, "{} kernels", kernels.len());
    let scale = Kernel::create(&prog, "scale").map_err(e("kernel"))?;
    ensure!(
        scale.num_args().map_err(e("num args"))? == 2 && scale.function_name().map_err(e("fname"))? == "scale",
        "kernel info"
    );
    ensure!(scale.get_work_group_size(dev).map_err(e("wg size"))? >= 1, "work-group size");
    // USE_HOST_PTR: device results visible in the application's memory after a map and a read.
    let n = 4096;
    let mut host: Vec<i32> = (0..n as i32).collect();
    // SAFETY (block): host outlives the buffer; all sizes are n ints.
    unsafe {
        let use_buf = Buffer::<i32>::create(&env.context, CL_MEM_USE_HOST_PTR, n, host.as_mut_ptr() as *mut c_void)
            .map_err(e("use host ptr"))?;
        ExecuteKernel::new(&scale)
            .set_arg(&use_buf)
            .set_arg(&3i32)
            .set_global_work_size(n)
            .enqueue_nd_range(&q2)
            .map_err(e("enqueue"))?;
        q2.finish().map_err(e("finish"))?;
        let mut mapped: *mut c_void = ptr::null_mut();
        q2.enqueue_map_buffer(&use_buf, CL_BLOCKING, 1, 0, n * 4, &mut mapped, &[]).map_err(e("map"))?;
        ensure!(
            mapped == host.as_mut_ptr() as *mut c_void,
            "map of a USE_HOST_PTR buffer must return the host pointer"
        );
        ensure!(host[5] == 5 * 3 + 1, "host memory after map: {}", host[5]);
        q2.enqueue_unmap_mem_object(use_buf.get(), mapped, &[]).map_err(e("unmap"))?;
        // ALLOC_HOST_PTR, fill, copy, write through a map.
        let a = Buffer::<i32>::create(&env.context, CL_MEM_ALLOC_HOST_PTR, n, ptr::null_mut())
            .map_err(e("alloc host ptr"))?;
        let mut b = Buffer::<i32>::create(&env.context, CL_MEM_READ_WRITE, n, ptr::null_mut()).map_err(e("buffer"))?;
        env.queue.enqueue_fill_buffer(&mut b, &[7i32], 0, n * 4, &[]).map_err(e("fill"))?;
        let mut a_mut = a;
        env.queue.enqueue_copy_buffer(&b, &mut a_mut, 0, 0, n * 4, &[]).map_err(e("copy"))?;
        let mut m: *mut c_void = ptr::null_mut();
        env.queue.enqueue_map_buffer(&a_mut, CL_BLOCKING, 3, 0, n * 4, &mut m, &[]).map_err(e("map rw"))?;
        let s = std::slice::from_raw_parts_mut(m as *mut i32, n);
        ensure!(s.iter().all(|&v| v == 7), "fill+copy: {}", s[0]);
        s[10] = 1234;
        env.queue.enqueue_unmap_mem_object(a_mut.get(), m, &[]).map_err(e("unmap"))?;
        let mut out = vec![0i32; n];
        env.queue.enqueue_read_buffer(&a_mut, CL_BLOCKING, 0, &mut out, &[]).map_err(e("read"))?;
        ensure!(out[10] == 1234 && out[11] == 7, "write through map: {} {}", out[10], out[11]);
        // A user event gates work; markers and barriers; a callback fires once with user_data.
        let user = cl3::event::create_user_event(env.context.get()).map_err(e("user event"))?;
        let mut gated = vec![0i32; n];
        let rd =
            env.queue.enqueue_read_buffer(&a_mut, CL_NON_BLOCKING, 0, &mut gated, &[user]).map_err(e("gated read"))?;
        rd.set_callback(0, on_complete, 0xC10 as *mut c_void).map_err(e("callback"))?;
        let marker = env.queue.enqueue_marker_with_wait_list(&[rd.get()]).map_err(e("marker"))?;
        ensure!(rd.command_execution_status().map_err(e("status"))?.0 != 0, "read ran before its user event");
        cl3::event::set_user_event_status(user, 0).map_err(e("set user event"))?;
        marker.wait().map_err(e("marker wait"))?;
        ensure!(gated[10] == 1234, "gated non-blocking read landed {}", gated[10]);
        env.queue.enqueue_barrier_with_wait_list(&[]).map_err(e("barrier"))?;
        env.queue.flush().map_err(e("flush"))?;
        env.queue.finish().map_err(e("finish"))?;
        cl3::event::release_event(user).map_err(e("release user event"))?;
    }
    for _ in 0..100 {
        if CALLBACKS.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    ensure!(CALLBACKS.load(Ordering::SeqCst) == 1, "callback fired {} times", CALLBACKS.load(Ordering::SeqCst));
    // Reference counts follow retains and releases.
    let before = env.context.reference_count().map_err(e("refcount"))?;
    // SAFETY: a retain of a live context, undone right after.
    unsafe {
        cl3::context::retain_context(env.context.get()).map_err(e("retain"))?;
        ensure!(env.context.reference_count().map_err(e("refcount"))? == before + 1, "retain did not count");
        cl3::context::release_context(env.context.get()).map_err(e("release"))?;
    }
    ensure!(env.context.reference_count().map_err(e("refcount"))? == before, "release did not count");
    Ok(())
}

fn expect_err<T: std::fmt::Debug>(what: &str, r: Result<T, cl_int>, code: cl_int) -> Res {
    match r {
        Err(c) if c == code => Ok(()),
        other => Err(format!("{what}: expected {code}, got {other:?}")),
    }
}

fn errors() -> Res {
    let env = env()?;
    let bad = "kernel void broken(global int *x) { x[0] = ; }";
    match Program::create_and_build_from_source(&env.context, bad, "") {
        Ok(_) => return Err("a broken kernel built".into()),
        Err(log) => ensure!(log.contains("error"), "build log lacks the error: {log}"),
    }
    let prog = program(&env)?;
    expect_err("bad kernel name", cl3::kernel::create_kernel(prog.get(), c"nope"), -46)?;
    let k = Kernel::create(&prog, "scale").map_err(e("kernel"))?;
    // SAFETY: arg index out of range; the value pointer is valid for its size.
    expect_err("arg index", unsafe { cl3::kernel::set_kernel_arg(k.get(), 9, 4, (&1i32 as *const i32).cast()) }, -49)?;
    // SAFETY: a 16-byte buffer and a read past its end.
    unsafe {
        let buf = Buffer::<i32>::create(&env.context, CL_MEM_READ_WRITE, 4, ptr::null_mut()).map_err(e("buffer"))?;
        let mut out = [0i32; 8];
        let r = cl3::command_queue::enqueue_read_buffer(
            env.queue.get(),
            buf.get(),
            CL_BLOCKING,
            0,
            32,
            out.as_mut_ptr().cast(),
            0,
            ptr::null(),
        );
        expect_err("read past the end", r, -30)?;
    }
    // Too small a value buffer, and an unknown parameter.
    let mut small = [0u8; 2];
    // SAFETY: small holds 2 bytes, as passed.
    let rc =
        unsafe { clGetDeviceInfo(env.device.id(), 0x102B, small.len(), small.as_mut_ptr().cast(), ptr::null_mut()) };
    ensure!(rc == -30, "small param_value_size: {rc}");
    expect_err("unknown param", cl3::device::get_device_info(env.device.id(), 0x7FFF).map(|_| ()), -30)?;
    Ok(())
}

fn threads() -> Res {
    let env = env()?;
    let prog = program(&env)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (context, prog, dev) = (&env.context, &prog, env.device.id() as usize);
                s.spawn(move || -> Res {
                    // SAFETY: a queue on a live context and device.
                    let q =
                        unsafe { CommandQueue::create_with_properties(context, dev as _, 0, 0) }.map_err(e("queue"))?;
                    let k = Kernel::create(prog, "scale").map_err(e("kernel"))?;
                    let n = 2048;
                    for round in 0..50 {
                        let init: Vec<i32> = (0..n as i32).collect();
                        // SAFETY: n ints.
                        let buf = unsafe {
                            Buffer::<i32>::create(context, CL_MEM_COPY_HOST_PTR, n, init.as_ptr() as *mut c_void)
                        }
                        .map_err(e("buffer"))?;
                        let factor = t + round;
                        // SAFETY: kernel args match the kernel.
                        unsafe {
                            ExecuteKernel::new(&k)
                                .set_arg(&buf)
                                .set_arg(&factor)
                                .set_global_work_size(n)
                                .enqueue_nd_range(&q)
                        }
                        .map_err(e("enqueue"))?;
                        let mut out = vec![0i32; n];
                        // SAFETY: n ints.
                        unsafe { q.enqueue_read_buffer(&buf, CL_BLOCKING, 0, &mut out, &[]) }.map_err(e("read"))?;
                        ensure!(
                            out.iter().enumerate().all(|(i, &v)| v == i as i32 * factor + 1),
                            "thread {t} round {round}"
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| "a thread panicked".to_string())?)
    })
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let result = match scenario.as_str() {
        "vecadd" => vecadd(),
        "reduction" => reduction(),
        "many" => many(),
        "families" => families(),
        "errors" => errors(),
        "threads" => threads(),
        other => Err(format!("unknown scenario {other:?}: vecadd reduction many families errors threads")),
    };
    match result {
        Ok(()) => println!("ok {scenario}"),
        Err(msg) => {
            eprintln!("FAILED {scenario}: {msg}");
            std::process::exit(1);
        }
    }
}
