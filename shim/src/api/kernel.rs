//! Kernels. `clSetKernelArg` is recorded here and shipped with the next enqueue, so setting
//! arguments costs no round trip. Index errors are reported at once (the argument count is
//! known); size and value errors the driver finds are reported by the enqueue.

use std::ffi::{c_char, c_void, CStr};

use cloister_ipc::cl::*;
use cloister_ipc::{ArgValue, CreateKernel, CreateKernelsInProgram, InfoTarget};

use super::{creation, forward_info, retain_release};
use crate::handle::{cells, lookup, new_handle, Kind, ObjData};
use crate::info;
use crate::kernel_args::{Incoming, KernelArgs};

/// Most arguments a kernel can have: each takes at least one byte of the driver's
/// `CL_DEVICE_MAX_PARAMETER_SIZE`, which no device sets anywhere near this. A larger count is
/// a worker making the shim allocate without bound.
const MAX_KERNEL_ARGS: u32 = 1 << 16;

/// The state of a kernel of program `p`; its argument slots grow as the application sets
/// them, so nothing is allocated from the worker's count.
fn kernel_data(p: &crate::handle::Object, num_args: u32) -> ObjData {
    // A program always has its context (`ObjData::context`); 0 matches no queue's, so a kernel
    // without one would never be posted.
    let context = p.data.context().unwrap_or(0);
    ObjData::Kernel {
        context,
        num_args,
        args: std::sync::Arc::new(KernelArgs::new(num_args)),
        launches: Default::default(),
    }
}

/// Checks a kernel's argument count from the worker.
fn checked_num_args(conn: &crate::conn::Conn, call: &str, num_args: u32) -> Result<u32, cl_int> {
    match num_args <= MAX_KERNEL_ARGS {
        true => Ok(num_args),
        false => Err(conn.reject(call, &format!("a kernel of {num_args} arguments"))),
    }
}

pub unsafe fn clCreateKernel(program: cl_program, kernel_name: *const c_char, errcode_ret: *mut cl_int) -> cl_kernel {
    let r = (|| {
        let p = lookup(program, Kind::Program)?;
        if kernel_name.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated per the API contract.
        let name = unsafe { CStr::from_ptr(kernel_name) }.to_bytes().to_vec();
        let id = p.conn.alloc_id();
        let req = CreateKernel { id, program: p.id, name };
        let copy = p.conn.replays().then(|| req.clone());
        let reply = p.conn.call(req)?;
        if reply.status != CL_SUCCESS {
            return Err(reply.status);
        }
        if let Some(req) = copy {
            crate::recovery::note(&p.conn, &req);
        }
        let num_args = checked_num_args(&p.conn, "clCreateKernel", reply.num_args)?;
        let h = new_handle(Kind::Kernel, id, &p.conn, kernel_data(&p, num_args));
        crate::handle::hold(h, program.cast_const(), Kind::Program);
        Ok(h)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateKernelsInProgram(
    program: cl_program,
    num_kernels: cl_uint,
    kernels: *mut cl_kernel,
    num_kernels_ret: *mut cl_uint,
) -> cl_int {
    let p = match lookup(program, Kind::Program) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if !kernels.is_null() && num_kernels == 0 {
        return CL_INVALID_VALUE;
    }
    let ids: Vec<u64> =
        if kernels.is_null() { Vec::new() } else { (0..num_kernels).map(|_| p.conn.alloc_id()).collect() };
    let reply = match p.conn.call(CreateKernelsInProgram { program: p.id, ids: ids.clone() }) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if reply.status != CL_SUCCESS {
        return reply.status;
    }
    // With an array, the driver fills `count` <= num_kernels slots, one argument count each.
    const CALL: &str = "clCreateKernelsInProgram";
    let filled = reply.num_args.len();
    if !kernels.is_null() && (filled != reply.count as usize || filled > ids.len()) {
        return p.conn.reject(CALL, &format!("{filled} kernels for {} slots", ids.len()));
    }
    for &n in &reply.num_args {
        if let Err(e) = checked_num_args(&p.conn, CALL, n) {
            return e;
        }
    }
    if !kernels.is_null() {
        for (i, (&id, &n)) in ids.iter().zip(&reply.num_args).enumerate() {
            let h = new_handle(Kind::Kernel, id, &p.conn, kernel_data(&p, n));
            crate::handle::hold(h, program.cast_const(), Kind::Program);
            // SAFETY: kernels holds num_kernels slots and reply.num_args has at most that many.
            unsafe { *kernels.add(i) = h };
            if p.conn.replays() {
                record_by_name(&p, id, h);
            }
        }
    }
    if !num_kernels_ret.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *num_kernels_ret = reply.count };
    }
    CL_SUCCESS
}

/// Replay mode: records kernel `id` (handle `h`) of program `p`, made otherwise than by name
/// (`clCreateKernelsInProgram`), as made by its name, which the driver says: the replacement
/// makes it with `clCreateKernel`. A kernel whose name cannot be had is not recorded (after a
/// death it answers `CL_DEVICE_NOT_AVAILABLE`).
fn record_by_name(p: &crate::handle::Object, id: cloister_ipc::ObjectId, h: cl_kernel) {
    let Ok(k) = lookup(h, Kind::Kernel) else { return };
    let Ok(mut name) = info::query(&k, InfoTarget::Kernel, 0, CL_KERNEL_FUNCTION_NAME) else { return };
    if name.last() == Some(&0) {
        name.pop();
    }
    crate::recovery::note(&p.conn, &CreateKernel { id, program: p.id, name });
}

/// Records the argument, to be shipped with the next enqueue. A shape the driver has accepted
/// before (index, size, kind of value) is recorded without a round trip and, for a value of
/// the same size as the last one, without an allocation: applications set arguments before
/// every enqueue. Inlined into its entry point: applications call it in tight loops, where
/// `set_recorded_arg` answers; the rest goes to `set_kernel_arg`.
#[inline]
pub unsafe fn clSetKernelArg(
    kernel: cl_kernel,
    arg_index: cl_uint,
    arg_size: usize,
    arg_value: *const c_void,
) -> cl_int {
    // SAFETY: forwarded API contract.
    match unsafe { set_recorded_arg(kernel, arg_index, arg_size, arg_value) } {
        Some(rc) => rc,
        // SAFETY: forwarded API contract.
        None => unsafe { set_kernel_arg(kernel, arg_index, arg_size, arg_value) },
    }
}

/// `clSetKernelArg`'s loop case: the kernel, and the memory object or sampler the value names,
/// are live as their handles' cells say (`handle::cells`), and the value has the shape of the
/// one recorded at its index. Nothing else is looked at: no registry, no thread-local, no
/// allocation, no reference count, no branch that only a first call needs. `None` (with
/// nothing changed): `set_kernel_arg` decides.
///
/// # Safety
/// `arg_value` is NULL or points at `arg_size` bytes (the OpenCL API contract).
#[inline(always)]
unsafe fn set_recorded_arg(
    kernel: cl_kernel,
    arg_index: cl_uint,
    arg_size: usize,
    arg_value: *const c_void,
) -> Option<cl_int> {
    if arg_value.is_null() {
        return None;
    }
    // SAFETY: arg_value points at arg_size bytes per the API contract.
    let bytes = unsafe { std::slice::from_raw_parts(arg_value.cast::<u8>(), arg_size) };
    let k = cells::kernel(kernel as usize)?;
    if arg_index >= k.num_args {
        return None;
    }
    let incoming = match word_in(bytes) {
        Some(raw) => match cells::object(raw) {
            Ok(Some(o)) if o.conn == k.conn => Incoming::Object { id: o.id, sampler: o.sampler },
            // A handle of another worker, or one the application released: the full path.
            Ok(_) => return None,
            // A handle that is no cell (`handle::cells`), which the full path finds.
            Err(()) if crate::handle::maybe_handle(raw) => return None,
            Err(()) => Incoming::Bytes(bytes),
        },
        None => Incoming::Bytes(bytes),
    };
    k.args.record_in_shape(arg_index, arg_size, &incoming).then_some(CL_SUCCESS)
}

/// The value of a pointer-sized argument, if it may be one of our handles
/// (`handle::maybe_handle`).
#[inline(always)]
fn handle_in(bytes: &[u8]) -> Option<*const c_void> {
    word_in(bytes).filter(|&raw| crate::handle::maybe_handle(raw)).map(|raw| raw as *const c_void)
}

/// The value of a pointer-sized argument.
#[inline(always)]
fn word_in(bytes: &[u8]) -> Option<usize> {
    Some(usize::from_ne_bytes(bytes.try_into().ok()?))
}

/// `clSetKernelArg` in full: the handles from the registry if need be, a first value at an
/// index, a new shape (checked with the driver at once, so an error comes from this call and
/// not from a later enqueue), a `__local` size, another worker's handle as plain bytes.
///
/// # Safety
/// As for `clSetKernelArg`.
#[inline(never)]
unsafe fn set_kernel_arg(kernel: cl_kernel, arg_index: cl_uint, arg_size: usize, arg_value: *const c_void) -> cl_int {
    // The kernel is lent (`with_object`): no reference count is touched.
    let r = crate::handle::with_object_then(kernel, Kind::Kernel, |k, also| {
        let ObjData::Kernel { num_args, args, .. } = &k.data else {
            return CL_INVALID_KERNEL;
        };
        if arg_index >= *num_args {
            return CL_INVALID_ARG_INDEX;
        }
        let incoming = if arg_value.is_null() {
            Incoming::Local(arg_size as u64)
        } else {
            // SAFETY: arg_value points at arg_size bytes per the API contract.
            let bytes = unsafe { std::slice::from_raw_parts(arg_value.cast::<u8>(), arg_size) };
            match object_arg(bytes, &k.conn, also) {
                Some(object) => object,
                // A memory object or sampler the application released: the driver would get
                // the handle's bytes as its own object's address, and crash on it.
                None => match handle_in(bytes).and_then(|raw| crate::handle::retired_kind(raw as usize)) {
                    Some(Kind::Mem) => return CL_INVALID_MEM_OBJECT,
                    Some(Kind::Sampler) => return CL_INVALID_SAMPLER,
                    _ => Incoming::Bytes(bytes),
                },
            }
        };
        if args.record_in_shape(arg_index, arg_size, &incoming) {
            return CL_SUCCESS;
        }
        // A shape the driver has not seen: ask it now.
        let call = cloister_ipc::SetKernelArg { kernel: k.id, index: arg_index, value: incoming.to_value() };
        match k.conn.call(call) {
            Ok(CL_SUCCESS) => {}
            Ok(e) | Err(e) => return e,
        }
        args.accept(arg_index, arg_size, &incoming);
        CL_SUCCESS
    });
    r.unwrap_or_else(|e| e)
}

/// A pointer-sized argument holding one of our memory-object or sampler handles of the
/// kernel's worker travels as its id (with the kind of object it is); an object of another
/// worker is not one the driver knows, so its handle is just bytes. `lookup` finds handles
/// (`handle::with_object_then`).
#[inline(always)]
fn object_arg<'a>(
    bytes: &'a [u8],
    kernel_conn: &std::sync::Arc<crate::conn::Conn>,
    lookup: &crate::handle::SecondLookup,
) -> Option<Incoming<'a>> {
    let raw = handle_in(bytes)?;
    let (kind, same_worker) = lookup
        .of_kinds(raw, &[Kind::Mem, Kind::Sampler], |o| std::sync::Arc::ptr_eq(&o.conn, kernel_conn).then_some(o.id))?;
    same_worker.map(|id| Incoming::Object { id, sampler: kind == Kind::Sampler })
}

/// Takes the arguments set since the last enqueue, to ship with the next one.
pub fn take_dirty_args(data: &ObjData) -> Vec<(u32, ArgValue)> {
    match data {
        ObjData::Kernel { args, .. } => args.take_dirty(),
        _ => Vec::new(),
    }
}

/// Every argument set so far (for `recovery`, which replays an enqueue with all of them).
pub fn all_args(data: &ObjData) -> Vec<(u32, ArgValue)> {
    match data {
        ObjData::Kernel { args, .. } => args.all(),
        _ => Vec::new(),
    }
}

/// Visits the id of every memory object or sampler set as an argument of the kernel.
pub fn each_object_arg(data: &ObjData, f: impl FnMut(cloister_ipc::ObjectId)) {
    if let ObjData::Kernel { args, .. } = data {
        args.each_object(f);
    }
}

/// Whether every argument of the kernel has a value (a posted enqueue needs them all: the
/// driver's `CL_INVALID_KERNEL_ARGS` would otherwise come late).
pub fn all_args_set(data: &ObjData) -> bool {
    matches!(data, ObjData::Kernel { num_args, args, .. } if args.all_set(*num_args))
}

/// Puts arguments back as unsent after a failed enqueue, so the next one ships them again.
pub fn restore_dirty_args(data: &ObjData, sent: &[(u32, ArgValue)]) {
    if let ObjData::Kernel { args, .. } = data {
        args.restore_dirty(sent);
    }
}

forward_info!(clGetKernelInfo, cl_kernel, Kind::Kernel, InfoTarget::Kernel);

pub unsafe fn clGetKernelWorkGroupInfo(
    kernel: cl_kernel,
    device: cl_device_id,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let dev = if device.is_null() {
        0
    } else {
        match lookup(device, Kind::Device) {
            Ok(d) => d.id,
            Err(e) => return e,
        }
    };
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(
            kernel,
            Kind::Kernel,
            InfoTarget::KernelWorkGroup,
            dev,
            param_name,
            size,
            value,
            size_ret,
            |_| None,
        )
    }
}

pub unsafe fn clGetKernelArgInfo(
    kernel: cl_kernel,
    arg_index: cl_uint,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(
            kernel,
            Kind::Kernel,
            InfoTarget::KernelArg,
            arg_index as u64,
            param_name,
            size,
            value,
            size_ret,
            |_| None,
        )
    }
}

/// A copy of the kernel with the same arguments: the driver copies what it has seen, and the
/// shim copies what it has recorded but not shipped yet.
pub unsafe fn clCloneKernel(source_kernel: cl_kernel, errcode_ret: *mut cl_int) -> cl_kernel {
    let r = (|| {
        let k = lookup(source_kernel, Kind::Kernel)?;
        let ObjData::Kernel { context, num_args, args, launches } = &k.data else {
            return Err(CL_INVALID_KERNEL);
        };
        let data = ObjData::Kernel {
            context: *context,
            num_args: *num_args,
            args: std::sync::Arc::new(args.copy(false)),
            launches: std::sync::Arc::new(launches.copy()),
        };
        // Of the source's program, which it keeps alive too.
        let program = crate::handle::held_by(source_kernel.cast_const()).map(|(h, kind)| (h as *const c_void, kind));
        let made = super::create(&k.conn, Kind::Kernel, data, |id| {
            let rc = k.conn.call(cloister_ipc::CloneKernel { id, source: k.id });
            if rc == Ok(CL_SUCCESS) && k.conn.replays() {
                // The replacement makes it as its source was made: every enqueue carries all
                // of a kernel's arguments, so the ones the clone copied need no replay.
                crate::recovery::journal_of(&k.conn).cloned(id, k.id);
            }
            rc
        })?;
        if let Some((program, kind)) = program {
            crate::handle::hold(made, program, kind);
        }
        Ok(made)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clGetKernelSubGroupInfo(
    kernel: cl_kernel,
    device: cl_device_id,
    param_name: cl_uint,
    input_size: usize,
    input: *const c_void,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    let k = lookup(kernel, Kind::Kernel)?;
    let dev = if device.is_null() { 0 } else { lookup(device, Kind::Device)?.id };
    // SAFETY: input holds input_size bytes.
    let input = unsafe { super::slice(input.cast::<u8>(), input_size, CL_INVALID_VALUE)? }.to_vec();
    let reply =
        k.conn.call(cloister_ipc::GetKernelSubGroupInfo { kernel: k.id, device: dev, param: param_name, input })?;
    if reply.status != CL_SUCCESS {
        return Err(reply.status);
    }
    if reply.value_status != CL_SUCCESS && !value.is_null() {
        return Err(reply.value_status);
    }
    // SAFETY: value/size_ret per the API contract.
    Ok(unsafe { info::write_value(&reply.value, size, value, size_ret) })
}

/// `cl_khr_subgroups`' name for the same query.
pub unsafe fn clGetKernelSubGroupInfoKHR(
    kernel: cl_kernel,
    device: cl_device_id,
    param_name: cl_uint,
    input_size: usize,
    input: *const c_void,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    // SAFETY: forwarded API contract.
    unsafe { clGetKernelSubGroupInfo(kernel, device, param_name, input_size, input, size, value, size_ret) }
}

retain_release! {
    clRetainKernel, clReleaseKernel, cl_kernel, Kind::Kernel;
}
