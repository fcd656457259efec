//! The real driver: loaded by path with `dlopen`, never through the ICD loader, and called
//! through the dispatch table found in the first word of each of its handles.

use std::ffi::{c_void, CString};

use cloister_ipc::cl::*;
use cloister_ipc::dispatch::IcdDispatch;

type IcdGetPlatformIds = unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;

/// A loaded vendor library and the platforms it reported.
pub struct Driver {
    pub platforms: Vec<usize>,
}

#[derive(Debug)]
pub struct LoadError(pub String);

impl Driver {
    pub fn load(library: &str) -> Result<Self, LoadError> {
        let cpath = CString::new(library).map_err(|_| LoadError("library path has a NUL".into()))?;
        // SAFETY: dlopen with a valid C string. The library's constructors run here; that is the
        // point of hosting it in this process.
        let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(LoadError(format!("dlopen {library}: {}", dlerror())));
        }
        // The library stays loaded for the life of the process, so the handle is not kept.
        let sym = c"clIcdGetPlatformIDsKHR";
        // SAFETY: lib is a valid handle and sym a valid C string.
        let mut f = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if f.is_null() {
            // The ICD way (cl_khr_icd): ask the library's extension lookup for the entry.
            // SAFETY: as above.
            let gefa = unsafe { libc::dlsym(lib, c"clGetExtensionFunctionAddress".as_ptr()) };
            if !gefa.is_null() {
                type Gefa = unsafe extern "C" fn(*const std::ffi::c_char) -> *mut c_void;
                // SAFETY: clGetExtensionFunctionAddress has this signature per the spec.
                let gefa: Gefa = unsafe { std::mem::transmute::<*mut c_void, Gefa>(gefa) };
                // SAFETY: a valid C string argument.
                f = unsafe { gefa(sym.as_ptr()) };
            }
        }
        if f.is_null() {
            // A non-ICD library: its clGetPlatformIDs has the same signature.
            // SAFETY: as above.
            f = unsafe { libc::dlsym(lib, c"clGetPlatformIDs".as_ptr()) };
        }
        if f.is_null() {
            return Err(LoadError(format!("{library} exports neither clIcdGetPlatformIDsKHR nor clGetPlatformIDs")));
        }
        // SAFETY: both symbols have the signature of IcdGetPlatformIds per the cl_khr_icd spec.
        let get: IcdGetPlatformIds = unsafe { std::mem::transmute::<*mut c_void, IcdGetPlatformIds>(f) };
        let mut n: cl_uint = 0;
        // SAFETY: querying the count with a valid out pointer.
        let rc = unsafe { get(0, std::ptr::null_mut(), &mut n) };
        if rc != CL_SUCCESS && rc != CL_PLATFORM_NOT_FOUND_KHR {
            return Err(LoadError(format!("{library}: platform query failed with {rc}")));
        }
        let mut ids = vec![std::ptr::null_mut(); n as usize];
        if n > 0 {
            // SAFETY: ids has room for n handles.
            let rc = unsafe { get(n, ids.as_mut_ptr(), std::ptr::null_mut()) };
            if rc != CL_SUCCESS {
                return Err(LoadError(format!("{library}: platform query failed with {rc}")));
            }
        }
        Ok(Self { platforms: ids.into_iter().map(|p| p as usize).collect() })
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null C string from libc.
    unsafe { std::ffi::CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// The dispatch table of a driver handle.
///
/// # Safety
/// `handle` must be a live handle created by an ICD driver (all of whose handles begin with a
/// pointer to their dispatch table, per cl_khr_icd).
pub unsafe fn dispatch<'a>(handle: usize) -> &'a IcdDispatch {
    // SAFETY: guaranteed by the caller.
    unsafe { &**(handle as *const *const IcdDispatch) }
}

/// Calls a driver entry point through the dispatch table of `$handle`, or returns
/// `CL_INVALID_OPERATION` from the enclosing function's error path if the driver lacks it.
#[macro_export]
macro_rules! driver_fn {
    ($handle:expr, $name:ident) => {{
        let handle: usize = $handle;
        // SAFETY: handles come only from the object table, which holds live driver handles.
        #[allow(unused_unsafe)]
        let table = unsafe { $crate::driver::dispatch(handle) };
        match table.$name {
            Some(f) => f,
            None => return cloister_ipc::cl::CL_INVALID_OPERATION.into(),
        }
    }};
}
