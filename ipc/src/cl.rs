//! The OpenCL C types and the constants cloister needs, spelled as in the Khronos headers.
//! Kept here rather than taken from a `-sys` crate because those link `libOpenCL`, and the shim
//! *is* `libOpenCL` when used as a drop-in.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::c_void;

pub type cl_int = i32;
pub type cl_uint = u32;
pub type cl_ulong = u64;
pub type cl_bool = u32;
pub type cl_bitfield = u64;
pub type size_t = usize;
pub type c_char = std::ffi::c_char;

pub type cl_platform_id = *mut c_void;
pub type cl_device_id = *mut c_void;
pub type cl_context = *mut c_void;
pub type cl_command_queue = *mut c_void;
pub type cl_mem = *mut c_void;
pub type cl_program = *mut c_void;
pub type cl_kernel = *mut c_void;
pub type cl_event = *mut c_void;
pub type cl_sampler = *mut c_void;
pub type cl_command_buffer_khr = *mut c_void;
pub type cl_mutable_command_khr = *mut c_void;
pub type cl_semaphore_khr = *mut c_void;

pub const CL_SUCCESS: cl_int = 0;
pub const CL_DEVICE_NOT_FOUND: cl_int = -1;
pub const CL_DEVICE_NOT_AVAILABLE: cl_int = -2;
pub const CL_COMPILER_NOT_AVAILABLE: cl_int = -3;
pub const CL_MEM_OBJECT_ALLOCATION_FAILURE: cl_int = -4;
pub const CL_OUT_OF_RESOURCES: cl_int = -5;
pub const CL_OUT_OF_HOST_MEMORY: cl_int = -6;
pub const CL_PROFILING_INFO_NOT_AVAILABLE: cl_int = -7;
pub const CL_MEM_COPY_OVERLAP: cl_int = -8;
pub const CL_BUILD_PROGRAM_FAILURE: cl_int = -11;
pub const CL_MAP_FAILURE: cl_int = -12;
pub const CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: cl_int = -14;
pub const CL_INVALID_VALUE: cl_int = -30;
pub const CL_INVALID_DEVICE_TYPE: cl_int = -31;
pub const CL_INVALID_PLATFORM: cl_int = -32;
pub const CL_INVALID_DEVICE: cl_int = -33;
pub const CL_INVALID_CONTEXT: cl_int = -34;
pub const CL_INVALID_QUEUE_PROPERTIES: cl_int = -35;
pub const CL_INVALID_COMMAND_QUEUE: cl_int = -36;
pub const CL_INVALID_HOST_PTR: cl_int = -37;
pub const CL_INVALID_MEM_OBJECT: cl_int = -38;
pub const CL_INVALID_IMAGE_FORMAT_DESCRIPTOR: cl_int = -39;
pub const CL_INVALID_IMAGE_SIZE: cl_int = -40;
pub const CL_INVALID_SAMPLER: cl_int = -41;
pub const CL_INVALID_BINARY: cl_int = -42;
pub const CL_INVALID_BUILD_OPTIONS: cl_int = -43;
pub const CL_INVALID_PROGRAM: cl_int = -44;
pub const CL_INVALID_PROGRAM_EXECUTABLE: cl_int = -45;
pub const CL_INVALID_KERNEL_NAME: cl_int = -46;
pub const CL_INVALID_KERNEL_DEFINITION: cl_int = -47;
pub const CL_INVALID_KERNEL: cl_int = -48;
pub const CL_INVALID_ARG_INDEX: cl_int = -49;
pub const CL_INVALID_ARG_VALUE: cl_int = -50;
pub const CL_INVALID_ARG_SIZE: cl_int = -51;
pub const CL_INVALID_KERNEL_ARGS: cl_int = -52;
pub const CL_INVALID_WORK_DIMENSION: cl_int = -53;
pub const CL_INVALID_WORK_GROUP_SIZE: cl_int = -54;
pub const CL_INVALID_WORK_ITEM_SIZE: cl_int = -55;
pub const CL_INVALID_GLOBAL_OFFSET: cl_int = -56;
pub const CL_INVALID_EVENT_WAIT_LIST: cl_int = -57;
pub const CL_INVALID_EVENT: cl_int = -58;
pub const CL_INVALID_OPERATION: cl_int = -59;
pub const CL_INVALID_BUFFER_SIZE: cl_int = -61;
pub const CL_INVALID_GLOBAL_WORK_SIZE: cl_int = -63;
pub const CL_INVALID_PROPERTY: cl_int = -64;
pub const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;

pub const CL_FALSE: cl_bool = 0;
pub const CL_TRUE: cl_bool = 1;

// Platform info.
pub const CL_PLATFORM_PROFILE: cl_uint = 0x0900;
pub const CL_PLATFORM_VERSION: cl_uint = 0x0901;
pub const CL_PLATFORM_NAME: cl_uint = 0x0902;
pub const CL_PLATFORM_VENDOR: cl_uint = 0x0903;
pub const CL_PLATFORM_EXTENSIONS: cl_uint = 0x0904;
pub const CL_PLATFORM_HOST_TIMER_RESOLUTION: cl_uint = 0x0905;
pub const CL_PLATFORM_NUMERIC_VERSION: cl_uint = 0x0906;
pub const CL_PLATFORM_EXTENSIONS_WITH_VERSION: cl_uint = 0x0907;
pub const CL_PLATFORM_ICD_SUFFIX_KHR: cl_uint = 0x0920;

// Device types and info.
pub const CL_DEVICE_TYPE_DEFAULT: cl_bitfield = 1 << 0;
pub const CL_DEVICE_TYPE_CPU: cl_bitfield = 1 << 1;
pub const CL_DEVICE_TYPE_GPU: cl_bitfield = 1 << 2;
pub const CL_DEVICE_TYPE_ACCELERATOR: cl_bitfield = 1 << 3;
pub const CL_DEVICE_TYPE_CUSTOM: cl_bitfield = 1 << 4;
pub const CL_DEVICE_TYPE_ALL: cl_bitfield = 0xFFFF_FFFF;
pub const CL_DEVICE_TYPE: cl_uint = 0x1000;
pub const CL_DEVICE_AVAILABLE: cl_uint = 0x1027;
pub const CL_DEVICE_NAME: cl_uint = 0x102B;
pub const CL_DRIVER_VERSION: cl_uint = 0x102D;
pub const CL_DEVICE_HOST_UNIFIED_MEMORY: cl_uint = 0x1035;
pub const CL_DEVICE_MEM_BASE_ADDR_ALIGN: cl_uint = 0x1019;
pub const CL_DEVICE_MAX_MEM_ALLOC_SIZE: cl_uint = 0x1010;
pub const CL_DEVICE_PLATFORM: cl_uint = 0x1031;
pub const CL_DEVICE_PARENT_DEVICE: cl_uint = 0x1042;
pub const CL_DEVICE_REFERENCE_COUNT: cl_uint = 0x1047;

// Context.
pub const CL_CONTEXT_REFERENCE_COUNT: cl_uint = 0x1080;
pub const CL_CONTEXT_DEVICES: cl_uint = 0x1081;
pub const CL_CONTEXT_PROPERTIES: cl_uint = 0x1082;
pub const CL_CONTEXT_NUM_DEVICES: cl_uint = 0x1083;
pub const CL_CONTEXT_PLATFORM: isize = 0x1084;
pub const CL_CONTEXT_INTEROP_USER_SYNC: isize = 0x1085;

// Command queue.
pub const CL_QUEUE_CONTEXT: cl_uint = 0x1090;
pub const CL_QUEUE_DEVICE: cl_uint = 0x1091;
pub const CL_QUEUE_REFERENCE_COUNT: cl_uint = 0x1092;
pub const CL_QUEUE_PROPERTIES: cl_uint = 0x1093;
pub const CL_QUEUE_DEVICE_DEFAULT: cl_uint = 0x1095;
pub const CL_QUEUE_PROPERTIES_ARRAY: cl_uint = 0x1098;

// Memory objects.
pub const CL_MEM_READ_WRITE: cl_bitfield = 1 << 0;
pub const CL_MEM_WRITE_ONLY: cl_bitfield = 1 << 1;
pub const CL_MEM_READ_ONLY: cl_bitfield = 1 << 2;
pub const CL_MEM_USE_HOST_PTR: cl_bitfield = 1 << 3;
pub const CL_MEM_HOST_WRITE_ONLY: cl_bitfield = 1 << 7;
pub const CL_MEM_HOST_READ_ONLY: cl_bitfield = 1 << 8;
pub const CL_MEM_HOST_NO_ACCESS: cl_bitfield = 1 << 9;
pub const CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE: cl_bitfield = 1 << 0;
pub const CL_QUEUE_PROFILING_ENABLE: cl_bitfield = 1 << 1;
pub const CL_QUEUE_ON_DEVICE: cl_bitfield = 1 << 2;
pub const CL_MEM_ALLOC_HOST_PTR: cl_bitfield = 1 << 4;
pub const CL_MEM_COPY_HOST_PTR: cl_bitfield = 1 << 5;
pub const CL_MEM_TYPE: cl_uint = 0x1100;
pub const CL_MEM_FLAGS: cl_uint = 0x1101;
pub const CL_MEM_SIZE: cl_uint = 0x1102;
pub const CL_MEM_HOST_PTR: cl_uint = 0x1103;
pub const CL_MEM_MAP_COUNT: cl_uint = 0x1104;
pub const CL_MEM_REFERENCE_COUNT: cl_uint = 0x1105;
pub const CL_MEM_CONTEXT: cl_uint = 0x1106;
pub const CL_MEM_ASSOCIATED_MEMOBJECT: cl_uint = 0x1107;
pub const CL_MEM_OFFSET: cl_uint = 0x1108;

pub const CL_MAP_READ: cl_bitfield = 1 << 0;
pub const CL_MAP_WRITE: cl_bitfield = 1 << 1;
pub const CL_MAP_WRITE_INVALIDATE_REGION: cl_bitfield = 1 << 2;

/// Whether a map with `flags` holds the object's contents once complete: every map but one for
/// `CL_MAP_WRITE_INVALIDATE_REGION` alone. The specification refuses that flag beside
/// `CL_MAP_READ` or `CL_MAP_WRITE`, but a driver that accepts the pair (pocl 3) maps with the
/// contents, and a cage that then left its copy unfilled would write garbage back at the unmap.
pub fn map_fills(flags: cl_bitfield) -> bool {
    flags & CL_MAP_WRITE_INVALIDATE_REGION == 0 || flags & (CL_MAP_READ | CL_MAP_WRITE) != 0
}

// Program.
pub const CL_PROGRAM_REFERENCE_COUNT: cl_uint = 0x1160;
pub const CL_PROGRAM_CONTEXT: cl_uint = 0x1161;
pub const CL_PROGRAM_NUM_DEVICES: cl_uint = 0x1162;
pub const CL_PROGRAM_DEVICES: cl_uint = 0x1163;
pub const CL_PROGRAM_SOURCE: cl_uint = 0x1164;
pub const CL_PROGRAM_BINARY_SIZES: cl_uint = 0x1165;
pub const CL_PROGRAM_BINARIES: cl_uint = 0x1166;
pub const CL_PROGRAM_BUILD_STATUS: cl_uint = 0x1181;
pub const CL_PROGRAM_BUILD_OPTIONS: cl_uint = 0x1182;
pub const CL_PROGRAM_BUILD_LOG: cl_uint = 0x1183;

// Kernel.
pub const CL_KERNEL_FUNCTION_NAME: cl_uint = 0x1190;
pub const CL_KERNEL_NUM_ARGS: cl_uint = 0x1191;
pub const CL_KERNEL_REFERENCE_COUNT: cl_uint = 0x1192;
pub const CL_KERNEL_CONTEXT: cl_uint = 0x1193;
pub const CL_KERNEL_PROGRAM: cl_uint = 0x1194;
/// `clGetKernelWorkGroupInfo`: the `reqd_work_group_size` the kernel was compiled with (zeros: none).
pub const CL_KERNEL_COMPILE_WORK_GROUP_SIZE: cl_uint = 0x11B1;

// Events.
pub const CL_EVENT_COMMAND_QUEUE: cl_uint = 0x11D0;
pub const CL_EVENT_COMMAND_TYPE: cl_uint = 0x11D1;
pub const CL_COMMAND_READ_BUFFER: cl_uint = 0x11F3;
pub const CL_COMMAND_WRITE_BUFFER: cl_uint = 0x11F4;
pub const CL_COMMAND_MAP_BUFFER: cl_uint = 0x11FB;
pub const CL_COMMAND_UNMAP_MEM_OBJECT: cl_uint = 0x11FD;
pub const CL_EVENT_REFERENCE_COUNT: cl_uint = 0x11D2;
pub const CL_EVENT_COMMAND_EXECUTION_STATUS: cl_uint = 0x11D3;
pub const CL_PROFILING_COMMAND_QUEUED: cl_uint = 0x1280;
pub const CL_PROFILING_COMMAND_SUBMIT: cl_uint = 0x1281;
pub const CL_PROFILING_COMMAND_START: cl_uint = 0x1282;
pub const CL_PROFILING_COMMAND_END: cl_uint = 0x1283;
pub const CL_EVENT_CONTEXT: cl_uint = 0x11D4;
pub const CL_COMPLETE: cl_int = 0;
pub const CL_RUNNING: cl_int = 1;
pub const CL_SUBMITTED: cl_int = 2;
pub const CL_QUEUED: cl_int = 3;

/// `cl_name_version.name` is a fixed 64-byte array.
pub const CL_NAME_VERSION_MAX_NAME_SIZE: usize = 64;

pub const CL_IMAGE_FORMAT_NOT_SUPPORTED: cl_int = -10;
pub const CL_INVALID_COMPILER_OPTIONS: cl_int = -66;
pub const CL_INVALID_LINKER_OPTIONS: cl_int = -67;
pub const CL_INVALID_DEVICE_PARTITION_COUNT: cl_int = -68;
pub const CL_INVALID_PIPE_SIZE: cl_int = -69;
pub const CL_INVALID_DEVICE_QUEUE: cl_int = -70;
pub const CL_INVALID_SPEC_ID: cl_int = -71;

// Device info the cage rewrites.
pub const CL_DEVICE_EXECUTION_CAPABILITIES: cl_uint = 0x1029;
pub const CL_DEVICE_EXTENSIONS: cl_uint = 0x1030;
pub const CL_DEVICE_SVM_CAPABILITIES: cl_uint = 0x1053;
pub const CL_DEVICE_EXTENSIONS_WITH_VERSION: cl_uint = 0x1060;
pub const CL_EXEC_NATIVE_KERNEL: cl_bitfield = 1 << 1;

// Memory object types and image info.
pub const CL_MEM_OBJECT_BUFFER: cl_uint = 0x10F0;
pub const CL_MEM_OBJECT_IMAGE2D: cl_uint = 0x10F1;
pub const CL_MEM_OBJECT_IMAGE3D: cl_uint = 0x10F2;
pub const CL_MEM_OBJECT_IMAGE2D_ARRAY: cl_uint = 0x10F3;
pub const CL_MEM_OBJECT_IMAGE1D: cl_uint = 0x10F4;
pub const CL_MEM_OBJECT_IMAGE1D_ARRAY: cl_uint = 0x10F5;
pub const CL_MEM_OBJECT_IMAGE1D_BUFFER: cl_uint = 0x10F6;
pub const CL_MEM_OBJECT_PIPE: cl_uint = 0x10F7;
pub const CL_IMAGE_ELEMENT_SIZE: cl_uint = 0x1111;
pub const CL_BUFFER_CREATE_TYPE_REGION: cl_uint = 0x1220;
pub const CL_SAMPLER_REFERENCE_COUNT: cl_uint = 0x1150;
pub const CL_SAMPLER_NORMALIZED_COORDS: cl_bitfield = 0x1152;
pub const CL_SAMPLER_ADDRESSING_MODE: cl_bitfield = 0x1153;
pub const CL_SAMPLER_FILTER_MODE: cl_bitfield = 0x1154;

/// `cl_image_format`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct cl_image_format {
    pub image_channel_order: cl_uint,
    pub image_channel_data_type: cl_uint,
}

/// `cl_image_desc` (the `buffer` / `mem_object` union is one pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cl_image_desc {
    pub image_type: cl_uint,
    pub image_width: usize,
    pub image_height: usize,
    pub image_depth: usize,
    pub image_array_size: usize,
    pub image_row_pitch: usize,
    pub image_slice_pitch: usize,
    pub num_mip_levels: cl_uint,
    pub num_samples: cl_uint,
    pub buffer: cl_mem,
}

/// `cl_buffer_region`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cl_buffer_region {
    pub origin: usize,
    pub size: usize,
}
pub const CL_INVALID_IMAGE_DESCRIPTOR: cl_int = -65;

// cl_khr_command_buffer
pub type cl_sync_point_khr = u32;
pub const CL_INVALID_COMMAND_BUFFER_KHR: cl_int = -1138;
pub const CL_INVALID_SYNC_POINT_WAIT_LIST_KHR: cl_int = -1139;
pub const CL_COMMAND_BUFFER_QUEUES_KHR: cl_uint = 0x1294;
pub const CL_COMMAND_BUFFER_REFERENCE_COUNT_KHR: cl_uint = 0x1296;

/// The name of an OpenCL error code, for messages ("CL_INVALID_WORK_GROUP_SIZE"); `None` for a
/// code OpenCL does not define.
pub fn error_name(code: cl_int) -> Option<&'static str> {
    const NAMES: [&str; 73] = [
        "CL_SUCCESS",
        "CL_DEVICE_NOT_FOUND",
        "CL_DEVICE_NOT_AVAILABLE",
        "CL_COMPILER_NOT_AVAILABLE",
        "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        "CL_OUT_OF_RESOURCES",
        "CL_OUT_OF_HOST_MEMORY",
        "CL_PROFILING_INFO_NOT_AVAILABLE",
        "CL_MEM_COPY_OVERLAP",
        "CL_IMAGE_FORMAT_MISMATCH",
        "CL_IMAGE_FORMAT_NOT_SUPPORTED",
        "CL_BUILD_PROGRAM_FAILURE",
        "CL_MAP_FAILURE",
        "CL_MISALIGNED_SUB_BUFFER_OFFSET",
        "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
        "CL_COMPILE_PROGRAM_FAILURE",
        "CL_LINKER_NOT_AVAILABLE",
        "CL_LINK_PROGRAM_FAILURE",
        "CL_DEVICE_PARTITION_FAILED",
        "CL_KERNEL_ARG_INFO_NOT_AVAILABLE",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "CL_INVALID_VALUE",
        "CL_INVALID_DEVICE_TYPE",
        "CL_INVALID_PLATFORM",
        "CL_INVALID_DEVICE",
        "CL_INVALID_CONTEXT",
        "CL_INVALID_QUEUE_PROPERTIES",
        "CL_INVALID_COMMAND_QUEUE",
        "CL_INVALID_HOST_PTR",
        "CL_INVALID_MEM_OBJECT",
        "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR",
        "CL_INVALID_IMAGE_SIZE",
        "CL_INVALID_SAMPLER",
        "CL_INVALID_BINARY",
        "CL_INVALID_BUILD_OPTIONS",
        "CL_INVALID_PROGRAM",
        "CL_INVALID_PROGRAM_EXECUTABLE",
        "CL_INVALID_KERNEL_NAME",
        "CL_INVALID_KERNEL_DEFINITION",
        "CL_INVALID_KERNEL",
        "CL_INVALID_ARG_INDEX",
        "CL_INVALID_ARG_VALUE",
        "CL_INVALID_ARG_SIZE",
        "CL_INVALID_KERNEL_ARGS",
        "CL_INVALID_WORK_DIMENSION",
        "CL_INVALID_WORK_GROUP_SIZE",
        "CL_INVALID_WORK_ITEM_SIZE",
        "CL_INVALID_GLOBAL_OFFSET",
        "CL_INVALID_EVENT_WAIT_LIST",
        "CL_INVALID_EVENT",
        "CL_INVALID_OPERATION",
        "CL_INVALID_GL_OBJECT",
        "CL_INVALID_BUFFER_SIZE",
        "CL_INVALID_MIP_LEVEL",
        "CL_INVALID_GLOBAL_WORK_SIZE",
        "CL_INVALID_PROPERTY",
        "CL_INVALID_IMAGE_DESCRIPTOR",
        "CL_INVALID_COMPILER_OPTIONS",
        "CL_INVALID_LINKER_OPTIONS",
        "CL_INVALID_DEVICE_PARTITION_COUNT",
        "CL_INVALID_PIPE_SIZE",
        "CL_INVALID_DEVICE_QUEUE",
        "CL_INVALID_SPEC_ID",
        "CL_MAX_SIZE_RESTRICTION_EXCEEDED",
    ];
    let i = usize::try_from(code.checked_neg()?).ok()?;
    NAMES.get(i).copied().filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_names_match_their_codes() {
        use super::*;
        assert_eq!(error_name(CL_INVALID_WORK_GROUP_SIZE), Some("CL_INVALID_WORK_GROUP_SIZE"));
        assert_eq!(error_name(CL_INVALID_SPEC_ID), Some("CL_INVALID_SPEC_ID"));
        assert_eq!(
            error_name(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
            Some("CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST")
        );
        assert_eq!(error_name(CL_INVALID_VALUE), Some("CL_INVALID_VALUE"));
        assert_eq!(error_name(-25), None);
        assert_eq!(error_name(i32::MIN), None);
        assert_eq!(error_name(-1000), None);
    }
}
