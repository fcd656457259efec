//! Samplers. The 1.x call becomes a property list, so the worker has one way to make them.

use std::ffi::c_void;

use cloister_ipc::cl::*;
use cloister_ipc::{CreateSampler, InfoTarget};

use super::memory::property_list;
use super::{creation, forward_info, retain_release};
use crate::handle::{lookup, Kind, ObjData};
use crate::info;

fn create_sampler(context: cl_context, properties: Option<Vec<u64>>, legacy: bool) -> Result<*mut c_void, cl_int> {
    let ctx = lookup(context, Kind::Context)?;
    super::create_held((context.cast_const(), Kind::Context), &ctx.conn, Kind::Sampler, ObjData::Sampler, |id| {
        crate::recovery::recorded(&ctx.conn, CreateSampler { id, context: ctx.id, properties, legacy })
    })
}

pub unsafe fn clCreateSampler(
    context: cl_context,
    normalized_coords: cl_bool,
    addressing_mode: cl_uint,
    filter_mode: cl_uint,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    let props = vec![
        CL_SAMPLER_NORMALIZED_COORDS,
        normalized_coords as u64,
        CL_SAMPLER_ADDRESSING_MODE,
        addressing_mode as u64,
        CL_SAMPLER_FILTER_MODE,
        filter_mode as u64,
        0,
    ];
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(create_sampler(context, Some(props), true), errcode_ret) }
}

pub unsafe fn clCreateSamplerWithProperties(
    context: cl_context,
    properties: *const cl_bitfield,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    // SAFETY: properties is NULL or zero-terminated per the API contract.
    let props = unsafe { property_list(properties) };
    // SAFETY: errcode_ret per API contract.
    unsafe { creation(create_sampler(context, props, false), errcode_ret) }
}

forward_info!(clGetSamplerInfo, cl_sampler, Kind::Sampler, InfoTarget::Sampler);

retain_release! {
    clRetainSampler, clReleaseSampler, cl_sampler, Kind::Sampler;
}
