//! Device-sharable memory: one pointer names the memory on the host and on the devices of the
//! context it is attached to. `clmalloc` allocates host memory and a buffer of the same size in
//! the context; a registry maps the host pointer to that buffer. `clmsync` copies one way or the
//! other with explicit reads and writes (no host pointer is handed to the driver, so the same
//! code works when the driver runs caged in another process).

use crate::context::{lock_ignoring_poison, lookup, Context};
use crate::error::{check, Error, Res};
use opencl_sys::*;
use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;

pub const CL_MEM_RO: i32 = 0x1;
pub const CL_MEM_WO: i32 = 0x2;
pub const CL_MEM_HOST: i32 = 0x100;
pub const CL_MEM_DEVICE: i32 = 0x200;
pub const CL_MEM_DETACHED: i32 = 0x1000;

const CL_MCTL_GET_STATUS: i32 = 1;
const CL_MCTL_GET_DEVNUM: i32 = 2;
const CL_MCTL_SET_DEVNUM: i32 = 3;

/// Alignment of every allocation (vector types, cache lines).
const ALIGN: usize = 128;

struct Mem {
    size: usize,
    /// The access flags given (CL_MEM_RO/WO/RW).
    access: i32,
    /// The context it is attached to (0: detached) and its buffer there.
    ctx: usize,
    buf: cl_mem,
    devnum: i32,
}

// SAFETY: a cl_mem may be used from any thread (OpenCL 1.2, appendix A.2).
unsafe impl Send for Mem {}

static MEMS: Mutex<Option<HashMap<usize, Mem>>> = Mutex::new(None);

fn with_mems<T>(f: impl FnOnce(&mut HashMap<usize, Mem>) -> T) -> T {
    let mut g = lock_ignoring_poison(&MEMS);
    f(g.get_or_insert_with(HashMap::new))
}

fn layout(size: usize) -> Res<Layout> {
    Layout::from_size_align(size.max(1), ALIGN)
        .map_err(|_| Error::new(libc::ENOMEM, format!("{size} bytes is too large")))
}

fn new_buffer(c: &Context, size: usize, access: i32) -> Res<cl_mem> {
    let flags = match access & 3 {
        CL_MEM_RO => CL_MEM_READ_ONLY,
        CL_MEM_WO => CL_MEM_WRITE_ONLY,
        _ => CL_MEM_READ_WRITE,
    };
    let mut err = 0;
    // SAFETY: no host pointer; size at least 1.
    let buf = unsafe { clCreateBuffer(c.ctx, flags, size.max(1), null_mut(), &mut err) };
    check(err, "clCreateBuffer")?;
    Ok(buf)
}

fn release(buf: cl_mem) {
    if !buf.is_null() {
        // SAFETY: a buffer this module made, released once.
        unsafe { clReleaseMemObject(buf) };
    }
}

pub fn clmalloc(cp: *mut Context, size: usize, flags: i32) -> Res<*mut c_void> {
    let attach = if flags & CL_MEM_DETACHED != 0 { None } else { Some(lookup(cp)?) };
    let buf = match attach {
        Some(c) => new_buffer(c, size, flags)?,
        None => null_mut(),
    };
    let l = layout(size)?;
    // SAFETY: a non-zero-sized layout.
    let host = unsafe { std::alloc::alloc(l) };
    if host.is_null() {
        release(buf);
        return Err(Error::new(libc::ENOMEM, format!("cannot allocate {size} host bytes")));
    }
    let ctx = if attach.is_some() { cp as usize } else { 0 };
    with_mems(|m| m.insert(host as usize, Mem { size, access: flags & 3, ctx, buf, devnum: 0 }));
    Ok(host as *mut c_void)
}

fn unknown(ptr: *mut c_void) -> Error {
    Error::new(libc::EINVAL, format!("{ptr:p} was not returned by clmalloc (or was freed)"))
}

pub fn clfree(ptr: *mut c_void) -> Res<()> {
    let m = with_mems(|m| m.remove(&(ptr as usize))).ok_or_else(|| unknown(ptr))?;
    release(m.buf);
    // SAFETY: allocated by clmalloc with this layout, removed from the registry just now so
    // freed once.
    unsafe { std::alloc::dealloc(ptr as *mut u8, layout(m.size)?) };
    Ok(())
}

pub fn clsizeofmem(ptr: *mut c_void) -> Res<usize> {
    with_mems(|m| m.get(&(ptr as usize)).map(|m| m.size)).ok_or_else(|| unknown(ptr))
}

pub fn clmrealloc(cp: *mut Context, ptr: *mut c_void, size: usize, flags: i32) -> Res<*mut c_void> {
    if ptr.is_null() {
        return clmalloc(cp, size, flags);
    }
    let (old_size, old_ctx, old_buf) =
        with_mems(|m| m.get(&(ptr as usize)).map(|m| (m.size, m.ctx, m.buf))).ok_or_else(|| unknown(ptr))?;
    let new = clmalloc(cp, size, flags)?;
    let keep = old_size.min(size);
    // SAFETY: both allocations hold at least `keep` bytes and are distinct.
    unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, keep) };
    // Device contents come along when both copies live in the same context.
    let new_buf = with_mems(|m| m.get(&(new as usize)).map(|m| m.buf).unwrap_or(null_mut()));
    if old_ctx == cp as usize && old_ctx != 0 && !new_buf.is_null() && keep > 0 {
        let c = lookup(cp)?;
        let q = c.queue(0)?;
        let mut ev = null_mut();
        // SAFETY: two buffers of this context, each at least `keep` bytes.
        let r = unsafe { clEnqueueCopyBuffer(q, old_buf, new_buf, 0, 0, keep, 0, std::ptr::null(), &mut ev) };
        if let Err(e) = check(r, "clEnqueueCopyBuffer").and_then(|_| wait_release(ev)) {
            let _ = clfree(new);
            return Err(e);
        }
    }
    clfree(ptr)?;
    Ok(new)
}

fn wait_release(ev: cl_event) -> Res<()> {
    // SAFETY: one event just made.
    let r = unsafe { clWaitForEvents(1, &ev) };
    // SAFETY: released once.
    unsafe { clReleaseEvent(ev) };
    check(r, "clWaitForEvents")
}

pub fn clmattach(cp: *mut Context, ptr: *mut c_void) -> Res<()> {
    let c = lookup(cp)?;
    let (size, access, ctx) =
        with_mems(|m| m.get(&(ptr as usize)).map(|m| (m.size, m.access, m.ctx))).ok_or_else(|| unknown(ptr))?;
    if ctx != 0 {
        return Err(Error::new(libc::EBUSY, "the memory is attached to a context already (clmdetach it first)"));
    }
    let buf = new_buffer(c, size, access)?;
    with_mems(|m| {
        if let Some(m) = m.get_mut(&(ptr as usize)) {
            m.ctx = cp as usize;
            m.buf = buf;
        }
    });
    Ok(())
}

pub fn clmdetach(ptr: *mut c_void) -> Res<()> {
    let buf = with_mems(|m| {
        let m = m.get_mut(&(ptr as usize)).ok_or_else(|| unknown(ptr))?;
        if m.ctx == 0 {
            return Err(Error::new(libc::EINVAL, "the memory is not attached to a context"));
        }
        m.ctx = 0;
        Ok(std::mem::replace(&mut m.buf, null_mut()))
    })?;
    // The driver keeps the buffer until commands that use it are done.
    release(buf);
    Ok(())
}

/// The buffer of `ptr` in context `cp` (NULL for a NULL pointer: an empty __global argument).
pub fn buffer_in(cp: *mut Context, ptr: *mut c_void) -> Res<cl_mem> {
    if ptr.is_null() {
        return Ok(null_mut());
    }
    let (ctx, buf) = with_mems(|m| m.get(&(ptr as usize)).map(|m| (m.ctx, m.buf))).ok_or_else(|| unknown(ptr))?;
    if ctx != cp as usize {
        return Err(Error::new(libc::EINVAL, format!("{ptr:p} is not attached to this context (clmattach it)")));
    }
    Ok(buf)
}

pub fn is_clmalloc(ptr: *mut c_void) -> bool {
    with_mems(|m| m.contains_key(&(ptr as usize)))
}

pub fn clmsync(cp: *mut Context, devnum: u32, ptr: *mut c_void, flags: i32) -> Res<cl_event> {
    let c = lookup(cp)?;
    let q = c.queue(devnum)?;
    let to_host = flags & CL_MEM_HOST != 0;
    if to_host == (flags & CL_MEM_DEVICE != 0) {
        return Err(Error::new(libc::EINVAL, "exactly one of CL_MEM_HOST and CL_MEM_DEVICE must be given"));
    }
    let buf = buffer_in(cp, ptr)?;
    if buf.is_null() {
        return Err(unknown(ptr));
    }
    let size = clsizeofmem(ptr)?;
    let mut ev = null_mut();
    // SAFETY: the buffer and the host memory both hold `size` bytes; non-blocking, so the host
    // memory must stay (it does until clfree, which the caller orders after the wait).
    let r = unsafe {
        if to_host {
            clEnqueueReadBuffer(q, buf, CL_FALSE, 0, size, ptr, 0, std::ptr::null(), &mut ev)
        } else {
            clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, size, ptr, 0, std::ptr::null(), &mut ev)
        }
    };
    check(r, if to_host { "clEnqueueReadBuffer" } else { "clEnqueueWriteBuffer" })?;
    crate::kernel::settle(c, devnum, ev, flags, crate::kernel::List::Mem)
}

pub fn clmcopy(cp: *mut Context, devnum: u32, dst: *mut c_void, src: *mut c_void, flags: i32) -> Res<cl_event> {
    let c = lookup(cp)?;
    let q = c.queue(devnum)?;
    let (db, sb) = (buffer_in(cp, dst)?, buffer_in(cp, src)?);
    if db.is_null() || sb.is_null() {
        return Err(Error::new(libc::EINVAL, "clmcopy needs two clmalloc'd pointers"));
    }
    let (ds, ss) = (clsizeofmem(dst)?, clsizeofmem(src)?);
    if ss > ds {
        return Err(Error::new(libc::EINVAL, format!("the source ({ss} bytes) is larger than the destination ({ds})")));
    }
    let mut ev = null_mut();
    // SAFETY: two buffers of this context; the copy fits both.
    let r = unsafe { clEnqueueCopyBuffer(q, sb, db, 0, 0, ss, 0, std::ptr::null(), &mut ev) };
    check(r, "clEnqueueCopyBuffer")?;
    crate::kernel::settle(c, devnum, ev, flags, crate::kernel::List::Mem)
}

pub fn clmctl(ptr: *mut c_void, op: i32, arg: i64) -> Res<i32> {
    with_mems(|m| {
        let m = m.get_mut(&(ptr as usize)).ok_or_else(|| unknown(ptr))?;
        match op {
            CL_MCTL_GET_STATUS => Ok(m.access | if m.ctx == 0 { CL_MEM_DETACHED } else { 0 }),
            CL_MCTL_GET_DEVNUM => Ok(m.devnum),
            CL_MCTL_SET_DEVNUM => {
                if m.ctx != 0 {
                    // SAFETY: attached memory's context is registered (a leaked box).
                    let n = unsafe { &*(m.ctx as *const Context) }.devices.len() as i64;
                    if !(0..n).contains(&arg) {
                        return Err(Error::new(libc::EINVAL, format!("device {arg} out of range (the context has {n})")));
                    }
                }
                m.devnum = arg as i32;
                Ok(0)
            }
            4 | 5 => Err(Error::new(
                libc::ENOTSUP,
                "CL_MCTL_MARK_CLEAN and CL_MCTL_SET_IMAGE2D are not supported (memory is copied only by clmsync; no images)",
            )),
            _ => Err(Error::new(libc::EINVAL, format!("unknown clmctl operation {op}"))),
        }
    })
}

/// At exit: releases the buffers of memory attached to context `cp` (the host memory stays).
pub fn release_context(cp: usize) {
    with_mems(|m| {
        for mem in m.values_mut().filter(|m| m.ctx == cp) {
            release(std::mem::replace(&mut mem.buf, null_mut()));
            mem.ctx = 0;
        }
    })
}
