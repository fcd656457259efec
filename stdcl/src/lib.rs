//! libstdcl: the STDCL rev 1.3 interface (Brown Deer Technology's "Standard Compute Layer") in
//! Rust, over the standard OpenCL API through the system's ICD loader, so that a program written
//! against `stdcl.h` runs directly on the installed drivers or, unchanged, with its driver caged
//! by `cloister run`.
//!
//! This file holds the exported C functions; each runs its body inside [`error::guard`] (no
//! panic unwinds into C; failures set errno and the message `clerror()` returns). The variadic
//! parts of the interface (`clforka`, `clmctl`) are macros and inline functions in `stdcl.h`
//! that call the fixed-argument `__stdcl_*` functions here.

#![allow(clippy::missing_safety_doc)]

mod context;
mod error;
mod kernel;
mod lock;
mod memory;
mod program;

pub use program::looks_binary;

use context::Context;
use error::{guard, Error, Res};
use kernel::{Arg, Ndr, EVENT_ERROR};
use opencl_sys::{cl_event, cl_int, cl_kernel, cl_uint};
use std::ffi::{c_char, c_int, c_long, c_uint, c_void, CStr};
use std::ptr::null_mut;

/// A C string argument: `None` for NULL, EINVAL if it is not UTF-8.
fn text<'a>(p: *const c_char, what: &str) -> Res<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| Error::new(libc::EINVAL, format!("{what} is not UTF-8")))
}

#[no_mangle]
pub extern "C" fn stdcl_init() {
    guard("stdcl_init", (), || {
        context::ensure_init();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn clgetndev(cp: *mut Context) -> cl_uint {
    guard("clgetndev", 0, || Ok(context::lookup(cp)?.devices.len() as cl_uint))
}

#[no_mangle]
pub extern "C" fn clerror() -> *mut c_char {
    guard("clerror", null_mut(), || Ok(error::take_message()))
}

#[no_mangle]
pub extern "C" fn clgeterror() -> cl_int {
    guard("clgeterror", 0, || Ok(error::last_cl_error()))
}

#[no_mangle]
pub extern "C" fn clopen(cp: *mut Context, filename: *const c_char, flags: c_int) -> *mut c_void {
    guard("clopen", null_mut(), || program::clopen(cp, text(filename, "the file name")?, flags))
}

#[no_mangle]
pub unsafe extern "C" fn clsopen(cp: *mut Context, src: *const c_char, flags: c_int) -> *mut c_void {
    guard("clsopen", null_mut(), || {
        if src.is_null() {
            return Err(Error::new(libc::EINVAL, "no source (NULL)"));
        }
        // SAFETY: the caller passes a NUL-terminated string.
        program::clsopen(cp, unsafe { CStr::from_ptr(src) }.to_bytes(), flags)
    })
}

#[no_mangle]
pub extern "C" fn clbuild(cp: *mut Context, handle: *mut c_void, options: *const c_char, _flags: c_int) -> *mut c_void {
    guard("clbuild", null_mut(), || program::clbuild(cp, handle, text(options, "the options")?))
}

#[no_mangle]
pub extern "C" fn clsym(cp: *mut Context, handle: *mut c_void, name: *const c_char, _flags: c_int) -> cl_kernel {
    guard("clsym", null_mut(), || {
        let name = text(name, "the kernel name")?.ok_or_else(|| Error::new(libc::EINVAL, "no kernel name (NULL)"))?;
        program::clsym(cp, handle, name)
    })
}

#[no_mangle]
pub extern "C" fn clclose(cp: *mut Context, handle: *mut c_void) -> c_int {
    guard("clclose", -1, || program::clclose(cp, handle))
}

/// Called by the constructor stdcl-clld writes into the executable.
#[no_mangle]
pub unsafe extern "C" fn stdcl_register_embedded(table: *const Embedded, n: usize) -> c_int {
    guard("stdcl_register_embedded", -1, || {
        if table.is_null() || n > 1 << 16 {
            return Err(Error::new(libc::EINVAL, "bad embedded program table"));
        }
        // SAFETY: the generated table has `n` entries.
        let entries = unsafe { std::slice::from_raw_parts(table, n) };
        let mut items = Vec::new();
        for e in entries {
            // SAFETY: each entry points at `size` bytes of static data.
            let data = unsafe { std::slice::from_raw_parts(e.data, e.size) }.to_vec();
            items.push(program::Embedded { data, binary: e.kind == 1 });
        }
        program::register_embedded(items);
        Ok(0)
    })
}

/// `struct __stdcl_embedded` of the header.
#[repr(C)]
pub struct Embedded {
    /// The file name, for people reading the table.
    _name: *const c_char,
    data: *const u8,
    size: usize,
    kind: c_int,
}

#[no_mangle]
pub extern "C" fn clmalloc(cp: *mut Context, size: usize, flags: c_int) -> *mut c_void {
    guard("clmalloc", null_mut(), || memory::clmalloc(cp, size, flags))
}

#[no_mangle]
pub extern "C" fn clmrealloc(cp: *mut Context, ptr: *mut c_void, size: usize, flags: c_int) -> *mut c_void {
    guard("clmrealloc", null_mut(), || memory::clmrealloc(cp, ptr, size, flags))
}

#[no_mangle]
pub extern "C" fn clfree(ptr: *mut c_void) {
    guard("clfree", (), || memory::clfree(ptr))
}

#[no_mangle]
pub extern "C" fn clsizeofmem(ptr: *mut c_void) -> usize {
    guard("clsizeofmem", 0, || memory::clsizeofmem(ptr))
}

#[no_mangle]
pub extern "C" fn clmattach(cp: *mut Context, ptr: *mut c_void) -> c_int {
    guard("clmattach", -1, || memory::clmattach(cp, ptr).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn clmdetach(ptr: *mut c_void) -> c_int {
    guard("clmdetach", -1, || memory::clmdetach(ptr).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn __stdcl_clmctl(ptr: *mut c_void, op: c_int, arg: c_long) -> c_int {
    guard("clmctl", -1, || memory::clmctl(ptr, op, arg))
}

#[no_mangle]
pub extern "C" fn clmsync(cp: *mut Context, devnum: c_uint, ptr: *mut c_void, flags: c_int) -> cl_event {
    guard("clmsync", EVENT_ERROR, || memory::clmsync(cp, devnum, ptr, flags))
}

#[no_mangle]
pub extern "C" fn clmcopy(
    cp: *mut Context,
    devnum: c_uint,
    dst: *mut c_void,
    src: *mut c_void,
    flags: c_int,
) -> cl_event {
    guard("clmcopy", EVENT_ERROR, || memory::clmcopy(cp, devnum, dst, src, flags))
}

fn no_gl<T>() -> Res<T> {
    Err(Error::new(libc::ENOTSUP, "GL sharing is not available in this libstdcl (no CL/GL interop)"))
}

#[no_mangle]
pub extern "C" fn clglmalloc(_cp: *mut Context, _glbuf: cl_uint, _flags: c_int) -> *mut c_void {
    guard("clglmalloc", null_mut(), no_gl)
}

#[no_mangle]
pub extern "C" fn clglmsync(_cp: *mut Context, _devnum: c_uint, _ptr: *mut c_void, _flags: c_int) -> cl_event {
    guard("clglmsync", EVENT_ERROR, no_gl)
}

#[no_mangle]
pub extern "C" fn __stdcl_clarg_set(
    cp: *mut Context,
    krn: cl_kernel,
    argnum: c_uint,
    size: usize,
    value: *const c_void,
) -> c_int {
    guard("clarg_set", -1, || kernel::clarg_set(cp, krn, argnum, size, value).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn clarg_set_global(cp: *mut Context, krn: cl_kernel, argnum: c_uint, ptr: *mut c_void) -> c_int {
    guard("clarg_set_global", -1, || kernel::clarg_set_global(cp, krn, argnum, ptr).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn clarg_set_local(cp: *mut Context, krn: cl_kernel, argnum: c_uint, size: usize) -> c_int {
    guard("clarg_set_local", -1, || kernel::clarg_set_local(cp, krn, argnum, size).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn clfork(cp: *mut Context, devnum: c_uint, krn: cl_kernel, ndr: *const Ndr, flags: c_int) -> cl_event {
    guard("clfork", EVENT_ERROR, || kernel::clfork(cp, devnum, krn, ndr, flags))
}

#[no_mangle]
pub unsafe extern "C" fn __stdcl_clforka(
    cp: *mut Context,
    devnum: c_uint,
    krn: cl_kernel,
    ndr: *const Ndr,
    flags: c_int,
    nargs: usize,
    args: *const Arg,
) -> cl_event {
    guard("clforka", EVENT_ERROR, || {
        if args.is_null() || nargs > 1024 {
            return Err(Error::new(libc::EINVAL, "bad argument list"));
        }
        // SAFETY: the header's macro passes an array of `nargs` entries.
        let args = unsafe { std::slice::from_raw_parts(args, nargs) };
        kernel::clforka(cp, devnum, krn, ndr, flags, args)
    })
}

#[no_mangle]
pub extern "C" fn clflush(cp: *mut Context, devnum: c_uint, flags: c_int) -> c_int {
    guard("clflush", -1, || kernel::clflush(cp, devnum, flags).map(|_| 0))
}

#[no_mangle]
pub extern "C" fn clwait(cp: *mut Context, devnum: c_uint, flags: c_int) -> cl_event {
    guard("clwait", EVENT_ERROR, || kernel::clwait(cp, devnum, flags))
}
