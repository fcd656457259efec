//! The extension entry points cloister forwards, for `clGetExtensionFunctionAddress*`; what
//! the cage advertises is decided in `cloister_ipc::advertised`.

use std::ffi::c_void;

pub use cloister_ipc::advertised::*;

/// The extension entry points cloister forwards, by name.
pub fn function_address(name: &[u8]) -> *mut c_void {
    match name {
        b"clIcdGetPlatformIDsKHR" => crate::clIcdGetPlatformIDsKHR as *mut c_void,
        // cl_khr_il_program
        b"clCreateProgramWithILKHR" => crate::guarded::clCreateProgramWithIL as *mut c_void,
        // cl_khr_create_command_queue
        b"clCreateCommandQueueWithPropertiesKHR" => crate::guarded::clCreateCommandQueueWithProperties as *mut c_void,
        // cl_khr_subgroups
        b"clGetKernelSubGroupInfoKHR" => crate::guarded::clGetKernelSubGroupInfoKHR as *mut c_void,
        // cl_khr_command_buffer, and any other entry point of the extension table
        _ => crate::extension_entry_point(name),
    }
}
