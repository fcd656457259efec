// The extension entry points cloister forwards that have no ICD dispatch slot: applications
// reach them only through `clGetExtensionFunctionAddress[ForPlatform]`. One line per entry
// point: (extension, name, (args) -> return, error-out). The signatures are those of
// cl_khr_command_buffer 0.9.0-0.9.4 (Khronos headers before 2024); from 0.9.5 on, every
// `clCommand*KHR` call gained a `properties` argument, so drivers that report 0.9.5 or later
// have the extension masked (see `advertised::COMMAND_BUFFER_ABI`) and the worker refuses to
// call them with these signatures.
#[macro_export]
macro_rules! for_each_extension_entry_point {
    ($m:ident) => {
        $m! {
            (cl_khr_command_buffer, clCreateCommandBufferKHR, (num_queues: cl_uint, queues: *const cl_command_queue, properties: *const cl_bitfield, errcode_ret: *mut cl_int) -> cl_command_buffer_khr, errcode_ret);
            (cl_khr_command_buffer, clFinalizeCommandBufferKHR, (command_buffer: cl_command_buffer_khr) -> cl_int, none);
            (cl_khr_command_buffer, clRetainCommandBufferKHR, (command_buffer: cl_command_buffer_khr) -> cl_int, none);
            (cl_khr_command_buffer, clReleaseCommandBufferKHR, (command_buffer: cl_command_buffer_khr) -> cl_int, none);
            (cl_khr_command_buffer, clEnqueueCommandBufferKHR, (num_queues: cl_uint, queues: *mut cl_command_queue, command_buffer: cl_command_buffer_khr, num_events_in_wait_list: cl_uint, event_wait_list: *const cl_event, event: *mut cl_event) -> cl_int, none);
            (cl_khr_command_buffer, clCommandBarrierWithWaitListKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandCopyBufferKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, src_buffer: cl_mem, dst_buffer: cl_mem, src_offset: size_t, dst_offset: size_t, size: size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandCopyBufferRectKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, src_buffer: cl_mem, dst_buffer: cl_mem, src_origin: *const size_t, dst_origin: *const size_t, region: *const size_t, src_row_pitch: size_t, src_slice_pitch: size_t, dst_row_pitch: size_t, dst_slice_pitch: size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandCopyBufferToImageKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, src_buffer: cl_mem, dst_image: cl_mem, src_offset: size_t, dst_origin: *const size_t, region: *const size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandCopyImageKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, src_image: cl_mem, dst_image: cl_mem, src_origin: *const size_t, dst_origin: *const size_t, region: *const size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandCopyImageToBufferKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, src_image: cl_mem, dst_buffer: cl_mem, src_origin: *const size_t, region: *const size_t, dst_offset: size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandFillBufferKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, buffer: cl_mem, pattern: *const c_void, pattern_size: size_t, offset: size_t, size: size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandFillImageKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, image: cl_mem, fill_color: *const c_void, origin: *const size_t, region: *const size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clCommandNDRangeKernelKHR, (command_buffer: cl_command_buffer_khr, command_queue: cl_command_queue, properties: *const cl_bitfield, kernel: cl_kernel, work_dim: cl_uint, global_work_offset: *const size_t, global_work_size: *const size_t, local_work_size: *const size_t, num_sync_points_in_wait_list: cl_uint, sync_point_wait_list: *const cl_sync_point_khr, sync_point: *mut cl_sync_point_khr, mutable_handle: *mut cl_mutable_command_khr) -> cl_int, none);
            (cl_khr_command_buffer, clGetCommandBufferInfoKHR, (command_buffer: cl_command_buffer_khr, param_name: cl_uint, param_value_size: size_t, param_value: *mut c_void, param_value_size_ret: *mut size_t) -> cl_int, none);
        }
    };
}
