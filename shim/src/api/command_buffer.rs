//! cl_khr_command_buffer (the 0.9.0-0.9.4 entry points of `extension_table.rs`). A command
//! buffer lives in the worker like any object; each `clCommand*KHR` call becomes one
//! `RecordCommand`, so the driver records exactly what the application recorded, with the
//! kernel arguments it had set at that moment.

use std::ffi::c_void;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::{
    ArgValue, CopyKind, CreateCommandBuffer, EnqueueCommandBuffer, FinalizeCommandBuffer, InfoTarget, RecordCommand,
    RecordedCommand,
};

use super::kernel::{restore_dirty_args, take_dirty_args};
use super::memory::property_list;
use super::region::{triple, wide};
use super::{create, creation, enqueue_call, forward_info, ids_of, retain_release, slice};
use crate::handle::{lookup, Kind, ObjData, Object};
use crate::info;

pub unsafe fn clCreateCommandBufferKHR(
    num_queues: cl_uint,
    queues: *const cl_command_queue,
    properties: *const cl_bitfield,
    errcode_ret: *mut cl_int,
) -> cl_command_buffer_khr {
    let r = (|| {
        if num_queues == 0 || queues.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: `queues` holds num_queues handles per the API contract.
        let queues = unsafe { slice(queues, num_queues as usize, CL_INVALID_VALUE)? };
        let (ids, conn) = ids_of(queues, Kind::Queue, CL_INVALID_COMMAND_QUEUE)?;
        let conn = conn.ok_or(CL_INVALID_VALUE)?;
        // SAFETY: NULL or zero-terminated per the API contract.
        let properties = unsafe { property_list(properties) };
        create(&conn, Kind::CommandBuffer, ObjData::CommandBuffer, |id| {
            let req = CreateCommandBuffer { id, queues: ids, properties };
            crate::recovery::recorded(&conn, req)
        })
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clFinalizeCommandBufferKHR(command_buffer: cl_command_buffer_khr) -> cl_int {
    match lookup(command_buffer, Kind::CommandBuffer) {
        Ok(cb) => {
            let rc = cb.conn.call(FinalizeCommandBuffer { buffer: cb.id });
            if rc == Ok(CL_SUCCESS) && cb.conn.replays() {
                crate::recovery::journal_of(&cb.conn).command_buffer_finalized(cb.id);
            }
            rc.unwrap_or_else(|e| e)
        }
        Err(e) => e,
    }
}

retain_release! {
    clRetainCommandBufferKHR, clReleaseCommandBufferKHR, cl_command_buffer_khr, Kind::CommandBuffer;
}

forward_info!(clGetCommandBufferInfoKHR, cl_command_buffer_khr, Kind::CommandBuffer, InfoTarget::CommandBuffer);

pub unsafe fn clEnqueueCommandBufferKHR(
    num_queues: cl_uint,
    queues: *mut cl_command_queue,
    command_buffer: cl_command_buffer_khr,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let cb = lookup(command_buffer, Kind::CommandBuffer)?;
    if (num_queues == 0) != queues.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: `queues` holds num_queues handles per the API contract.
    let queues = unsafe { slice(queues.cast_const(), num_queues as usize, CL_INVALID_VALUE)? };
    let (ids, conn) = ids_of(queues, Kind::Queue, CL_INVALID_COMMAND_QUEUE)?;
    if conn.is_some_and(|c| !Arc::ptr_eq(&c, &cb.conn)) {
        return Err(CL_INVALID_CONTEXT);
    }
    crate::direct::command_buffer_enqueued(queues);
    let make = |sync| EnqueueCommandBuffer { queues: ids, buffer: cb.id, sync };
    // SAFETY: the wait list and event per API contract.
    unsafe { enqueue_call(&cb, n, list, event, make) }
}

/// The arguments every `clCommand*KHR` call shares, checked.
struct Recording {
    buffer: Arc<Object>,
    queue: Option<Arc<Object>>,
    wait: Vec<u32>,
    sync_point: *mut cl_sync_point_khr,
}

impl Recording {
    /// # Safety
    /// `wait` holds `n` sync points or is NULL; `sync_point` is NULL or writable.
    unsafe fn new(
        command_buffer: cl_command_buffer_khr,
        command_queue: cl_command_queue,
        n: cl_uint,
        wait: *const cl_sync_point_khr,
        sync_point: *mut cl_sync_point_khr,
        mutable_handle: *mut cl_mutable_command_khr,
    ) -> Result<Self, cl_int> {
        let buffer = lookup(command_buffer, Kind::CommandBuffer)?;
        let queue = match command_queue.is_null() {
            true => None,
            false => Some(buffer.same_worker(lookup(command_queue, Kind::Queue)?)?),
        };
        // Mutable commands are cl_khr_command_buffer_mutable_dispatch, which the cage masks.
        if !mutable_handle.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        if (n == 0) != wait.is_null() {
            return Err(CL_INVALID_SYNC_POINT_WAIT_LIST_KHR);
        }
        // SAFETY: per the caller.
        let wait = unsafe { slice(wait, n as usize, CL_INVALID_SYNC_POINT_WAIT_LIST_KHR)? }.to_vec();
        Ok(Self { buffer, queue, wait, sync_point })
    }

    /// A memory object of the buffer's worker, as its id.
    fn mem(&self, m: cl_mem) -> Result<u64, cl_int> {
        Ok(self.buffer.same_worker(lookup(m, Kind::Mem)?)?.id)
    }

    /// Records `command`; `all_args`: an NDRange's every kernel argument (`command` carries
    /// only those set since), for replay, which records it into a fresh kernel.
    fn record(self, command: RecordedCommand, all_args: Option<Vec<(u32, ArgValue)>>) -> Result<cl_int, cl_int> {
        let req = RecordCommand {
            buffer: self.buffer.id,
            queue: self.queue.as_ref().map(|q| q.id),
            command,
            wait: self.wait,
        };
        let copy = self.buffer.conn.replays().then(|| {
            let mut copy = req.clone();
            if let (RecordedCommand::NdRange { args, .. }, Some(all)) = (&mut copy.command, all_args) {
                *args = all;
            }
            copy
        });
        let reply = self.buffer.conn.call(req)?;
        if let (Some(copy), CL_SUCCESS) = (copy, reply.status) {
            crate::recovery::journal_of(&self.buffer.conn).command_recorded(copy);
        }
        if reply.status == CL_SUCCESS && !self.sync_point.is_null() {
            // SAFETY: checked non-NULL; writable per the API contract.
            unsafe { *self.sync_point = reply.sync_point };
        }
        Ok(reply.status)
    }
}

/// One `clCommand*KHR` entry point: the shared arguments, then what `command` makes of the rest.
macro_rules! record_entry {
    ($cb:ident, $q:ident, $n:ident, $wait:ident, $sp:ident, $mh:ident, |$rec:ident| $command:expr) => {{
        // SAFETY: the sync point list and out-pointers per the API contract.
        let $rec = unsafe { Recording::new($cb, $q, $n, $wait, $sp, $mh)? };
        let command = $command;
        $rec.record(command, None)
    }};
}

pub unsafe fn clCommandBarrierWithWaitListKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| RecordedCommand::Barrier)
}

pub unsafe fn clCommandCopyBufferKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| RecordedCommand::CopyBuffer {
        src: rec.mem(src)?,
        dst: rec.mem(dst)?,
        src_offset: src_offset as u64,
        dst_offset: dst_offset as u64,
        size: size as u64,
    })
}

/// A region copy's command; origins and region are arrays of three (buffer offsets travel as
/// the first element, as in `EnqueueCopyRegion`).
fn copy_region(
    rec: &Recording,
    kind: CopyKind,
    (src, dst): (cl_mem, cl_mem),
    (src_origin, dst_origin, region): ([usize; 3], [usize; 3], *const usize),
    (src_pitches, dst_pitches): ((usize, usize), (usize, usize)),
) -> Result<RecordedCommand, cl_int> {
    // SAFETY: NULL or three values per the API contract.
    let region = unsafe { triple(region)? };
    let pitches = |p: (usize, usize)| (p.0 as u64, p.1 as u64);
    Ok(RecordedCommand::CopyRegion {
        src: rec.mem(src)?,
        dst: rec.mem(dst)?,
        kind,
        src_origin: wide(src_origin),
        dst_origin: wide(dst_origin),
        region: wide(region),
        src_pitches: pitches(src_pitches),
        dst_pitches: pitches(dst_pitches),
    })
}

pub unsafe fn clCommandCopyBufferRectKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    src_row_pitch: usize,
    src_slice_pitch: usize,
    dst_row_pitch: usize,
    dst_slice_pitch: usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        // SAFETY: NULL or three values each per the API contract.
        let (so, d_o) = unsafe { (triple(src_origin)?, triple(dst_origin)?) };
        let pitches = ((src_row_pitch, src_slice_pitch), (dst_row_pitch, dst_slice_pitch));
        copy_region(&rec, CopyKind::BufferRect, (src, dst), (so, d_o, region), pitches)?
    })
}

pub unsafe fn clCommandCopyImageKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        // SAFETY: NULL or three values each per the API contract.
        let (so, d_o) = unsafe { (triple(src_origin)?, triple(dst_origin)?) };
        copy_region(&rec, CopyKind::Image, (src, dst), (so, d_o, region), ((0, 0), (0, 0)))?
    })
}

pub unsafe fn clCommandCopyImageToBufferKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_origin: *const usize,
    region: *const usize,
    dst_offset: usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        // SAFETY: NULL or three values per the API contract.
        let so = unsafe { triple(src_origin)? };
        let origins = (so, [dst_offset, 0, 0], region);
        copy_region(&rec, CopyKind::ImageToBuffer, (src, dst), origins, ((0, 0), (0, 0)))?
    })
}

pub unsafe fn clCommandCopyBufferToImageKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_offset: usize,
    dst_origin: *const usize,
    region: *const usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        // SAFETY: NULL or three values per the API contract.
        let d_o = unsafe { triple(dst_origin)? };
        let origins = ([src_offset, 0, 0], d_o, region);
        copy_region(&rec, CopyKind::BufferToImage, (src, dst), origins, ((0, 0), (0, 0)))?
    })
}

pub unsafe fn clCommandFillBufferKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    buffer: cl_mem,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        if pattern.is_null() || pattern_size == 0 {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: `pattern` holds pattern_size bytes per the API contract.
        let pattern = unsafe { slice(pattern.cast::<u8>(), pattern_size, CL_INVALID_VALUE)? }.to_vec();
        RecordedCommand::FillBuffer { mem: rec.mem(buffer)?, pattern, offset: offset as u64, size: size as u64 }
    })
}

pub unsafe fn clCommandFillImageKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    image: cl_mem,
    fill_color: *const c_void,
    origin: *const usize,
    region: *const usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    record_entry!(cb, q, n, wait, sp, mh, |rec| {
        // SAFETY: the colour is a cl_float4, cl_int4 or cl_uint4: 16 bytes.
        let color = unsafe { slice(fill_color.cast::<u8>(), 16, CL_INVALID_VALUE)? }.to_vec();
        // SAFETY: NULL or three values each per the API contract.
        let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
        RecordedCommand::FillImage { mem: rec.mem(image)?, color, origin: wide(origin), region: wide(region) }
    })
}

pub unsafe fn clCommandNDRangeKernelKHR(
    cb: cl_command_buffer_khr,
    q: cl_command_queue,
    properties: *const cl_bitfield,
    kernel: cl_kernel,
    work_dim: cl_uint,
    global_work_offset: *const usize,
    global_work_size: *const usize,
    local_work_size: *const usize,
    n: cl_uint,
    wait: *const cl_sync_point_khr,
    sp: *mut cl_sync_point_khr,
    mh: *mut cl_mutable_command_khr,
) -> Result<cl_int, cl_int> {
    // SAFETY: the sync point list and out-pointers per the API contract.
    let rec = unsafe { Recording::new(cb, q, n, wait, sp, mh)? };
    let k = rec.buffer.same_worker(lookup(kernel, Kind::Kernel)?)?;
    if !(1..=3).contains(&work_dim) {
        return Err(CL_INVALID_WORK_DIMENSION);
    }
    // SAFETY (dims): non-NULL size arrays hold work_dim entries per the API contract.
    let dims = |p: *const usize| unsafe { super::enqueue::work_size(p, work_dim) };
    let args = take_dirty_args(&k.data);
    let command = RecordedCommand::NdRange {
        kernel: k.id,
        args: args.clone(),
        // SAFETY: NULL or zero-terminated per the API contract.
        properties: unsafe { property_list(properties) },
        work_dim,
        offset: dims(global_work_offset),
        global: dims(global_work_size),
        local: dims(local_work_size),
    };
    let rc = rec.record(command, k.conn.replays().then(|| super::kernel::all_args(&k.data)));
    if rc != Ok(CL_SUCCESS) {
        restore_dirty_args(&k.data, &args);
    }
    rc
}
