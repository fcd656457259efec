//! The `shim_replies` fuzz target's body: the shim's own code (its real entry points, `Conn`,
//! lanes and notifier thread) against an in-process scripted hostile worker. The input is split
//! into the application's plan (which entry points it calls, with which sizes) and the
//! worker's script (its welcome, each reply, and notifications it sends between replies).
//! Every buffer the application hands over is surrounded by guard bytes, checked after each
//! call: the shim must never write application memory outside what it declared (issue 11,
//! class 1), nor run a callback of an object it released (class 3). No process is spawned; the
//! worker is a thread on one end of a real socket pair, serving a real lane.

use std::ffi::{c_char, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::lane::{Lane, LANE_BYTES};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::*;

use crate::api;
use crate::conn::Conn;

/// Bytes read in order; zeros once exhausted.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }

    /// Mostly success, sometimes an error code.
    fn status(&mut self) -> i32 {
        match self.byte() {
            b if b < 192 => CL_SUCCESS,
            b => -i32::from(b - 191),
        }
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs one input.
pub fn shim_replies(data: &[u8]) {
    // Warnings for every fault would drown the fuzzer's output.
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::env::set_var("CLOISTER_QUIET", "1"));
    let Some((&plan_len, rest)) = data.split_first() else { return };
    let (plan, script) = rest.split_at((plan_len as usize % 48).min(rest.len()));
    let Ok((app_end, worker_end)) = channel::seqpacket_pair() else { return };
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (script, stop) = (script.to_vec(), stop.clone());
        std::thread::spawn(move || scripted_worker(worker_end, &script, &stop))
    };
    if let Ok(conn) = Conn::connect(app_end, "fuzz", None, &crate::runtime::LAYERS) {
        let mut app = App::new(&conn);
        let mut plan = Script(plan);
        while !plan.done() {
            app.step(&mut plan);
        }
        app.finish();
        stop.store(true, Ordering::SeqCst);
        conn.hang_up();
        // The notifier sees the hang-up, runs the death handling and wakes the lanes.
        while !conn.is_dead() {
            std::thread::yield_now();
        }
        crate::handle::forget_worker(&conn);
    }
    stop.store(true, Ordering::SeqCst);
    let _ = worker.join();
}

fn scripted_worker(sock: OwnedFd, script: &[u8], stop: &AtomicBool) {
    let mut s = Script(script);
    let Ok((ShimMessage::Hello(_), _)) = channel::recv::<ShimMessage>(&sock) else { return };
    let welcome = match s.byte() % 4 {
        // Raw bytes for a welcome.
        0 => {
            let n = s.byte() as usize;
            let bytes = s.take(n);
            let _ = channel::send_raw(sock.as_raw_fd(), &bytes, &[]);
            None
        }
        // Lists of the script's choosing (lengths, ids, platforms).
        1 => {
            let platforms = (0..s.u16() % 64).map(|i| WORKER_ID_BIT | u64::from(i % 8)).collect();
            let devices = (0..s.u16() % 2048)
                .map(|i| Enumerated {
                    id: WORKER_ID_BIT | 0x100 | u64::from(i),
                    platform: WORKER_ID_BIT | u64::from(i % 3),
                })
                .collect();
            Some((platforms, devices))
        }
        _ => Some((vec![WORKER_ID_BIT], vec![Enumerated { id: WORKER_ID_BIT | 1, platform: WORKER_ID_BIT }])),
    };
    if let Some((platforms, devices)) = welcome {
        let msg = WorkerMessage::Welcome {
            version: handshake::PROTOCOL_VERSION,
            driver: "fuzz".into(),
            profile: "none".into(),
            layers: vec![],
            platforms,
            devices,
        };
        if channel::send(&sock, &msg, &[]).is_err() {
            return;
        }
    }
    // Every lane gets a thread (the application's, and the notifier's when a callback makes
    // a call), all reading the one script; segments are kept but never looked at.
    let script = std::sync::Mutex::new(s);
    let dead = AtomicBool::new(false);
    std::thread::scope(|scope| {
        while let Ok((msg, mut fds)) = channel::recv::<ShimMessage>(&sock) {
            if let (ShimMessage::NewLane { .. }, Some(fd)) = (msg, fds.pop()) {
                let Ok(lane) = SharedRegion::from_fd(fd, LANE_BYTES).and_then(Lane::from_region) else { break };
                let (script, dead, sock) = (&script, &dead, &sock);
                scope.spawn(move || serve(&lane, script, sock, stop, dead));
            }
        }
        dead.store(true, Ordering::SeqCst);
    });
}

/// Answers one lane from the script until it runs out: then the worker "dies" (the shim sees
/// its socket close).
fn serve(lane: &Lane, script: &std::sync::Mutex<Script>, sock: &OwnedFd, stop: &AtomicBool, dead: &AtomicBool) {
    let alive = || !stop.load(Ordering::SeqCst) && !dead.load(Ordering::SeqCst);
    while let Ok(request) = lane.wait_request(&alive) {
        let mut s = script.lock().unwrap_or_else(|e| e.into_inner());
        if s.done() {
            break;
        }
        // Notifications the driver sends on its own time, before this reply.
        while !s.done() && s.byte().is_multiple_of(4) {
            let n = match s.byte() % 5 {
                0 => Notification::EventStatus { token: u64::from(s.byte() % 32), status: s.status() },
                4 => Notification::SlabIdle { segment: u64::from(s.byte()) },
                3 => Notification::LateError {
                    token: u64::from(s.byte() % 32),
                    op: u32::from(s.byte()),
                    code: s.status(),
                },
                1 => Notification::ContextError {
                    token: u64::from(s.byte() % 32),
                    errinfo: String::from_utf8_lossy(&s.take(8)).into_owned(),
                    private_info: {
                        let n = s.byte() as usize;
                        s.take(n)
                    },
                },
                _ => Notification::BuildDone { token: u64::from(s.byte() % 32) },
            };
            let _ = channel::send(sock, &WorkerMessage::Notify(n), &[]);
        }
        let Ok(Frame::Inline(RawBytes(request))) = spill::decode(&request) else { break };
        let Ok(req) = decode_request(request) else { break };
        // A build whose callback the driver called: the worker sends it before the reply (a
        // build callback announced and never sent is class 4's deadline, not this target's).
        let (reply, sent) = build_reply(&req, &mut s).unwrap_or_else(|| (reply_to(req, &mut s), None));
        drop(s);
        if let Some(token) = sent {
            let _ = channel::send(sock, &WorkerMessage::Notify(Notification::BuildDone { token }), &[]);
        }
        if lane.post_reply(&spill::inline(&reply)).is_err() {
            break;
        }
    }
    dead.store(true, Ordering::SeqCst);
    // SAFETY: shutdown on the worker's socket, open for the whole scope.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
}

macro_rules! enc {
    ($v:expr) => {
        postcard::to_allocvec(&$v).unwrap_or_default()
    };
}

/// A reply to `req`: raw bytes now and then, else the right type with fields of the script's
/// choosing (lengths, counts and pitches included).
fn reply_to(req: Request, s: &mut Script) -> Vec<u8> {
    if s.byte().is_multiple_of(16) {
        let n = s.byte() as usize;
        return s.take(n);
    }
    let value = |s: &mut Script| {
        let n = s.byte() as usize;
        s.take(n)
    };
    match req {
        Request::GetInfo(_) | Request::GetKernelSubGroupInfo(_) => {
            enc!(InfoReply { status: s.status(), value_status: s.status(), value: value(s) })
        }
        Request::GetDeviceIds(_) => {
            enc!(IdsReply {
                status: s.status(),
                ids: (0..s.byte() % 8).map(|_| u64::from(s.byte()) | WORKER_ID_BIT).collect()
            })
        }
        Request::CreateProgramWithBinary(_) => {
            enc!(StatusesReply { status: s.status(), statuses: (0..s.byte() % 8).map(|_| s.status()).collect() })
        }
        Request::GetProgramBinaries(_) => {
            let binaries = (0..s.byte() % 4).map(|_| vec![0xEE; usize::from(s.u16())]).collect();
            enc!(BinariesReply { status: s.status(), binaries })
        }
        Request::CreateKernel(_) => enc!(KernelReply { status: s.status(), num_args: s.u32() }),
        Request::CreateKernelsInProgram(_) => {
            let count = u32::from(s.byte() % 16);
            enc!(KernelsReply { status: s.status(), count, num_args: (0..s.byte() % 16).map(|_| s.u32()).collect() })
        }
        Request::CreateSubDevices(_) => enc!(CountReply { status: s.status(), count: s.u32() % 64 }),
        Request::GetSupportedImageFormats(_) => {
            enc!(FormatsReply { status: s.status(), formats: (0..s.byte() % 64).map(|_| (s.u32(), s.u32())).collect() })
        }
        Request::EnqueueMapImage(_) => {
            enc!(MapImageReply { status: s.status(), row_pitch: s.u64(), slice_pitch: s.u64() })
        }
        Request::GetTimers(_) => {
            enc!(TimersReply { status: s.status(), device_timestamp: s.u64(), host_timestamp: s.u64() })
        }
        Request::RecordCommand(_) => enc!(SyncPointReply { status: s.status(), sync_point: s.u32() }),
        // Any count (the shim checks it against what it asked) and any status or times.
        Request::EventStatuses(_) => {
            enc!(StatusesReply { status: s.status(), statuses: (0..s.byte() % 8).map(|_| s.status()).collect() })
        }
        Request::EventProfiles(_) => {
            let profiles = (0..s.byte() % 8)
                .map(|_| EventProfile {
                    status: s.status(),
                    times: s.byte().is_multiple_of(2).then(|| (s.u64(), s.u64())),
                })
                .collect();
            enc!(ProfilesReply { status: s.status(), profiles })
        }
        _ => enc!(s.status()),
    }
}

/// The reply to a build, compile or link, and the callback token the worker announces as
/// sent (it sends that `BuildDone` first).
fn build_reply(req: &Request, s: &mut Script) -> Option<(Vec<u8>, Option<u64>)> {
    let notify = match req {
        Request::BuildProgram(r) => r.notify,
        Request::CompileProgram(r) => r.notify,
        Request::LinkProgram(r) => r.notify,
        _ => return None,
    };
    let (status, created) = (s.status(), !s.byte().is_multiple_of(4));
    let sent = notify.filter(|_| s.byte().is_multiple_of(2) && (created || !matches!(req, Request::LinkProgram(_))));
    let callback_sent = sent.is_some();
    let reply = match req {
        Request::LinkProgram(_) => enc!(CreatedReply { status, created, callback_sent }),
        _ => enc!(BuildReply { status, callback_sent }),
    };
    Some((reply, sent))
}

/// Application memory of `len` bytes between guard bytes.
struct Guarded {
    buf: Vec<u8>,
    len: usize,
}

const SLACK: usize = 256;
const GUARD: u8 = 0xC5;

impl Guarded {
    fn new(len: usize) -> Self {
        let mut buf = vec![GUARD; len + 2 * SLACK];
        buf[SLACK..SLACK + len].fill(0);
        Guarded { buf, len }
    }

    fn ptr(&mut self) -> *mut c_void {
        self.buf[SLACK..].as_mut_ptr().cast()
    }

    fn contains(&self, p: usize, n: usize) -> bool {
        let base = self.buf[SLACK..].as_ptr() as usize;
        p >= base && p.checked_add(n).is_some_and(|end| end <= base + self.len)
    }

    fn check(&self, what: &str) {
        let (head, rest) = self.buf.split_at(SLACK);
        let tail = &rest[self.len..];
        assert!(
            head.iter().chain(tail).all(|&b| b == GUARD),
            "{what}: the shim wrote outside the application's {} bytes",
            self.len
        );
    }
}

/// What a context callback may look at: `released` is set once the application released it.
struct Notified {
    released: AtomicBool,
}

unsafe extern "C" fn context_notify(_: *const c_char, _: *const c_void, _: usize, user_data: *mut c_void) {
    // SAFETY: user_data is the `Notified` the harness registered, kept allocated for the check.
    let n = unsafe { &*(user_data as *const Notified) };
    assert!(!n.released.load(Ordering::SeqCst), "a released context's callback ran");
}

unsafe extern "C" fn build_notify(_: cl_program, _: *mut c_void) {}

unsafe extern "C" fn event_notify(_: cl_event, _: cl_int, _: *mut c_void) {}

/// Parameters of every value kind: strings, words, sizes, arrays, bitfields, handles.
const DEVICE_PARAMS: &[u32] = &[
    CL_DEVICE_NAME,
    CL_DEVICE_TYPE,
    0x1002, // MAX_COMPUTE_UNITS
    0x1005, // MAX_WORK_ITEM_SIZES
    0x101F, // GLOBAL_MEM_SIZE
    CL_DEVICE_PLATFORM,
    0x1030, // EXTENSIONS
    0x1029, // EXECUTION_CAPABILITIES
    0x1053, // SVM_CAPABILITIES
    0x1060, // EXTENSIONS_WITH_VERSION
    0x1044, // PARTITION_PROPERTIES
    CL_DEVICE_AVAILABLE,
];
const PLATFORM_PARAMS: &[u32] = &[CL_PLATFORM_NAME, CL_PLATFORM_VERSION, CL_PLATFORM_EXTENSIONS, 0x0907];

/// The application: what it created, and the guarded memory it still lends the shim.
struct App {
    platform: *mut c_void,
    device: *mut c_void,
    contexts: Vec<(*mut c_void, Box<Notified>)>,
    /// Boxed: the shim holds their addresses as `user_data`.
    #[allow(clippy::vec_box)]
    released: Vec<Box<Notified>>,
    programs: Vec<*mut c_void>,
    /// `CL_MEM_USE_HOST_PTR` memory lives as long as its buffer (here: the whole input).
    host: Vec<(*mut c_void, Box<Guarded>)>,
    images: Vec<*mut c_void>,
    queue: *mut c_void,
}

impl App {
    fn new(conn: &Arc<Conn>) -> Self {
        let first = conn.platforms.get().and_then(|p| p.first()).cloned();
        let (platform, device) = match first {
            Some((p, d)) => (p as *mut c_void, d.first().map_or(std::ptr::null_mut(), |&d| d as *mut c_void)),
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        App {
            platform,
            device,
            contexts: Vec::new(),
            released: Vec::new(),
            programs: Vec::new(),
            host: Vec::new(),
            images: Vec::new(),
            queue: std::ptr::null_mut(),
        }
    }

    fn context(&self) -> *mut c_void {
        self.contexts.last().map_or(std::ptr::null_mut(), |c| c.0)
    }

    /// One entry point (or a few that belong together), chosen and sized by the plan.
    fn step(&mut self, p: &mut Script) {
        let mut err = 0;
        // SAFETY (every call below): the arguments follow each entry point's API contract;
        // buffers are `Guarded` memory of the sizes passed.
        unsafe {
            match p.byte() % 12 {
                0 => {
                    let param = DEVICE_PARAMS[p.byte() as usize % DEVICE_PARAMS.len()];
                    let mut g = Guarded::new(p.byte() as usize);
                    let mut ret = 0usize;
                    api::clGetDeviceInfo(self.device, param, g.len, g.ptr(), &mut ret);
                    g.check("clGetDeviceInfo");
                }
                1 => {
                    let param = PLATFORM_PARAMS[p.byte() as usize % PLATFORM_PARAMS.len()];
                    let mut g = Guarded::new(p.byte() as usize);
                    api::clGetPlatformInfo(self.platform, param, g.len, g.ptr(), std::ptr::null_mut());
                    g.check("clGetPlatformInfo");
                }
                2 => {
                    let n = Box::new(Notified { released: AtomicBool::new(false) });
                    let user = &*n as *const Notified as *mut c_void;
                    let devs = [self.device];
                    let ctx = api::clCreateContext(
                        std::ptr::null(),
                        1,
                        devs.as_ptr(),
                        context_notify as *mut c_void,
                        user,
                        &mut err,
                    );
                    if !ctx.is_null() {
                        self.contexts.push((ctx, n));
                        let mut g = Guarded::new(p.byte() as usize % 64);
                        api::clGetContextInfo(ctx, CL_CONTEXT_DEVICES, g.len, g.ptr(), std::ptr::null_mut());
                        g.check("clGetContextInfo");
                    }
                }
                3 => {
                    if let Some((ctx, n)) = self.contexts.pop() {
                        api::clReleaseContext(ctx);
                        n.released.store(true, Ordering::SeqCst);
                        self.released.push(n);
                    }
                }
                4 => self.program_binaries(p),
                5 => self.host_buffer(p),
                6 => self.image_map(p),
                7 => {
                    let Some(&prog) = self.programs.last() else { return };
                    let name = c"k";
                    let k = api::clCreateKernel(prog, name.as_ptr(), &mut err);
                    if !k.is_null() {
                        let v = 0u32;
                        api::clSetKernelArg(k, p.byte() as u32, 4, (&v as *const u32).cast());
                        api::clReleaseKernel(k);
                    }
                }
                8 => {
                    let Some(&prog) = self.programs.last() else { return };
                    let n = p.byte() as usize % 8;
                    let mut g = Guarded::new(n * 8);
                    let mut count = 0u32;
                    let out = if n == 0 { std::ptr::null_mut() } else { g.ptr().cast() };
                    if api::clCreateKernelsInProgram(prog, n as u32, out, &mut count) == CL_SUCCESS {
                        for i in 0..n.min(count as usize) {
                            let k = *(g.ptr() as *mut *mut c_void).add(i);
                            if !k.is_null() {
                                api::clReleaseKernel(k);
                            }
                        }
                    }
                    g.check("clCreateKernelsInProgram");
                }
                9 => {
                    let n = p.byte() as usize % 8;
                    let mut g = Guarded::new(n * 8);
                    let mut count = 0u32;
                    let _ = api::clGetSupportedImageFormats(
                        self.context(),
                        0,
                        CL_MEM_OBJECT_IMAGE2D,
                        n as u32,
                        g.ptr(),
                        &mut count,
                    );
                    g.check("clGetSupportedImageFormats");
                    let props = [0x1086isize /* PARTITION_EQUALLY */, 1, 0];
                    let mut d = Guarded::new(n * 8);
                    let out = if n == 0 { std::ptr::null_mut() } else { d.ptr().cast() };
                    if api::clCreateSubDevices(self.device, props.as_ptr(), n as u32, out, &mut count) == Ok(CL_SUCCESS)
                    {
                        for i in 0..n.min(count as usize) {
                            let sub = *(d.ptr() as *mut *mut c_void).add(i);
                            api::clReleaseDevice(sub);
                        }
                    }
                    d.check("clCreateSubDevices");
                }
                10 => {
                    let ev = api::clCreateUserEvent(self.context(), &mut err);
                    if !ev.is_null() {
                        let _ =
                            api::clSetEventCallback(ev, CL_COMPLETE, event_notify as *mut c_void, std::ptr::null_mut());
                        api::clReleaseEvent(ev);
                    }
                }
                _ => {
                    if self.queue.is_null() {
                        self.queue = api::clCreateCommandQueueWithProperties(
                            self.context(),
                            self.device,
                            std::ptr::null(),
                            &mut err,
                        );
                    } else {
                        api::clFinish(self.queue);
                    }
                }
            }
        }
    }

    /// A program built with a callback, then its binaries into buffers of the sizes told.
    fn program_binaries(&mut self, p: &mut Script) {
        let mut err = 0;
        // SAFETY: as in `step`.
        unsafe {
            let src = c"kernel void k(global int *o) { o[0] = 1; }";
            let strings = [src.as_ptr()];
            let prog = api::clCreateProgramWithSource(
                self.context(),
                1,
                strings.as_ptr().cast_mut(),
                std::ptr::null(),
                &mut err,
            );
            if prog.is_null() {
                return;
            }
            self.programs.push(prog);
            let notify = if p.byte().is_multiple_of(2) { build_notify as *mut c_void } else { std::ptr::null_mut() };
            let _ = api::clBuildProgram(prog, 0, std::ptr::null(), std::ptr::null(), notify, std::ptr::null_mut());
            let mut sizes = Guarded::new(64);
            let mut ret = 0usize;
            if api::clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, 64, sizes.ptr(), &mut ret) != CL_SUCCESS {
                sizes.check("CL_PROGRAM_BINARY_SIZES");
                return;
            }
            sizes.check("CL_PROGRAM_BINARY_SIZES");
            let told: Vec<usize> = (0..ret.min(64) / 8).map(|i| *(sizes.ptr() as *const usize).add(i)).collect();
            let mut bins: Vec<Guarded> = told.iter().map(|&n| Guarded::new(if n <= 1 << 16 { n } else { 0 })).collect();
            let mut ptrs: Vec<*mut u8> = bins
                .iter_mut()
                .zip(&told)
                .map(|(g, &n)| if n <= 1 << 16 { g.ptr().cast() } else { std::ptr::null_mut() })
                .collect();
            let mut array = Guarded::new(ptrs.len() * 8);
            std::ptr::copy_nonoverlapping(ptrs.as_mut_ptr().cast::<u8>(), array.ptr().cast(), ptrs.len() * 8);
            api::clGetProgramInfo(prog, CL_PROGRAM_BINARIES, array.len, array.ptr(), std::ptr::null_mut());
            array.check("CL_PROGRAM_BINARIES array");
            for b in &bins {
                b.check("CL_PROGRAM_BINARIES");
            }
        }
    }

    /// A `CL_MEM_USE_HOST_PTR` buffer: reads and maps of the plan's offsets and sizes.
    fn host_buffer(&mut self, p: &mut Script) {
        let mut err = 0;
        let len = 1 + p.byte() as usize;
        let mut host = Box::new(Guarded::new(len));
        // SAFETY: as in `step`; the host memory lives in `self.host` as long as the buffer.
        unsafe {
            let buf = api::clCreateBuffer(self.context(), CL_MEM_USE_HOST_PTR, len, host.ptr(), &mut err);
            if buf.is_null() {
                return;
            }
            let (offset, size) = (p.byte() as usize, 1 + p.byte() as usize);
            let mut dst = Guarded::new(size);
            let blocking = u32::from(p.byte() % 2);
            api::clEnqueueReadBuffer(
                self.queue,
                buf,
                blocking,
                offset,
                size,
                dst.ptr(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            );
            api::clFinish(self.queue);
            dst.check("clEnqueueReadBuffer");
            let m = api::clEnqueueMapBuffer(
                self.queue,
                buf,
                1,
                CL_MAP_WRITE,
                offset,
                size,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut err,
            );
            if !m.is_null() {
                // The application writes the bytes it mapped: they must be the host memory or a
                // mapping of their own.
                let own = host.contains(m as usize, size);
                assert!(own || !host.contains(m as usize, 1), "a mapping straddles the host memory's end");
                std::ptr::write_bytes(m.cast::<u8>(), 0x11, size);
                let _ = api::clEnqueueUnmapMemObject(self.queue, buf, m, 0, std::ptr::null(), std::ptr::null_mut());
            }
            host.check("CL_MEM_USE_HOST_PTR memory");
            self.host.push((buf, host));
        }
    }

    /// A 2D image mapped over the plan's region; the application writes every row at the
    /// pitch it is given.
    fn image_map(&mut self, p: &mut Script) {
        let mut err = 0;
        let (w, h) = (1 + p.byte() as usize % 8, 1 + p.byte() as usize % 8);
        let format = cl_image_format { image_channel_order: 0x10B5, image_channel_data_type: 0x10DA };
        let desc = cl_image_desc {
            image_type: CL_MEM_OBJECT_IMAGE2D,
            image_width: w,
            image_height: h,
            image_depth: 1,
            image_array_size: 0,
            image_row_pitch: 0,
            image_slice_pitch: 0,
            num_mip_levels: 0,
            num_samples: 0,
            buffer: std::ptr::null_mut(),
        };
        // SAFETY: as in `step`.
        unsafe {
            let img = api::clCreateImage(
                self.context(),
                0,
                (&format as *const cl_image_format).cast(),
                (&desc as *const cl_image_desc).cast(),
                std::ptr::null_mut(),
                &mut err,
            );
            if img.is_null() {
                return;
            }
            self.images.push(img);
            let origin = [0usize; 3];
            let region = [w, h, 1];
            let (mut row, mut slice) = (0usize, 0usize);
            let m = api::clEnqueueMapImage(
                self.queue,
                img,
                1,
                CL_MAP_WRITE,
                origin.as_ptr(),
                region.as_ptr(),
                &mut row,
                &mut slice,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut err,
            );
            if !m.is_null() {
                // The mapping is the packed rows: any other pitch writes past it.
                assert_eq!(row, w * 4, "a mapped image's row pitch is not its packed rows");
                for y in 0..h {
                    std::ptr::write_bytes(m.cast::<u8>().add(y * row), 0x22, w * 4);
                }
                let _ = api::clEnqueueUnmapMemObject(self.queue, img, m, 0, std::ptr::null(), std::ptr::null_mut());
            }
        }
    }

    /// Releases what is left; released contexts' records stay allocated until the worker is
    /// gone, so a late callback is caught by its flag, not by reading freed memory.
    fn finish(&mut self) {
        // SAFETY: each handle was created above and is released once.
        unsafe {
            for (buf, g) in self.host.drain(..) {
                api::clReleaseMemObject(buf);
                g.check("CL_MEM_USE_HOST_PTR memory");
            }
            for img in self.images.drain(..) {
                api::clReleaseMemObject(img);
            }
            for prog in self.programs.drain(..) {
                api::clReleaseProgram(prog);
            }
            if !self.queue.is_null() {
                api::clReleaseCommandQueue(self.queue);
            }
            for (ctx, n) in self.contexts.drain(..) {
                api::clReleaseContext(ctx);
                n.released.store(true, Ordering::SeqCst);
                self.released.push(n);
            }
        }
        // The notifier may still be running callbacks after this input ends: their records
        // stay (a few bytes each), so a late callback reads its flag, never freed memory.
        for n in self.released.drain(..) {
            Box::leak(n);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The committed `shim_replies` corpus (seeds and anything fuzzing found) replays on stable,
    /// with truncated variants.
    #[test]
    fn replays_the_shim_replies_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/shim_replies");
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
        assert!(!files.is_empty(), "empty corpus");
        for f in files {
            let data = std::fs::read(f.unwrap().path()).unwrap();
            super::shim_replies(&data);
            for cut in [1, 2, data.len() / 3, data.len() / 2] {
                super::shim_replies(&data[..cut.min(data.len())]);
            }
        }
    }
}
