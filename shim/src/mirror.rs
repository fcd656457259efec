//! Leaf: the rows of a `CL_MEM_USE_HOST_PTR` object's memory the shim keeps in step with the
//! device, as the handle table (`handle::MapRecord`), pending transfers and recovery know them.

use cloister_ipc::cl::*;
use cloister_ipc::image::Strided;

/// Rows of a `CL_MEM_USE_HOST_PTR` object's memory the shim keeps in step with the device:
/// the box `shape` at `at`.
#[derive(Clone, Copy, Debug)]
pub struct Mirror {
    pub at: usize,
    pub shape: Strided,
}

impl Mirror {
    /// The box `shape` at `at`, if it lies within the application's `len` bytes at `base` (the
    /// object's memory as it declared it); `CL_INVALID_VALUE` otherwise, whatever the driver
    /// would say, as the shim itself copies into it.
    pub fn within(at: usize, shape: Strided, base: usize, len: usize) -> Result<Mirror, cl_int> {
        let end = shape.extent().and_then(|e| at.checked_add(e)).ok_or(CL_INVALID_VALUE)?;
        match at >= base && end <= base.saturating_add(len) {
            true => Ok(Mirror { at, shape }),
            false => Err(CL_INVALID_VALUE),
        }
    }

    /// Unpacks packed rows at `src` into the application's memory.
    ///
    /// # Safety
    /// `src` holds `shape.packed_len()` bytes; the application's memory covers the box (it
    /// created the object over it).
    pub unsafe fn fill_from(&self, src: *const u8) {
        // SAFETY: guaranteed by the caller.
        unsafe { self.shape.unpack(src, self.at as *mut u8) };
    }

    /// Packs the application's rows into `dst`.
    ///
    /// # Safety
    /// `dst` holds `shape.packed_len()` writable bytes; the application's memory covers the box.
    pub unsafe fn pack_into(&self, dst: *mut u8) {
        // SAFETY: guaranteed by the caller.
        unsafe { self.shape.pack(self.at as *const u8, dst) };
    }
}
