//! The default contexts `stddev`, `stdcpu`, `stdgpu`, `stdrpu`: made in the library's
//! constructor (or by the first call, for static links), shaped by the `STD*` environment
//! variables, torn down at exit. A context keeps one in-order queue per device and, per device,
//! the kernel and memory events that `clwait()` later waits for.

use crate::error::{check, Error, Res};
use crate::lock;
use opencl_sys::*;
use std::ffi::c_void;
use std::fs::File;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// The default contexts as C reads them: `extern CLCONTEXT* stddev;` (an `AtomicPtr` has the
/// layout of a pointer).
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static stddev: AtomicPtr<Context> = AtomicPtr::new(null_mut());
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static stdcpu: AtomicPtr<Context> = AtomicPtr::new(null_mut());
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static stdgpu: AtomicPtr<Context> = AtomicPtr::new(null_mut());
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static stdrpu: AtomicPtr<Context> = AtomicPtr::new(null_mut());

/// Runs at load (shared library, or a static link that pulls this object in), so that a C
/// program reading `stdgpu` before any call sees the context.
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

extern "C" fn constructor() {
    crate::error::guard("stdcl_init", (), || {
        ensure_init();
        Ok(())
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Dev,
    Cpu,
    Gpu,
    Rpu,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Dev, Kind::Cpu, Kind::Gpu, Kind::Rpu];

    fn env(self) -> &'static str {
        match self {
            Kind::Dev => "STDDEV",
            Kind::Cpu => "STDCPU",
            Kind::Gpu => "STDGPU",
            Kind::Rpu => "STDRPU",
        }
    }

    fn device_type(self) -> cl_device_type {
        match self {
            Kind::Dev => CL_DEVICE_TYPE_ALL,
            Kind::Cpu => CL_DEVICE_TYPE_CPU,
            Kind::Gpu => CL_DEVICE_TYPE_GPU,
            Kind::Rpu => CL_DEVICE_TYPE_ACCELERATOR,
        }
    }

    fn slot(self) -> &'static AtomicPtr<Context> {
        match self {
            Kind::Dev => &stddev,
            Kind::Cpu => &stdcpu,
            Kind::Gpu => &stdgpu,
            Kind::Rpu => &stdrpu,
        }
    }

    fn symbol(self) -> &'static std::ffi::CStr {
        match self {
            Kind::Dev => c"stddev",
            Kind::Cpu => c"stdcpu",
            Kind::Gpu => c"stdgpu",
            Kind::Rpu => c"stdrpu",
        }
    }
}

/// The events a device has outstanding, in the order they were made.
#[derive(Default)]
pub struct DevEvents {
    pub kernel: Vec<cl_event>,
    pub mem: Vec<cl_event>,
}

pub struct Context {
    pub ctx: cl_context,
    pub devices: Vec<cl_device_id>,
    pub queues: Vec<cl_command_queue>,
    pub events: Mutex<Vec<DevEvents>>,
    /// `-D __STDCL__ -D __CPU__ -D __POCL__`: the build options every program gets (the
    /// working folder's `-I` is added at build time).
    pub defines: String,
    live: AtomicBool,
    _locks: Vec<File>,
}

// SAFETY: OpenCL objects may be used from any thread (OpenCL 1.2, appendix A.2); the event lists
// are behind a mutex.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}
// SAFETY: an event list only holds handles, which OpenCL lets any thread use.
unsafe impl Send for DevEvents {}

/// Every live context, so that a pointer from C is checked before it is used.
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

pub fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The context behind a C pointer, or EINVAL.
pub fn lookup(cp: *mut Context) -> Res<&'static Context> {
    ensure_init();
    if cp.is_null() {
        return Err(Error::new(libc::EINVAL, "no context (NULL: is the context disabled or without devices?)"));
    }
    if !lock_ignoring_poison(&CONTEXTS).contains(&(cp as usize)) {
        return Err(Error::new(libc::EINVAL, format!("{cp:p} is not a STDCL context")));
    }
    // SAFETY: registered contexts are leaked boxes that are never freed.
    let c = unsafe { &*cp };
    if !c.live.load(Ordering::Acquire) {
        return Err(Error::new(libc::EINVAL, "the context was torn down (the program is exiting)"));
    }
    Ok(c)
}

impl Context {
    pub fn queue(&self, devnum: u32) -> Res<cl_command_queue> {
        self.queues.get(devnum as usize).copied().ok_or_else(|| {
            Error::new(libc::EINVAL, format!("device {devnum} out of range (the context has {})", self.queues.len()))
        })
    }

    pub fn events(&self) -> MutexGuard<'_, Vec<DevEvents>> {
        lock_ignoring_poison(&self.events)
    }
}

static INIT: Once = Once::new();

pub fn ensure_init() {
    INIT.call_once(|| {
        for kind in Kind::ALL {
            // A context that cannot be made is NULL, as when there are no such devices; the
            // reason is kept for clerror().
            if let Some(cp) = crate::error::guard("stdcl_init", None, || create(kind)) {
                lock_ignoring_poison(&CONTEXTS).push(cp as usize);
                publish(kind, cp);
            }
        }
        // SAFETY: registering a plain extern "C" fn with atexit.
        unsafe { libc::atexit(teardown) };
    });
}

/// Stores a default context where C reads it. A PIE or non-PIC executable that reads `stdgpu`
/// holds its own copy of the variable (a copy relocation), filled by the dynamic linker at load,
/// before the constructor ran. This library reaches its exported variables through the GOT, so
/// the store lands in that copy (checked: `seen` equals the slot); should a build ever bind
/// them locally, the copy the program reads is the one `dlsym` finds, and it is written too.
fn publish(kind: Kind, cp: *mut Context) {
    kind.slot().store(cp, Ordering::Release);
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope.
    let seen = unsafe { libc::dlsym(libc::RTLD_DEFAULT, kind.symbol().as_ptr()) };
    if !seen.is_null() && seen != kind.slot().as_ptr() as *mut c_void {
        // SAFETY: the symbol is this library's pointer-sized variable, copied into the
        // executable; writing a pointer there is what the dynamic linker did at load.
        unsafe { (seen as *mut *mut Context).write_volatile(cp) };
    }
}

fn env(kind: Kind, suffix: &str) -> Option<String> {
    std::env::var(format!("{}{suffix}", kind.env())).ok()
}

fn create(kind: Kind) -> Res<Option<*mut Context>> {
    if env(kind, "").is_some_and(|v| v.trim() == "0") {
        return Ok(None);
    }
    let want = env(kind, "_PLATFORM_NAME").map(|s| s.to_lowercase());
    let mut chosen = None;
    for p in platforms()? {
        let name = platform_info(p, CL_PLATFORM_NAME);
        if want.as_ref().is_some_and(|w| !name.to_lowercase().contains(w.as_str())) {
            continue;
        }
        let devs = devices(p, kind.device_type())?;
        if !devs.is_empty() {
            chosen = Some((p, name, devs));
            break;
        }
    }
    let Some((platform, name, devs)) = chosen else { return Ok(None) };
    let max = env(kind, "_MAX_NDEV").and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(usize::MAX);
    let mut locks = Vec::new();
    let picked: Vec<cl_device_id> = match env(kind, "_LOCK") {
        Some(id) => {
            let mut picked = Vec::new();
            for (i, d) in devs.iter().enumerate() {
                if picked.len() >= max {
                    break;
                }
                if let Some(f) = lock::try_lock(kind.env(), &id, i)? {
                    locks.push(f);
                    picked.push(*d);
                }
            }
            picked
        }
        None => devs.into_iter().take(max).collect(),
    };
    if picked.is_empty() {
        return Ok(None);
    }
    let props = [CL_CONTEXT_PLATFORM as cl_context_properties, platform as cl_context_properties, 0];
    let mut err = 0;
    // SAFETY: a zero-terminated property list and `picked.len()` device handles.
    let ctx = unsafe {
        clCreateContext(props.as_ptr(), picked.len() as cl_uint, picked.as_ptr(), None, null_mut(), &mut err)
    };
    check(err, "clCreateContext")?;
    let mut queues = Vec::new();
    for d in &picked {
        // SAFETY: a context and one of its devices; no properties.
        #[allow(deprecated)]
        let q = unsafe { clCreateCommandQueue(ctx, *d, 0, &mut err) };
        if let Err(e) = check(err, "clCreateCommandQueue") {
            for q in queues {
                // SAFETY: queues made above.
                unsafe { clReleaseCommandQueue(q) };
            }
            // SAFETY: the context made above.
            unsafe { clReleaseContext(ctx) };
            return Err(e);
        }
        queues.push(q);
    }
    let vendor = platform_info(platform, CL_PLATFORM_VENDOR);
    let defines = defines(&name, &vendor, &picked);
    let events = Mutex::new(picked.iter().map(|_| DevEvents::default()).collect());
    let c = Context { ctx, devices: picked, queues, events, defines, live: AtomicBool::new(true), _locks: locks };
    Ok(Some(Box::into_raw(Box::new(c))))
}

/// The default build options: `-D __STDCL__`, the device kind (`__CPU__`, `__GPU__`, `__RPU__`
/// when all devices are of one kind) and the vendor (`__POCL__`, `__NVIDIA__`, `__AMD__`,
/// `__INTEL__`, ... else the vendor's first word in capitals).
fn defines(platform: &str, vendor: &str, devs: &[cl_device_id]) -> String {
    let mut out = String::from("-D __STDCL__");
    let types: Vec<cl_device_type> = devs.iter().map(|d| device_type(*d)).collect();
    for (bit, name) in
        [(CL_DEVICE_TYPE_CPU, "__CPU__"), (CL_DEVICE_TYPE_GPU, "__GPU__"), (CL_DEVICE_TYPE_ACCELERATOR, "__RPU__")]
    {
        if types.iter().all(|t| t & bit != 0) {
            out += &format!(" -D {name}");
        }
    }
    let both = format!("{platform} {vendor}").to_lowercase();
    let known = [
        ("pocl", "POCL"),
        ("portable computing language", "POCL"),
        ("nvidia", "NVIDIA"),
        ("advanced micro devices", "AMD"),
        ("amd", "AMD"),
        ("intel", "INTEL"),
        ("apple", "APPLE"),
        ("arm", "ARM"),
        ("coprthr", "COPRTHR"),
        ("brown deer", "COPRTHR"),
    ];
    let v = known.iter().find(|(k, _)| both.contains(k)).map(|(_, v)| v.to_string()).unwrap_or_else(|| {
        vendor
            .split_whitespace()
            .next()
            .unwrap_or("UNKNOWN")
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_uppercase()
    });
    if !v.is_empty() {
        out += &format!(" -D __{v}__");
    }
    out
}

fn platforms() -> Res<Vec<cl_platform_id>> {
    let mut n = 0;
    // SAFETY: a count query.
    let err = unsafe { clGetPlatformIDs(0, null_mut(), &mut n) };
    if err == -1001 || n == 0 {
        return Ok(Vec::new());
    }
    check(err, "clGetPlatformIDs")?;
    let mut v = vec![null_mut(); n as usize];
    // SAFETY: room for n handles.
    check(unsafe { clGetPlatformIDs(n, v.as_mut_ptr(), null_mut()) }, "clGetPlatformIDs")?;
    Ok(v)
}

fn devices(p: cl_platform_id, t: cl_device_type) -> Res<Vec<cl_device_id>> {
    let mut n = 0;
    // SAFETY: a count query.
    let err = unsafe { clGetDeviceIDs(p, t, 0, null_mut(), &mut n) };
    if err == CL_DEVICE_NOT_FOUND || n == 0 {
        return Ok(Vec::new());
    }
    check(err, "clGetDeviceIDs")?;
    let mut v = vec![null_mut(); n as usize];
    // SAFETY: room for n handles.
    check(unsafe { clGetDeviceIDs(p, t, n, v.as_mut_ptr(), null_mut()) }, "clGetDeviceIDs")?;
    Ok(v)
}

fn platform_info(p: cl_platform_id, what: cl_platform_info) -> String {
    let mut buf = [0u8; 512];
    let mut len = 0;
    // SAFETY: a buffer of buf.len() bytes.
    let err = unsafe { clGetPlatformInfo(p, what, buf.len(), buf.as_mut_ptr() as *mut c_void, &mut len) };
    if err != 0 {
        return String::new();
    }
    let s = &buf[..len.min(buf.len())];
    String::from_utf8_lossy(s.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
}

fn device_type(d: cl_device_id) -> cl_device_type {
    let mut t: cl_device_type = 0;
    // SAFETY: a cl_device_type-sized answer.
    unsafe {
        clGetDeviceInfo(d, CL_DEVICE_TYPE, size_of::<cl_device_type>(), &mut t as *mut _ as *mut c_void, null_mut())
    };
    t
}

/// At exit: waits for each context's queues, releases what the program left (events, kernels,
/// programs, device memory, queues), the context, and the device locks. Host memory from
/// clmalloc stays valid (the program may still read it in its own exit handlers).
extern "C" fn teardown() {
    crate::error::guard("stdcl teardown", (), || {
        let all: Vec<usize> = std::mem::take(&mut *lock_ignoring_poison(&CONTEXTS));
        for kind in Kind::ALL {
            publish(kind, null_mut());
        }
        for cp in all {
            // SAFETY: registered contexts are leaked boxes, never freed.
            let c = unsafe { &*(cp as *mut Context) };
            c.live.store(false, Ordering::Release);
            for q in &c.queues {
                // SAFETY: the context's own queues.
                unsafe { clFinish(*q) };
            }
            for d in c.events().iter_mut() {
                for ev in d.kernel.drain(..).chain(d.mem.drain(..)) {
                    // SAFETY: events the lists own one reference to.
                    unsafe { clReleaseEvent(ev) };
                }
            }
            crate::program::release_context(cp);
            crate::memory::release_context(cp);
            for q in &c.queues {
                // SAFETY: as above, released once.
                unsafe { clReleaseCommandQueue(*q) };
            }
            // SAFETY: the context's own handle, released once.
            unsafe { clReleaseContext(c.ctx) };
        }
        Ok(())
    })
}
