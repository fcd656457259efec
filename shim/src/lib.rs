//! `libcloister.so`: an OpenCL ICD, and a drop-in `libOpenCL.so.1`, that forwards every call to
//! a worker process hosting the real driver.
//!
//! Every entry point is generated from `cloister_ipc::api_table`: the exported `cl*` symbol, a
//! guarded twin that catches panics (the ICD dispatch table points at the twins, so the symbols
//! the ICD loader exports can never be interposed over ours), and for entry points cloister
//! does not forward, a stub that returns `CL_INVALID_OPERATION`.
//!
//! The core modules depend one way: `runtime` (the process-wide state: workers, dispatch,
//! restarts) on `pending` (calls whose replies come later) on `handle` (the objects behind the
//! application's handles) on `conn` (one connection to a worker: socket, lanes, shared memory).
//! A module never names one before it in that line (`core_modules_depend_one_way` checks).
// The entry points keep the OpenCL C signatures, argument counts included.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod api;
mod base;
mod brief_lock;
mod conn;
mod direct;
#[doc(hidden)]
pub mod fuzzing;
mod handle;
mod includes;
mod info;
mod intercept;
mod kernel_args;
mod launch_shapes;
mod mirror;
mod pending;
mod queue_state;
mod recovery;
mod runtime;
mod stdio_relay;
mod summary;

pub use summary::{cage_summary, DeviceSummary, WorkerSummary};

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::dispatch::IcdDispatch;

/// What an entry point returns when it is not forwarded, or when it panicked.
trait EntryReturn {
    fn with_code(code: cl_int) -> Self;
    /// Whether the call failed in a way a worker's death explains (see `recovery::retrying`).
    fn failed(&self) -> bool;
    /// The error code this return value is, for the call log (a creation's is in errcode_ret).
    fn status(&self) -> Option<cl_int> {
        None
    }
}

/// What an `api` function returns for an entry point returning `R`: `R` itself, or, for one
/// returning a status, `Result<cl_int, cl_int>` (an error is the status), so the safe function
/// says its errors with `?` and the conversion is written once, here.
trait IntoEntry<R> {
    fn into_entry(self) -> R;
}

impl<R: EntryReturn> IntoEntry<R> for R {
    #[inline(always)]
    fn into_entry(self) -> R {
        self
    }
}

impl IntoEntry<cl_int> for Result<cl_int, cl_int> {
    #[inline(always)]
    fn into_entry(self) -> cl_int {
        self.unwrap_or_else(|e| e)
    }
}

impl EntryReturn for cl_int {
    fn with_code(code: cl_int) -> Self {
        code
    }
    fn failed(&self) -> bool {
        *self == conn::FAULT
    }
    fn status(&self) -> Option<cl_int> {
        Some(*self)
    }
}

impl EntryReturn for *mut c_void {
    fn with_code(_: cl_int) -> Self {
        std::ptr::null_mut()
    }
    fn failed(&self) -> bool {
        self.is_null()
    }
}

impl EntryReturn for () {
    fn with_code(_: cl_int) -> Self {}
    fn failed(&self) -> bool {
        false
    }
}

macro_rules! set_errcode {
    (none, $code:expr) => {};
    ($err:ident, $code:expr) => {
        if !$err.is_null() {
            // SAFETY: errcode_ret is NULL or points at a cl_int, per the OpenCL API.
            unsafe { *$err = $code };
        }
    };
}

/// An entry point's body: the call itself (`@call`), observed by `intercept` when any of its
/// features is on. With all of them off that costs one relaxed atomic load.
macro_rules! entry_body {
    ($status:ident, $name:ident, ($($arg:ident : $ty:ty),*), $ret:ty, $err:ident) => {{
        let on = crate::intercept::state();
        if on == 0 {
            entry_body!(@call $status, $name, ($($arg),*), $ret, $err)
        } else {
            // Out of line, so the common path stays as small as without the hook; `on` last,
            // so the arguments stay in the registers the application passed them in.
            #[cold]
            #[inline(never)]
            unsafe fn observed($($arg: $ty,)* on: u8) -> $ret {
                let on = crate::intercept::settled(on);
                if on == 0 {
                    return entry_body!(@call $status, $name, ($($arg),*), $ret, $err);
                }
                let call = crate::intercept::Call::begin(on, stringify!($name));
                // The arguments as the application passed them (out-parameters are read after).
                let args = [$( crate::intercept::Arg {
                    name: stringify!($arg),
                    ty: stringify!($ty),
                    raw: crate::intercept::AsRaw::raw(&$arg),
                } ),*];
                // Without the application's errcode_ret the log would not know a creation's error.
                let mut own_errcode: cl_int = CL_SUCCESS;
                entry_body!(@own_errcode $err, own_errcode);
                // Without the application's event the trace could not time a command.
                #[allow(unused_mut)]
                let mut own_event: *mut c_void = std::ptr::null_mut();
                $( let $arg = crate::intercept::device::own_event(on, stringify!($arg), $arg, &mut own_event); )*
                let r = entry_body!(@call $status, $name, ($($arg),*), $ret, $err);
                let status = <$ret as EntryReturn>::status(&r).or(entry_body!(@errcode $err));
                call.end(stringify!($name), stringify!($ret), crate::intercept::AsRaw::raw(&r), status, &args, own_event);
                r
            }
            // SAFETY: the same arguments, under the same contract.
            unsafe { observed($($arg,)* on) }
        }
    }};
    (@own_errcode none, $own:ident) => { let _ = &mut $own; };
    (@own_errcode $err:ident, $own:ident) => {
        let $err = if $err.is_null() { &mut $own as *mut cl_int } else { $err };
    };
    (@errcode none) => { None };
    // SAFETY: errcode_ret is the application's (valid per the API) or our own.
    (@errcode $err:ident) => { Some(unsafe { *$err }) };
    (@call forwarded, $name:ident, ($($arg:ident),*), $ret:ty, $err:ident) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            recovery::retrying(<$ret as EntryReturn>::failed, || {
                // SAFETY: the caller upholds the OpenCL API contract for this entry point.
                IntoEntry::<$ret>::into_entry(unsafe { api::$name($($arg),*) })
            })
        })) {
            Ok(v) => v,
            Err(_) => {
                set_errcode!($err, CL_OUT_OF_HOST_MEMORY);
                <$ret as EntryReturn>::with_code(CL_OUT_OF_HOST_MEMORY)
            }
        }
    };
    (@call unimplemented, $name:ident, ($($arg:ident),*), $ret:ty, $err:ident) => {{
        $( let _ = $arg; )*
        set_errcode!($err, CL_INVALID_OPERATION);
        <$ret as EntryReturn>::with_code(CL_INVALID_OPERATION)
    }};
}

macro_rules! slot_value {
    (windows, $name:ident) => {
        std::ptr::null()
    };
    ($status:ident, $name:ident) => {
        Some(guarded::$name)
    };
}

macro_rules! define_entry_points {
    ($( ($slot:literal, $name:ident, $status:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident); )*) => {
        /// The guarded entry points the dispatch table points at.
        mod guarded {
            #![allow(unused_imports, clippy::unused_unit)]
            use super::*;
            $( define_entry_points!(@guarded $status, $name, ($($arg : $ty),*) -> $ret, $err); )*
        }

        /// The exported symbols, for applications that link cloister as `libOpenCL.so.1`.
        mod exports {
            #![allow(unused_imports)]
            use super::*;
            $( define_entry_points!(@export $status, $name, ($($arg : $ty),*) -> $ret); )*
        }

        /// The table every cloister handle points at.
        pub(crate) static DISPATCH: IcdDispatch = IcdDispatch { $( $name: slot_value!($status, $name), )* };
    };
    (@guarded windows, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident) => {};
    (@guarded $status:ident, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident) => {
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            entry_body!($status, $name, ($($arg : $ty),*), $ret, $err)
        }
    };
    (@export windows, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty) => {};
    (@export $status:ident, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller upholds the OpenCL API contract for this entry point.
            unsafe { guarded::$name($($arg),*) }
        }
    };
}

cloister_ipc::for_each_cl_entry_point!(define_entry_points);

macro_rules! define_extension_entry_points {
    ($( ($ext:ident, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident); )*) => {
        /// The forwarded extension entry points without a dispatch slot, guarded like the rest.
        mod extension_entry_points {
            #![allow(unused_imports, clippy::unused_unit)]
            use super::*;
            $(
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    entry_body!(forwarded, $name, ($($arg : $ty),*), $ret, $err)
                }
            )*
        }

        /// One of them, by name, for `clGetExtensionFunctionAddress*`.
        fn extension_entry_point(name: &[u8]) -> *mut c_void {
            $(
                if name == stringify!($name).as_bytes() {
                    return extension_entry_points::$name as *mut c_void;
                }
            )*
            std::ptr::null_mut()
        }
    };
}

cloister_ipc::for_each_extension_entry_point!(define_extension_entry_points);

/// The ICD loader's way in (cl_khr_icd).
#[no_mangle]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    std::panic::catch_unwind(|| {
        // SAFETY: same contract as clGetPlatformIDs.
        unsafe { api::platform::icd_get_platform_ids(num_entries, platforms, num_platforms) }
    })
    .unwrap_or(CL_OUT_OF_HOST_MEMORY)
}

#[cfg(test)]
mod layering {
    use std::path::Path;

    /// The core modules in the order they may depend on each other: each may use those after it.
    const CORE: [&str; 4] = ["runtime", "pending", "handle", "conn"];

    /// The text of a module: its file and the files of its submodules.
    fn module_text(name: &str) -> String {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut text = std::fs::read_to_string(src.join(format!("{name}.rs"))).unwrap();
        if let Ok(entries) = std::fs::read_dir(src.join(name)) {
            for entry in entries {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    text += &std::fs::read_to_string(path).unwrap();
                }
            }
        }
        text
    }

    /// Whether `text` names module `name` of this crate (`crate::name::` or `crate::{.. name`).
    fn names(text: &str, name: &str) -> bool {
        text.contains(&format!("crate::{name}::"))
            || text.split("crate::{").skip(1).any(|group| {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group.split(|c: char| !c.is_alphanumeric() && c != '_').any(|word| word == name)
            })
    }

    #[test]
    fn core_modules_depend_one_way() {
        for (i, module) in CORE.iter().enumerate() {
            let text = module_text(module);
            for earlier in &CORE[..i] {
                assert!(!names(&text, earlier), "`{module}` names `{earlier}`, which depends on it");
            }
        }
        // The check itself sees a dependency where there is one.
        assert!(names(&module_text("runtime"), "conn"));
        assert!(names("use crate::{base, handle::Object};", "handle"));
    }
}
