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

/// `CL_MAKE_VERSION`.
pub const fn make_version(major: u32, minor: u32, patch: u32) -> u32 {
    (major << 22) | (minor << 12) | patch
}

/// The cl_khr_command_buffer versions whose entry points have the signatures cloister forwards
/// (`extension_table.rs`): 0.9.5 gave every `clCommand*KHR` call a new `properties` argument.
pub const COMMAND_BUFFER_ABI: std::ops::RangeInclusive<u32> = make_version(0, 9, 0)..=make_version(0, 9, 4);

/// Extensions forwarded only at the versions whose entry points cloister knows; masked at any
/// other version, or where the driver does not say its version.
const VERSIONED_EXTENSIONS: &[(&str, std::ops::RangeInclusive<u32>)] = &[("cl_khr_command_buffer", COMMAND_BUFFER_ABI)];

/// Whether the cage hides extension `name`, which the driver reports at `version`.
fn masked(name: &[u8], version: Option<u32>) -> bool {
    if let Some((_, ok)) = VERSIONED_EXTENSIONS.iter().find(|(n, _)| n.as_bytes() == name) {
        return !version.is_some_and(|v| ok.contains(&v));
    }
    MASKED_EXTENSIONS.iter().any(|m| m.as_bytes() == name)
}

const NAME_VERSION: usize = 4 + CL_NAME_VERSION_MAX_NAME_SIZE;

/// The records of a `cl_name_version` array: (name, version).
fn name_versions(v: &[u8]) -> impl Iterator<Item = (&[u8], u32)> {
    v.chunks_exact(NAME_VERSION).map(|r| {
        let version = u32::from_ne_bytes([r[0], r[1], r[2], r[3]]);
        let name = &r[4..];
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        (&name[..end], version)
    })
}

/// The version of extension `name` in a `CL_DEVICE_EXTENSIONS_WITH_VERSION` value.
pub fn extension_version(with_versions: &[u8], name: &str) -> Option<u32> {
    name_versions(with_versions).find(|(n, _)| *n == name.as_bytes()).map(|(_, v)| v)
}

/// Filters a NUL-terminated, space-separated extension list; `with_versions` is the same
/// object's `cl_name_version` list (empty where there is none). Each removed name takes one
/// separator with it; the driver's other spacing is kept as it was.
pub fn filter_list(v: Vec<u8>, with_versions: &[u8]) -> Vec<u8> {
    let text = v.split(|&b| b == 0).next().unwrap_or_default();
    let version = |n: &[u8]| name_versions(with_versions).find(|(m, _)| *m == n).map(|(_, v)| v);
    let kept: Vec<&[u8]> = text.split(|&b| b == b' ').filter(|n| !masked(n, version(n))).collect();
    let mut out = kept.join(&b' ');
    out.push(0);
    out
}

/// Filters an array of `cl_name_version` records.
pub fn filter_name_versions(v: Vec<u8>) -> Vec<u8> {
    v.chunks_exact(NAME_VERSION)
        .zip(name_versions(&v))
        .filter(|(_, (name, version))| !masked(name, Some(*version)))
        .flat_map(|(r, _)| r.iter().copied())
        .collect()
}

/// The device info values the cage rewrites, given the driver's value and the device's
/// `CL_DEVICE_EXTENSIONS_WITH_VERSION` (empty if it has none).
pub fn device_value(param: u32, v: Vec<u8>, with_versions: &[u8]) -> Vec<u8> {
    match param {
        CL_DEVICE_EXTENSIONS => filter_list(v, with_versions),
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
        assert_eq!(filter_list(v, &[]), b"cl_khr_fp64 cl_khr_icd \0");
        let v = b"a   cl_khr_semaphore b\0".to_vec();
        assert_eq!(filter_list(v, &[]), b"a   b\0");
    }

    fn rec(n: &str, version: u32) -> Vec<u8> {
        let mut r = version.to_ne_bytes().to_vec();
        let mut name = [0u8; CL_NAME_VERSION_MAX_NAME_SIZE];
        name[..n.len()].copy_from_slice(n.as_bytes());
        r.extend_from_slice(&name);
        r
    }

    #[test]
    fn masked_name_versions_leave_the_array() {
        let v = [rec("cl_khr_fp64", 7), rec("cl_khr_semaphore", 7), rec("cl_khr_icd", 7)].concat();
        assert_eq!(filter_name_versions(v), [rec("cl_khr_fp64", 7), rec("cl_khr_icd", 7)].concat());
    }

    /// Command buffers pass at the versions whose signatures cloister forwards, and only there.
    #[test]
    fn command_buffers_are_advertised_only_at_known_versions() {
        let cb = "cl_khr_command_buffer";
        for (version, shown) in
            [(make_version(0, 9, 0), true), (make_version(0, 9, 4), true), (make_version(0, 9, 5), false)]
        {
            let versions = [rec("cl_khr_fp64", 7), rec(cb, version)].concat();
            assert_eq!(filter_name_versions(versions.clone()).len() / NAME_VERSION, if shown { 2 } else { 1 });
            let list = filter_list(b"cl_khr_fp64 cl_khr_command_buffer\0".to_vec(), &versions);
            assert_eq!(list.windows(cb.len()).any(|w| w == cb.as_bytes()), shown);
            assert_eq!(extension_version(&versions, cb), Some(version));
        }
    }

    #[test]
    fn native_kernels_and_svm_are_not_advertised() {
        let caps = (CL_EXEC_NATIVE_KERNEL | 1).to_ne_bytes().to_vec();
        assert_eq!(device_value(CL_DEVICE_EXECUTION_CAPABILITIES, caps, &[]), 1u64.to_ne_bytes().to_vec());
        assert_eq!(device_value(CL_DEVICE_SVM_CAPABILITIES, vec![15, 0, 0, 0, 0, 0, 0, 0], &[]), vec![0; 8]);
    }
}
