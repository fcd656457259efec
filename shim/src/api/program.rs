//! Programs.

use std::ffi::{c_char, c_void, CStr};

use cloister_ipc::cl::*;
use cloister_ipc::{BuildProgram, CreateProgramWithSource, InfoTarget};

use super::{create, creation, forward_info, ids_of, retain_release, slice};
use crate::conn::{BuildNotifyFn, Callback};
use crate::handle::{lookup, Kind, ObjData};
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
        create(&ctx.conn, Kind::Program, ObjData::Program, |id| {
            ctx.conn.call(CreateProgramWithSource { id, context: ctx.id, sources })
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
) -> cl_int {
    let r = (|| {
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
            Some(p.conn.register_callback(Callback::Build {
                pfn,
                user_data: user_data as usize,
                program: program as usize,
            }))
        };
        let rc = p.conn.call(BuildProgram { program: p.id, devices, options, notify });
        if let (Some(token), Err(_)) = (notify, &rc) {
            p.conn.unregister_callback(token);
        }
        rc
    })();
    r.unwrap_or_else(|e| e)
}

forward_info!(clGetProgramInfo, cl_program, Kind::Program, InfoTarget::Program);

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
        info::get_info(program, Kind::Program, InfoTarget::ProgramBuild, dev, param_name, size, value, size_ret, |_| {
            None
        })
    }
}

retain_release! {
    clRetainProgram, clReleaseProgram, cl_program, Kind::Program;
}
