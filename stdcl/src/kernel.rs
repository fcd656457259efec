//! Kernel arguments, `clfork`/`clforka`, and the per-device event lists behind `clwait`.

use crate::context::{lookup, Context};
use crate::error::{check, Error, Res};
use crate::memory::{buffer_in, is_clmalloc};
use opencl_sys::*;
use std::ffi::c_void;
use std::ptr::null_mut;

pub const CL_EVENT_WAIT: i32 = 0x01;
pub const CL_EVENT_NOWAIT: i32 = 0x02;
pub const CL_EVENT_NORELEASE: i32 = 0x40;
pub const CL_KERNEL_EVENT: i32 = 0x10;
pub const CL_MEM_EVENT: i32 = 0x20;

/// `(cl_event)-1`, the error return of calls that return an event.
pub const EVENT_ERROR: cl_event = usize::MAX as cl_event;

#[derive(Clone, Copy)]
pub enum List {
    Kernel,
    Mem,
}

/// What happens to the event of an operation, by its flags: with CL_EVENT_NOWAIT it joins the
/// device's kernel or memory list (which owns it until clwait) and is returned; otherwise the
/// call waits for it and releases it (returning NULL), or with CL_EVENT_NORELEASE returns it for
/// the caller to release.
pub fn settle(c: &Context, devnum: u32, ev: cl_event, flags: i32, list: List) -> Res<cl_event> {
    if flags & CL_EVENT_WAIT != 0 && flags & CL_EVENT_NOWAIT != 0 {
        // SAFETY: the event just made, released once.
        unsafe { clReleaseEvent(ev) };
        return Err(Error::new(libc::EINVAL, "CL_EVENT_WAIT and CL_EVENT_NOWAIT together"));
    }
    if flags & CL_EVENT_NOWAIT != 0 {
        let mut all = c.events();
        let d = &mut all[devnum as usize];
        match list {
            List::Kernel => d.kernel.push(ev),
            List::Mem => d.mem.push(ev),
        }
        return Ok(ev);
    }
    // SAFETY: one event just made.
    let r = unsafe { clWaitForEvents(1, &ev) };
    if flags & CL_EVENT_NORELEASE == 0 || r != 0 {
        // SAFETY: released once.
        unsafe { clReleaseEvent(ev) };
    }
    check(r, "clWaitForEvents")?;
    Ok(if flags & CL_EVENT_NORELEASE != 0 { ev } else { null_mut() })
}

pub fn clarg_set(cp: *mut Context, krn: cl_kernel, argnum: u32, size: usize, value: *const c_void) -> Res<()> {
    lookup(cp)?;
    if value.is_null() {
        return Err(Error::new(libc::EINVAL, "no value"));
    }
    // SAFETY: `size` readable bytes at `value` (the header passes sizeof and a copy).
    check(unsafe { clSetKernelArg(krn, argnum, size, value) }, &format!("clSetKernelArg(argument {argnum})"))
}

pub fn clarg_set_global(cp: *mut Context, krn: cl_kernel, argnum: u32, ptr: *mut c_void) -> Res<()> {
    lookup(cp)?;
    let buf = buffer_in(cp, ptr)?;
    // SAFETY: a cl_mem-sized value.
    let r = unsafe { clSetKernelArg(krn, argnum, size_of::<cl_mem>(), &buf as *const cl_mem as *const c_void) };
    check(r, &format!("clSetKernelArg(argument {argnum})"))
}

pub fn clarg_set_local(cp: *mut Context, krn: cl_kernel, argnum: u32, size: usize) -> Res<()> {
    lookup(cp)?;
    // SAFETY: a __local argument takes a size and no value.
    check(unsafe { clSetKernelArg(krn, argnum, size, std::ptr::null()) }, &format!("clSetKernelArg(argument {argnum})"))
}

#[repr(C)]
pub struct Arg {
    pub size: usize,
    pub value: *const c_void,
}

/// What a kernel argument is, by the kernel's own description (clGetKernelArgInfo, available
/// because every program is built with -cl-kernel-arg-info).
fn address_qualifier(krn: cl_kernel, i: u32) -> Option<cl_kernel_arg_address_qualifier> {
    let mut q: cl_kernel_arg_address_qualifier = 0;
    // SAFETY: an answer of the queried type's size.
    let r = unsafe {
        clGetKernelArgInfo(
            krn,
            i,
            CL_KERNEL_ARG_ADDRESS_QUALIFIER,
            size_of_val(&q),
            &mut q as *mut _ as *mut c_void,
            null_mut(),
        )
    };
    (r == 0).then_some(q)
}

fn read_uint(a: &Arg) -> Res<usize> {
    // SAFETY: `a.size` readable bytes at `a.value` (sizeof the caller's expression); read
    // unaligned since the copy may sit anywhere.
    unsafe {
        Ok(match a.size {
            1 => *(a.value as *const u8) as usize,
            2 => (a.value as *const u16).read_unaligned() as usize,
            4 => (a.value as *const u32).read_unaligned() as usize,
            8 => (a.value as *const u64).read_unaligned() as usize,
            n => return Err(Error::new(libc::EINVAL, format!("a __local size must be an integer, got {n} bytes"))),
        })
    }
}

fn read_ptr(a: &Arg, i: u32) -> Res<*mut c_void> {
    if a.size != size_of::<*mut c_void>() {
        return Err(Error::new(libc::EINVAL, format!("argument {i} is a __global pointer; {} bytes given", a.size)));
    }
    // SAFETY: pointer-sized readable bytes at `a.value`.
    Ok(unsafe { (a.value as *const *mut c_void).read_unaligned() })
}

pub fn clforka(
    cp: *mut Context,
    devnum: u32,
    krn: cl_kernel,
    ndr: *const Ndr,
    flags: i32,
    args: &[Arg],
) -> Res<cl_event> {
    lookup(cp)?;
    let mut n: cl_uint = 0;
    // SAFETY: a cl_uint answer.
    let r = unsafe {
        clGetKernelInfo(krn, CL_KERNEL_NUM_ARGS, size_of::<cl_uint>(), &mut n as *mut _ as *mut c_void, null_mut())
    };
    check(r, "clGetKernelInfo(CL_KERNEL_NUM_ARGS)")?;
    if n as usize != args.len() {
        return Err(Error::new(libc::EINVAL, format!("the kernel takes {n} arguments, {} given", args.len())));
    }
    for (i, a) in args.iter().enumerate() {
        let i = i as u32;
        match address_qualifier(krn, i) {
            Some(CL_KERNEL_ARG_ADDRESS_GLOBAL) | Some(CL_KERNEL_ARG_ADDRESS_CONSTANT) => {
                clarg_set_global(cp, krn, i, read_ptr(a, i)?)?
            }
            Some(CL_KERNEL_ARG_ADDRESS_LOCAL) => clarg_set_local(cp, krn, i, read_uint(a)?)?,
            Some(_) => clarg_set(cp, krn, i, a.size, a.value)?,
            // No argument info (a binary built without it): a pointer clmalloc gave is a
            // __global argument, anything else a value.
            None => {
                let p = read_ptr(a, i).ok().filter(|p| !p.is_null() && is_clmalloc(*p));
                match p {
                    Some(p) => clarg_set_global(cp, krn, i, p)?,
                    None => clarg_set(cp, krn, i, a.size, a.value)?,
                }
            }
        }
    }
    clfork(cp, devnum, krn, ndr, flags)
}

/// `clndrange_t` as the header lays it out.
#[repr(C)]
pub struct Ndr {
    pub dim: usize,
    pub gtid_offset: [usize; 4],
    pub gtid: [usize; 4],
    pub ltid: [usize; 4],
}

pub fn clfork(cp: *mut Context, devnum: u32, krn: cl_kernel, ndr: *const Ndr, flags: i32) -> Res<cl_event> {
    let c = lookup(cp)?;
    let q = c.queue(devnum)?;
    if ndr.is_null() {
        return Err(Error::new(libc::EINVAL, "no index space (ndr is NULL)"));
    }
    // SAFETY: the caller's clndrange_t.
    let ndr = unsafe { &*ndr };
    if !(1..=3).contains(&ndr.dim) {
        return Err(Error::new(libc::EINVAL, format!("{} dimensions (OpenCL takes 1 to 3)", ndr.dim)));
    }
    let d = ndr.dim;
    let local = if ndr.ltid[..d].contains(&0) { std::ptr::null() } else { ndr.ltid.as_ptr() };
    let mut ev = null_mut();
    // SAFETY: arrays of at least `d` sizes; local NULL or `d` sizes.
    let r = unsafe {
        clEnqueueNDRangeKernel(
            q,
            krn,
            d as cl_uint,
            ndr.gtid_offset.as_ptr(),
            ndr.gtid.as_ptr(),
            local,
            0,
            std::ptr::null(),
            &mut ev,
        )
    };
    check(r, "clEnqueueNDRangeKernel")?;
    settle(c, devnum, ev, flags, List::Kernel)
}

pub fn clflush(cp: *mut Context, devnum: u32, flags: i32) -> Res<()> {
    let c = lookup(cp)?;
    let q = c.queue(devnum)?;
    // SAFETY: the context's own queue.
    check(unsafe { clFlush(q) }, "clFlush")?;
    if flags & CL_EVENT_WAIT != 0 {
        // SAFETY: as above.
        check(unsafe { clFinish(q) }, "clFinish")?;
    }
    Ok(())
}

pub fn clwait(cp: *mut Context, devnum: u32, flags: i32) -> Res<cl_event> {
    let c = lookup(cp)?;
    c.queue(devnum)?;
    if flags & (CL_KERNEL_EVENT | CL_MEM_EVENT) == 0 {
        return Err(Error::new(libc::EINVAL, "no event list chosen (CL_KERNEL_EVENT, CL_MEM_EVENT or CL_ALL_EVENT)"));
    }
    let keep = flags & CL_EVENT_NORELEASE != 0;
    let mut last = null_mut();
    let mut failure = None;
    // Kernel events first, then memory events, as the interface says.
    for (bit, list) in [(CL_KERNEL_EVENT, List::Kernel), (CL_MEM_EVENT, List::Mem)] {
        if flags & bit == 0 {
            continue;
        }
        let evs: Vec<cl_event> = {
            let mut all = c.events();
            let d = &mut all[devnum as usize];
            let l = match list {
                List::Kernel => &mut d.kernel,
                List::Mem => &mut d.mem,
            };
            if keep {
                l.clone()
            } else {
                std::mem::take(l)
            }
        };
        if evs.is_empty() {
            continue;
        }
        // SAFETY: events the list holds references to.
        let r = unsafe { clWaitForEvents(evs.len() as cl_uint, evs.as_ptr()) };
        if r != 0 && failure.is_none() {
            failure = Some(Error::cl(r, "clWaitForEvents"));
        }
        last = *evs.last().unwrap_or(&null_mut());
        if !keep {
            for ev in evs {
                // SAFETY: taken out of the list, released once.
                unsafe { clReleaseEvent(ev) };
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(if keep { last } else { null_mut() }),
    }
}
