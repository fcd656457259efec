//! What the cage advertises. Extensions whose entry points cloister does not forward are taken
//! out of every extension list, SVM capabilities are reported as none and native kernels as
//! unsupported, so an application that asks before it uses a feature never meets
//! `CL_INVALID_OPERATION`. Shared with the tests, which expect exactly these differences.

use crate::cl::*;

/// Extensions that add entry points (or callbacks into the application) cloister does not
/// forward. Kernel-language and info-only extensions pass through untouched.
pub const MASKED_EXTENSIONS: &[&str] = &[
    "cl_arm_import_memory",
    "cl_arm_printf",
    "cl_arm_shared_virtual_memory",
    "cl_ext_buffer_device_address",
    "cl_ext_device_fission",
    "cl_intel_accelerator",
    "cl_intel_advanced_motion_estimation",
    "cl_intel_create_buffer_with_properties",
    "cl_intel_dx9_media_sharing",
    "cl_intel_mem_alloc_buffer_location",
    "cl_intel_motion_estimation",
    "cl_intel_unified_shared_memory",
    "cl_intel_va_api_media_sharing",
    "cl_khr_command_buffer",
    "cl_khr_command_buffer_multi_device",
    "cl_khr_command_buffer_mutable_dispatch",
    "cl_khr_d3d10_sharing",
    "cl_khr_d3d11_sharing",
    "cl_khr_dx9_media_sharing",
    "cl_khr_egl_event",
    "cl_khr_egl_image",
    "cl_khr_external_memory",
    "cl_khr_external_memory_dma_buf",
    "cl_khr_external_memory_opaque_fd",
    "cl_khr_external_semaphore",
    "cl_khr_external_semaphore_opaque_fd",
    "cl_khr_external_semaphore_sync_fd",
    "cl_khr_gl_depth_images",
    "cl_khr_gl_event",
    "cl_khr_gl_msaa_sharing",
    "cl_khr_gl_sharing",
    "cl_khr_semaphore",
    "cl_khr_suggested_local_work_size",
    "cl_khr_terminate_context",
    "cl_nv_create_buffer",
    "cl_pocl_content_size",
];

fn masked(name: &[u8]) -> bool {
    MASKED_EXTENSIONS.iter().any(|m| m.as_bytes() == name)
}

/// Filters a NUL-terminated, space-separated extension list. Each removed name takes one
/// separator with it; the driver's other spacing is kept as it was.
pub fn filter_list(v: Vec<u8>) -> Vec<u8> {
    let text = v.split(|&b| b == 0).next().unwrap_or_default();
    let kept: Vec<&[u8]> = text.split(|&b| b == b' ').filter(|n| !masked(n)).collect();
    let mut out = kept.join(&b' ');
    out.push(0);
    out
}

/// Filters an array of `cl_name_version` records.
pub fn filter_name_versions(v: Vec<u8>) -> Vec<u8> {
    const RECORD: usize = 4 + CL_NAME_VERSION_MAX_NAME_SIZE;
    v.chunks(RECORD)
        .filter(|r| {
            let name = r.get(4..).unwrap_or_default();
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            !masked(&name[..end])
        })
        .flatten()
        .copied()
        .collect()
}

/// The device info values the cage rewrites, given the driver's value.
pub fn device_value(param: u32, v: Vec<u8>) -> Vec<u8> {
    match param {
        CL_DEVICE_EXTENSIONS => filter_list(v),
        CL_DEVICE_EXTENSIONS_WITH_VERSION => filter_name_versions(v),
        CL_DEVICE_SVM_CAPABILITIES => vec![0; v.len()],
        CL_DEVICE_EXECUTION_CAPABILITIES => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => (u64::from_ne_bytes(b) & !CL_EXEC_NATIVE_KERNEL).to_ne_bytes().to_vec(),
            Err(_) => v,
        },
        _ => v,
    }
}

pub fn rewrites_device_param(param: u32) -> bool {
    matches!(
        param,
        CL_DEVICE_EXTENSIONS
            | CL_DEVICE_EXTENSIONS_WITH_VERSION
            | CL_DEVICE_SVM_CAPABILITIES
            | CL_DEVICE_EXECUTION_CAPABILITIES
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_extensions_leave_the_list() {
        let v = b"cl_khr_fp64 cl_khr_gl_sharing cl_khr_icd cl_khr_command_buffer \0".to_vec();
        assert_eq!(filter_list(v), b"cl_khr_fp64 cl_khr_icd \0");
        let v = b"a   cl_khr_semaphore b\0".to_vec();
        assert_eq!(filter_list(v), b"a   b\0");
    }

    #[test]
    fn masked_name_versions_leave_the_array() {
        let rec = |n: &str| {
            let mut r = 7u32.to_ne_bytes().to_vec();
            let mut name = [0u8; CL_NAME_VERSION_MAX_NAME_SIZE];
            name[..n.len()].copy_from_slice(n.as_bytes());
            r.extend_from_slice(&name);
            r
        };
        let v = [rec("cl_khr_fp64"), rec("cl_khr_semaphore"), rec("cl_khr_icd")].concat();
        assert_eq!(filter_name_versions(v), [rec("cl_khr_fp64"), rec("cl_khr_icd")].concat());
    }

    #[test]
    fn native_kernels_and_svm_are_not_advertised() {
        let caps = (CL_EXEC_NATIVE_KERNEL | 1).to_ne_bytes().to_vec();
        assert_eq!(device_value(CL_DEVICE_EXECUTION_CAPABILITIES, caps), 1u64.to_ne_bytes().to_vec());
        assert_eq!(device_value(CL_DEVICE_SVM_CAPABILITIES, vec![15, 0, 0, 0, 0, 0, 0, 0]), vec![0; 8]);
    }
}
