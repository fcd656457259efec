//! Memory objects: buffers, sub-buffers, images and pipes. `CL_MEM_USE_HOST_PTR` becomes
//! `CL_MEM_COPY_HOST_PTR` on the worker (it cannot see the application's memory); for buffers
//! the shim keeps the application's pointer and syncs it on map and blocking read, and answers
//! `CL_MEM_FLAGS` / `CL_MEM_HOST_PTR` itself. On host-unified devices other buffers are
//! zero-copy: their memory is shared with the worker (`create_zero_copy_buffer`).

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::image::{element_size, host_extent};
use cloister_ipc::lane::BULK_CAP;
use cloister_ipc::{Call, CreateBuffer, CreateImage, CreatePipe, CreateSubBuffer, DataRef, ImageDesc, InfoTarget};

use super::{create, creation, forward_info, retain_release};
use crate::conn::{Conn, SharedView};
use crate::handle::{lookup, DestructorFn, HostImage, ImageMeta, Kind, ObjData, Object};
use crate::info;

/// A zero-terminated list of 64-bit property words (`cl_mem_properties`,
/// `cl_sampler_properties`, `cl_device_partition_property`...) as the wire carries it, with its
/// terminator (`None` for NULL).
///
/// # Safety
/// `props` is NULL or a zero-terminated list of 8-byte words.
pub unsafe fn property_list<T>(props: *const T) -> Option<Vec<u64>> {
    const { assert!(std::mem::size_of::<T>() == 8) };
    let props = props.cast::<u64>();
    if props.is_null() {
        return None;
    }
    let mut out = Vec::new();
    for i in 0.. {
        // SAFETY: zero-terminated per the caller; keys and values alternate.
        let v = unsafe { *props.add(i) };
        out.push(v);
        if v == 0 && i % 2 == 0 {
            break;
        }
    }
    Some(out)
}

/// Checks the host-pointer flags and returns the flags the worker gets.
fn host_ptr_flags(flags: u64, host_ptr: *mut c_void) -> Result<u64, cl_int> {
    let uses = flags & CL_MEM_USE_HOST_PTR != 0;
    let copies = flags & CL_MEM_COPY_HOST_PTR != 0;
    if uses && (copies || flags & CL_MEM_ALLOC_HOST_PTR != 0) {
        return Err(CL_INVALID_VALUE);
    }
    if host_ptr.is_null() == (uses || copies) {
        return Err(CL_INVALID_HOST_PTR);
    }
    Ok(if uses { (flags & !CL_MEM_USE_HOST_PTR) | CL_MEM_COPY_HOST_PTR } else { flags })
}

/// Makes a creating call that ships `len` bytes of the application's memory at `host_ptr`
/// (none if NULL): through the lane when they fit, else through a segment.
fn with_host_data<C: Call<Reply = i32>>(
    conn: &Conn,
    host_ptr: *const c_void,
    len: usize,
    req: impl FnOnce(Option<DataRef>) -> C,
) -> Result<cl_int, cl_int> {
    if host_ptr.is_null() {
        return conn.call(req(None));
    }
    if len <= BULK_CAP {
        let copy = |bulk: *mut u8| {
            // SAFETY: the application's host memory holds `len` bytes (the API contract for the
            // object being created); the bulk area BULK_CAP >= len.
            unsafe { std::ptr::copy_nonoverlapping(host_ptr.cast::<u8>(), bulk, len) };
            Ok(())
        };
        return conn.call_with(req(Some(DataRef::Lane { offset: 0, len: len as u64 })), copy, |_, _| ());
    }
    let seg = conn.acquire_segment(len)?;
    // SAFETY: as above; the segment holds at least `len` bytes.
    unsafe { cloister_ipc::copy::copy(seg.region.as_ptr(), host_ptr.cast::<u8>(), len) };
    let rc = conn.call(req(Some(DataRef::Segment { id: seg.id, offset: 0, len: len as u64 })));
    conn.release_segment(seg);
    rc
}

/// Buffers smaller than this keep the copying path, unless the context is one of CPU devices:
/// elsewhere a transfer that small costs a round trip either way, and a shared mapping per small
/// buffer would cost a page and a map each. On CPU devices a zero-copy buffer's transfers on an
/// idle queue cost no round trip at all (`crate::direct`), which pays for the page and the map
/// at creation.
const ZERO_COPY_MIN: usize = 64 << 10;

/// Whether buffers of this context get zero-copy memory: every device of it shares the host's
/// memory (`CL_DEVICE_HOST_UNIFIED_MEMORY`), and `CLOISTER_ZERO_COPY=0` does not turn it off.
/// Asked of the worker once per context; its answer only picks the path (both are safe).
pub(super) fn zero_copy_context(ctx: &Object) -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(cloister_ipc::settings::zero_copy)
        && every_device(ctx, CL_DEVICE_HOST_UNIFIED_MEMORY, |unified| unified != 0)
}

/// Whether every device of `ctx` is a CPU device (see `crate::direct`).
pub(super) fn cpu_context(ctx: &Object) -> bool {
    every_device(ctx, CL_DEVICE_TYPE, |t| t & CL_DEVICE_TYPE_CPU != 0)
}

/// Whether every device of `ctx` answers `param` (a `cl_uint` or `cl_bitfield` query) with a
/// value `accept` takes; `false` for a context without devices or a failing query.
pub(super) fn every_device(ctx: &Object, param: cl_uint, accept: fn(u64) -> bool) -> bool {
    over_devices(ctx, param, |mut values| values.len() > 0 && values.all(accept)).unwrap_or(false)
}

/// Each device's answer, read out of the context's info cache (`over_devices`).
type DeviceValues<'a> = std::iter::Map<std::slice::ChunksExact<'a, u8>, fn(&[u8]) -> u64>;

/// `fold` over what each device of `ctx` answers to `param` (a `cl_uint`, `cl_ulong` or
/// `cl_bitfield` query); `None` when a query fails. The answers are asked of the worker once
/// per context and kept in its info cache, under a device parameter no context query uses: a
/// byte saying whether every query answered, then each device's value.
fn over_devices<R>(ctx: &Object, param: cl_uint, fold: impl Fn(DeviceValues<'_>) -> R) -> Option<R> {
    let value: fn(&[u8]) -> u64 = |v| v.try_into().map_or(0, u64::from_ne_bytes);
    let read = |kept: &[u8]| match kept.split_first() {
        Some((1, values)) => Some(fold(values.chunks_exact(8).map(value))),
        _ => None,
    };
    let key = (param, u64::MAX);
    if let Some(r) = ctx.cached_info(key, read) {
        return r;
    }
    let kept: Vec<u8> = match device_values(ctx, param) {
        Some(values) => std::iter::once(1).chain(values.iter().flat_map(|v| v.to_ne_bytes())).collect(),
        None => vec![0],
    };
    let r = read(&kept);
    ctx.cache_info(key, kept);
    r
}

/// What each device of `ctx` answers to `param` (a `cl_uint` or `cl_bitfield` query); `None`
/// when a query fails.
fn device_values(ctx: &Object, param: cl_uint) -> Option<Vec<u64>> {
    let devices = info::query(ctx, InfoTarget::Context, 0, CL_CONTEXT_DEVICES).ok()?;
    devices
        .chunks_exact(std::mem::size_of::<usize>())
        .map(|h| {
            let h = usize::from_ne_bytes(h.try_into().ok()?);
            device_value(&*lookup(h as *const c_void, Kind::Device).ok()?, param)
        })
        .collect()
}

/// A device's answer to `param`, a `cl_uint` or `cl_bitfield` query.
pub(super) fn device_value(dev: &Object, param: cl_uint) -> Option<u64> {
    let v = info::query(dev, InfoTarget::Device, 0, param).ok()?;
    match v.len() {
        4 => Some(u32::from_ne_bytes(v[..4].try_into().ok()?) as u64),
        8 => Some(u64::from_ne_bytes(v[..8].try_into().ok()?)),
        _ => None,
    }
}

/// A buffer, which keeps its context alive (`handle::hold`).
fn create_buffer(
    context: cl_context,
    properties: Option<Vec<u64>>,
    flags: cl_bitfield,
    size: usize,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    create_unheld_buffer(context, properties, flags, size, host_ptr)
        .inspect(|&h| crate::handle::hold(h, context.cast_const(), Kind::Context))
}

fn create_unheld_buffer(
    context: cl_context,
    properties: Option<Vec<u64>>,
    flags: cl_bitfield,
    size: usize,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    let ctx = lookup(context, Kind::Context)?;
    let wire_flags = host_ptr_flags(flags, host_ptr)?;
    if size == 0 {
        return Err(CL_INVALID_BUFFER_SIZE);
    }
    let conn = ctx.conn.clone();
    // The application's own memory (USE_HOST_PTR) cannot be shared: it keeps the mirror path.
    if flags & CL_MEM_USE_HOST_PTR == 0 && zero_copy_context(&ctx) && (size >= ZERO_COPY_MIN || cpu_context(&ctx)) {
        return create_zero_copy_buffer(&ctx, properties, flags, wire_flags, size, host_ptr);
    }
    let mirror = if flags & CL_MEM_USE_HOST_PTR != 0 { host_ptr as usize } else { 0 };
    create(&conn, Kind::Mem, ObjData::mem(ctx.id, flags, mirror, size, None), |id| {
        let req = buffer_request(id, &ctx, properties, wire_flags, size);
        let vouched = creation_vouched(&ctx, &req.properties, flags, size);
        // Contents are posted in a pooled segment, unless too many posts still hold theirs:
        // the application does not wait for the driver's copy, which runs while it goes on (a
        // 64 KiB creation on the H100 was a round trip beside the copies; through the lane's
        // bulk area in a call, the application's copy and the driver's took turns: 1 MiB 215-235
        // us a creation on the H200 against 60 directly, `tools/measure/createdata.c`).
        let posts_contents = vouched && !host_ptr.is_null() && size <= POSTED_CONTENTS_MAX;
        let spare = if posts_contents { conn.spare_segment(size) } else { None };
        let rc = match spare {
            Some(seg) => {
                let seg = seg?;
                // SAFETY: COPY_HOST_PTR: the application's memory holds `size` bytes, and the
                // segment at least as many.
                unsafe { cloister_ipc::copy::copy(seg.region.as_ptr(), host_ptr.cast::<u8>(), size) };
                let data = DataRef::Segment { id: seg.id, offset: 0, len: size as u64 };
                conn.post_with_segment(CreateBuffer { host_data: Some(data), ..req.clone() }, seg)
            }
            None if vouched && host_ptr.is_null() => conn.post(req.clone()),
            None => with_host_data(&conn, host_ptr, size, |host_data| CreateBuffer { host_data, ..req.clone() }),
        };
        record_buffer(&conn, req, host_ptr, size, None, &rc);
        rc
    })
}

/// Contents up to this size are posted with their buffer's creation (`Conn::spare_segment`),
/// as many as the lane's bulk area holds; larger ones go through segments of their own in a
/// call.
const POSTED_CONTENTS_MAX: usize = BULK_CAP;

/// Buffer `id`'s creation as the journal records it: without the bytes or the memory the call
/// itself carries (`host_data`, `memory`), which the caller adds.
fn buffer_request(
    id: cloister_ipc::ObjectId,
    ctx: &Object,
    properties: Option<Vec<u64>>,
    flags: u64,
    size: usize,
) -> CreateBuffer {
    CreateBuffer { id, context: ctx.id, properties, flags, size: size as u64, host_data: None, memory: None }
}

/// A buffer whose memory is a sealed segment mapped here and in the worker, where the driver
/// uses it in place (`CL_MEM_USE_HOST_PTR`): maps hand out this process's view of it, and
/// `CL_MEM_COPY_HOST_PTR` data is copied straight into it.
fn create_zero_copy_buffer(
    ctx: &Object,
    properties: Option<Vec<u64>>,
    flags: u64,
    wire_flags: u64,
    size: usize,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    let conn = &ctx.conn;
    let place = conn.buffer_memory(size, base_alignment(ctx))?;
    if !host_ptr.is_null() {
        // SAFETY: COPY_HOST_PTR: the application's memory holds `size` bytes; so does the
        // placed memory, at its offset.
        unsafe { cloister_ipc::copy::copy(place.mapping.as_ptr().add(place.offset), host_ptr.cast::<u8>(), size) };
    }
    let view = place.view(size);
    let recorded = conn.replays().then(|| view.clone());
    let r = create(conn, Kind::Mem, ObjData::shared_mem(ctx.id, flags, view), |id| {
        let req = buffer_request(id, ctx, properties, wire_flags, size);
        let create = CreateBuffer { memory: Some(place.memory), ..req.clone() };
        let rc =
            if creation_vouched(ctx, &req.properties, flags, size) { conn.post(create) } else { conn.call(create) };
        record_buffer(conn, req, host_ptr, size, recorded, &rc);
        rc
    });
    conn.buffer_placed(&place, r.is_ok());
    r
}

/// The alignment every device of `ctx` wants of a buffer's memory (`CL_DEVICE_MEM_BASE_ADDR_ALIGN`,
/// in bits), at least 128 bytes.
fn base_alignment(ctx: &Object) -> usize {
    let bits = over_devices(ctx, CL_DEVICE_MEM_BASE_ADDR_ALIGN, |v| v.max()).flatten().unwrap_or(0);
    ((bits / 8) as usize).max(128).next_power_of_two()
}

/// Whether a buffer's creation may go posted, without waiting for the driver's answer
/// (`Posted::Create`): the shim has checked everything the driver could refuse but the memory
/// itself. The spec's buffer flags only, at most one of each exclusive group (host pointer
/// flags were checked before); no properties; a size every device of the context takes
/// (`CL_DEVICE_MAX_MEM_ALLOC_SIZE`). A failure to allocate then comes late, as it does from
/// drivers that allocate at a buffer's first use: each later use of the buffer returns it.
fn creation_vouched(ctx: &Object, properties: &Option<Vec<u64>>, flags: u64, size: usize) -> bool {
    const ACCESS: u64 = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
    const HOST: u64 = CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
    const KNOWN: u64 = ACCESS | HOST | CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
    properties.as_ref().is_none_or(|p| p.is_empty())
        && flags & !KNOWN == 0
        && (flags & ACCESS).count_ones() <= 1
        && (flags & HOST).count_ones() <= 1
        && over_devices(ctx, CL_DEVICE_MAX_MEM_ALLOC_SIZE, |v| v.min()).flatten().is_some_and(|max| size as u64 <= max)
}

/// In replay mode, records a buffer just created, with its initial contents or, for a
/// zero-copy buffer, its memory (`recovery`).
fn record_buffer(
    conn: &Conn,
    req: CreateBuffer,
    host_ptr: *mut c_void,
    size: usize,
    view: Option<SharedView>,
    rc: &Result<cl_int, cl_int>,
) {
    if !conn.replays() || *rc != Ok(CL_SUCCESS) {
        return;
    }
    // SAFETY: a non-NULL host_ptr holds `size` bytes (COPY_HOST_PTR or USE_HOST_PTR), per the
    // API contract the creating call relied on too.
    let initial = (!host_ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(host_ptr.cast::<u8>(), size) });
    crate::recovery::journal_of(conn).buffer(req, initial, view);
}

pub unsafe fn clCreateBuffer(
    context: cl_context,
    flags: cl_bitfield,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(create_buffer(context, None, flags, size, host_ptr), errcode_ret) }
}

pub unsafe fn clCreateBufferWithProperties(
    context: cl_context,
    properties: *const cl_bitfield,
    flags: cl_bitfield,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    // SAFETY: properties is NULL or zero-terminated per the API contract.
    let props = unsafe { property_list(properties) };
    // SAFETY: errcode_ret per API contract.
    // (An empty list tells the worker the application passed NULL.)
    unsafe { creation(create_buffer(context, Some(props.unwrap_or_default()), flags, size, host_ptr), errcode_ret) }
}

pub unsafe fn clCreateSubBuffer(
    buffer: cl_mem,
    flags: cl_bitfield,
    create_type: cl_uint,
    info: *const c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let r = (|| {
        let parent = lookup(buffer, Kind::Mem)?;
        let ObjData::Mem { context, flags: parent_flags, host_ptr, host_len, image: None, shared, .. } = &parent.data
        else {
            return Err(CL_INVALID_MEM_OBJECT);
        };
        if create_type != CL_BUFFER_CREATE_TYPE_REGION || info.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: for CL_BUFFER_CREATE_TYPE_REGION, info points at a cl_buffer_region.
        let region = unsafe { *info.cast::<cl_buffer_region>() };
        // The sub-buffer inherits the parent's host-pointer flags, and its access flags unless
        // it names its own (as the driver reports them).
        const ACCESS: u64 = CL_MEM_READ_WRITE | CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY;
        const HOST_ACCESS: u64 = CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
        let mut own = flags | (parent_flags & (CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR));
        if flags & ACCESS == 0 {
            own |= parent_flags & ACCESS;
        }
        if flags & HOST_ACCESS == 0 {
            own |= parent_flags & HOST_ACCESS;
        }
        // The shim copies into the application's memory of the region: it must lie within the
        // parent's, whatever the driver accepts.
        let inside = region.origin.checked_add(region.size).is_some_and(|end| end <= *host_len);
        if *host_ptr != 0 && !inside {
            return Err(CL_INVALID_VALUE);
        }
        let mirror = if *host_ptr != 0 { host_ptr + region.origin } else { 0 };
        // A zero-copy buffer's sub-buffer is a window of its memory (the driver's sub-buffer of
        // a USE_HOST_PTR buffer lives at the parent's host pointer plus its origin).
        let data = match shared {
            Some(view) => {
                ObjData::shared_mem(*context, own, view.window(region.origin, region.size).ok_or(CL_INVALID_VALUE)?)
            }
            None => ObjData::mem(*context, own, mirror, region.size, None),
        };
        let data = data.sub_buffer_of(parent.storage());
        super::create_held((buffer.cast_const(), Kind::Mem), &parent.conn, Kind::Mem, data, |id| {
            crate::recovery::recorded(
                &parent.conn,
                CreateSubBuffer {
                    id,
                    buffer: parent.id,
                    flags,
                    origin: region.origin as u64,
                    size: region.size as u64,
                },
            )
        })
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

/// `clCreateImage` and its relatives.
///
/// # Safety
/// `format` and `desc` are NULL or valid structs.
unsafe fn create_image(
    context: cl_context,
    properties: Option<Vec<u64>>,
    flags: cl_bitfield,
    format: *const cl_image_format,
    desc: *const cl_image_desc,
    host_ptr: *mut c_void,
) -> Result<*mut c_void, cl_int> {
    let ctx = lookup(context, Kind::Context)?;
    if format.is_null() {
        return Err(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    }
    if desc.is_null() {
        return Err(CL_INVALID_IMAGE_DESCRIPTOR);
    }
    // SAFETY: checked non-NULL; valid per the API contract.
    let (format, d) = unsafe { (*format, *desc) };
    let buffer = if d.buffer.is_null() {
        None
    } else {
        let b = lookup(d.buffer, Kind::Mem).map_err(|_| CL_INVALID_IMAGE_DESCRIPTOR)?;
        if !std::sync::Arc::ptr_eq(&b.conn, &ctx.conn) {
            return Err(CL_INVALID_IMAGE_DESCRIPTOR);
        }
        Some(b.id)
    };
    let wire_flags = host_ptr_flags(flags, host_ptr)?;
    let elem = element_size(format.image_channel_order, format.image_channel_data_type)
        .ok_or(CL_IMAGE_FORMAT_NOT_SUPPORTED)?;
    let wire_desc = ImageDesc {
        image_type: d.image_type,
        width: d.image_width as u64,
        height: d.image_height as u64,
        depth: d.image_depth as u64,
        array_size: d.image_array_size as u64,
        row_pitch: d.image_row_pitch as u64,
        slice_pitch: d.image_slice_pitch as u64,
        num_mip_levels: d.num_mip_levels,
        num_samples: d.num_samples,
        buffer,
    };
    let (len, host) = if host_ptr.is_null() {
        (0, None)
    } else {
        let (row, slice, total) = host_extent(elem, &wire_desc).ok_or(CL_INVALID_IMAGE_DESCRIPTOR)?;
        let size = |v: u64| usize::try_from(v).map_err(|_| CL_INVALID_IMAGE_SIZE);
        let host =
            HostImage { ptr: host_ptr as usize, len: size(total)?, row_pitch: size(row)?, slice_pitch: size(slice)? };
        (size(total)?, Some(host).filter(|_| flags & CL_MEM_USE_HOST_PTR != 0))
    };
    let pixels = match d.image_type {
        CL_MEM_OBJECT_IMAGE1D_ARRAY => [d.image_width, d.image_array_size, 1],
        CL_MEM_OBJECT_IMAGE2D_ARRAY => [d.image_width, d.image_height, d.image_array_size],
        CL_MEM_OBJECT_IMAGE2D => [d.image_width, d.image_height, 1],
        CL_MEM_OBJECT_IMAGE3D => [d.image_width, d.image_height, d.image_depth],
        _ => [d.image_width, 1, 1],
    };
    let meta = ImageMeta { elem: elem as usize, image_type: d.image_type, host, pixels };
    let mirror = host.map_or(0, |h| h.ptr);
    let data = ObjData::mem(ctx.id, flags, mirror, host.map_or(0, |h| h.len), Some(meta));
    let conn = ctx.conn.clone();
    create(&conn, Kind::Mem, data, |id| {
        let req = CreateImage {
            id,
            context: ctx.id,
            properties,
            flags: wire_flags,
            format: (format.image_channel_order, format.image_channel_data_type),
            desc: wire_desc,
            host_data: None,
        };
        let rc = with_host_data(&conn, host_ptr, len, |host_data| CreateImage { host_data, ..req.clone() });
        if rc == Ok(CL_SUCCESS) && conn.replays() {
            record_image(&conn, req, elem as usize, host_ptr);
        }
        rc
    })
}

/// Records an image just created (`recovery`): its description without pitches, and its host
/// data, if any, packed the same way.
fn record_image(conn: &Conn, req: CreateImage, elem: usize, host_ptr: *mut c_void) {
    if req.desc.buffer.is_some() {
        // Its memory is its buffer's: made again over the rebuilt buffer, pitches and all.
        return crate::recovery::journal_of(conn).image(req, None);
    }
    let d = &req.desc;
    let Some((row, slice, _)) = cloister_ipc::image::host_extent(elem as u64, d) else { return };
    let [w, h, depth] = crate::recovery::image_box(d).map(|v| v as usize);
    let shape = cloister_ipc::image::Strided {
        row_bytes: w * elem,
        rows: h,
        slices: depth,
        row_pitch: row as usize,
        slice_pitch: slice as usize,
    };
    let initial = (!host_ptr.is_null()).then(|| {
        let mut packed = vec![0u8; shape.packed_len()];
        // SAFETY: the application's host memory holds the image with these pitches (the
        // creating call shipped the same bytes); `packed` holds the rows without padding.
        unsafe { shape.pack(host_ptr.cast::<u8>(), packed.as_mut_ptr()) };
        packed
    });
    let desc = ImageDesc { row_pitch: 0, slice_pitch: 0, ..req.desc.clone() };
    crate::recovery::journal_of(conn).image(CreateImage { desc, ..req }, initial.as_deref());
}

/// An image keeps the buffer it was made from alive, any other its context (`handle::hold`).
fn hold_image_parent(image: *mut c_void, context: cl_context, desc: *const cl_image_desc) {
    // SAFETY: the image was just made from `desc`, valid per the API contract (or NULL).
    let buffer = unsafe { desc.as_ref() }.map_or(std::ptr::null_mut(), |d| d.buffer);
    match buffer.is_null() {
        true => crate::handle::hold(image, context.cast_const(), Kind::Context),
        false => crate::handle::hold(image, buffer.cast_const(), Kind::Mem),
    }
}

pub unsafe fn clCreateImage(
    context: cl_context,
    flags: cl_bitfield,
    format: *const c_void,
    desc: *const c_void,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    // SAFETY: format/desc per the API contract.
    let r = unsafe { create_image(context, None, flags, format.cast(), desc.cast(), host_ptr) };
    let r = r.inspect(|&h| hold_image_parent(h, context, desc.cast()));
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clCreateImageWithProperties(
    context: cl_context,
    properties: *const cl_bitfield,
    flags: cl_bitfield,
    format: *const c_void,
    desc: *const c_void,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    // SAFETY: properties is NULL or zero-terminated per the API contract.
    let props = unsafe { property_list(properties) }.unwrap_or_default();
    // SAFETY: format/desc per the API contract.
    let r = unsafe { create_image(context, Some(props), flags, format.cast(), desc.cast(), host_ptr) };
    let r = r.inspect(|&h| hold_image_parent(h, context, desc.cast()));
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

fn legacy_desc(image_type: u32, dims: [usize; 3], row_pitch: usize, slice_pitch: usize) -> cl_image_desc {
    cl_image_desc {
        image_type,
        image_width: dims[0],
        image_height: dims[1],
        image_depth: dims[2],
        image_array_size: 0,
        image_row_pitch: row_pitch,
        image_slice_pitch: slice_pitch,
        num_mip_levels: 0,
        num_samples: 0,
        buffer: std::ptr::null_mut(),
    }
}

/// OpenCL 1.0's 2D image: `clCreateImage` with a 2D descriptor.
pub unsafe fn clCreateImage2D(
    context: cl_context,
    flags: cl_bitfield,
    format: *const c_void,
    width: usize,
    height: usize,
    row_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let desc = legacy_desc(CL_MEM_OBJECT_IMAGE2D, [width, height, 1], row_pitch, 0);
    // SAFETY: forwarded API contract; desc is a local.
    unsafe { clCreateImage(context, flags, format, (&desc as *const cl_image_desc).cast(), host_ptr, errcode_ret) }
}

/// OpenCL 1.0's 3D image: `clCreateImage` with a 3D descriptor.
pub unsafe fn clCreateImage3D(
    context: cl_context,
    flags: cl_bitfield,
    format: *const c_void,
    width: usize,
    height: usize,
    depth: usize,
    row_pitch: usize,
    slice_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let desc = legacy_desc(CL_MEM_OBJECT_IMAGE3D, [width, height, depth], row_pitch, slice_pitch);
    // SAFETY: forwarded API contract; desc is a local.
    unsafe { clCreateImage(context, flags, format, (&desc as *const cl_image_desc).cast(), host_ptr, errcode_ret) }
}

pub unsafe fn clCreatePipe(
    context: cl_context,
    flags: cl_bitfield,
    packet_size: cl_uint,
    max_packets: cl_uint,
    properties: *const isize,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let r = (|| {
        let ctx = lookup(context, Kind::Context)?;
        // SAFETY: properties is NULL or zero-terminated; OpenCL defines none for pipes.
        if !properties.is_null() && unsafe { *properties } != 0 {
            return Err(CL_INVALID_VALUE);
        }
        let held = (context.cast_const(), Kind::Context);
        super::create_held(held, &ctx.conn, Kind::Mem, ObjData::mem(ctx.id, flags, 0, 0, None), |id| {
            ctx.conn.call(CreatePipe { id, context: ctx.id, flags, packet_size, max_packets })
        })
    })();
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(r, errcode_ret) }
}

pub unsafe fn clGetSupportedImageFormats(
    context: cl_context,
    flags: cl_bitfield,
    image_type: cl_uint,
    num_entries: cl_uint,
    formats: *mut c_void,
    num_formats: *mut cl_uint,
) -> Result<cl_int, cl_int> {
    let ctx = lookup(context, Kind::Context)?;
    if num_entries == 0 && !formats.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    let reply = ctx.conn.call(cloister_ipc::GetSupportedImageFormats { context: ctx.id, flags, image_type })?;
    if reply.status != CL_SUCCESS {
        return Err(reply.status);
    }
    let out = formats.cast::<cl_image_format>();
    if !out.is_null() {
        for (i, &(order, ty)) in reply.formats.iter().take(num_entries as usize).enumerate() {
            // SAFETY: the application provides num_entries slots.
            unsafe { *out.add(i) = cl_image_format { image_channel_order: order, image_channel_data_type: ty } };
        }
    }
    if !num_formats.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *num_formats = reply.formats.len() as cl_uint };
    }
    Ok(CL_SUCCESS)
}

forward_info!(clGetMemObjectInfo, cl_mem, Kind::Mem, InfoTarget::MemObject, mem_answers);

/// A `CL_MEM_USE_HOST_PTR` buffer lives in the worker as `COPY_HOST_PTR`: its flags and host
/// pointer answer as the application created it. The map count is the mappings the application
/// holds, as the shim recorded them: the driver never hears of a map the shim makes itself
/// (`crate::direct`), and hears of an unmap only after the shim forgot the mapping.
///
/// A buffer's or an image's type is what the application created, answered here: pyopencl asks
/// it of every memory object it wraps, right after creating it, and through the worker the query
/// waited behind every command posted before it (175-1 669 us a query in a pyopencl loop on 2
/// pocl cores, `tools/measure/pyloop.py`). A pipe's goes to the worker.
fn mem_answers(obj: &Object, param_name: cl_uint) -> Option<Result<Vec<u8>, cl_int>> {
    let ObjData::Mem { flags, host_ptr, maps, image, shared, host_len, .. } = &obj.data else {
        return None;
    };
    match param_name {
        CL_MEM_TYPE => {
            let kind = match image {
                Some(meta) => meta.image_type,
                // A pipe has neither memory of its own here nor a view (`ObjData::mem`'s callers).
                None if shared.is_some() || *host_len > 0 => CL_MEM_OBJECT_BUFFER,
                None => return None,
            };
            Some(Ok(kind.to_ne_bytes().to_vec()))
        }
        CL_MEM_MAP_COUNT => {
            let held = maps.lock().unwrap_or_else(|e| e.into_inner()).values().map(Vec::len).sum::<usize>();
            Some(Ok((held as cl_uint).to_ne_bytes().to_vec()))
        }
        CL_MEM_FLAGS => Some(Ok(flags.to_ne_bytes().to_vec())),
        CL_MEM_HOST_PTR if *flags & CL_MEM_USE_HOST_PTR != 0 && *host_ptr != 0 => {
            Some(Ok(host_ptr.to_ne_bytes().to_vec()))
        }
        CL_MEM_HOST_PTR => Some(Ok(0usize.to_ne_bytes().to_vec())),
        _ => None,
    }
}

forward_info!(clGetImageInfo, cl_mem, Kind::Mem, InfoTarget::Image);
forward_info!(clGetPipeInfo, cl_mem, Kind::Mem, InfoTarget::Pipe);

/// Registers a callback the shim runs when the object's last reference goes.
pub fn add_destructor(handle: *mut c_void, kind: Kind, pfn: *mut c_void, user_data: *mut c_void) -> cl_int {
    let obj: std::sync::Arc<Object> = match lookup(handle, kind) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if pfn.is_null() {
        return CL_INVALID_VALUE;
    }
    // SAFETY: the application passes a function of the destructor-callback type.
    let f = unsafe { std::mem::transmute::<*mut c_void, DestructorFn>(pfn) };
    obj.add_destructor(f, user_data as usize);
    CL_SUCCESS
}

pub unsafe fn clSetMemObjectDestructorCallback(memobj: cl_mem, pfn: *mut c_void, user_data: *mut c_void) -> cl_int {
    add_destructor(memobj, Kind::Mem, pfn, user_data)
}

retain_release! {
    clRetainMemObject, clReleaseMemObject, cl_mem, Kind::Mem;
}
