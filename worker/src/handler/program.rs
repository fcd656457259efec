//! Programs: creation from source, binaries, IL or built-in kernels; builds, compiles, links.

use super::*;

impl Serve<CreateProgramWithSource> for LaneServer<'_> {
    fn serve(&self, r: CreateProgramWithSource) -> i32 {
        if let Some(rec) = crate::RECORDER.get() {
            rec.program_source.set(&r.sources.concat());
        }
        let ctx = tri!(self.obj(r.context, Kind::Context));
        // NUL-terminated copies: a length of 0 tells the driver to look for the NUL, so an empty
        // string must still point at one (a bare empty Vec points nowhere: pocl crashed on it).
        let sources: Vec<Vec<u8>> = r.sources.iter().map(|s| nul_terminated(s)).collect();
        let ptrs: Vec<*const c_char> = sources.iter().map(|s| s.as_ptr().cast()).collect();
        let lens: Vec<usize> = r.sources.iter().map(|s| s.len()).collect();
        let f = driver_fn!(ctx, clCreateProgramWithSource);
        let mut rc = CL_SUCCESS;
        // SAFETY: ptrs/lens describe `sources`, alive for the call.
        let p = unsafe { f(ctx as _, ptrs.len() as u32, ptrs.as_ptr() as *mut _, lens.as_ptr(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }
}

impl Serve<BuildProgram> for LaneServer<'_> {
    fn serve(&self, r: BuildProgram) -> BuildReply {
        record_build_options(&r.options);
        let p = tri!(self.obj(r.program, Kind::Program));
        let devs = tri!(self.opt_devices(&r.devices));
        let options = tri!(build_options(&r.includes, r.options));
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(p, clBuildProgram);
        // SAFETY: live program and devices; options NUL-terminated.
        let (status, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                p as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                cb,
                token,
            )
        });
        BuildReply { status, callback_sent }
    }
}

impl Serve<CreateProgramWithBinary> for LaneServer<'_> {
    fn serve(&self, r: CreateProgramWithBinary) -> StatusesReply {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        if devs.len() != r.binaries.len() {
            return CL_INVALID_VALUE.into();
        }
        let lens: Vec<usize> = r.binaries.iter().map(|b| b.len()).collect();
        let ptrs: Vec<*const u8> = r.binaries.iter().map(|b| b.as_ptr()).collect();
        let mut statuses = vec![CL_SUCCESS; devs.len()];
        let f = driver_fn!(ctx, clCreateProgramWithBinary);
        let mut rc = CL_SUCCESS;
        // SAFETY: devs, lens, ptrs and statuses all hold devs.len() entries, alive for the call.
        let p = unsafe {
            f(
                ctx as _,
                devs.len() as u32,
                devs.as_ptr(),
                lens.as_ptr(),
                ptrs.as_ptr() as *mut _,
                statuses.as_mut_ptr(),
                &mut rc,
            )
        };
        let status = self.adopt(r.id, Kind::Program, p, rc);
        StatusesReply { status, statuses }
    }
}

impl Serve<CreateProgramWithIl> for LaneServer<'_> {
    fn serve(&self, r: CreateProgramWithIl) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: the IL bytes outlive the call.
        let p = unsafe { driver_fn!(ctx, clCreateProgramWithIL)(ctx as _, r.il.as_ptr().cast(), r.il.len(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }
}

impl Serve<CreateProgramWithBuiltInKernels> for LaneServer<'_> {
    fn serve(&self, r: CreateProgramWithBuiltInKernels) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.objs(&r.devices, Kind::Device, CL_INVALID_DEVICE));
        let names = nul_terminated(&r.names);
        let f = driver_fn!(ctx, clCreateProgramWithBuiltInKernels);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context and devices; names NUL-terminated.
        let p = unsafe { f(ctx as _, devs.len() as u32, wait_ptr(&devs), names.as_ptr().cast(), &mut rc) };
        self.adopt(r.id, Kind::Program, p, rc)
    }
}

impl Serve<CompileProgram> for LaneServer<'_> {
    fn serve(&self, r: CompileProgram) -> BuildReply {
        record_build_options(&r.options);
        let p = tri!(self.obj(r.program, Kind::Program));
        let devs = tri!(self.opt_devices(&r.devices));
        let options = tri!(build_options(&r.includes, r.options));
        let header_ids: Vec<ObjectId> = r.headers.iter().map(|h| h.0).collect();
        let headers = tri!(self.objs(&header_ids, Kind::Program, CL_INVALID_VALUE));
        let names: Vec<Vec<u8>> = r.headers.iter().map(|h| nul_terminated(&h.1)).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr().cast()).collect();
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(p, clCompileProgram);
        // SAFETY: live program, devices and headers; every string NUL-terminated; the arrays
        // hold the counts passed.
        let (status, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                p as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                headers.len() as u32,
                wait_ptr(&headers),
                if name_ptrs.is_empty() { null_mut() } else { name_ptrs.as_ptr() as *mut _ },
                cb,
                token,
            )
        });
        BuildReply { status, callback_sent }
    }
}

impl Serve<LinkProgram> for LaneServer<'_> {
    fn serve(&self, r: LinkProgram) -> CreatedReply {
        record_build_options(&r.options);
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let devs = tri!(self.opt_devices(&r.devices));
        let inputs = tri!(self.objs(&r.inputs, Kind::Program, CL_INVALID_PROGRAM));
        let options = r.options.as_deref().map(nul_terminated);
        let (cb, token) = notify_pair(r.notify, notify::on_build_done as *mut c_void);
        let f = driver_fn!(ctx, clLinkProgram);
        let mut rc = CL_SUCCESS;
        // SAFETY: live context, devices and programs; options NUL-terminated.
        let (p, callback_sent) = notify::build_call(r.notify, || unsafe {
            f(
                ctx as _,
                devs.as_ref().map_or(0, |d| d.len() as u32),
                devs.as_ref().map_or(null(), |d| d.as_ptr()),
                options.as_ref().map_or(null(), |o| o.as_ptr().cast()),
                inputs.len() as u32,
                wait_ptr(&inputs),
                cb,
                token,
                &mut rc,
            )
        });
        if !p.is_null() {
            self.worker.objects.insert(r.id, Kind::Program, p as usize);
        }
        CreatedReply { status: rc, created: !p.is_null(), callback_sent }
    }
}

impl Serve<GetProgramBinaries> for LaneServer<'_> {
    fn serve(&self, r: GetProgramBinaries) -> BinariesReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let f = driver_fn!(p, clGetProgramInfo);
        let mut size = 0usize;
        // SAFETY: a live program; size query.
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARY_SIZES, 0, null_mut(), &mut size) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut sizes = vec![0usize; size / HANDLE];
        // SAFETY: sizes holds `size` bytes.
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARY_SIZES, size, sizes.as_mut_ptr().cast(), null_mut()) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut binaries: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut ptrs: Vec<*mut u8> =
            binaries.iter_mut().map(|b| if b.is_empty() { null_mut() } else { b.as_mut_ptr() }).collect();
        // SAFETY: one pointer per device, each to as many bytes as the driver said (or NULL).
        let rc = unsafe { f(p as _, CL_PROGRAM_BINARIES, ptrs.len() * HANDLE, ptrs.as_mut_ptr().cast(), null_mut()) };
        BinariesReply { status: rc, binaries: if rc == CL_SUCCESS { binaries } else { Vec::new() } }
    }
}

impl Serve<SetProgramSpecializationConstant> for LaneServer<'_> {
    fn serve(&self, r: SetProgramSpecializationConstant) -> i32 {
        let p = tri!(self.obj(r.program, Kind::Program));
        let value = if r.value.is_empty() { null() } else { r.value.as_ptr() };
        // SAFETY: a live program; value holds value.len() bytes.
        unsafe { driver_fn!(p, clSetProgramSpecializationConstant)(p as _, r.spec_id, r.value.len(), value.cast()) }
    }
}

impl Serve<UnloadPlatformCompiler> for LaneServer<'_> {
    fn serve(&self, r: UnloadPlatformCompiler) -> i32 {
        let p = tri!(self.obj(r.platform, Kind::Platform));
        // SAFETY: a live platform.
        unsafe { driver_fn!(p, clUnloadPlatformCompiler)(p as _) }
    }
}

impl Serve<ProbeProgramReleaseCallback> for LaneServer<'_> {
    fn serve(&self, r: ProbeProgramReleaseCallback) -> i32 {
        let p = tri!(self.obj(r.program, Kind::Program));
        // SAFETY: a live program; the callback has the signature the driver calls.
        unsafe { driver_fn!(p, clSetProgramReleaseCallback)(p as _, notify::ignore_program as *mut c_void, null_mut()) }
    }
}
