//! Memory for small zero-copy buffers, carved out of slabs shared with the worker once.
//!
//! A zero-copy buffer with a segment of its own costs a memfd, a mapping on each side, an fd
//! sent over the socket and the worker's wait for that fd to arrive beside the request that
//! names it: 50-90 us on 2 pocl cores, where the driver's own `clCreateBuffer` takes 0.25 us.
//! Buffers up to `SLAB_ITEM_MAX` bytes instead take the next aligned bytes of an open slab, so
//! their creation costs the `CreateBuffer` round trip alone.
//!
//! A slab is never reused in part: bytes of a released buffer may still be in the driver's
//! hands (its last commands), so they come back only with the whole slab, once every buffer in
//! it is destroyed (the worker keeps the slab mapped for each buffer it holds, the shim for
//! each view). A long-lived small buffer thus keeps its slab's `SLAB_LEN` bytes of address space
//! and the pages its neighbours touched.
//!
//! A full slab is retired: the worker is told to drop it from its segment table once no
//! `CreateBuffer` naming it is still unanswered (threads create buffers on lanes of their own,
//! so a drop sent earlier could overtake one).

use std::sync::{Arc, Mutex};

use cloister_ipc::shm::SharedMapping;

/// Buffers up to this size share slabs. Larger ones get a segment of their own: their creation
/// is small beside their use, and as a slab's neighbours they would pin large slabs.
pub const SLAB_ITEM_MAX: usize = 64 << 10;

/// A slab's size: sixteen of the largest buffers it takes, 256 of 4 KiB.
pub const SLAB_LEN: usize = 1 << 20;

struct Slab {
    segment: u64,
    mapping: Arc<SharedMapping>,
    /// Bytes handed out from its start.
    used: usize,
    /// Buffers placed in it whose `CreateBuffer` is not answered yet.
    creating: usize,
}

#[derive(Default)]
struct State {
    /// The slab new buffers go into.
    open: Option<Slab>,
    /// Full slabs with creations still unanswered: dropped in the worker once they are.
    retired: Vec<Slab>,
}

/// Bytes placed in a slab for one buffer.
pub struct Carved {
    pub mapping: Arc<SharedMapping>,
    pub segment: u64,
    pub offset: usize,
    /// A slab retired to make room, with nothing in flight: the worker may drop it now.
    pub retired: Option<u64>,
}

/// The slabs of one connection.
#[derive(Default)]
pub struct Slabs {
    state: Mutex<State>,
}

impl Slabs {
    /// Places `len` bytes (at most `SLAB_ITEM_MAX`) at a multiple of `align` (a power of two,
    /// at most a page) in the open slab, or in a fresh one from `fresh` (a segment the worker
    /// was sent and this side's mapping of it) when they do not fit.
    pub fn carve<E>(
        &self,
        len: usize,
        align: usize,
        fresh: impl FnOnce() -> Result<(u64, SharedMapping), E>,
    ) -> Result<Carved, E> {
        debug_assert!(len <= SLAB_ITEM_MAX && align.is_power_of_two() && align <= 4096);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |s: &Slab| s.used.next_multiple_of(align) + len <= s.mapping.len();
        let mut retired = None;
        if !state.open.as_ref().is_some_and(fits) {
            let (segment, mapping) = fresh()?;
            let slab = Slab { segment, mapping: Arc::new(mapping), used: 0, creating: 0 };
            if let Some(full) = state.open.replace(slab) {
                match full.creating {
                    0 => retired = Some(full.segment),
                    _ => state.retired.push(full),
                }
            }
        }
        let slab = state.open.as_mut().expect("an open slab was just ensured");
        let offset = slab.used.next_multiple_of(align);
        slab.used = offset + len;
        slab.creating += 1;
        Ok(Carved { mapping: slab.mapping.clone(), segment: slab.segment, offset, retired })
    }

    /// The `CreateBuffer` naming bytes of slab `segment` was answered; returns the slab when it
    /// is retired and nothing in it is in flight any more (the worker may drop it now).
    pub fn placed(&self, segment: u64) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = state.open.as_mut().filter(|s| s.segment == segment) {
            open.creating -= 1;
            return None;
        }
        let i = state.retired.iter().position(|s| s.segment == segment)?;
        state.retired[i].creating -= 1;
        (state.retired[i].creating == 0).then(|| state.retired.swap_remove(i).segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloister_ipc::shm::SharedRegion;

    fn slab(next: &mut u64) -> Result<(u64, SharedMapping), ()> {
        *next += 1;
        Ok((*next, SharedRegion::create("slab-test", SLAB_LEN).map_err(|_| ())?.into_mapping()))
    }

    #[test]
    fn buffers_are_placed_aligned_one_after_the_other() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let a = slabs.carve(100, 128, || slab(&mut next)).unwrap();
        let b = slabs.carve(4096, 128, || slab(&mut next)).unwrap();
        let c = slabs.carve(1, 4096, || slab(&mut next)).unwrap();
        assert_eq!((a.segment, a.offset), (1, 0));
        assert_eq!((b.segment, b.offset), (1, 128));
        assert_eq!((c.segment, c.offset), (1, 8192));
        assert!(Arc::ptr_eq(&a.mapping, &c.mapping));
        assert_eq!(next, 1, "one slab for all three");
    }

    /// Fills the open slab (from `from` bytes used) with buffers of the largest size.
    fn fill(slabs: &Slabs, next: &mut u64, from: usize) -> Vec<Carved> {
        (0..(SLAB_LEN - from) / SLAB_ITEM_MAX)
            .map(|_| slabs.carve(SLAB_ITEM_MAX, 128, || slab(next)).unwrap())
            .collect()
    }

    #[test]
    fn a_full_slab_is_dropped_once_nothing_in_it_is_in_flight() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let first = fill(&slabs, &mut next, 0);
        assert!(first.iter().all(|c| c.segment == 1 && c.retired.is_none()));
        assert_eq!(first.last().unwrap().offset + SLAB_ITEM_MAX, SLAB_LEN, "filled to the byte");
        // Answers for all but one: the slab is still open, nothing to drop.
        for c in &first[1..] {
            assert_eq!(slabs.placed(c.segment), None);
        }
        // One byte more opens a second slab; the first waits for its last answer.
        let second = slabs.carve(1, 128, || slab(&mut next)).unwrap();
        assert_eq!((second.segment, second.offset, second.retired), (2, 0, None));
        assert_eq!(slabs.placed(1), Some(1), "its last answer lets the worker drop it");
        assert_eq!(slabs.placed(1), None, "and only once");
        // A slab with nothing in flight is dropped as it is retired.
        assert_eq!(slabs.placed(2), None);
        for c in fill(&slabs, &mut next, 128) {
            assert_eq!((c.segment, slabs.placed(c.segment)), (2, None));
        }
        let third = slabs.carve(SLAB_ITEM_MAX, 64, || slab(&mut next)).unwrap();
        assert_eq!((third.segment, third.offset, third.retired), (3, 0, Some(2)));
    }

    #[test]
    fn a_failed_fresh_slab_leaves_the_open_one() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let first = fill(&slabs, &mut next, 0);
        assert!(slabs.carve(1, 128, || Err::<(u64, SharedMapping), ()>(())).is_err());
        for _ in &first {
            assert_eq!(slabs.placed(1), None, "still the open slab");
        }
        let b = slabs.carve(8, 128, || slab(&mut next)).unwrap();
        assert_eq!((b.segment, b.offset, b.retired), (2, 0, Some(1)));
    }
}
