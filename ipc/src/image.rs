//! Image geometry both sides need: the size of a pixel, the bytes of host memory an image or a
//! region covers, and copying rows between the application's pitched memory and packed bytes.
//! The wire always carries packed rows, so the driver sees host pitches of 0 and neither side
//! ships the gaps between the application's rows.

use crate::cl::*;
use crate::wire::ImageDesc;

/// Bytes per pixel of a `cl_image_format`, or `None` for a format the spec does not list.
pub fn element_size(order: u32, data_type: u32) -> Option<u64> {
    // Packed types are one element whatever the channel order.
    match data_type {
        0x10D4 | 0x10D5 => return Some(2),          // UNORM_SHORT_565, UNORM_SHORT_555
        0x10D6 | 0x10DF | 0x10E0 => return Some(4), // UNORM_INT_101010, UNORM_INT24, UNORM_INT_101010_2
        _ => {}
    }
    let channel = match data_type {
        0x10D0 | 0x10D2 | 0x10D7 | 0x10DA => 1, // SNORM_INT8, UNORM_INT8, SIGNED_INT8, UNSIGNED_INT8
        0x10D1 | 0x10D3 | 0x10D8 | 0x10DB | 0x10DD => 2, // *_INT16, HALF_FLOAT
        0x10D9 | 0x10DC | 0x10DE => 4,          // SIGNED_INT32, UNSIGNED_INT32, FLOAT
        _ => return None,
    };
    let channels = match order {
        0x10B0 | 0x10B1 | 0x10B8 | 0x10B9 | 0x10BA | 0x10BD => 1, // R A INTENSITY LUMINANCE Rx DEPTH
        0x10B2 | 0x10B3 | 0x10BB => 2,                            // RG RA RGx
        0x10B4 | 0x10BC | 0x10BF | 0x10C0 => 3,                   // RGB RGBx sRGB sRGBx
        0x10B5 | 0x10B6 | 0x10B7 | 0x10C1 | 0x10C2 | 0x10C3 => 4, // RGBA BGRA ARGB sRGBA sBGRA ABGR
        0x10BE => 2,                                              // DEPTH_STENCIL (with 32-bit float: 8)
        _ => return None,
    };
    Some(channel * channels)
}

/// Host memory an image created with `CL_MEM_USE/COPY_HOST_PTR` reads: `(row_pitch,
/// slice_pitch, total)`, with the spec's defaults for pitches of 0.
pub fn host_extent(elem: u64, d: &ImageDesc) -> Option<(u64, u64, u64)> {
    let row = if d.row_pitch == 0 { d.width.checked_mul(elem)? } else { d.row_pitch };
    let (slice_default, slices) = match d.image_type {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => (row, 1),
        CL_MEM_OBJECT_IMAGE2D => (row.checked_mul(d.height)?, 1),
        CL_MEM_OBJECT_IMAGE3D => (row.checked_mul(d.height)?, d.depth),
        CL_MEM_OBJECT_IMAGE1D_ARRAY => (row, d.array_size),
        CL_MEM_OBJECT_IMAGE2D_ARRAY => (row.checked_mul(d.height)?, d.array_size),
        _ => return None,
    };
    let slice = if d.slice_pitch == 0 { slice_default } else { d.slice_pitch };
    Some((row, slice, slice.checked_mul(slices.max(1))?))
}

/// A box of rows in memory: `rows` x `slices` rows of `row_bytes`, `row_pitch` apart within a
/// slice and `slice_pitch` apart between slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub row_bytes: usize,
    pub rows: usize,
    pub slices: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

impl Strided {
    /// `len` contiguous bytes.
    pub fn linear(len: usize) -> Self {
        Strided { row_bytes: len, rows: 1, slices: 1, row_pitch: len, slice_pitch: len }
    }

    /// The same box with no gaps.
    pub fn packed(row_bytes: usize, rows: usize, slices: usize) -> Self {
        Strided { row_bytes, rows, slices, row_pitch: row_bytes, slice_pitch: row_bytes * rows }
    }

    pub fn packed_len(&self) -> usize {
        self.row_bytes * self.rows * self.slices
    }

    /// The bytes from the box's first byte to its last, inclusive (0 for an empty box); `None`
    /// where that overflows (pitches or counts no memory can hold).
    pub fn extent(&self) -> Option<usize> {
        if self.row_bytes == 0 || self.rows == 0 || self.slices == 0 {
            return Some(0);
        }
        let last_slice = (self.slices - 1).checked_mul(self.slice_pitch)?;
        let last_row = (self.rows - 1).checked_mul(self.row_pitch)?;
        last_slice.checked_add(last_row)?.checked_add(self.row_bytes)
    }

    /// The offset of each row, in order.
    fn rows(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.slices).flat_map(move |z| (0..self.rows).map(move |y| z * self.slice_pitch + y * self.row_pitch))
    }

    /// Copies the box at `src` into packed bytes at `dst`.
    ///
    /// # Safety
    /// `src` is readable over every row of the box; `dst` writable for `packed_len()` bytes;
    /// the two do not overlap.
    pub unsafe fn pack(&self, src: *const u8, dst: *mut u8) {
        for (i, off) in self.rows().enumerate() {
            // SAFETY: guaranteed by the caller.
            unsafe { crate::copy::copy(dst.add(i * self.row_bytes), src.add(off), self.row_bytes) };
        }
    }

    /// Copies packed bytes at `src` into the box at `dst`.
    ///
    /// # Safety
    /// As for `pack`, with the roles swapped.
    pub unsafe fn unpack(&self, src: *const u8, dst: *mut u8) {
        for (i, off) in self.rows().enumerate() {
            // SAFETY: guaranteed by the caller.
            unsafe { crate::copy::copy(dst.add(off), src.add(i * self.row_bytes), self.row_bytes) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_round_trips_and_leaves_gaps_alone() {
        let s = Strided { row_bytes: 3, rows: 2, slices: 2, row_pitch: 5, slice_pitch: 12 };
        let src: Vec<u8> = (0..24).collect();
        let mut packed = vec![0u8; s.packed_len()];
        // SAFETY: both buffers cover the box.
        unsafe { s.pack(src.as_ptr(), packed.as_mut_ptr()) };
        assert_eq!(packed, [0, 1, 2, 5, 6, 7, 12, 13, 14, 17, 18, 19]);
        let mut out = vec![0xAAu8; 24];
        // SAFETY: as above.
        unsafe { s.unpack(packed.as_ptr(), out.as_mut_ptr()) };
        assert_eq!(&out[0..5], &[0, 1, 2, 0xAA, 0xAA]);
        assert_eq!(&out[17..20], &[17, 18, 19]);
        assert_eq!(out[11], 0xAA);
    }

    #[test]
    fn element_sizes_follow_the_spec() {
        assert_eq!(element_size(0x10B5, 0x10DE), Some(16)); // RGBA float
        assert_eq!(element_size(0x10B0, 0x10D2), Some(1)); // R unorm8
        assert_eq!(element_size(0x10B4, 0x10D4), Some(2)); // RGB 565
        assert_eq!(element_size(0x1234, 0x10D2), None);
    }

    #[test]
    fn a_box_extent_spans_first_to_last_byte_and_overflow_is_none() {
        let b = Strided { row_bytes: 10, rows: 3, slices: 2, row_pitch: 16, slice_pitch: 64 };
        assert_eq!(b.extent(), Some(64 + 2 * 16 + 10));
        assert_eq!(Strided::packed(10, 3, 2).extent(), Some(60));
        assert_eq!(Strided { rows: 0, ..b }.extent(), Some(0));
        assert_eq!(Strided { slices: 1 << 40, slice_pitch: 1 << 40, ..b }.extent(), None);
        assert_eq!(Strided { rows: 2, row_pitch: usize::MAX, ..b }.extent(), None);
    }

    #[test]
    fn host_extent_uses_default_pitches() {
        let d = ImageDesc { image_type: CL_MEM_OBJECT_IMAGE2D, width: 10, height: 4, ..Default::default() };
        assert_eq!(host_extent(4, &d), Some((40, 160, 160)));
        let d = ImageDesc { image_type: CL_MEM_OBJECT_IMAGE1D_ARRAY, width: 10, array_size: 3, ..Default::default() };
        assert_eq!(host_extent(4, &d), Some((40, 40, 120)));
    }
}
