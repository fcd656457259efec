//! Kernels and their arguments.

use super::*;

impl Serve<CreateKernel> for LaneServer<'_> {
    fn serve(&self, r: CreateKernel) -> KernelReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let mut name = r.name.clone();
        name.push(0);
        let f = driver_fn!(p, clCreateKernel);
        let mut rc = CL_SUCCESS;
        // SAFETY: live program, NUL-terminated name.
        let k = unsafe { f(p as _, name.as_ptr().cast(), &mut rc) };
        let rc = self.adopt(r.id, Kind::Kernel, k, rc);
        if rc != CL_SUCCESS {
            return rc.into();
        }
        KernelReply { status: CL_SUCCESS, num_args: kernel_num_args(k as usize) }
    }
}

impl Serve<CreateKernelsInProgram> for LaneServer<'_> {
    fn serve(&self, r: CreateKernelsInProgram) -> KernelsReply {
        let p = tri!(self.obj(r.program, Kind::Program));
        let f = driver_fn!(p, clCreateKernelsInProgram);
        let mut count: cl_uint = 0;
        let mut ks = vec![null_mut(); r.ids.len()];
        let out = if ks.is_empty() { null_mut() } else { ks.as_mut_ptr() };
        // SAFETY: live program; ks has room for ids.len() kernels.
        let rc = unsafe { f(p as _, ks.len() as u32, out, &mut count) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut num_args = Vec::new();
        if !ks.is_empty() {
            for (k, &id) in ks.iter().zip(&r.ids).take(count as usize) {
                self.adopt(id, Kind::Kernel, *k, CL_SUCCESS);
                num_args.push(kernel_num_args(*k as usize));
            }
        }
        KernelsReply { status: CL_SUCCESS, count, num_args }
    }
}

impl Serve<CloneKernel> for LaneServer<'_> {
    fn serve(&self, r: CloneKernel) -> i32 {
        let k = tri!(self.obj(r.source, Kind::Kernel));
        let mut rc = CL_SUCCESS;
        // SAFETY: a live kernel.
        let c = unsafe { driver_fn!(k, clCloneKernel)(k as _, &mut rc) };
        self.adopt(r.id, Kind::Kernel, c, rc)
    }
}

impl Serve<GetKernelSubGroupInfo> for LaneServer<'_> {
    fn serve(&self, r: GetKernelSubGroupInfo) -> InfoReply {
        let k = tri!(self.obj(r.kernel, Kind::Kernel));
        let d = if r.device == 0 { 0 } else { tri!(self.obj(r.device, Kind::Device)) };
        let f = driver_fn!(k, clGetKernelSubGroupInfo);
        let input = if r.input.is_empty() { null() } else { r.input.as_ptr() };
        let mut size = 0usize;
        // SAFETY: (both calls) live kernel and device; input holds input.len() bytes; value
        // holds `size` bytes.
        let status = unsafe { f(k as _, d as _, r.param, r.input.len(), input.cast(), 0, null_mut(), &mut size) };
        if status != CL_SUCCESS {
            return status.into();
        }
        let mut value = vec![0u8; size];
        let value_status = if size == 0 {
            CL_SUCCESS
        } else {
            unsafe {
                f(k as _, d as _, r.param, r.input.len(), input.cast(), size, value.as_mut_ptr().cast(), null_mut())
            }
        };
        InfoReply { status, value_status, value }
    }
}

/// The shim asks here for each new shape of value at an index (`shim/src/kernel_args.rs`: a
/// pointer-sized zero and other words are two), and records later values of an accepted shape
/// itself, shipped with the enqueue: so a word of no object is checked here once, not at every
/// enqueue.
impl Serve<SetKernelArg> for LaneServer<'_> {
    fn serve(&self, r: SetKernelArg) -> i32 {
        let k = tri!(self.obj(r.kernel, Kind::Kernel));
        if let ArgValue::Bytes(b) = &r.value {
            if b.len() == HANDLE && b.iter().any(|&x| x != 0) {
                // No object of ours (those travel as ids): the application's bytes, which an
                // object argument would take as the address of a driver object here.
                if let Some(refused) = self.object_arg(k, r.index) {
                    return refused;
                }
            }
        }
        self.set_args(k, &[(r.index, r.value)]).err().unwrap_or(CL_SUCCESS)
    }
}
