//! Rectangular transfers: images and buffer rectangles. The application's rows, at its own
//! pitches, travel packed (`image::Strided`), so the wire never carries the gaps between rows
//! and the driver always sees host pitches of 0.

use std::ffi::c_void;
use std::sync::Arc;

use cloister_ipc::cl::*;
use cloister_ipc::image::Strided;
use cloister_ipc::lane::BULK_CAP;
use cloister_ipc::shm::KeptBytes;
use cloister_ipc::*;

use super::enqueue::{
    enqueue_pending, journal_map_in_flight, keep_written, land_reads_into, map_done, queue_and_mem, remember_map,
    with_own_event, write_after_reads, SettleAfter,
};
use super::{enqueue_call, enqueue_sync, finish_enqueue};
use crate::handle::{ImageMeta, Kind, MapArea, MapRecord, ObjData, Object};
use crate::mirror::Mirror;
use crate::pending::Transfer;

/// Three `size_t`s from an origin or region argument.
///
/// # Safety
/// `p` is NULL or points at three `size_t`s.
pub(super) unsafe fn triple(p: *const usize) -> Result<[usize; 3], cl_int> {
    if p.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: guaranteed by the caller.
    Ok(unsafe { [*p, *p.add(1), *p.add(2)] })
}

pub(super) fn wide(v: [usize; 3]) -> [u64; 3] {
    v.map(|x| x as u64)
}

fn image_meta(m: &Object) -> Result<ImageMeta, cl_int> {
    match m.data {
        ObjData::Mem { image: Some(meta), .. } => Ok(meta),
        _ => Err(CL_INVALID_MEM_OBJECT),
    }
}

/// Both sides of a rectangular transfer: the device side, the region, the application's box at
/// `ptr + offset`, and the rows of a `CL_MEM_USE_HOST_PTR` object's own memory to keep in step.
struct Shape {
    target: RegionTarget,
    region: [usize; 3],
    host: Strided,
    offset: usize,
    mirror: Option<Mirror>,
}

/// The rows of a `CL_MEM_USE_HOST_PTR` image's memory that `origin` and `region` cover;
/// `CL_INVALID_VALUE` when they leave the image's memory (the shim copies them itself).
fn image_mirror(meta: ImageMeta, origin: [usize; 3], region: [usize; 3]) -> Result<Option<Mirror>, cl_int> {
    let Some(h) = meta.host else { return Ok(None) };
    let row_step = if meta.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY { h.slice_pitch } else { h.row_pitch };
    let offset =
        [origin[0].checked_mul(meta.elem), origin[1].checked_mul(row_step), origin[2].checked_mul(h.slice_pitch)]
            .into_iter()
            .try_fold(h.ptr, |acc, o| o.and_then(|o| acc.checked_add(o)));
    let shape = Strided {
        row_bytes: region[0].checked_mul(meta.elem).ok_or(CL_INVALID_VALUE)?,
        rows: region[1],
        slices: region[2],
        row_pitch: row_step,
        slice_pitch: h.slice_pitch,
    };
    Mirror::within(offset.ok_or(CL_INVALID_VALUE)?, shape, h.ptr, h.len).map(Some)
}

/// `CL_INVALID_VALUE` unless the box at `origin` of `region` lies within the image, the driver's
/// first refusal. The shim packs or unpacks the application's rows before the driver sees the
/// call, so it must refuse first: a write of a 1 GiB region into a 16x16 image read past the
/// application's memory and crashed it, where pocl says `CL_INVALID_VALUE`.
fn image_box_within(meta: &ImageMeta, origin: [usize; 3], region: [usize; 3]) -> Result<(), cl_int> {
    for ((o, r), pixels) in origin.into_iter().zip(region).zip(meta.pixels) {
        if o.checked_add(r).is_none_or(|end| end > pixels) {
            return Err(CL_INVALID_VALUE);
        }
    }
    Ok(())
}

/// `CL_INVALID_VALUE` unless the box of a rectangle transfer at `origin` lies within `buffer`
/// (as `image_box_within`, for a buffer: its size is the shim's record of it). A pipe (no size
/// recorded) is left to the driver.
fn rect_within_buffer(
    buffer: &Object,
    origin: [usize; 3],
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<(), cl_int> {
    let ObjData::Mem { host_len: size, image: None, .. } = buffer.data else { return Ok(()) };
    if size == 0 {
        return Ok(());
    }
    let (shape, at) = rect_host_shape(origin, region, row_pitch, slice_pitch)?;
    match shape.extent().and_then(|e| at.checked_add(e)) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CL_INVALID_VALUE),
    }
}

/// The application's side of an image transfer: its rows at `row_pitch`, or between the
/// images of a 1D array at `slice_pitch`, with the spec's defaults for 0.
fn image_host_shape(
    meta: ImageMeta,
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<Strided, cl_int> {
    let row_bytes = region[0].checked_mul(meta.elem).ok_or(CL_INVALID_VALUE)?;
    let row = if row_pitch == 0 { row_bytes } else { row_pitch };
    if row < row_bytes {
        return Err(CL_INVALID_VALUE);
    }
    let array_1d = meta.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
    let slice_default = if array_1d { row } else { row.checked_mul(region[1]).ok_or(CL_INVALID_VALUE)? };
    let slice = if slice_pitch == 0 { slice_default } else { slice_pitch };
    let row_step = if array_1d { slice } else { row };
    Ok(Strided { row_bytes, rows: region[1], slices: region[2], row_pitch: row_step, slice_pitch: slice })
}

/// The application's side of a buffer-rectangle transfer, and the byte offset of its origin.
fn rect_host_shape(
    origin: [usize; 3],
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<(Strided, usize), cl_int> {
    let row = if row_pitch == 0 { region[0] } else { row_pitch };
    let rows_bytes = row.checked_mul(region[1]).ok_or(CL_INVALID_VALUE)?;
    let slice = if slice_pitch == 0 { rows_bytes } else { slice_pitch };
    if row < region[0] || slice < rows_bytes || (slice_pitch != 0 && row != 0 && slice % row != 0) {
        return Err(CL_INVALID_VALUE);
    }
    let offset = [origin[2].checked_mul(slice), origin[1].checked_mul(row), Some(origin[0])]
        .into_iter()
        .try_fold(0usize, |acc, o| o.and_then(|o| acc.checked_add(o)))
        .ok_or(CL_INVALID_VALUE)?;
    Ok((
        Strided { row_bytes: region[0], rows: region[1], slices: region[2], row_pitch: row, slice_pitch: slice },
        offset,
    ))
}

/// One rectangular read or write. Blocking ones go through the lane (or a segment when the
/// region is larger than the bulk area); non-blocking ones through a pending segment. In replay
/// mode, a write staged in a segment leaves in `staged` the segment's bytes for the journal
/// (`keep_written`).
///
/// # Safety
/// `host` describes application memory at `ptr`, readable (write) or writable (read); `event`
/// is NULL or valid for a write.
#[allow(clippy::too_many_arguments)]
unsafe fn transfer(
    q: &Object,
    m: &Object,
    write: bool,
    blocking: bool,
    target: RegionTarget,
    region: [usize; 3],
    host: Strided,
    ptr: *mut u8,
    mirror: Option<Mirror>,
    mut sync: EnqueueSync,
    event: *mut cl_event,
    staged: &mut Option<KeptBytes>,
) -> Result<cl_int, cl_int> {
    let len = host.packed_len();
    let mirror = mirror.filter(|_| !write);
    if write && blocking {
        // The rows are taken now: reads under way that land in them land first
        // (`land_reads_into`, as for a buffer write).
        land_reads_into(q, ptr, host.extent().unwrap_or(0));
    }
    let req = |data, sync| EnqueueRegionTransfer {
        queue: q.id,
        mem: m.id,
        write,
        blocking,
        target: target.clone(),
        region: wide(region),
        data,
        sync,
    };
    if !blocking || len > BULK_CAP {
        let segment = q.conn.acquire_segment(len)?;
        let data = DataRef::Segment { id: segment.id, offset: 0, len: len as u64 };
        let mut gate = None;
        if write {
            let base = ptr as usize;
            // SAFETY: the application's rows per the caller, left alone until the write
            // completes (or the call returns, blocking); the segment holds `len` bytes.
            let fill = move |seg: *mut u8| unsafe { host.pack(base as *const u8, seg) };
            let source = (ptr.cast_const(), host.extent().unwrap_or(0));
            // SAFETY: as for `fill`.
            match unsafe { write_after_reads(q, source, blocking, &segment, fill) } {
                Ok(g) => gate = g,
                Err(e) => {
                    q.conn.release_segment(segment);
                    return Err(e);
                }
            }
        }
        if let Some(gate) = &gate {
            sync.wait.push(gate.id);
        }
        if write {
            *staged = keep_written(q, &segment, len, gate.is_some());
        }
        if !blocking {
            let transfer =
                if write { Transfer::Write } else { Transfer::Read { dst: ptr as usize, shape: host, mirror } };
            // SAFETY: event per the caller.
            let rc = unsafe { enqueue_pending(q, &sync, event, segment, transfer, write, |_, s| req(data, s)) };
            if let Some(gate) = gate {
                // The write holds it now.
                gate.let_go(&q.conn);
            }
            return rc;
        }
        let _settled = SettleAfter::new(q);
        let rc = q.conn.call(req(data, sync.clone()));
        if !write && rc == Ok(CL_SUCCESS) {
            // SAFETY: as above, the other way; the mirror is within the object's host memory.
            unsafe {
                host.unpack(segment.region.as_ptr(), ptr);
                if let Some(m) = mirror {
                    m.fill_from(segment.region.as_ptr());
                }
            }
        }
        q.conn.release_segment(segment);
        // SAFETY: event per the caller.
        return Ok(unsafe { finish_enqueue(q, &sync, event, rc) });
    }
    let _settled = SettleAfter::new(q);
    let data = DataRef::Lane { offset: 0, len: len as u64 };
    let fill = |bulk: *mut u8| {
        if write {
            // SAFETY: the application's rows per the caller; the bulk area holds `len` bytes.
            unsafe { host.pack(ptr, bulk) };
        }
        Ok(())
    };
    let drain = |rc: &cl_int, bulk: *mut u8| {
        if !write && *rc == CL_SUCCESS {
            // SAFETY: as above, the other way; the mirror is within the object's host memory.
            unsafe {
                host.unpack(bulk, ptr);
                if let Some(m) = mirror {
                    m.fill_from(bulk);
                }
            }
        }
    };
    let rc = q.conn.call_with(req(data, sync.clone()), fill, drain);
    // SAFETY: event per the caller.
    Ok(unsafe { finish_enqueue(q, &sync, event, rc) })
}

/// The shared body of the four rectangular read/write entry points.
///
/// # Safety
/// The arguments follow the entry point's API contract.
#[allow(clippy::too_many_arguments)]
unsafe fn read_or_write(
    queue: cl_command_queue,
    mem: cl_mem,
    write: bool,
    blocking: cl_bool,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    shape: impl FnOnce(&Object) -> Result<Shape, cl_int>,
) -> cl_int {
    let r = (|| {
        let (q, m) = queue_and_mem(queue, mem)?;
        if ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let Shape { target, region, host, offset, mirror } = shape(&m)?;
        // SAFETY: API contract for the wait list and event.
        let sync = unsafe { enqueue_sync(&q, n, list, event)? };
        // SAFETY: ptr + offset is where the application's box starts (API contract).
        let base = unsafe { ptr.cast::<u8>().add(offset) }.cast_mut();
        let replay = q.conn.replays().then(|| (target.clone(), sync.clone()));
        if replay.is_some() && write {
            crate::recovery::journal_of(&q.conn).changing(m.id, true);
        }
        let mut staged = None;
        let blocking = blocking != CL_FALSE;
        // SAFETY: forwarded.
        let rc =
            unsafe { transfer(&q, &m, write, blocking, target, region, host, base, mirror, sync, event, &mut staged) };
        if let (Some((target, sync)), Ok(CL_SUCCESS)) = (replay, &rc) {
            let packed = || {
                let mut data = vec![0u8; host.packed_len()];
                // SAFETY: the application's rows at `base` per the API contract (a read filled
                // them); `data` holds them packed.
                unsafe { host.pack(base, data.as_mut_ptr()) };
                data
            };
            if write {
                // Replay writes the same rows again, packed as the worker got them.
                // SAFETY: the event per the API contract, written by the successful call.
                let sync = EnqueueSync { event: unsafe { super::returned_event(event) }, ..sync };
                let req = EnqueueRegionTransfer {
                    queue: q.id,
                    mem: m.id,
                    write: true,
                    blocking: true,
                    target,
                    region: wide(region),
                    data: DataRef::Lane { offset: 0, len: 0 },
                    sync,
                };
                crate::recovery::journal_of(&q.conn).wrote_region(req, staged, packed);
            } else if blocking && matches!(target, RegionTarget::Image { origin: [0, 0, 0] }) {
                // A blocking read of an image from its corner: a checkpoint if it is all of it.
                crate::recovery::journal_of(&q.conn).read(&q.conn, q.id, m.id, 0, &packed());
            }
        }
        rc
    })();
    r.unwrap_or_else(|e| e)
}

/// The image side and the host side of a `clEnqueueRead/WriteImage`.
///
/// # Safety
/// `origin` and `region` hold three values each or are NULL.
unsafe fn image_shape(
    image: &Object,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<Shape, cl_int> {
    // SAFETY: guaranteed by the caller.
    let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
    let meta = image_meta(image)?;
    image_box_within(&meta, origin, region)?;
    let host = image_host_shape(meta, region, row_pitch, slice_pitch)?;
    let mirror = image_mirror(meta, origin, region)?;
    Ok(Shape { target: RegionTarget::Image { origin: wide(origin) }, region, host, offset: 0, mirror })
}

pub unsafe fn clEnqueueReadImage(
    queue: cl_command_queue,
    image: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: origin and region hold three values per the API contract.
    let shape = |m: &Object| unsafe { image_shape(m, origin, region, row_pitch, slice_pitch) };
    // SAFETY: forwarded API contract.
    unsafe { read_or_write(queue, image, false, blocking, ptr, n, list, event, shape) }
}

pub unsafe fn clEnqueueWriteImage(
    queue: cl_command_queue,
    image: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: origin and region hold three values per the API contract.
    let shape = |m: &Object| unsafe { image_shape(m, origin, region, row_pitch, slice_pitch) };
    // SAFETY: forwarded API contract.
    unsafe { read_or_write(queue, image, true, blocking, ptr, n, list, event, shape) }
}

/// The buffer side and the host side of a `clEnqueueRead/WriteBufferRect`.
///
/// # Safety
/// The three arrays hold three values each or are NULL.
#[allow(clippy::too_many_arguments)]
unsafe fn rect_shape(
    buffer: &Object,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buffer_row_pitch: usize,
    buffer_slice_pitch: usize,
    host_row_pitch: usize,
    host_slice_pitch: usize,
) -> Result<Shape, cl_int> {
    // SAFETY: guaranteed by the caller.
    let (b_origin, h_origin, region) = unsafe { (triple(buffer_origin)?, triple(host_origin)?, triple(region)?) };
    rect_within_buffer(buffer, b_origin, region, buffer_row_pitch, buffer_slice_pitch)?;
    let (host, offset) = rect_host_shape(h_origin, region, host_row_pitch, host_slice_pitch)?;
    // A CL_MEM_USE_HOST_PTR buffer's memory: the same box at the buffer's origin and pitches.
    let mirror = match buffer.data {
        ObjData::Mem { host_ptr, host_len, image: None, .. } if host_ptr != 0 => {
            let (shape, at) = rect_host_shape(b_origin, region, buffer_row_pitch, buffer_slice_pitch)?;
            let at = host_ptr.checked_add(at).ok_or(CL_INVALID_VALUE)?;
            Some(Mirror::within(at, shape, host_ptr, host_len)?)
        }
        _ => None,
    };
    let target = RegionTarget::BufferRect {
        origin: wide(b_origin),
        row_pitch: buffer_row_pitch as u64,
        slice_pitch: buffer_slice_pitch as u64,
    };
    Ok(Shape { target, region, host, offset, mirror })
}

pub unsafe fn clEnqueueReadBufferRect(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking: cl_bool,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buffer_row_pitch: usize,
    buffer_slice_pitch: usize,
    host_row_pitch: usize,
    host_slice_pitch: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the arrays per the API contract.
    let shape = |b: &Object| unsafe {
        rect_shape(
            b,
            buffer_origin,
            host_origin,
            region,
            buffer_row_pitch,
            buffer_slice_pitch,
            host_row_pitch,
            host_slice_pitch,
        )
    };
    // SAFETY: forwarded API contract.
    unsafe { read_or_write(queue, buffer, false, blocking, ptr, n, list, event, shape) }
}

pub unsafe fn clEnqueueWriteBufferRect(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking: cl_bool,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buffer_row_pitch: usize,
    buffer_slice_pitch: usize,
    host_row_pitch: usize,
    host_slice_pitch: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the arrays per the API contract.
    let shape = |b: &Object| unsafe {
        rect_shape(
            b,
            buffer_origin,
            host_origin,
            region,
            buffer_row_pitch,
            buffer_slice_pitch,
            host_row_pitch,
            host_slice_pitch,
        )
    };
    // SAFETY: forwarded API contract.
    unsafe { read_or_write(queue, buffer, true, blocking, ptr, n, list, event, shape) }
}

/// The shared body of the four device-side region copies.
///
/// # Safety
/// Origins and region hold three values each or are NULL; `event` per the API contract.
#[allow(clippy::too_many_arguments)]
unsafe fn copy_region(
    queue: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    kind: CopyKind,
    src_origin: [usize; 3],
    dst_origin: [usize; 3],
    region: *const usize,
    src_pitches: (usize, usize),
    dst_pitches: (usize, usize),
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    let r = (|| {
        let (q, s) = queue_and_mem(queue, src)?;
        let (_, d) = queue_and_mem(queue, dst)?;
        // SAFETY: per the caller.
        let region = unsafe { triple(region)? };
        let make = |sync| EnqueueCopyRegion {
            queue: q.id,
            src: s.id,
            dst: d.id,
            kind,
            src_origin: wide(src_origin),
            dst_origin: wide(dst_origin),
            region: wide(region),
            src_pitches: (src_pitches.0 as u64, src_pitches.1 as u64),
            dst_pitches: (dst_pitches.0 as u64, dst_pitches.1 as u64),
            sync,
        };
        // SAFETY: the wait list and event per API contract.
        unsafe { enqueue_call(&q, n, list, event, make) }
    })();
    r.unwrap_or_else(|e| e)
}

pub unsafe fn clEnqueueCopyBufferRect(
    queue: cl_command_queue,
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
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the arrays per the API contract.
    let origins = unsafe { triple(src_origin).and_then(|s| Ok((s, triple(dst_origin)?))) };
    let Ok((so, d_o)) = origins else { return CL_INVALID_VALUE };
    let (sp, dp) = ((src_row_pitch, src_slice_pitch), (dst_row_pitch, dst_slice_pitch));
    // SAFETY: forwarded API contract.
    unsafe { copy_region(queue, src, dst, CopyKind::BufferRect, so, d_o, region, sp, dp, n, list, event) }
}

pub unsafe fn clEnqueueCopyImage(
    queue: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the arrays per the API contract.
    let origins = unsafe { triple(src_origin).and_then(|s| Ok((s, triple(dst_origin)?))) };
    let Ok((so, d_o)) = origins else { return CL_INVALID_VALUE };
    // SAFETY: forwarded API contract.
    unsafe { copy_region(queue, src, dst, CopyKind::Image, so, d_o, region, (0, 0), (0, 0), n, list, event) }
}

pub unsafe fn clEnqueueCopyImageToBuffer(
    queue: cl_command_queue,
    src_image: cl_mem,
    dst_buffer: cl_mem,
    src_origin: *const usize,
    region: *const usize,
    dst_offset: usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the array per the API contract.
    let Ok(so) = (unsafe { triple(src_origin) }) else { return CL_INVALID_VALUE };
    let d_o = [dst_offset, 0, 0];
    // SAFETY: forwarded API contract.
    unsafe {
        copy_region(
            queue,
            src_image,
            dst_buffer,
            CopyKind::ImageToBuffer,
            so,
            d_o,
            region,
            (0, 0),
            (0, 0),
            n,
            list,
            event,
        )
    }
}

pub unsafe fn clEnqueueCopyBufferToImage(
    queue: cl_command_queue,
    src_buffer: cl_mem,
    dst_image: cl_mem,
    src_offset: usize,
    dst_origin: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the array per the API contract.
    let Ok(d_o) = (unsafe { triple(dst_origin) }) else { return CL_INVALID_VALUE };
    let so = [src_offset, 0, 0];
    // SAFETY: forwarded API contract.
    unsafe {
        copy_region(
            queue,
            src_buffer,
            dst_image,
            CopyKind::BufferToImage,
            so,
            d_o,
            region,
            (0, 0),
            (0, 0),
            n,
            list,
            event,
        )
    }
}

pub unsafe fn clEnqueueFillImage(
    queue: cl_command_queue,
    image: cl_mem,
    fill_color: *const c_void,
    origin: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let (q, m) = queue_and_mem(queue, image)?;
    if fill_color.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: the colour is a cl_float4, cl_int4 or cl_uint4: 16 bytes.
    let color = unsafe { std::slice::from_raw_parts(fill_color.cast::<u8>(), 16) }.to_vec();
    // SAFETY: origin and region hold three values per the API contract.
    let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
    let make =
        |sync| EnqueueFillImage { queue: q.id, mem: m.id, color, origin: wide(origin), region: wide(region), sync };
    // SAFETY: the wait list and event per API contract.
    unsafe { enqueue_call(&q, n, list, event, make) }
}

/// Maps into a segment holding the region's rows packed; the application gets the segment and
/// packed pitches. Unmapped by `clEnqueueUnmapMemObject` like a buffer mapping.
pub unsafe fn clEnqueueMapImage(
    queue: cl_command_queue,
    image: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_bitfield,
    origin: *const usize,
    region: *const usize,
    image_row_pitch: *mut usize,
    image_slice_pitch: *mut usize,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    let r = (|| {
        let (q, m) = queue_and_mem(queue, image)?;
        let meta = image_meta(&m)?;
        if image_row_pitch.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let needs_slice = matches!(
            meta.image_type,
            CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY
        );
        if needs_slice && image_slice_pitch.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: origin and region hold three values per the API contract.
        let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
        // Within the image, the packed box is at most the image's bytes.
        image_box_within(&meta, origin, region)?;
        let packed = Strided::packed(region[0] * meta.elem, region[1], region[2]);
        let size = packed.packed_len();
        // The segment holds the rows packed: the pitches the application gets are those, and
        // a worker that says otherwise would have it write past the mapping.
        let row_pitch = packed.row_pitch;
        let slice_pitch = match meta.image_type {
            CL_MEM_OBJECT_IMAGE1D_ARRAY => row_pitch,
            CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE2D_ARRAY => packed.slice_pitch,
            _ => 0,
        };
        let mirror = image_mirror(meta, origin, region)?;
        // SAFETY: API contract.
        let sync = unsafe { enqueue_sync(&q, n, list, event)? };
        let blocking = blocking_map != CL_FALSE;
        // A blocking map may have waited for another queue's non-blocking transfer: landed
        // before the application looks.
        let _settled = blocking.then(|| SettleAfter::new(&q));
        let (wire_sync, event_id) = if blocking { (sync.clone(), 0) } else { with_own_event(&q, &sync) };
        let segment = q.conn.acquire_segment(size)?;
        // Replay reads the box again if the worker dies before a non-blocking map is complete.
        let read_again = (!blocking && q.conn.replays()).then(|| {
            let (target, into) = (RegionTarget::Image { origin: wide(origin) }, DataRef::Lane { offset: 0, len: 0 });
            let (queue, mem, sync) = (q.id, m.id, wire_sync.clone());
            EnqueueRegionTransfer {
                queue,
                mem,
                write: false,
                blocking: false,
                target,
                region: wide(region),
                data: into,
                sync,
            }
            .into_request()
        });
        let req = EnqueueMapImage {
            queue: q.id,
            mem: m.id,
            blocking,
            flags: map_flags,
            origin: wide(origin),
            region: wide(region),
            segment: segment.id,
            sync: wire_sync,
        };
        let reply = match q.conn.call(req) {
            Ok(r) if r.status == CL_SUCCESS => r,
            other => {
                q.conn.release_segment(segment);
                return Err(other.map_or_else(|e| e, |r| r.status));
            }
        };
        if (reply.row_pitch, reply.slice_pitch) != (row_pitch as u64, slice_pitch as u64) {
            // The segment stays with the worker's mapping; it is not reused.
            let what = format!("pitches {}/{} for rows packed at {row_pitch}", reply.row_pitch, reply.slice_pitch);
            return Err(q.conn.reject("clEnqueueMapImage", &what));
        }
        // CL_MEM_USE_HOST_PTR: the application's own memory, at its own pitches, as the spec
        // requires; otherwise the packed segment.
        let view = (segment.id, segment.region.as_ptr());
        // SAFETY: event per API contract; the mirror is within the image's host memory.
        unsafe { map_done(&q, &sync, event, event_id, blocking, view, map_flags, mirror) };
        if let Some(read) = read_again {
            journal_map_in_flight(&q, read, event_id, view.1, packed, map_flags, mirror);
        }
        let (ptr, row_pitch, slice_pitch) = match (mirror, meta.host) {
            (Some(m), Some(h)) => (m.at, h.row_pitch, if needs_slice { h.slice_pitch } else { 0 }),
            _ => (segment.region.as_ptr() as usize, row_pitch, slice_pitch),
        };
        // SAFETY: checked non-NULL above (row) or NULL-checked here (slice).
        unsafe {
            *image_row_pitch = row_pitch;
            if !image_slice_pitch.is_null() {
                *image_slice_pitch = slice_pitch;
            }
        }
        let area = MapArea::Image { origin: wide(origin), region: wide(region) };
        remember_map(&q, &m, ptr, MapRecord::new(segment.id, Some(segment), map_flags, mirror, area));
        Ok(ptr as *mut c_void)
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { super::creation(r, errcode_ret) }
}

pub unsafe fn clEnqueueMigrateMemObjects(
    queue: cl_command_queue,
    num_mem_objects: cl_uint,
    mem_objects: *const cl_mem,
    flags: cl_bitfield,
    n: cl_uint,
    list: *const cl_event,
    event: *mut cl_event,
) -> Result<cl_int, cl_int> {
    let q = crate::handle::lookup(queue, Kind::Queue)?;
    if num_mem_objects == 0 || mem_objects.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: mem_objects holds num_mem_objects handles.
    let handles = unsafe { super::slice(mem_objects, num_mem_objects as usize, CL_INVALID_VALUE)? };
    let (mems, conn) = super::ids_of(handles, Kind::Mem, CL_INVALID_MEM_OBJECT)?;
    if conn.is_some_and(|c| !Arc::ptr_eq(&c, &q.conn)) {
        return Err(CL_INVALID_CONTEXT);
    }
    let make = |sync| EnqueueMigrateMemObjects { queue: q.id, mems, flags, sync };
    // SAFETY: the wait list and event per API contract.
    unsafe { enqueue_call(&q, n, list, event, make) }
}
