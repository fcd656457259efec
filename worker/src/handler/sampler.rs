//! Samplers.

use super::*;

impl Serve<CreateSampler> for LaneServer<'_> {
    fn serve(&self, r: CreateSampler) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let props = terminated(&r.properties);
        let mut rc = CL_SUCCESS;
        let table = unsafe_dispatch(ctx);
        // SAFETY: (both arms) a live context; props zero-terminated or NULL.
        let s = match table.clCreateSamplerWithProperties {
            Some(f) if !r.legacy => unsafe { f(ctx as _, opt_ptr(&props), &mut rc) },
            _ => {
                let props = props.unwrap_or_default();
                // A 1.x driver: the three properties the 1.x call knows, with its defaults.
                let get = |k| props.chunks(2).find(|kv| kv[0] == k).map(|kv| kv[1]);
                let normalized = get(CL_SAMPLER_NORMALIZED_COORDS).unwrap_or(1) as cl_uint;
                let addressing = get(CL_SAMPLER_ADDRESSING_MODE).unwrap_or(0x1132) as cl_uint;
                let filter = get(CL_SAMPLER_FILTER_MODE).unwrap_or(0x1140) as cl_uint;
                let f = driver_fn!(ctx, clCreateSampler);
                unsafe { f(ctx as _, normalized, addressing, filter, &mut rc) }
            }
        };
        self.adopt(r.id, Kind::Sampler, s, rc)
    }
}
