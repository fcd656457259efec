//! Platforms: enumerated by the workers, mirrored here with `cl_cloister_sandbox` added.

use std::ffi::{c_char, c_void, CStr};

use cloister_ipc::cl::*;
use cloister_ipc::InfoTarget;

use super::extensions;
use crate::handle::{lookup, Kind};
use crate::info;
use crate::runtime::runtime;

/// The extension name that tells a user the platform is caged.
pub const SANDBOX_EXTENSION: &str = "cl_cloister_sandbox";

/// # Safety
/// OpenCL API contract for clGetPlatformIDs.
pub unsafe fn icd_get_platform_ids(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    if (num_entries == 0 && !platforms.is_null()) || (platforms.is_null() && num_platforms.is_null()) {
        return CL_INVALID_VALUE;
    }
    let all = runtime().platforms();
    if !num_platforms.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *num_platforms = all.len() as cl_uint };
    }
    if !platforms.is_null() {
        for (i, p) in all.iter().take(num_entries as usize).enumerate() {
            // SAFETY: the caller provides num_entries slots.
            unsafe { *platforms.add(i) = *p as cl_platform_id };
        }
    }
    CL_SUCCESS
}

pub unsafe fn clGetPlatformIDs(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    // SAFETY: same contract.
    let rc = unsafe { icd_get_platform_ids(num_entries, platforms, num_platforms) };
    if rc == CL_SUCCESS && runtime().platforms().is_empty() {
        return CL_PLATFORM_NOT_FOUND_KHR;
    }
    rc
}

/// A NULL platform means "the default": the first caged one.
fn platform_or_default(platform: cl_platform_id) -> cl_platform_id {
    if platform.is_null() {
        runtime().platforms().first().map_or(std::ptr::null_mut(), |&p| p as cl_platform_id)
    } else {
        platform
    }
}

pub unsafe fn clGetPlatformInfo(
    platform: cl_platform_id,
    param_name: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let platform = platform_or_default(platform);
    // SAFETY: forwarded API contract.
    unsafe {
        info::get_info(platform, Kind::Platform, InfoTarget::Platform, 0, param_name, size, value, size_ret, |obj| {
            match param_name {
                CL_PLATFORM_EXTENSIONS => Some(
                    info::query(obj, InfoTarget::Platform, 0, param_name)
                        .map(|v| add_extension(extensions::filter_list(v, &[]))),
                ),
                CL_PLATFORM_EXTENSIONS_WITH_VERSION => Some(
                    info::query(obj, InfoTarget::Platform, 0, param_name)
                        .map(|v| add_extension_with_version(extensions::filter_name_versions(v))),
                ),
                _ => None,
            }
        })
    }
}

/// Appends our extension to a NUL-terminated, space-separated list.
fn add_extension(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    let trimmed = v.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    v.truncate(trimmed);
    if !v.is_empty() {
        v.push(b' ');
    }
    v.extend_from_slice(SANDBOX_EXTENSION.as_bytes());
    v.push(0);
    v
}

/// Appends a `cl_name_version` record (version 1.0.0) for our extension.
fn add_extension_with_version(mut v: Vec<u8>) -> Vec<u8> {
    let version: u32 = 1 << 22;
    v.extend_from_slice(&version.to_ne_bytes());
    let mut name = [0u8; CL_NAME_VERSION_MAX_NAME_SIZE];
    name[..SANDBOX_EXTENSION.len()].copy_from_slice(SANDBOX_EXTENSION.as_bytes());
    v.extend_from_slice(&name);
    v
}

pub unsafe fn clGetExtensionFunctionAddress(func_name: *const c_char) -> *mut c_void {
    if func_name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated name per the API contract.
    let name = unsafe { CStr::from_ptr(func_name) };
    extensions::function_address(name.to_bytes())
}

pub unsafe fn clGetExtensionFunctionAddressForPlatform(
    platform: cl_platform_id,
    func_name: *const c_char,
) -> *mut c_void {
    if crate::handle::lookup(platform, Kind::Platform).is_err() {
        return std::ptr::null_mut();
    }
    // SAFETY: forwarded.
    unsafe { clGetExtensionFunctionAddress(func_name) }
}

/// A hint: forwarded, so the driver may free its compiler in the worker.
pub unsafe fn clUnloadPlatformCompiler(platform: cl_platform_id) -> cl_int {
    match lookup(platform, Kind::Platform) {
        Ok(p) => p.conn.call(cloister_ipc::UnloadPlatformCompiler { platform: p.id }).unwrap_or_else(|e| e),
        Err(e) => e,
    }
}

/// OpenCL 1.1's hint, for every platform: always succeeds.
pub unsafe fn clUnloadCompiler() -> cl_int {
    for &p in runtime().platforms().iter() {
        // SAFETY: a platform handle of ours.
        unsafe { clUnloadPlatformCompiler(p as cl_platform_id) };
    }
    CL_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_is_appended_once_with_one_space() {
        assert_eq!(add_extension(b"cl_khr_icd \0".to_vec()), b"cl_khr_icd cl_cloister_sandbox\0");
        assert_eq!(add_extension(b"\0".to_vec()), b"cl_cloister_sandbox\0");
    }

    #[test]
    fn name_version_record_is_68_bytes() {
        let v = add_extension_with_version(vec![]);
        assert_eq!(v.len(), 4 + CL_NAME_VERSION_MAX_NAME_SIZE);
        assert_eq!(&v[4..4 + SANDBOX_EXTENSION.len()], SANDBOX_EXTENSION.as_bytes());
    }
}
