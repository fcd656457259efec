//! Contexts, and the image formats a context supports.

use super::*;

impl Serve<CreateContext> for LaneServer<'_> {
    fn serve(&self, r: CreateContext) -> i32 {
        let props = tri!(self.context_properties(&r.properties));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        let Some(&first) = devs.first() else {
            return CL_INVALID_VALUE;
        };
        let f = driver_fn!(first as usize, clCreateContext);
        let mut rc = CL_SUCCESS;
        let (cb, token) = notify_pair(r.notify, notify::on_context_error as *mut c_void);
        // SAFETY: props is zero-terminated or NULL; devs holds live devices; the callback has
        // the signature clCreateContext expects.
        let ctx = unsafe { f(opt_ptr(&props), devs.len() as u32, devs.as_ptr(), cb, token, &mut rc) };
        self.context_created(ctx, rc, r.notify);
        self.adopt(r.id, Kind::Context, ctx, rc)
    }
}

impl Serve<CreateContextFromType> for LaneServer<'_> {
    fn serve(&self, r: CreateContextFromType) -> i32 {
        let props = tri!(self.context_properties(&r.properties));
        let platform = props
            .as_ref()
            .and_then(|p| p.chunks(2).find(|kv| kv[0] == CL_CONTEXT_PLATFORM).map(|kv| kv[1] as usize))
            .or_else(|| self.some_platform());
        let Some(platform) = platform else {
            return CL_INVALID_PLATFORM;
        };
        let f = driver_fn!(platform, clCreateContextFromType);
        let mut rc = CL_SUCCESS;
        let (cb, token) = notify_pair(r.notify, notify::on_context_error as *mut c_void);
        // SAFETY: as in create_context.
        let ctx = unsafe { f(opt_ptr(&props), r.device_type, cb, token, &mut rc) };
        self.context_created(ctx, rc, r.notify);
        self.adopt(r.id, Kind::Context, ctx, rc)
    }
}

impl Serve<GetSupportedImageFormats> for LaneServer<'_> {
    fn serve(&self, r: GetSupportedImageFormats) -> FormatsReply {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let f = driver_fn!(ctx, clGetSupportedImageFormats);
        let mut n: cl_uint = 0;
        // SAFETY: a live context; count query.
        let rc = unsafe { f(ctx as _, r.flags, r.image_type, 0, null_mut(), &mut n) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut formats = vec![cl_image_format::default(); n as usize];
        if n > 0 {
            // SAFETY: formats has room for n entries.
            let rc = unsafe { f(ctx as _, r.flags, r.image_type, n, formats.as_mut_ptr().cast(), null_mut()) };
            if rc != CL_SUCCESS {
                return rc.into();
            }
        }
        let formats = formats.iter().map(|f| (f.image_channel_order, f.image_channel_data_type)).collect();
        FormatsReply { status: CL_SUCCESS, formats }
    }
}
