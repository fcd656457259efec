//! The launch shapes a kernel's driver has accepted: which NDRanges the shim may post.
//!
//! A posted NDRange returns `CL_SUCCESS` before the driver sees it, so whatever the driver
//! refuses in it comes late. The work-group checks need not: whether a driver takes an
//! NDRange's sizes (`CL_INVALID_WORK_GROUP_SIZE`, `CL_INVALID_WORK_ITEM_SIZE`) depends on the
//! kernel, the device, the local size and whether the global size is a whole number of
//! work-groups, not on the global size's values. A local size larger than the kernel or the
//! device allows, one that is not the kernel's `reqd_work_group_size`, or a global size that is
//! not a multiple of it where the program needs uniform work-groups (OpenCL C 1.2, or a device
//! without non-uniform work-groups): the driver refuses every NDRange of that shape, or none.
//!
//! So the first NDRange of each shape goes as a call and the application hears the driver's
//! answer from it, as directly; once the driver has accepted a shape, later NDRanges of it are
//! posted. With no local size the driver picks one, and what it may refuse then depends on the
//! kernel's required work-group size (`CL_KERNEL_COMPILE_WORK_GROUP_SIZE`): the shim asks for it
//! once per device, and a global size that is a multiple of it is another shape than one that
//! is not. The Khronos CTS's test_api checks both at the call (`kernel_required_group_size`,
//! `consistency_non_uniform_work_group`).
//!
//! Layer: a leaf (the wire's ids, `brief_lock`).

use cloister_ipc::{Dims, ObjectId};

use crate::brief_lock::BriefLock;

/// Shapes kept per kernel: applications launch a kernel in a handful of shapes. Past this the
/// oldest is forgotten, and its next NDRange goes as a call again.
const KEPT: usize = 32;

/// An NDRange's shape, as far as the driver's work-group checks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    device: ObjectId,
    work_dim: u32,
    /// `None`: the driver picks the local size.
    local: Option<[u64; 3]>,
    /// The global size is a whole number of work-groups in every dimension (of the local
    /// size, or with none of the kernel's required size; true where the kernel requires none).
    uniform: bool,
}

#[derive(Default)]
pub struct LaunchShapes {
    /// Shapes the driver accepted, oldest first.
    accepted: BriefLock<Vec<Launch>>,
    /// The kernel's required work-group size per device, as the driver answered it (zeros: none).
    required: BriefLock<Vec<(ObjectId, [u64; 3])>>,
}

impl LaunchShapes {
    /// The shape of an NDRange of `global` work-items in groups of `local` (`work_dim` of each
    /// used) on `device`; `None` with no local size while the kernel's required size on that
    /// device is not known (`note_required`).
    pub fn shape(&self, device: ObjectId, work_dim: u32, global: &[u64], local: Option<&Dims>) -> Option<Launch> {
        let divides = |group: &[u64]| global.iter().zip(group).all(|(&g, &l)| l == 0 || g % l == 0);
        let (local, uniform) = match local {
            Some(l) => (Some(l.padded()), divides(l)),
            None => {
                let required = self.required.lock().iter().find(|(d, _)| *d == device).map(|(_, size)| *size)?;
                (None, divides(&required))
            }
        };
        Some(Launch { device, work_dim, local, uniform })
    }

    /// Whether the driver has accepted an NDRange of this shape.
    pub fn accepted(&self, launch: &Launch) -> bool {
        self.accepted.lock().contains(launch)
    }

    /// Notes that the driver accepted an NDRange of this shape (it ran as a call).
    pub fn accept(&self, launch: Launch) {
        let mut accepted = self.accepted.lock();
        if accepted.contains(&launch) {
            return;
        }
        if accepted.len() == KEPT {
            accepted.remove(0);
        }
        accepted.push(launch);
    }

    /// Notes the kernel's required work-group size on `device` (zeros: it requires none).
    pub fn note_required(&self, device: ObjectId, size: [u64; 3]) {
        let mut required = self.required.lock();
        if !required.iter().any(|(d, _)| *d == device) {
            required.push((device, size));
        }
    }

    /// A copy, for a kernel cloned from this one or rebuilt in a replacement worker: the same
    /// code on the same devices, so the driver takes the same shapes.
    pub fn copy(&self) -> LaunchShapes {
        LaunchShapes {
            accepted: BriefLock::new(self.accepted.lock().clone()),
            required: BriefLock::new(self.required.lock().clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(values: &[u64]) -> Dims {
        Dims::new(values.iter().copied()).unwrap()
    }

    #[test]
    fn a_shape_is_its_local_size_and_whether_the_groups_divide_the_global_size() {
        let shapes = LaunchShapes::default();
        let a = shapes.shape(1, 1, &[64], Some(&dims(&[16]))).unwrap();
        assert_eq!(shapes.shape(1, 1, &[1 << 20], Some(&dims(&[16]))), Some(a), "another global size, the same shape");
        assert_ne!(shapes.shape(1, 1, &[60], Some(&dims(&[16]))), Some(a), "a partial work-group");
        assert_ne!(shapes.shape(1, 1, &[64], Some(&dims(&[8]))), Some(a), "another local size");
        assert_ne!(shapes.shape(2, 1, &[64], Some(&dims(&[16]))), Some(a), "another device");
        assert_ne!(shapes.shape(1, 2, &[64, 1], Some(&dims(&[16, 1]))), Some(a), "another dimension count");
        assert!(!shapes.accepted(&a));
        shapes.accept(a);
        assert!(shapes.accepted(&a));
        assert!(!shapes.accepted(&shapes.shape(1, 1, &[60], Some(&dims(&[16]))).unwrap()));
    }

    #[test]
    fn without_a_local_size_the_shape_waits_for_the_required_size() {
        let shapes = LaunchShapes::default();
        assert_eq!(shapes.shape(1, 1, &[64], None), None, "not known yet");
        shapes.note_required(1, [8, 1, 1]);
        let whole = shapes.shape(1, 1, &[64], None).unwrap();
        let partial = shapes.shape(1, 1, &[60], None).unwrap();
        assert_ne!(whole, partial, "60 is not a multiple of the required 8");
        assert_eq!(shapes.shape(2, 1, &[64], None), None, "known on device 1 only");
        shapes.note_required(2, [0, 0, 0]);
        assert_eq!(shapes.shape(2, 1, &[60], None), shapes.shape(2, 1, &[64], None), "no required size");
    }

    #[test]
    fn the_oldest_shape_is_forgotten_past_the_limit() {
        let shapes = LaunchShapes::default();
        let launch = |l: u64| shapes.shape(1, 1, &[l * 4], Some(&dims(&[l]))).unwrap();
        for l in 1..=KEPT as u64 + 1 {
            shapes.accept(launch(l));
        }
        assert!(!shapes.accepted(&launch(1)));
        assert!(shapes.accepted(&launch(2)) && shapes.accepted(&launch(KEPT as u64 + 1)));
        let copy = shapes.copy();
        assert!(copy.accepted(&launch(2)));
    }
}
