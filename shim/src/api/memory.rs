//! Buffers. `CL_MEM_USE_HOST_PTR` becomes `CL_MEM_COPY_HOST_PTR` on the worker (it cannot see
//! the application's memory); the shim keeps the application's pointer and syncs it on map and
//! blocking read, and answers `CL_MEM_FLAGS` / `CL_MEM_HOST_PTR` itself.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cloister_ipc::cl::*;
use cloister_ipc::lane::BULK_CAP;
use cloister_ipc::{CreateBuffer, DataRef, InfoTarget};

use super::{create, creation, retain_release};
use crate::handle::{lookup, Kind, ObjData};
use crate::info;

pub unsafe fn clCreateBuffer(
    context: cl_context,
    flags: cl_bitfield,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        let uses = flags & CL_MEM_USE_HOST_PTR != 0;
        let copies = flags & CL_MEM_COPY_HOST_PTR != 0;
        if uses && (copies || flags & CL_MEM_ALLOC_HOST_PTR != 0) {
            return Err(CL_INVALID_VALUE);
        }
        if host_ptr.is_null() == (uses || copies) {
            return Err(CL_INVALID_HOST_PTR);
        }
        if size == 0 {
            return Err(CL_INVALID_BUFFER_SIZE);
        }
        let wire_flags = if uses { (flags & !CL_MEM_USE_HOST_PTR) | CL_MEM_COPY_HOST_PTR } else { flags };
        let data = ObjData::Mem {
            flags,
            host_ptr: if uses { host_ptr as usize } else { 0 },
            maps: Mutex::new(HashMap::new()),
        };
        let conn = ctx.conn.clone();
        create(&conn, Kind::Mem, data, |id| {
            let req = |host_data| CreateBuffer { id, context: ctx.id, flags: wire_flags, size: size as u64, host_data };
            if host_ptr.is_null() {
                return conn.call(req(None));
            }
            if size <= BULK_CAP {
                let copy = |bulk: *mut u8| {
                    // SAFETY: the application's host_ptr holds `size` bytes; the bulk area
                    // BULK_CAP >= size.
                    unsafe { std::ptr::copy_nonoverlapping(host_ptr.cast::<u8>(), bulk, size) };
                    Ok(())
                };
                return conn.call_with(req(Some(DataRef::Lane { offset: 0, len: size as u64 })), copy, |_, _| ());
            }
            let seg = conn.acquire_segment(size)?;
            // SAFETY: as above; the segment holds at least `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(host_ptr.cast::<u8>(), seg.region.as_ptr(), size) };
            let rc = conn.call(req(Some(DataRef::Segment { id: seg.id, offset: 0, len: size as u64 })));
            conn.release_segment(seg);
            rc
        })
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clGetMemObjectInfo(
    memobj: cl_mem,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(memobj, Kind::Mem, InfoTarget::MemObject, 0, param_name, size, value, size_ret, |obj| {
            let ObjData::Mem { flags, host_ptr, .. } = &obj.data else {
                return None;
            };
            match param_name {
                CL_MEM_FLAGS => Some(Ok(flags.to_ne_bytes().to_vec())),
                CL_MEM_HOST_PTR => Some(Ok(host_ptr.to_ne_bytes().to_vec())),
                _ => None,
            }
        })
    }
}

retain_release! {
    clRetainMemObject, clReleaseMemObject, cl_mem, Kind::Mem;
}
