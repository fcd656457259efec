//! cl_khr_command_buffer on the driver. Its entry points have no dispatch slot: they are found
//! once, by name, through the driver's `clGetExtensionFunctionAddressForPlatform`. A worker hosts
//! one vendor library, so one set serves every platform it has.
//!
//! The signatures are those of versions 0.9.0-0.9.4; a driver reporting another version would
//! read these arguments wrongly, so buffers are not created on it (the shim does not advertise
//! the extension there either).

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use cloister_ipc::advertised::{extension_version, COMMAND_BUFFER_ABI};
use cloister_ipc::cl::*;
use cloister_ipc::dispatch::ExtensionFns;
use cloister_ipc::*;

use super::{info_call, opt_ptr, sizes, terminated, LaneServer};
use crate::objects::Kind;

static FNS: OnceLock<ExtensionFns> = OnceLock::new();

/// The driver's extension entry points, once a command buffer has been asked for.
pub fn fns() -> Option<&'static ExtensionFns> {
    FNS.get()
}

/// Calls a driver extension entry point, or returns `CL_INVALID_OPERATION` from the enclosing
/// function's error path if the driver lacks it.
#[macro_export]
macro_rules! ext_fn {
    ($name:ident) => {
        match $crate::handler::command_buffer::fns().and_then(|f| f.$name) {
            Some(f) => f,
            None => return cloister_ipc::cl::CL_INVALID_OPERATION.into(),
        }
    };
}

/// A driver extension entry point, or `CL_INVALID_OPERATION` if the driver lacks it.
fn need<T>(pick: impl FnOnce(&ExtensionFns) -> Option<T>) -> Result<T, cl_int> {
    fns().and_then(pick).ok_or(CL_INVALID_OPERATION)
}

fn resolve(platform: usize) -> ExtensionFns {
    // SAFETY: `platform` is a live platform handle from the object table.
    let gefa = unsafe { crate::driver::dispatch(platform) }.clGetExtensionFunctionAddressForPlatform;
    // SAFETY: the driver returns each named entry point or NULL, and the names are those of
    // the extension table, whose signatures the caller has checked the driver's version against.
    unsafe {
        ExtensionFns::resolve(|name| match gefa {
            Some(f) => f(platform as _, name.as_ptr().cast()),
            None => null_mut(),
        })
    }
}

/// The whole value of an info query on the driver.
fn info_value(target: InfoTarget, h: usize, param: u32) -> Result<Vec<u8>, cl_int> {
    let mut size = 0usize;
    match info_call(target, h, 0, param, 0, null_mut(), &mut size) {
        CL_SUCCESS => {}
        e => return Err(e),
    }
    let mut v = vec![0u8; size];
    match info_call(target, h, 0, param, size, v.as_mut_ptr().cast(), null_mut()) {
        CL_SUCCESS => Ok(v),
        e => Err(e),
    }
}

/// Whether the device behind `queue` has cl_khr_command_buffer at a version whose signatures
/// are the ones cloister calls.
fn abi_matches(queue: usize) -> Result<bool, cl_int> {
    let device = info_value(InfoTarget::CommandQueue, queue, CL_QUEUE_DEVICE)?;
    let device = usize::from_ne_bytes(device.try_into().map_err(|_| CL_INVALID_COMMAND_QUEUE)?);
    let versions = info_value(InfoTarget::Device, device, CL_DEVICE_EXTENSIONS_WITH_VERSION).unwrap_or_default();
    Ok(extension_version(&versions, "cl_khr_command_buffer").is_some_and(|v| COMMAND_BUFFER_ABI.contains(&v)))
}

pub fn create(s: &LaneServer, r: CreateCommandBuffer) -> Result<cl_int, cl_int> {
    let queues = s.objs(&r.queues, Kind::Queue, CL_INVALID_COMMAND_QUEUE)?;
    let Some(&first) = queues.first() else { return Err(CL_INVALID_VALUE) };
    if !abi_matches(first as usize)? {
        return Err(CL_INVALID_OPERATION);
    }
    let platform = s.some_platform().ok_or(CL_INVALID_OPERATION)?;
    FNS.get_or_init(|| resolve(platform));
    let f = need(|x| x.clCreateCommandBufferKHR)?;
    let props = terminated(&r.properties);
    let mut rc = CL_SUCCESS;
    // SAFETY: live queues; the property list is zero-terminated or NULL.
    let cb = unsafe { f(queues.len() as u32, queues.as_ptr(), opt_ptr(&props), &mut rc) };
    Ok(s.adopt(r.id, Kind::CommandBuffer, cb, rc))
}

pub fn finalize(s: &LaneServer, r: FinalizeCommandBuffer) -> Result<cl_int, cl_int> {
    let cb = s.obj(r.buffer, Kind::CommandBuffer)?;
    // SAFETY: a live command buffer.
    Ok(unsafe { need(|x| x.clFinalizeCommandBufferKHR)?(cb as _) })
}

pub fn enqueue(s: &LaneServer, r: EnqueueCommandBuffer) -> Result<cl_int, cl_int> {
    let cb = s.obj(r.buffer, Kind::CommandBuffer)?;
    let mut queues = s.objs(&r.queues, Kind::Queue, CL_INVALID_COMMAND_QUEUE)?;
    let qp = if queues.is_empty() { null_mut() } else { queues.as_mut_ptr() };
    let f = need(|x| x.clEnqueueCommandBufferKHR)?;
    // SAFETY: live queues (or none) and command buffer; the wait list and event per `enqueue`.
    Ok(s.enqueue(&r.sync, |n, w, e| unsafe { f(queues.len() as u32, qp, cb as _, n, w, e) }))
}

pub fn record(s: &LaneServer, r: RecordCommand) -> Result<SyncPointReply, cl_int> {
    let cb = s.obj(r.buffer, Kind::CommandBuffer)? as *mut c_void;
    let q = match r.queue {
        Some(id) => s.obj(id, Kind::Queue)? as *mut c_void,
        None => null_mut(),
    };
    let mem = |id| s.obj(id, Kind::Mem).map(|m| m as *mut c_void);
    let (n, wait) = (r.wait.len() as u32, if r.wait.is_empty() { null() } else { r.wait.as_ptr() });
    let mut sp: cl_sync_point_khr = 0;
    let out = &mut sp as *mut cl_sync_point_khr;
    let no_handle = null_mut();
    let wide = |v: [u64; 3]| v.map(|x| x as usize);
    // SAFETY (all arms): live command buffer, queue (or NULL) and objects; origin and region
    // arrays of three; the sync point list holds `n` entries; the driver copies the pattern.
    let status = unsafe {
        match r.command {
            RecordedCommand::Barrier => need(|x| x.clCommandBarrierWithWaitListKHR)?(cb, q, n, wait, out, no_handle),
            RecordedCommand::CopyBuffer { src, dst, src_offset, dst_offset, size } => {
                let (so, d_o, size) = (src_offset as usize, dst_offset as usize, size as usize);
                need(|x| x.clCommandCopyBufferKHR)?(cb, q, mem(src)?, mem(dst)?, so, d_o, size, n, wait, out, no_handle)
            }
            RecordedCommand::CopyRegion {
                src,
                dst,
                kind,
                src_origin,
                dst_origin,
                region,
                src_pitches,
                dst_pitches,
            } => {
                let (so, d_o, rg) = (wide(src_origin), wide(dst_origin), wide(region));
                let (sp_, dp_, rp) = (so.as_ptr(), d_o.as_ptr(), rg.as_ptr());
                let (src, dst) = (mem(src)?, mem(dst)?);
                match kind {
                    CopyKind::BufferRect => need(|x| x.clCommandCopyBufferRectKHR)?(
                        cb,
                        q,
                        src,
                        dst,
                        sp_,
                        dp_,
                        rp,
                        src_pitches.0 as usize,
                        src_pitches.1 as usize,
                        dst_pitches.0 as usize,
                        dst_pitches.1 as usize,
                        n,
                        wait,
                        out,
                        no_handle,
                    ),
                    CopyKind::Image => {
                        need(|x| x.clCommandCopyImageKHR)?(cb, q, src, dst, sp_, dp_, rp, n, wait, out, no_handle)
                    }
                    CopyKind::ImageToBuffer => need(|x| x.clCommandCopyImageToBufferKHR)?(
                        cb, q, src, dst, sp_, rp, d_o[0], n, wait, out, no_handle,
                    ),
                    CopyKind::BufferToImage => need(|x| x.clCommandCopyBufferToImageKHR)?(
                        cb, q, src, dst, so[0], dp_, rp, n, wait, out, no_handle,
                    ),
                }
            }
            RecordedCommand::FillBuffer { mem: m, pattern, offset, size } => {
                let p = if pattern.is_empty() { null() } else { pattern.as_ptr().cast() };
                let (len, offset, size) = (pattern.len(), offset as usize, size as usize);
                need(|x| x.clCommandFillBufferKHR)?(cb, q, mem(m)?, p, len, offset, size, n, wait, out, no_handle)
            }
            RecordedCommand::FillImage { mem: m, color, origin, region } => {
                if color.len() != 16 {
                    return Err(CL_INVALID_VALUE);
                }
                let (o, rg) = (wide(origin), wide(region));
                let f = need(|x| x.clCommandFillImageKHR)?;
                f(cb, q, mem(m)?, color.as_ptr().cast(), o.as_ptr(), rg.as_ptr(), n, wait, out, no_handle)
            }
            RecordedCommand::NdRange { kernel, args, properties, work_dim, offset, global, local } => {
                let k = s.obj(kernel, Kind::Kernel)?;
                s.set_args(k, &args)?;
                let props = terminated(&properties);
                let (offset, global, local) = (sizes(&offset), sizes(&global), sizes(&local));
                need(|x| x.clCommandNDRangeKernelKHR)?(
                    cb,
                    q,
                    opt_ptr(&props),
                    k as _,
                    work_dim,
                    opt_ptr(&offset),
                    opt_ptr(&global),
                    opt_ptr(&local),
                    n,
                    wait,
                    out,
                    no_handle,
                )
            }
        }
    };
    Ok(SyncPointReply { status, sync_point: sp })
}

impl Serve<CreateCommandBuffer> for LaneServer<'_> {
    fn serve(&self, r: CreateCommandBuffer) -> i32 {
        create(self, r).unwrap_or_else(|e| e)
    }
}

impl Serve<FinalizeCommandBuffer> for LaneServer<'_> {
    fn serve(&self, r: FinalizeCommandBuffer) -> i32 {
        finalize(self, r).unwrap_or_else(|e| e)
    }
}

impl Serve<RecordCommand> for LaneServer<'_> {
    fn serve(&self, r: RecordCommand) -> SyncPointReply {
        record(self, r).unwrap_or_else(SyncPointReply::from)
    }
}

impl Serve<EnqueueCommandBuffer> for LaneServer<'_> {
    fn serve(&self, r: EnqueueCommandBuffer) -> i32 {
        enqueue(self, r).unwrap_or_else(|e| e)
    }
}
