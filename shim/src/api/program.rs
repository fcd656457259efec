//! Programs.

use std::ffi::{c_char, c_void, CStr};

use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::*;

use super::{creation, ids_of, retain_release, slice};
use crate::conn::{BuildNotifyFn, Callback, Conn};
use crate::handle::{lookup, new_handle, Kind, ObjData, Object};
use crate::info;

pub unsafe fn clCreateProgramWithSource(
    context: cl_context,
    count: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        if count == 0 || strings.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let mut sources = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: `strings` holds `count` pointers per the API contract.
            let s = unsafe { *strings.add(i) };
            if s.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: lengths is NULL or holds `count` entries.
            let len = if lengths.is_null() { 0 } else { unsafe { *lengths.add(i) } };
            let bytes = if len == 0 {
                // SAFETY: a zero length means the string is NUL-terminated.
                unsafe { CStr::from_ptr(s) }.to_bytes().to_vec()
            } else {
                // SAFETY: the string holds `len` bytes.
                unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) }.to_vec()
            };
            sources.push(bytes);
        }
        if let Some(injected) = crate::intercept::program::at_source_creation(context, &mut sources) {
            return injected;
        }
        // The driver cannot open the application's files by absolute path (the cage forbids
        // it): it gets those includes relative to the root of the staged headers, and the
        // application's own text is kept (taken before the first rewrite) for its queries.
        let mut app_source = None;
        for i in 0..sources.len() {
            if let Some(relative) = crate::includes::relative_includes(&sources[i]) {
                app_source.get_or_insert_with(|| sources.concat());
                sources[i] = relative;
            }
        }
        let held = (context.cast_const(), Kind::Context);
        super::create_held(held, &ctx.conn, Kind::Program, ObjData::program_with(ctx.id, app_source), |id| {
            crate::recovery::recorded(&ctx.conn, CreateProgramWithSource { id, context: ctx.id, sources })
        })
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clBuildProgram(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
) -> Result<cl_int, cl_int> {
    let p = lookup(program, Kind::Program)?;
    if (num_devices == 0) != device_list.is_null() || (pfn_notify.is_null() && !user_data.is_null()) {
        return Err(CL_INVALID_VALUE);
    }
    let devices = if device_list.is_null() {
        None
    } else {
        // SAFETY: device_list holds num_devices handles.
        let devs = unsafe { slice(device_list, num_devices as usize, CL_INVALID_VALUE)? };
        Some(ids_of(devs, Kind::Device, CL_INVALID_DEVICE)?.0)
    };
    // SAFETY: options is NULL or NUL-terminated.
    let options = (!options.is_null()).then(|| unsafe { CStr::from_ptr(options) }.to_bytes().to_vec());
    let notify = if pfn_notify.is_null() {
        None
    } else {
        // SAFETY: the application passes a function of clBuildProgram's pfn_notify type.
        let pfn = unsafe { std::mem::transmute::<*mut c_void, BuildNotifyFn>(pfn_notify) };
        // Kept alive until its callback has run (see `Callback::Build`).
        crate::handle::retain(program, Kind::Program);
        Some(p.conn.register_callback(Callback::Build {
            pfn,
            user_data: user_data as usize,
            program: program as usize,
        }))
    };
    let app_options = crate::intercept::program::build_options(options);
    let (options, includes) = with_includes(&p, app_options.clone());
    let req = BuildProgram { program: p.id, devices, options, includes, notify };
    if p.conn.replays() {
        crate::recovery::journal_of(&p.conn).built(req.clone());
    }
    let reply = p.conn.call(req);
    let built = finish_build(&p.conn, notify, reply.map(|r| (r.status, r.callback_sent)));
    crate::intercept::program::after_build(program, app_options.as_deref());
    built
}

/// After a build, compile or link with callback `notify`: a callback the driver called during
/// the call has run in the application too before the call returns (as it would directly); a
/// call that failed without calling it never will, so it is forgotten.
fn finish_build(conn: &Conn, notify: Option<u64>, reply: Result<(cl_int, bool), cl_int>) -> Result<cl_int, cl_int> {
    let Some(token) = notify else { return reply.map(|(status, _)| status) };
    match reply {
        Ok((status, true)) => {
            conn.await_build_callback(token);
            Ok(status)
        }
        Ok((CL_SUCCESS, false)) => Ok(CL_SUCCESS),
        Ok((status, false)) => {
            forget_build_callback(conn, token);
            Ok(status)
        }
        Err(e) => {
            forget_build_callback(conn, token);
            Err(e)
        }
    }
}

/// Drops a build callback that will never run, and the program reference it held.
fn forget_build_callback(conn: &Conn, token: u64) {
    if let Some(Callback::Build { program, .. }) = conn.unregister_callback(token) {
        crate::handle::release(program as *mut c_void, Kind::Program);
    }
}

/// A build's options, with the application's headers it needs gathered for the worker (which
/// cannot read them itself). The program keeps the application's options where the driver
/// gets others, for `CL_PROGRAM_BUILD_OPTIONS`.
fn with_includes(p: &Object, options: Option<Vec<u8>>) -> (Option<Vec<u8>>, Option<AppIncludes>) {
    let source = match &p.data {
        ObjData::Program { app_source: Some(s), .. } => s.clone(),
        _ => info::query(p, InfoTarget::Program, 0, CL_PROGRAM_SOURCE).unwrap_or_default(),
    };
    let (options, includes, app_options) = match crate::includes::gather(&source, options.as_deref()) {
        Some((includes, rest)) => (Some(rest), Some(includes), Some(options.unwrap_or_default())),
        None => (options, None, None),
    };
    if let ObjData::Program { build_options, .. } = &p.data {
        *build_options.lock().unwrap_or_else(|e| e.into_inner()) = app_options;
    }
    (options, includes)
}

/// A device list argument: `None` for NULL (all devices), ids otherwise.
///
/// # Safety
/// `list` is NULL or holds `n` handles.
unsafe fn device_list(n: cl_uint, list: *const cl_device_id) -> Result<Option<Vec<ObjectId>>, cl_int> {
    if (n == 0) != list.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    if list.is_null() {
        return Ok(None);
    }
    // SAFETY: guaranteed by the caller.
    let devs = unsafe { slice(list, n as usize, CL_INVALID_VALUE)? };
    Ok(Some(ids_of(devs, Kind::Device, CL_INVALID_DEVICE)?.0))
}

/// An optional NUL-terminated string argument.
///
/// # Safety
/// `s` is NULL or NUL-terminated.
unsafe fn c_bytes(s: *const c_char) -> Option<Vec<u8>> {
    // SAFETY: guaranteed by the caller.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_bytes().to_vec())
}

/// Registers a build-style notification for `program` (the handle the callback gets).
fn build_notify(
    conn: &Conn,
    program: *mut c_void,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
) -> Result<Option<u64>, cl_int> {
    if pfn_notify.is_null() {
        return if user_data.is_null() { Ok(None) } else { Err(CL_INVALID_VALUE) };
    }
    // SAFETY: the application passes a function of the pfn_notify type of clBuildProgram,
    // clCompileProgram and clLinkProgram (all the same).
    let pfn = unsafe { std::mem::transmute::<*mut c_void, BuildNotifyFn>(pfn_notify) };
    // Kept alive until its callback has run (see `Callback::Build`).
    crate::handle::retain(program, Kind::Program);
    Ok(Some(conn.register_callback(Callback::Build { pfn, user_data: user_data as usize, program: program as usize })))
}

pub unsafe fn clCreateProgramWithBinary(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    lengths: *const usize,
    binaries: *mut *const c_char,
    binary_status: *mut cl_int,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        if num_devices == 0 || device_list.is_null() || lengths.is_null() || binaries.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: device_list holds num_devices handles.
        let devs = unsafe { slice(device_list, num_devices as usize, CL_INVALID_VALUE)? };
        let (devices, _) = ids_of(devs, Kind::Device, CL_INVALID_DEVICE)?;
        let mut bins = Vec::with_capacity(devices.len());
        for i in 0..num_devices as usize {
            // SAFETY: lengths and binaries hold num_devices entries.
            let (len, bin) = unsafe { (*lengths.add(i), *binaries.add(i)) };
            if len == 0 || bin.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: each binary holds `len` bytes.
            bins.push(unsafe { std::slice::from_raw_parts(bin.cast::<u8>(), len) }.to_vec());
        }
        let id = ctx.conn.alloc_id();
        let req = CreateProgramWithBinary { id, context: ctx.id, devices, binaries: bins };
        let copy = ctx.conn.replays().then(|| req.clone());
        let reply = ctx.conn.call(req)?;
        if let (Some(req), CL_SUCCESS) = (copy, reply.status) {
            crate::recovery::note(&ctx.conn, &req);
        }
        if !binary_status.is_null() {
            for (i, &st) in reply.statuses.iter().take(num_devices as usize).enumerate() {
                // SAFETY: binary_status holds num_devices entries.
                unsafe { *binary_status.add(i) = st };
            }
        }
        match reply.status {
            CL_SUCCESS => {
                let h = new_handle(Kind::Program, id, &ctx.conn, ObjData::program(ctx.id));
                crate::handle::hold(h, context.cast_const(), Kind::Context);
                Ok(h)
            }
            e => Err(e),
        }
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateProgramWithIL(
    context: cl_context,
    il: *const c_void,
    length: usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        // SAFETY: il holds `length` bytes.
        let il = unsafe { slice(il.cast::<u8>(), length, CL_INVALID_VALUE)? }.to_vec();
        if il.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        super::create_held(
            (context.cast_const(), Kind::Context),
            &ctx.conn,
            Kind::Program,
            ObjData::program(ctx.id),
            |id| ctx.conn.call(CreateProgramWithIl { id, context: ctx.id, il }),
        )
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateProgramWithBuiltInKernels(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    kernel_names: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        // SAFETY: device_list per the API contract.
        let devices = unsafe { self::device_list(num_devices, device_list)? }.ok_or(CL_INVALID_VALUE)?;
        // SAFETY: kernel_names is NUL-terminated.
        let names = unsafe { c_bytes(kernel_names) }.ok_or(CL_INVALID_VALUE)?;
        super::create_held(
            (context.cast_const(), Kind::Context),
            &ctx.conn,
            Kind::Program,
            ObjData::program(ctx.id),
            |id| ctx.conn.call(CreateProgramWithBuiltInKernels { id, context: ctx.id, devices, names }),
        )
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCompileProgram(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_input_headers: cl_uint,
    input_headers: *const cl_program,
    header_include_names: *mut *const c_char,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
) -> Result<cl_int, cl_int> {
    let p = lookup(program, Kind::Program)?;
    // SAFETY: device_list per the API contract.
    let devices = unsafe { self::device_list(num_devices, device_list)? };
    if (num_input_headers == 0) != (input_headers.is_null() || header_include_names.is_null())
        && !(num_input_headers == 0 && input_headers.is_null() && header_include_names.is_null())
    {
        return Err(CL_INVALID_VALUE);
    }
    let mut headers = Vec::with_capacity(num_input_headers as usize);
    for i in 0..num_input_headers as usize {
        // SAFETY: both arrays hold num_input_headers entries.
        let (h, name) = unsafe { (*input_headers.add(i), *header_include_names.add(i)) };
        let hp = lookup(h, Kind::Program).map_err(|_| CL_INVALID_VALUE)?;
        // SAFETY: include names are NUL-terminated.
        let name = unsafe { c_bytes(name) }.ok_or(CL_INVALID_VALUE)?;
        headers.push((hp.id, name));
    }
    // SAFETY: options is NULL or NUL-terminated.
    let options = crate::intercept::program::build_options(unsafe { c_bytes(options) });
    let notify = build_notify(&p.conn, program, pfn_notify, user_data)?;
    let (options, includes) = with_includes(&p, options);
    let req = CompileProgram { program: p.id, devices, options, headers, includes, notify };
    if p.conn.replays() {
        crate::recovery::journal_of(&p.conn).compiled(req.clone());
    }
    let reply = p.conn.call(req);
    finish_build(&p.conn, notify, reply.map(|r| (r.status, r.callback_sent)))
}

pub unsafe fn clLinkProgram(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_input_programs: cl_uint,
    input_programs: *const cl_program,
    pfn_notify: *mut c_void,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        // SAFETY: device_list per the API contract.
        let devices = unsafe { self::device_list(num_devices, device_list)? };
        if num_input_programs == 0 || input_programs.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: input_programs holds num_input_programs handles.
        let progs = unsafe { slice(input_programs, num_input_programs as usize, CL_INVALID_VALUE)? };
        let (inputs, _) = ids_of(progs, Kind::Program, CL_INVALID_PROGRAM)?;
        // SAFETY: options is NULL or NUL-terminated.
        let options = unsafe { c_bytes(options) };
        // The callback names the new program, so its handle exists before the driver links.
        let id = ctx.conn.alloc_id();
        let handle = new_handle(Kind::Program, id, &ctx.conn, ObjData::program(ctx.id));
        crate::handle::hold(handle, context.cast_const(), Kind::Context);
        let discard = |e| {
            crate::handle::release(handle, Kind::Program);
            Err(e)
        };
        let notify = match build_notify(&ctx.conn, handle, pfn_notify, user_data) {
            Ok(n) => n,
            Err(e) => return discard(e),
        };
        let req = LinkProgram { id, context: ctx.id, devices, options, inputs, notify };
        let copy = ctx.conn.replays().then(|| LinkProgram { notify: None, ..req.clone() });
        let reply = match ctx.conn.call(req) {
            Ok(r) => r,
            Err(e) => {
                let _ = finish_build(&ctx.conn, notify, Err(e));
                return discard(e);
            }
        };
        if !reply.created {
            let _ = finish_build(&ctx.conn, notify, Err(reply.status));
            return discard(if reply.status == CL_SUCCESS { CL_OUT_OF_RESOURCES } else { reply.status });
        }
        let _ = finish_build(&ctx.conn, notify, Ok((reply.status, reply.callback_sent)));
        if let Some(copy) = copy {
            crate::recovery::note(&ctx.conn, &copy);
        }
        // A program that failed to link still exists (its log says why).
        Ok((handle, reply.status))
    })();
    match r {
        Ok((h, status)) => {
            // SAFETY: errcode_ret per API contract.
            unsafe { super::set_err(errcode_ret, status) };
            h
        }
        // SAFETY: errcode_ret per API contract.
        Err(e) => unsafe { creation(Err(e), errcode_ret) },
    }
}

/// `CL_PROGRAM_BINARIES`: the application passes an array of its own buffers, one per device,
/// and the bytes go where those pointers say. It sized them from the `CL_PROGRAM_BINARY_SIZES`
/// it was told (`told_binary_sizes`): the worker's binaries must match those in number, and
/// none may be longer, or the worker would decide how many bytes land in the application's
/// memory.
fn program_binaries(p: &Arc<Object>, size: usize, value: *mut c_void, size_ret: *mut usize) -> cl_int {
    let reply = match p.conn.call(GetProgramBinaries { program: p.id }) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if reply.status != CL_SUCCESS {
        return reply.status;
    }
    let need = reply.binaries.len() * std::mem::size_of::<*mut u8>();
    if !value.is_null() {
        if size < need {
            return CL_INVALID_VALUE;
        }
        let told = match told_binary_sizes(p) {
            Ok(t) => t,
            Err(e) => return e,
        };
        let fits = |(bin, &cap): (&Vec<u8>, &usize)| bin.len() <= cap;
        if told.len() != reply.binaries.len() || !reply.binaries.iter().zip(&told).all(fits) {
            return p.conn.reject("CL_PROGRAM_BINARIES", "binaries longer than the sizes it gave");
        }
        let dsts = value.cast::<*mut u8>();
        for (i, bin) in reply.binaries.iter().enumerate() {
            // SAFETY: value holds one pointer per device (size checked); a non-NULL pointer is
            // the application's buffer of CL_PROGRAM_BINARY_SIZES[i] bytes, and the binary is
            // no longer (checked above).
            unsafe {
                let dst = *dsts.add(i);
                if !dst.is_null() {
                    std::ptr::copy_nonoverlapping(bin.as_ptr(), dst, bin.len());
                }
            }
        }
    }
    if !size_ret.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *size_ret = need };
    }
    CL_SUCCESS
}

/// The binary sizes the application was last told; asked now (and remembered) if it never
/// asked, as its buffers can then only have come from the same answer.
fn told_binary_sizes(p: &Object) -> Result<Vec<usize>, cl_int> {
    let ObjData::Program { binary_sizes, .. } = &p.data else { return Err(CL_INVALID_PROGRAM) };
    if let Some(told) = binary_sizes.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return Ok(told);
    }
    let bytes = info::query(p, InfoTarget::Program, 0, CL_PROGRAM_BINARY_SIZES)?;
    Ok(remember_binary_sizes(p, &bytes))
}

/// Records a `CL_PROGRAM_BINARY_SIZES` answer the application is given.
fn remember_binary_sizes(p: &Object, bytes: &[u8]) -> Vec<usize> {
    const W: usize = std::mem::size_of::<usize>();
    let sizes: Vec<usize> =
        bytes.chunks_exact(W).map(|c| usize::from_ne_bytes(c.try_into().unwrap_or([0; W]))).collect();
    if let ObjData::Program { binary_sizes, .. } = &p.data {
        *binary_sizes.lock().unwrap_or_else(|e| e.into_inner()) = Some(sizes.clone());
    }
    sizes
}

pub unsafe fn clGetProgramInfo(
    program: cl_program,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    if param_name == CL_PROGRAM_BINARIES {
        return match lookup(program, Kind::Program) {
            Ok(p) => program_binaries(&p, size, value, size_ret),
            Err(e) => e,
        };
    }
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(program, Kind::Program, InfoTarget::Program, 0, param_name, size, value, size_ret, |p| {
            match (&p.data, param_name) {
                // The source as the application wrote it, NUL-terminated as drivers return it.
                (ObjData::Program { app_source: Some(s), .. }, CL_PROGRAM_SOURCE) => {
                    Some(Ok(s.iter().copied().chain([0]).collect()))
                }
                (_, CL_PROGRAM_BINARY_SIZES) => Some(info::query(p, InfoTarget::Program, 0, param_name).inspect(|v| {
                    remember_binary_sizes(p, v);
                })),
                _ => None,
            }
        })
    }
}

pub unsafe fn clSetProgramSpecializationConstant(
    program: cl_program,
    spec_id: cl_uint,
    spec_size: usize,
    spec_value: *const c_void,
) -> Result<cl_int, cl_int> {
    let p = lookup(program, Kind::Program)?;
    // SAFETY: spec_value holds spec_size bytes.
    let value = unsafe { slice(spec_value.cast::<u8>(), spec_size, CL_INVALID_VALUE)? }.to_vec();
    if value.is_empty() {
        return Err(CL_INVALID_VALUE);
    }
    p.conn.call(SetProgramSpecializationConstant { program: p.id, spec_id, value })
}

/// Deprecated in OpenCL 3.0 but still exported: the shim runs the callback when the program's
/// last reference goes.
/// The driver says whether it takes release callbacks at all (pocl 3.1 does not: its devices
/// have no program-scope destructors); the application's callback then runs in the shim.
pub unsafe fn clSetProgramReleaseCallback(program: cl_program, pfn: *mut c_void, user_data: *mut c_void) -> cl_int {
    let p = match lookup(program, Kind::Program) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if pfn.is_null() {
        return CL_INVALID_VALUE;
    }
    match p.conn.call(cloister_ipc::ProbeProgramReleaseCallback { program: p.id }) {
        Ok(CL_SUCCESS) => super::memory::add_destructor(program, Kind::Program, pfn, user_data),
        Ok(e) | Err(e) => e,
    }
}

pub unsafe fn clGetProgramBuildInfo(
    program: cl_program,
    device: cl_device_id,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let dev = match lookup(device, Kind::Device) {
        Ok(d) => d.id,
        Err(e) => return e,
    };
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(program, Kind::Program, InfoTarget::ProgramBuild, dev, param_name, size, value, size_ret, |p| {
            match (&p.data, param_name) {
                // The options as the application gave them, NUL-terminated as drivers return them.
                (ObjData::Program { build_options, .. }, CL_PROGRAM_BUILD_OPTIONS) => {
                    let given = build_options.lock().unwrap_or_else(|e| e.into_inner());
                    given.as_ref().map(|o| Ok(o.iter().copied().chain([0]).collect()))
                }
                _ => None,
            }
        })
    }
}

retain_release! {
    clRetainProgram, clReleaseProgram, cl_program, Kind::Program;
}
