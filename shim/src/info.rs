//! The `param_value_size` / `param_value_size_ret` protocol, applied in one place to whole
//! values fetched from the worker (or computed here).

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::wire::{handle_layout, map_handles};
use cloister_ipc::{GetInfo, InfoTarget};

use crate::handle::{Kind, Object};

/// Copies `bytes` out following the OpenCL info protocol.
///
/// # Safety
/// `value` is NULL or points at `size` writable bytes; `size_ret` is NULL or valid.
pub unsafe fn write_value(bytes: &[u8], size: usize, value: *mut c_void, size_ret: *mut usize) -> cl_int {
    if !value.is_null() {
        if size < bytes.len() {
            return CL_INVALID_VALUE;
        }
        // SAFETY: the caller guarantees `size` >= bytes.len() writable bytes at value.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), bytes.len()) };
    }
    if !size_ret.is_null() {
        // SAFETY: the caller guarantees size_ret is valid.
        unsafe { *size_ret = bytes.len() };
    }
    CL_SUCCESS
}

fn cacheable(target: InfoTarget, param: u32) -> bool {
    match target {
        InfoTarget::Platform => true,
        InfoTarget::Device => param != CL_DEVICE_AVAILABLE && param != CL_DEVICE_REFERENCE_COUNT,
        _ => false,
    }
}

/// What the driver answered to an info query.
pub enum Answer {
    Value(Vec<u8>),
    /// The size query succeeded (with this size) but the value query failed with this code.
    SizeOnly(usize, cl_int),
}

impl Answer {
    pub fn into_value(self) -> Result<Vec<u8>, cl_int> {
        match self {
            Answer::Value(v) => Ok(v),
            Answer::SizeOnly(_, e) => Err(e),
        }
    }
}

/// The whole value of an info query, with worker ids turned into this process's handles.
pub fn query(obj: &Object, target: InfoTarget, aux: u64, param: u32) -> Result<Vec<u8>, cl_int> {
    query_answer(obj, target, aux, param)?.into_value()
}

fn query_answer(obj: &Object, target: InfoTarget, aux: u64, param: u32) -> Result<Answer, cl_int> {
    let cache = cacheable(target, param);
    if cache {
        if let Some(v) = obj.cached_info((param, aux), <[u8]>::to_vec) {
            return Ok(Answer::Value(v));
        }
    }
    let reply = obj.conn.call(GetInfo { target, object: obj.id, aux, param })?;
    if reply.status != CL_SUCCESS {
        return Err(reply.status);
    }
    if reply.value_status != CL_SUCCESS {
        return Ok(Answer::SizeOnly(reply.value.len(), reply.value_status));
    }
    let mut value = reply.value;
    if let Some(layout) = handle_layout(target, param) {
        map_handles(layout, &mut value, |id| obj.conn.handle_of(id));
    }
    if cache {
        obj.cache_info((param, aux), value.clone());
    }
    Ok(Answer::Value(value))
}

/// A reference-count query answered from the shim's own count.
pub fn ref_count_param(kind: Kind) -> Option<u32> {
    Some(match kind {
        Kind::Context => CL_CONTEXT_REFERENCE_COUNT,
        Kind::Queue => CL_QUEUE_REFERENCE_COUNT,
        Kind::Mem => CL_MEM_REFERENCE_COUNT,
        Kind::Program => CL_PROGRAM_REFERENCE_COUNT,
        Kind::Kernel => CL_KERNEL_REFERENCE_COUNT,
        Kind::Event => CL_EVENT_REFERENCE_COUNT,
        Kind::Sampler => CL_SAMPLER_REFERENCE_COUNT,
        Kind::CommandBuffer => CL_COMMAND_BUFFER_REFERENCE_COUNT_KHR,
        _ => return None,
    })
}

/// The common shape of every `clGet*Info` entry point: validate, answer locally where the shim
/// knows better (`local`), else forward; then apply the size protocol.
///
/// A query repeated in a tight loop (a device's name, its limits) is answered from the cache by
/// the small first step; only what the cache cannot answer takes `Query::otherwise`, which
/// looks the handle up again.
///
/// # Safety
/// As for `write_value`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub unsafe fn get_info(
    handle: *const c_void,
    kind: Kind,
    target: InfoTarget,
    aux: u64,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
    local: impl Fn(&Object) -> Option<Result<Vec<u8>, cl_int>>,
) -> cl_int {
    let q = Query { handle, kind, target, aux, param, out: Out { size, value, size_ret } };
    // The object is lent from this thread's recent ones (`with_recent`): a repeated query
    // touches no reference count and no lock. A handle not among them is looked up out of line.
    // SAFETY: forwarded from the caller.
    match crate::handle::with_recent(handle, kind, |obj| Some(unsafe { q.answer_here(obj, &local) })) {
        Some(Some(rc)) => rc,
        // SAFETY: forwarded from the caller.
        Some(None) => unsafe { q.otherwise() },
        // SAFETY: forwarded from the caller.
        None => unsafe { q.looked_up(&local) },
    }
}

/// A `clGet*Info` entry point's own answers (`get_info`'s `local`): `None` asks further.
type LocalAnswer<'a> = dyn Fn(&Object) -> Option<Result<Vec<u8>, cl_int>> + 'a;

/// One `clGet*Info` call: what is asked of which handle, and where the answer goes.
#[derive(Clone, Copy)]
struct Query {
    handle: *const c_void,
    kind: Kind,
    target: InfoTarget,
    aux: u64,
    param: u32,
    out: Out,
}

impl Query {
    /// Whether this asks for the object's reference count, which the shim keeps (a program's
    /// build info has none).
    #[inline(always)]
    fn asks_ref_count(self) -> bool {
        ref_count_param(self.kind) == Some(self.param) && self.target != InfoTarget::ProgramBuild
    }

    /// The answer found with the object at hand: the shim's own (`local`), or a cached one,
    /// written straight from the cache to the application (the common repeated query
    /// allocates nothing); `None` if neither has it (`otherwise`).
    ///
    /// # Safety
    /// As for `write_value`.
    #[inline(always)]
    unsafe fn answer_here<L: Fn(&Object) -> Option<Result<Vec<u8>, cl_int>> + ?Sized>(
        self,
        obj: &Object,
        local: &L,
    ) -> Option<cl_int> {
        if self.asks_ref_count() {
            return None;
        }
        if let Some(v) = local(obj) {
            // SAFETY: forwarded from the caller.
            return Some(v.map_or_else(|e| e, |b| unsafe { self.out.write(&b) }));
        }
        match cacheable(self.target, self.param) {
            // SAFETY: forwarded from the caller.
            true => obj.cached_info((self.param, self.aux), |b| unsafe { self.out.write(b) }),
            false => None,
        }
    }

    /// `get_info` for a handle not among this thread's recent ones: looked up in full.
    ///
    /// # Safety
    /// As for `write_value`.
    #[inline(never)]
    unsafe fn looked_up(self, local: &LocalAnswer<'_>) -> cl_int {
        // SAFETY: forwarded from the caller.
        match crate::handle::with_object(self.handle, self.kind, |obj| unsafe { self.answer_here(obj, local) }) {
            Ok(Some(rc)) => rc,
            // SAFETY: forwarded from the caller.
            Ok(None) => unsafe { self.otherwise() },
            Err(e) => e,
        }
    }

    /// What neither the cache nor `local` answered: a reference count, or a query for the
    /// worker.
    ///
    /// # Safety
    /// As for `write_value`.
    #[inline(never)]
    unsafe fn otherwise(self) -> cl_int {
        let Query { handle, kind, target, aux, param, out } = self;
        let answer = crate::handle::with_object(handle, kind, |obj| {
            if self.asks_ref_count() {
                return Ok(Answer::Value(obj.ref_count().to_ne_bytes().to_vec()));
            }
            query_answer(obj, target, aux, param)
        })
        .and_then(|a| a);
        match answer {
            // SAFETY: forwarded from the caller.
            Ok(Answer::Value(b)) => unsafe { out.write(&b) },
            Ok(Answer::SizeOnly(len, e)) => {
                if !out.value.is_null() {
                    return e;
                }
                if !out.size_ret.is_null() {
                    // SAFETY: the caller guarantees size_ret is valid.
                    unsafe { *out.size_ret = len };
                }
                CL_SUCCESS
            }
            Err(e) => e,
        }
    }
}

/// Where an answer goes: the application's `param_value_size`, `param_value` and
/// `param_value_size_ret`.
#[derive(Clone, Copy)]
struct Out {
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
}

impl Out {
    /// # Safety
    /// As for `write_value`.
    unsafe fn write(self, bytes: &[u8]) -> cl_int {
        // SAFETY: forwarded from the caller.
        unsafe { write_value(bytes, self.size, self.value, self.size_ret) }
    }
}
