//! Large copies between application memory and shared memory, split across threads.
//!
//! Every caged transfer costs one copy the direct path does not have (or, with zero-copy
//! buffers, the copy the driver would have made, made by the shim instead). One thread's memcpy
//! reaches 7-10 GB/s on a server core (an H100 host: `clpeak`'s "memcpy to mapped ptr" 10.8
//! GB/s), while a discrete GPU's DMA from pinned pages reaches 55 GB/s: the copy is the
//! bottleneck, and memory bandwidth allows several threads at once. Copies of at least
//! `PARALLEL_MIN` bytes are split across `threads()` threads (scoped, so nothing outlives the
//! call); smaller ones, and machines with few cores, copy on the calling thread.

use std::sync::OnceLock;

/// Below this, starting threads costs more than it saves.
pub const PARALLEL_MIN: usize = 2 << 20;

/// How many threads a large copy uses: `CLOISTER_COPY_THREADS`, else half the cores the process
/// may run on, at most 4 (the other half is the driver's, and the application's own).
pub fn threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| crate::settings::number("copy_threads", None).max(1) as usize)
}

/// Copies `len` bytes from `src` to `dst`, on several threads when it is large.
///
/// # Safety
/// `src` is valid for `len` bytes of reads and `dst` for `len` bytes of writes, and the two do
/// not overlap; nothing else writes either range during the call.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_with(threads(), dst, src, len) }
}

/// `copy` with an explicit thread count (tests pin it).
///
/// # Safety
/// As `copy`.
pub unsafe fn copy_with(threads: usize, dst: *mut u8, src: *const u8, len: usize) {
    if threads <= 1 || len < PARALLEL_MIN {
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    // Page-aligned pieces, so no two threads write one page.
    let piece = len.div_ceil(threads).next_multiple_of(4096);
    let (dst, src) = (dst as usize, src as usize);
    std::thread::scope(|s| {
        let mut start = piece;
        while start < len {
            let n = piece.min(len - start);
            // SAFETY: [start, start + n) lies within both ranges (start < len, n <= len - start).
            s.spawn(move || unsafe {
                std::ptr::copy_nonoverlapping((src + start) as *const u8, (dst + start) as *mut u8, n)
            });
            start += piece;
        }
        // SAFETY: the first piece, on this thread; piece < len here.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, piece.min(len)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_arrives_whatever_the_split() {
        for (threads, len) in
            [(1, PARALLEL_MIN + 3), (3, PARALLEL_MIN + 4097), (4, PARALLEL_MIN), (7, 3 * PARALLEL_MIN - 1)]
        {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
            let mut dst = vec![0u8; len + 2];
            // SAFETY: distinct vectors, each large enough.
            unsafe { copy_with(threads, dst.as_mut_ptr().add(1), src.as_ptr(), len) };
            assert_eq!(&dst[1..=len], &src[..], "threads {threads} len {len}");
            assert_eq!((dst[0], dst[len + 1]), (0, 0), "wrote outside the range");
        }
    }
}
