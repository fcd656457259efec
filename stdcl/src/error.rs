//! Errors the STDCL way: the call returns its failure value, `errno` says what kind of failure,
//! `clerror()` describes it and `clgeterror()` gives the OpenCL code behind it. Every exported
//! function runs inside [`guard`], so no panic crosses into C.

use opencl_sys::cl_int;
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One failure: the errno to set, the OpenCL code behind it (`CL_SUCCESS` if none) and words.
#[derive(Debug)]
pub struct Error {
    pub errno: i32,
    pub cl: cl_int,
    pub msg: String,
}

pub type Res<T> = Result<T, Error>;

impl Error {
    pub fn new(errno: i32, msg: impl Into<String>) -> Self {
        Error { errno, cl: 0, msg: msg.into() }
    }

    /// An OpenCL call `what` that returned `code`.
    pub fn cl(code: cl_int, what: &str) -> Self {
        let errno = match code {
            -6..=-4 => libc::ENOMEM,
            -11 => libc::ENOEXEC,
            c if c <= -30 => libc::EINVAL,
            _ => libc::EIO,
        };
        Error { errno, cl: code, msg: format!("{what} failed: {} ({code})", cl_error_name(code)) }
    }
}

/// `Ok` for `CL_SUCCESS`, else the error of call `what`.
pub fn check(code: cl_int, what: &str) -> Res<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::cl(code, what))
    }
}

thread_local! {
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
    static SHOWN: RefCell<Option<CString>> = const { RefCell::new(None) };
    static LAST_CL: Cell<cl_int> = const { Cell::new(0) };
}

fn record(func: &str, e: Error) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e.errno };
    LAST.with(|l| *l.borrow_mut() = Some(format!("{func}: {}", e.msg)));
    LAST_CL.with(|c| c.set(e.cl));
}

/// Runs the body of exported function `func`; on error or panic records the error and returns
/// `fail`.
pub fn guard<T>(func: &str, fail: T, body: impl FnOnce() -> Res<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            record(func, e);
            fail
        }
        Err(_) => {
            record(func, Error::new(libc::EFAULT, "internal error in libstdcl (a bug; the call did nothing)"));
            fail
        }
    }
}

/// The message for `clerror()`: taken (so the next call says NULL unless a new error came),
/// kept alive in this thread until the next call.
pub fn take_message() -> *mut libc::c_char {
    let msg = LAST.with(|l| l.borrow_mut().take());
    SHOWN.with(|s| {
        let mut s = s.borrow_mut();
        *s = msg.map(|m| CString::new(m.replace('\0', " ")).unwrap_or_default());
        s.as_ref().map_or(std::ptr::null_mut(), |c| c.as_ptr() as *mut libc::c_char)
    })
}

pub fn last_cl_error() -> cl_int {
    LAST_CL.with(|c| c.get())
}

/// The name of an OpenCL error code, for messages.
pub fn cl_error_name(code: cl_int) -> &'static str {
    match code {
        0 => "CL_SUCCESS",
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -3 => "CL_COMPILER_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -11 => "CL_BUILD_PROGRAM_FAILURE",
        -14 => "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
        -30 => "CL_INVALID_VALUE",
        -33 => "CL_INVALID_DEVICE",
        -34 => "CL_INVALID_CONTEXT",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -38 => "CL_INVALID_MEM_OBJECT",
        -42 => "CL_INVALID_BINARY",
        -43 => "CL_INVALID_BUILD_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -53 => "CL_INVALID_WORK_DIMENSION",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        -55 => "CL_INVALID_WORK_ITEM_SIZE",
        -56 => "CL_INVALID_GLOBAL_OFFSET",
        -58 => "CL_INVALID_EVENT",
        -59 => "CL_INVALID_OPERATION",
        -61 => "CL_INVALID_BUFFER_SIZE",
        -63 => "CL_INVALID_GLOBAL_WORK_SIZE",
        -19 => "CL_KERNEL_ARG_INFO_NOT_AVAILABLE",
        -1001 => "CL_PLATFORM_NOT_FOUND_KHR",
        _ => "an OpenCL error",
    }
}
