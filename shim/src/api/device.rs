//! Devices: enumerated by the workers; type-filtered lists are asked of the driver once.

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::{CreateSubDevices, GetDeviceIds, InfoTarget, WORKER_ID_BIT};

use crate::conn::Conn;
use crate::handle::{lookup, new_handle, Kind, ObjData, Object};
use crate::info;

use super::{extensions, forward_info, retain_release};

/// Under `CLOISTER_RECOVERY=auto`, settles (once per worker, before its first object) whether
/// `conn`'s worker is replayed: when every device of its driver shares the host's memory, so
/// its buffers are zero-copy and the journal copies next to nothing.
pub(super) fn decide_recovery(conn: &Conn) {
    // Zero-copy buffers must be on as well: staged buffers make the journal copy.
    conn.settle_replay(|| {
        let mut devices = conn.platforms.get().into_iter().flatten().flat_map(|(_, d)| d.iter().copied()).peekable();
        cloister_ipc::settings::zero_copy()
            && devices.peek().is_some()
            && devices.all(|h| {
                lookup(h as *const c_void, Kind::Device)
                    .ok()
                    .and_then(|dev| super::memory::device_value(&dev, CL_DEVICE_HOST_UNIFIED_MEMORY))
                    .is_some_and(|v| v != 0)
            })
    });
}

pub unsafe fn clGetDeviceIDs(
    platform: cl_platform_id,
    device_type: cl_bitfield,
    num_entries: cl_uint,
    devices: *mut cl_device_id,
    num_devices: *mut cl_uint,
) -> cl_int {
    let platform = if platform.is_null() {
        crate::runtime::runtime().platforms().first().map_or(std::ptr::null_mut(), |&p| p as cl_platform_id)
    } else {
        platform
    };
    let obj = match lookup(platform, Kind::Platform) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if (num_entries == 0 && !devices.is_null()) || (devices.is_null() && num_devices.is_null()) {
        return CL_INVALID_VALUE;
    }
    // Cached beside the info values under a parameter name no info query uses.
    let key = (u32::MAX, device_type);
    let cached = obj.cached_info(key, <[u8]>::to_vec);
    let ids: Vec<u64> = match cached {
        Some(bytes) => bytes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default())).collect(),
        None => {
            let reply = match obj.conn.call(GetDeviceIds { platform: obj.id, device_type }) {
                Ok(r) => r,
                Err(e) => return e,
            };
            if reply.status != CL_SUCCESS {
                return reply.status;
            }
            let bytes = reply.ids.iter().flat_map(|i| i.to_ne_bytes()).collect();
            obj.cache_info(key, bytes);
            reply.ids
        }
    };
    let handles: Vec<u64> = ids.iter().map(|&id| obj.conn.handle_of(id)).filter(|&h| h != 0).collect();
    if handles.is_empty() {
        return CL_DEVICE_NOT_FOUND;
    }
    if !num_devices.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *num_devices = handles.len() as cl_uint };
    }
    if !devices.is_null() {
        for (i, &h) in handles.iter().take(num_entries as usize).enumerate() {
            // SAFETY: the caller provides num_entries slots.
            unsafe { *devices.add(i) = h as cl_device_id };
        }
    }
    CL_SUCCESS
}

forward_info!(clGetDeviceInfo, cl_device_id, Kind::Device, InfoTarget::Device, device_answers);

/// What the shim answers about a device itself: availability after a worker death, sub-device
/// reference counts, and the masked capability and extension values. Inline, a test of the
/// parameter alone, with the answers out of line (`device_answer`): the common query (a
/// device's name, its limits) is none of these and goes on to the cache without a call.
#[inline(always)]
fn device_answers(obj: &Object, param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    match param_name {
        CL_DEVICE_AVAILABLE | CL_DEVICE_REFERENCE_COUNT => device_answer(obj, param_name),
        p if extensions::rewrites_device_param(p) => device_answer(obj, param_name),
        _ => None,
    }
}

/// `device_answers` for the parameters it names.
#[inline(never)]
fn device_answer(obj: &Object, param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    match param_name {
        // A device whose worker died is unavailable, not an error.
        CL_DEVICE_AVAILABLE if obj.conn.is_dead() => Some(Ok(CL_FALSE.to_ne_bytes().to_vec())),
        // Sub-devices are counted here; root devices always say 1.
        CL_DEVICE_REFERENCE_COUNT if obj.id & WORKER_ID_BIT == 0 => Some(Ok(obj.ref_count().to_ne_bytes().to_vec())),
        p if extensions::rewrites_device_param(p) => Some(masked(obj, p)),
        _ => None,
    }
}

/// The driver's value of `param`, masked to what the cage supports.
#[inline(never)]
fn masked(obj: &Object, param: cl_uint) -> Result<Vec<u8>, cl_int> {
    info::query(obj, InfoTarget::Device, 0, param).map(|v| {
        // Versioned masking needs the versions; a 1.2 device has none.
        let versions = info::query(obj, InfoTarget::Device, 0, CL_DEVICE_EXTENSIONS_WITH_VERSION).unwrap_or_default();
        extensions::device_value(param, v, &versions)
    })
}

/// Sub-devices are objects like any other: ids from the shim, reference counted here.
pub unsafe fn clCreateSubDevices(
    in_device: cl_device_id,
    properties: *const isize,
    num_devices: cl_uint,
    out_devices: *mut cl_device_id,
    num_devices_ret: *mut cl_uint,
) -> Result<cl_int, cl_int> {
    let d = lookup(in_device, Kind::Device)?;
    if properties.is_null() || (out_devices.is_null() && num_devices_ret.is_null()) {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: properties is zero-terminated per the API contract.
    let props = unsafe { super::memory::property_list(properties) }.unwrap_or_default();
    let props: Vec<i64> = props.into_iter().map(|p| p as i64).collect();
    let ids: Vec<u64> =
        if out_devices.is_null() { Vec::new() } else { (0..num_devices).map(|_| d.conn.alloc_id()).collect() };
    let req = CreateSubDevices { device: d.id, properties: props, ids: ids.clone() };
    decide_recovery(&d.conn);
    let copy = d.conn.replays().then(|| req.clone());
    let reply = d.conn.call(req)?;
    if reply.status != CL_SUCCESS {
        return Err(reply.status);
    }
    if let Some(copy) = copy.filter(|c| !c.ids.is_empty()) {
        crate::recovery::note(&d.conn, &copy);
    }
    // A driver that made more sub-devices than the array holds must have failed instead.
    if !out_devices.is_null() && reply.count as usize > ids.len() {
        let what = format!("{} sub-devices for {} slots", reply.count, ids.len());
        return Err(d.conn.reject("clCreateSubDevices", &what));
    }
    if !out_devices.is_null() {
        for (i, &id) in ids.iter().take(reply.count as usize).enumerate() {
            // SAFETY: out_devices holds num_devices slots.
            unsafe { *out_devices.add(i) = new_handle(Kind::Device, id, &d.conn, ObjData::Device) };
        }
    }
    if !num_devices_ret.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *num_devices_ret = reply.count };
    }
    Ok(CL_SUCCESS)
}

retain_release! {
    clRetainDevice, clReleaseDevice, cl_device_id, Kind::Device;
}

fn timers(device: cl_device_id, with_device: bool) -> Result<cloister_ipc::TimersReply, cl_int> {
    let d = lookup(device, Kind::Device)?;
    let reply = d.conn.call(cloister_ipc::GetTimers { device: d.id, with_device })?;
    if reply.status != CL_SUCCESS {
        return Err(reply.status);
    }
    Ok(reply)
}

pub unsafe fn clGetDeviceAndHostTimer(
    device: cl_device_id,
    device_timestamp: *mut cl_ulong,
    host_timestamp: *mut cl_ulong,
) -> cl_int {
    // The driver first (a platform without timers answers CL_INVALID_OPERATION whatever the
    // pointers), then the pointers.
    match timers(device, true) {
        Ok(_) if device_timestamp.is_null() || host_timestamp.is_null() => CL_INVALID_VALUE,
        Ok(t) => {
            // SAFETY: both checked non-NULL; the API contract makes them writable.
            unsafe {
                *device_timestamp = t.device_timestamp;
                *host_timestamp = t.host_timestamp;
            }
            CL_SUCCESS
        }
        Err(e) => e,
    }
}

/// The host clock is the worker's: the same CLOCK as the application's on one machine, and
/// the one the driver relates device timestamps to.
pub unsafe fn clGetHostTimer(device: cl_device_id, host_timestamp: *mut cl_ulong) -> cl_int {
    match timers(device, false) {
        Ok(_) if host_timestamp.is_null() => CL_INVALID_VALUE,
        Ok(t) => {
            // SAFETY: checked non-NULL; the API contract makes it writable.
            unsafe { *host_timestamp = t.host_timestamp };
            CL_SUCCESS
        }
        Err(e) => e,
    }
}
