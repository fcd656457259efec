//! Devices: enumeration, sub-devices, timers.

use super::*;

impl Serve<GetDeviceIds> for LaneServer<'_> {
    fn serve(&self, r: GetDeviceIds) -> IdsReply {
        let p = tri!(self.obj(r.platform, Kind::Platform));
        let f = driver_fn!(p, clGetDeviceIDs);
        let mut n: cl_uint = 0;
        // SAFETY: p is a live platform; count query with a valid out pointer.
        let rc = unsafe { f(p as _, r.device_type, 0, null_mut(), &mut n) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        let mut devs = vec![null_mut(); n as usize];
        // SAFETY: devs has room for n handles.
        let rc = unsafe { f(p as _, r.device_type, n, devs.as_mut_ptr(), null_mut()) };
        if rc != CL_SUCCESS {
            return rc.into();
        }
        IdsReply { status: CL_SUCCESS, ids: devs.iter().map(|&d| self.worker.objects.id_of(d as usize)).collect() }
    }
}

impl Serve<CreateSubDevices> for LaneServer<'_> {
    fn serve(&self, r: CreateSubDevices) -> CountReply {
        let d = tri!(self.obj(r.device, Kind::Device));
        let mut props: Vec<isize> = r.properties.iter().map(|&p| p as isize).collect();
        if props.last() != Some(&0) {
            props.push(0);
        }
        let mut out = vec![null_mut(); r.ids.len()];
        let mut count: cl_uint = 0;
        let f = driver_fn!(d, clCreateSubDevices);
        let out_ptr = if out.is_empty() { null_mut() } else { out.as_mut_ptr() };
        // SAFETY: a live device; props zero-terminated; out has room for ids.len() devices.
        let rc = unsafe { f(d as _, props.as_ptr(), out.len() as u32, out_ptr, &mut count) };
        if rc == CL_SUCCESS {
            for (&h, &id) in out.iter().zip(&r.ids).filter(|(h, _)| !h.is_null()) {
                self.worker.objects.insert(id, Kind::Device, h as usize);
            }
        }
        CountReply { status: rc, count }
    }
}

impl Serve<GetTimers> for LaneServer<'_> {
    fn serve(&self, r: GetTimers) -> TimersReply {
        let d = tri!(self.obj(r.device, Kind::Device));
        let (mut device_timestamp, mut host_timestamp) = (0u64, 0u64);
        // SAFETY: a live device; both out pointers are valid u64s.
        let status = unsafe {
            if r.with_device {
                driver_fn!(d, clGetDeviceAndHostTimer)(d as _, &mut device_timestamp, &mut host_timestamp)
            } else {
                driver_fn!(d, clGetHostTimer)(d as _, &mut host_timestamp)
            }
        };
        TimersReply { status, device_timestamp, host_timestamp }
    }
}
