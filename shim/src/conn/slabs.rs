//! Memory for small zero-copy buffers, carved out of slabs shared with the worker once.
//!
//! A zero-copy buffer with a segment of its own costs a memfd, a mapping on each side, an fd
//! sent over the socket and the worker's wait for that fd to arrive beside the request that
//! names it: 50-90 us on 2 pocl cores, where the driver's own `clCreateBuffer` takes 0.25 us.
//! Buffers up to `SLAB_ITEM_MAX` bytes instead take the next aligned bytes of an open slab, so
//! their creation costs the `CreateBuffer` round trip alone.
//!
//! A slab's bytes are never handed out twice while it is in use: bytes of a released buffer
//! may still be in the driver's hands (its last commands). A full slab is retired instead
//! (`RetireSlab`, posted once no `CreateBuffer` naming it is unanswered: threads create buffers
//! on lanes of their own, so a retirement sent earlier could overtake one), and the worker says
//! when the driver has destroyed every buffer in it (`Notification::SlabIdle`). Once this
//! side's views of it are gone too (each buffer's `SlabLease`), the slab is carved again from
//! its start: its pages are warm on both sides, where fresh memory costs a page fault and a
//! zeroed page per 4 KiB touched (56 us to make a 64 KiB buffer with contents on 2 pocl cores,
//! against 0.7 us directly). Up to `SPARE_SLABS` idle slabs wait to be carved again; more are
//! dropped (`DropSegment`).
//!
//! A long-lived small buffer keeps its slab from coming back. So that an application whose
//! long-lived small buffers sit among short-lived ones cannot keep a slab per buffer without
//! bound, no fresh slab is made while the slabs still mapped here hold `SLAB_WASTE_FLOOR`
//! bytes or more and their live buffers fill under a quarter of them: small buffers then get
//! segments of their own, freed with them, until slabs empty out. A worker that never says a
//! slab is idle (a driver without destructor callbacks, a hostile one) keeps at most
//! `WAITING_SLABS` slabs without live buffers here; older ones are dropped.
//!
//! A larger buffer, up to `WHOLE_SLAB_MAX`, takes a slab of its own (`carve_whole`), retired as
//! soon as its creation is sent, and comes back the same way: a later buffer of at least half
//! its size takes it again once the driver destroyed the first and this side's views are gone.
//! Fresh memory for a 1 MiB buffer with contents cost 850 us on 2 pocl cores (a page fault,
//! zeroing and a cgroup charge per 4 KiB), against 88 us directly, where the driver's `malloc`
//! hands back the pages it freed (the CTS's `buffer_fill_*` create 400 such buffers). Idle ones
//! are kept up to `SPARE_WHOLE_BYTES`, and those the worker has not said idle with nothing live
//! here up to `WAITING_WHOLE_BYTES`; beyond, the oldest are dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cloister_ipc::shm::SharedMapping;

/// Buffers up to this size share slabs. Larger ones get a segment of their own: their creation
/// is small beside their use, and as a slab's neighbours they would pin large slabs.
pub const SLAB_ITEM_MAX: usize = 64 << 10;

/// A slab's size: sixteen of the largest buffers it takes, 256 of 4 KiB.
pub const SLAB_LEN: usize = 1 << 20;

/// Slab memory mapped here beyond which a fresh slab is made only while live buffers fill at
/// least a quarter of what is mapped.
pub const SLAB_WASTE_FLOOR: usize = 64 * SLAB_LEN;

/// Idle slabs with nothing live kept to be carved again.
pub const SPARE_SLABS: usize = 4;

/// Retired slabs with nothing live here kept waiting for the worker's `SlabIdle`.
pub const WAITING_SLABS: usize = 16;

/// Buffers up to this size (and over `SLAB_ITEM_MAX`) take a slab of their own, which a later
/// buffer takes again (`carve_whole`); larger ones get a segment of their own, freed with them.
pub const WHOLE_SLAB_MAX: usize = 64 << 20;

/// Bytes of idle slabs of one buffer kept to be taken again: memory a driver's own `free` would
/// have given back, kept for the next buffers (a pool of transfer segments keeps as much).
pub const SPARE_WHOLE_BYTES: usize = 128 << 20;

/// Bytes of retired slabs of one buffer with nothing live here kept waiting for `SlabIdle`.
pub const WAITING_WHOLE_BYTES: usize = 256 << 20;

/// Bytes of a slab that a live buffer holds: counted in its slab's live bytes until the last
/// view of the buffer (its object's, a sub-buffer's, the replay journal's) is gone.
pub struct SlabLease {
    bytes: usize,
    live: Arc<AtomicUsize>,
}

impl Drop for SlabLease {
    fn drop(&mut self) {
        self.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A slab as long as this side maps it: the mapping (gone once every view is), and the bytes
/// its live buffers hold.
struct Mapped {
    mapping: Weak<SharedMapping>,
    live: Arc<AtomicUsize>,
}

/// Where a full slab is on its way back to being carved again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Creations naming it are still unanswered: retired once they are.
    Retiring,
    /// The worker was told (`RetireSlab`) and has not said it idle yet.
    Retired,
    /// The driver holds no buffer in it: carved again once nothing here is live in it.
    Idle,
}

struct Slab {
    segment: u64,
    mapping: Arc<SharedMapping>,
    /// Bytes handed out from its start.
    used: usize,
    /// Buffers placed in it whose `CreateBuffer` is not answered yet.
    creating: usize,
    /// Bytes its live buffers hold (`SlabLease`).
    live: Arc<AtomicUsize>,
    /// Once full.
    phase: Phase,
    /// A slab of one buffer (`carve_whole`): never open, never carved past its one buffer.
    whole: bool,
}

impl Slab {
    /// A slab over `mapping`, fresh from the worker: nothing handed out, nothing live.
    fn fresh(segment: u64, mapping: SharedMapping, whole: bool) -> Slab {
        let (mapping, live) = (Arc::new(mapping), Arc::new(AtomicUsize::new(0)));
        Slab { segment, mapping, used: 0, creating: 0, live, phase: Phase::Retiring, whole }
    }

    fn empty_here(&self) -> bool {
        self.live.load(Ordering::Relaxed) == 0
    }

    /// Hands out `len` bytes at `offset` (past what was handed out before) for a buffer whose
    /// creation is now in flight, counted live until its lease goes.
    fn hand_out(&mut self, offset: usize, len: usize) -> Carved {
        self.used = offset + len;
        self.creating += 1;
        self.live.fetch_add(len, Ordering::Relaxed);
        let lease = Arc::new(SlabLease { bytes: len, live: self.live.clone() });
        Carved { mapping: self.mapping.clone(), segment: self.segment, offset, lease }
    }
}

#[derive(Default)]
struct State {
    /// The slab new buffers go into.
    open: Option<Slab>,
    /// Full slabs, oldest first, until they are carved again or dropped.
    full: Vec<Slab>,
    /// Every slab made, until this side unmaps it.
    mapped: Vec<Mapped>,
}

impl State {
    /// Whether the slabs mapped here are large and mostly empty (see the module's doc): slabs
    /// unmapped since are forgotten first.
    fn too_sparse(&mut self) -> bool {
        self.mapped.retain(|m| m.mapping.strong_count() > 0);
        let mapped = self.mapped.len() * SLAB_LEN;
        let live: usize = self.mapped.iter().map(|m| m.live.load(Ordering::Relaxed)).sum();
        mapped >= SLAB_WASTE_FLOOR && live < mapped / 4
    }

    /// An idle slab with nothing live here, ready to be carved again from its start.
    fn take_spare(&mut self) -> Option<Slab> {
        let i = self.full.iter().position(|s| !s.whole && s.phase == Phase::Idle && s.empty_here())?;
        let mut slab = self.full.remove(i);
        (slab.used, slab.creating) = (0, 0);
        cloister_ipc::log::in_shim(|| tracing::trace!(segment = slab.segment, "slab carved again"));
        Some(slab)
    }

    /// Drops the spare slabs beyond `SPARE_SLABS` and the oldest retired ones with nothing
    /// live here beyond `WAITING_SLABS`; returns their segments, for the worker to drop too.
    /// Slabs of one buffer are kept by their bytes (`SPARE_WHOLE_BYTES`, `WAITING_WHOLE_BYTES`).
    fn shed(&mut self) -> Vec<u64> {
        let mut dropped = Vec::new();
        // What a slab counts for against its limit: one, or its bytes.
        let weight = |s: &Slab| if s.whole { s.mapping.len() } else { 1 };
        let limits = [
            (false, Phase::Idle, SPARE_SLABS),
            (false, Phase::Retired, WAITING_SLABS),
            (true, Phase::Idle, SPARE_WHOLE_BYTES),
            (true, Phase::Retired, WAITING_WHOLE_BYTES),
        ];
        for (is_whole, phase, keep) in limits {
            let unused = |s: &Slab| s.whole == is_whole && s.phase == phase && s.empty_here();
            let mut excess = self.full.iter().filter(|s| unused(s)).map(weight).sum::<usize>().saturating_sub(keep);
            self.full.retain(|s| {
                let shed = excess > 0 && unused(s);
                if shed {
                    excess = excess.saturating_sub(weight(s));
                    dropped.push(s.segment);
                }
                !shed
            });
        }
        dropped
    }

    /// The smallest idle slab of one buffer with nothing live here that holds `len` bytes and
    /// not twice as many.
    fn take_whole_spare(&mut self, len: usize) -> Option<Slab> {
        let fits = |s: &Slab| {
            s.whole
                && s.phase == Phase::Idle
                && s.empty_here()
                && (len..=len.saturating_mul(2)).contains(&s.mapping.len())
        };
        let (i, _) = self.full.iter().enumerate().filter(|(_, s)| fits(s)).min_by_key(|(_, s)| s.mapping.len())?;
        let mut slab = self.full.remove(i);
        (slab.used, slab.creating) = (0, 0);
        Some(slab)
    }
}

/// Bytes placed in a slab for one buffer.
pub struct Carved {
    pub mapping: Arc<SharedMapping>,
    pub segment: u64,
    pub offset: usize,
    /// The buffer's share of the slab, for its views to hold.
    pub lease: Arc<SlabLease>,
}

/// What `Slabs::carve` did: the bytes (`None`: the buffer takes memory of its own), and what
/// the worker must be told first.
pub struct Placed {
    pub carved: Option<Carved>,
    /// A slab retired to make room, with nothing in flight: send `RetireSlab`.
    pub retired: Option<u64>,
    /// Slabs shed (`State::shed`): send `DropSegment`.
    pub dropped: Vec<u64>,
}

/// The slabs of one connection.
#[derive(Default)]
pub struct Slabs {
    state: Mutex<State>,
}

impl Slabs {
    /// Places `len` bytes (at most `SLAB_ITEM_MAX`) at a multiple of `align` (a power of two,
    /// at most a page) in the open slab, or, when they do not fit, in a spare one carved again
    /// or a fresh one from `fresh` (a segment the worker was sent and this side's mapping of
    /// it). No bytes while slabs are too sparse (`State::too_sparse`).
    pub fn carve<E>(
        &self,
        len: usize,
        align: usize,
        fresh: impl FnOnce() -> Result<(u64, SharedMapping), E>,
    ) -> Result<Placed, E> {
        debug_assert!(len <= SLAB_ITEM_MAX && align.is_power_of_two() && align <= 4096);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |s: &Slab| s.used.next_multiple_of(align) + len <= s.mapping.len();
        let mut placed = Placed { carved: None, retired: None, dropped: Vec::new() };
        if !state.open.as_ref().is_some_and(fits) {
            let next = match state.take_spare() {
                Some(spare) => spare,
                None => {
                    placed.dropped = state.shed();
                    if state.too_sparse() {
                        return Ok(placed);
                    }
                    let (segment, mapping) = fresh()?;
                    let slab = Slab::fresh(segment, mapping, false);
                    state.mapped.push(Mapped { mapping: Arc::downgrade(&slab.mapping), live: slab.live.clone() });
                    slab
                }
            };
            if let Some(mut full) = state.open.replace(next) {
                full.phase = match full.creating {
                    0 => {
                        placed.retired = Some(full.segment);
                        Phase::Retired
                    }
                    _ => Phase::Retiring,
                };
                state.full.push(full);
            }
            placed.dropped.extend(state.shed());
        }
        let slab = state.open.as_mut().expect("an open slab was just ensured");
        let offset = slab.used.next_multiple_of(align);
        placed.carved = Some(slab.hand_out(offset, len));
        Ok(placed)
    }

    /// Places a buffer of `len` bytes (over `SLAB_ITEM_MAX`, at most `WHOLE_SLAB_MAX`) at the
    /// start of a slab of its own: an idle one taken again (`take_whole_spare`), or a fresh one
    /// from `fresh` (given the bytes to make, `len` rounded up to a page). The slab counts as
    /// full at once: retired when its creation is answered (`placed`).
    pub fn carve_whole<E>(
        &self,
        len: usize,
        fresh: impl FnOnce(usize) -> Result<(u64, SharedMapping), E>,
    ) -> Result<Placed, E> {
        debug_assert!(len > SLAB_ITEM_MAX && len <= WHOLE_SLAB_MAX);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = state.shed();
        let mut slab = match state.take_whole_spare(len) {
            Some(spare) => {
                cloister_ipc::log::in_shim(|| {
                    tracing::trace!(segment = spare.segment, len, "slab of one buffer taken again")
                });
                spare
            }
            None => {
                let (segment, mapping) = fresh(len.next_multiple_of(4096))?;
                Slab::fresh(segment, mapping, true)
            }
        };
        slab.phase = Phase::Retiring;
        let carved = slab.hand_out(0, len);
        state.full.push(slab);
        Ok(Placed { carved: Some(carved), retired: None, dropped })
    }

    /// The `CreateBuffer` naming bytes of slab `segment` was answered; returns the slab when it
    /// is full and nothing in it is in flight any more (send `RetireSlab` now).
    pub fn placed(&self, segment: u64) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = state.open.as_mut().filter(|s| s.segment == segment) {
            open.creating = open.creating.saturating_sub(1);
            return None;
        }
        let slab = state.full.iter_mut().find(|s| s.segment == segment)?;
        slab.creating = slab.creating.saturating_sub(1);
        (slab.phase == Phase::Retiring && slab.creating == 0).then(|| {
            slab.phase = Phase::Retired;
            segment
        })
    }

    /// The worker says retired slab `segment` holds no buffer any more
    /// (`Notification::SlabIdle`). Anything else it says of a slab is ignored.
    pub fn idle(&self, segment: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slab) = state.full.iter_mut().find(|s| s.segment == segment && s.phase == Phase::Retired) {
            slab.phase = Phase::Idle;
        }
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

    /// `len` bytes at 128, which must be carved.
    fn carve(slabs: &Slabs, next: &mut u64, len: usize) -> (Carved, Option<u64>, Vec<u64>) {
        let p = slabs.carve(len, 128, || slab(next)).unwrap();
        (p.carved.expect("carved"), p.retired, p.dropped)
    }

    #[test]
    fn buffers_are_placed_aligned_one_after_the_other() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let (a, ..) = carve(&slabs, &mut next, 100);
        let (b, ..) = carve(&slabs, &mut next, 4096);
        let c = slabs.carve(1, 4096, || slab(&mut next)).unwrap().carved.unwrap();
        assert_eq!((a.segment, a.offset), (1, 0));
        assert_eq!((b.segment, b.offset), (1, 128));
        assert_eq!((c.segment, c.offset), (1, 8192));
        assert!(Arc::ptr_eq(&a.mapping, &c.mapping));
        assert_eq!(next, 1, "one slab for all three");
    }

    /// Fills the open slab (from `from` bytes used) with buffers of the largest size, each
    /// answered at once if `answered`.
    fn fill(slabs: &Slabs, next: &mut u64, from: usize, answered: bool) -> Vec<Carved> {
        (0..(SLAB_LEN - from) / SLAB_ITEM_MAX)
            .map(|_| {
                let (c, ..) = carve(slabs, next, SLAB_ITEM_MAX);
                if answered {
                    assert_eq!(slabs.placed(c.segment), None);
                }
                c
            })
            .collect()
    }

    #[test]
    fn a_full_slab_is_retired_once_nothing_in_it_is_in_flight() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let first = fill(&slabs, &mut next, 0, false);
        assert!(first.iter().all(|c| c.segment == 1));
        assert_eq!(first.last().unwrap().offset + SLAB_ITEM_MAX, SLAB_LEN, "filled to the byte");
        // Answers for all but one: the slab is still open, nothing to retire.
        for c in &first[1..] {
            assert_eq!(slabs.placed(c.segment), None);
        }
        // One byte more opens a second slab; the first waits for its last answer.
        let (second, retired, _) = carve(&slabs, &mut next, 1);
        assert_eq!((second.segment, second.offset, retired), (2, 0, None));
        assert_eq!(slabs.placed(1), Some(1), "its last answer retires it");
        assert_eq!(slabs.placed(1), None, "and only once");
        // A slab with nothing in flight is retired as it fills.
        assert_eq!(slabs.placed(2), None);
        for c in fill(&slabs, &mut next, 128, true) {
            assert_eq!(c.segment, 2);
        }
        let (third, retired, _) = carve(&slabs, &mut next, SLAB_ITEM_MAX);
        assert_eq!((third.segment, third.offset, retired), (3, 0, Some(2)));
    }

    #[test]
    fn a_failed_fresh_slab_leaves_the_open_one() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let first = fill(&slabs, &mut next, 0, false);
        assert!(slabs.carve(1, 128, || Err::<(u64, SharedMapping), ()>(())).is_err());
        for _ in &first {
            assert_eq!(slabs.placed(1), None, "still the open slab");
        }
        let (b, retired, _) = carve(&slabs, &mut next, 8);
        assert_eq!((b.segment, b.offset, retired), (2, 0, Some(1)));
    }

    #[test]
    fn an_idle_slab_is_carved_again_once_nothing_here_is_live_in_it() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let mut first = fill(&slabs, &mut next, 0, true);
        let (second, retired, _) = carve(&slabs, &mut next, SLAB_ITEM_MAX);
        assert_eq!((second.segment, retired, slabs.placed(2)), (2, Some(1), None));
        slabs.idle(2);
        slabs.idle(7);
        // The worker holds nothing in slab 1, but a buffer here still does: not carved yet.
        slabs.idle(1);
        let kept = first.pop().unwrap();
        first.clear();
        fill(&slabs, &mut next, SLAB_ITEM_MAX, true);
        let (third, retired, _) = carve(&slabs, &mut next, SLAB_ITEM_MAX);
        assert_eq!((third.segment, retired), (3, Some(2)), "a fresh slab; the open one (idle said early) retired");
        assert_eq!(slabs.placed(3), None);
        drop(kept);
        fill(&slabs, &mut next, SLAB_ITEM_MAX, true);
        let (again, retired, _) = carve(&slabs, &mut next, 100);
        assert_eq!((again.segment, again.offset, retired), (1, 0, Some(3)), "slab 1 from its start");
        assert!(Arc::ptr_eq(&again.mapping, &first_mapping(&slabs, 1)));
        assert_eq!(next, 3, "no fresh slab for it");
        // Slab 2 was idle too early (before its retirement): it waits for a real idle.
        slabs.idle(2);
        let (b, ..) = carve(&slabs, &mut next, 200);
        assert_eq!((b.segment, b.offset), (1, 128));
    }

    fn first_mapping(slabs: &Slabs, segment: u64) -> Arc<SharedMapping> {
        let state = slabs.state.lock().unwrap();
        let open = state.open.as_ref().filter(|s| s.segment == segment);
        open.or_else(|| state.full.iter().find(|s| s.segment == segment)).unwrap().mapping.clone()
    }

    #[test]
    fn idle_slabs_beyond_the_spares_are_dropped() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let slabs_made = SPARE_SLABS + 3;
        for _ in 0..slabs_made {
            fill(&slabs, &mut next, 0, true);
        }
        // Slabs 1..slabs_made are full and retired (the last is still open).
        let (_, retired, dropped) = carve(&slabs, &mut next, SLAB_ITEM_MAX);
        assert_eq!((retired, dropped), (Some(slabs_made as u64), vec![]));
        for segment in 1..=slabs_made as u64 {
            slabs.idle(segment);
        }
        fill(&slabs, &mut next, SLAB_ITEM_MAX, true);
        let (c, _, dropped) = carve(&slabs, &mut next, SLAB_ITEM_MAX);
        assert_eq!(c.segment, 1, "the oldest spare is carved again");
        assert_eq!(dropped, vec![2, 3], "and the spares beyond {SPARE_SLABS} are dropped, oldest first");
    }

    #[test]
    fn slabs_held_mostly_empty_by_long_lived_buffers_stop_being_made_until_they_empty_out() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let slabs_at_floor = SLAB_WASTE_FLOOR / SLAB_LEN;
        // Per slab, one buffer lives on (with its view of the slab) and fifteen are released:
        // a sixteenth of the slabs' memory is live.
        let mut kept = Vec::new();
        for _ in 0..slabs_at_floor {
            kept.push(fill(&slabs, &mut next, 0, true).pop().unwrap());
        }
        assert_eq!(next as usize, slabs_at_floor);
        let at_floor = slabs.carve(SLAB_ITEM_MAX, 128, || slab(&mut next)).unwrap();
        assert!(at_floor.carved.is_none(), "no fresh slab while mapped slabs are under a quarter live");
        assert_eq!(next as usize, slabs_at_floor, "and none was made");
        // Once the long-lived buffers go, and with them the slabs the worker never said idle
        // beyond the few kept waiting, slabs are made again.
        kept.clear();
        let again = slabs.carve(SLAB_ITEM_MAX, 128, || slab(&mut next)).unwrap();
        assert_eq!(again.dropped.len(), slabs_at_floor - WAITING_SLABS, "shed, the oldest first");
        assert_eq!(again.dropped[0], 1);
        assert_eq!(again.carved.expect("a fresh slab").segment as usize, slabs_at_floor + 1);
    }

    fn whole(next: &mut u64, bytes: usize) -> Result<(u64, SharedMapping), ()> {
        *next += 1;
        Ok((*next, SharedRegion::create("whole-test", bytes).map_err(|_| ())?.into_mapping()))
    }

    fn carve_whole(slabs: &Slabs, next: &mut u64, len: usize) -> (Carved, Vec<u64>) {
        let p = slabs.carve_whole(len, |bytes| whole(next, bytes)).unwrap();
        assert_eq!(p.retired, None, "retired once answered, not when carved");
        (p.carved.expect("carved"), p.dropped)
    }

    #[test]
    fn a_larger_buffers_slab_is_taken_again_once_the_driver_and_this_side_are_done_with_it() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let (a, _) = carve_whole(&slabs, &mut next, 1 << 20);
        assert_eq!((a.segment, a.offset, a.mapping.len()), (1, 0, 1 << 20));
        assert_eq!(slabs.placed(1), Some(1), "retired as its creation is answered");
        // The worker says it idle, but this side still has the buffer: a fresh slab.
        slabs.idle(1);
        let (b, _) = carve_whole(&slabs, &mut next, 1 << 20);
        assert_eq!(b.segment, 2);
        assert_eq!(slabs.placed(2), Some(2));
        // Gone here, but not yet said idle: not taken again either.
        drop(b);
        let (c, _) = carve_whole(&slabs, &mut next, (1 << 20) - 100);
        assert_eq!(c.segment, 3);
        assert_eq!(slabs.placed(3), Some(3));
        // Slab 1: idle and gone here: taken again, from its start, with its mapping.
        let mapping = a.mapping.clone();
        drop(a);
        let (d, _) = carve_whole(&slabs, &mut next, (1 << 20) - 4096);
        assert_eq!((d.segment, d.offset), (1, 0));
        assert!(Arc::ptr_eq(&d.mapping, &mapping));
        assert_eq!(slabs.placed(1), Some(1), "and retired again as its creation is answered");
        assert_eq!(next, 3);
    }

    #[test]
    fn a_slab_twice_the_size_or_more_is_not_taken_for_a_buffer() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let (a, _) = carve_whole(&slabs, &mut next, 4 << 20);
        assert_eq!(slabs.placed(1), Some(1));
        slabs.idle(1);
        drop(a);
        let (small, _) = carve_whole(&slabs, &mut next, (2 << 20) - 1);
        assert_eq!(small.segment, 2, "under half its size: a fresh slab");
        let (big, _) = carve_whole(&slabs, &mut next, 5 << 20);
        assert_eq!(big.segment, 3, "larger than it: a fresh slab");
        let (half, _) = carve_whole(&slabs, &mut next, 2 << 20);
        assert_eq!(half.segment, 1, "half its size: taken again");
    }

    #[test]
    fn idle_slabs_of_one_buffer_beyond_their_bytes_are_dropped_oldest_first() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let len = WHOLE_SLAB_MAX;
        let count = SPARE_WHOLE_BYTES / len + 2;
        let made: Vec<Carved> = (0..count).map(|_| carve_whole(&slabs, &mut next, len).0).collect();
        for c in &made {
            assert_eq!(slabs.placed(c.segment), Some(c.segment));
            slabs.idle(c.segment);
        }
        drop(made);
        // The next carving sheds the idle ones beyond the spare bytes, then takes the oldest kept.
        let (c, dropped) = carve_whole(&slabs, &mut next, len);
        assert_eq!(dropped, vec![1, 2], "the two oldest beyond {SPARE_WHOLE_BYTES} bytes");
        assert_eq!(c.segment, 3);
        assert_eq!(next as usize, count, "no fresh slab");
    }

    #[test]
    fn slabs_of_one_buffer_do_not_count_toward_small_slabs_sparseness() {
        let (slabs, mut next) = (Slabs::default(), 0);
        // Idle slabs of one buffer, nothing live in them: far past the floor in bytes.
        for _ in 0..SPARE_WHOLE_BYTES / WHOLE_SLAB_MAX {
            let (c, _) = carve_whole(&slabs, &mut next, WHOLE_SLAB_MAX);
            assert_eq!(slabs.placed(c.segment), Some(c.segment));
            slabs.idle(c.segment);
        }
        assert!(slabs.carve(100, 128, || slab(&mut next)).unwrap().carved.is_some(), "a small slab is still made");
    }

    #[test]
    fn slabs_full_of_live_buffers_are_made_past_the_floor() {
        let (slabs, mut next) = (Slabs::default(), 0);
        let live: Vec<Carved> =
            (0..SLAB_WASTE_FLOOR / SLAB_LEN + 2).flat_map(|_| fill(&slabs, &mut next, 0, true)).collect();
        assert_eq!(next as usize, SLAB_WASTE_FLOOR / SLAB_LEN + 2);
        // A quarter live is enough: leases of three buffers in four go.
        let quarter: Vec<Carved> = live.into_iter().step_by(4).collect();
        assert!(slabs.carve(SLAB_ITEM_MAX, 128, || slab(&mut next)).unwrap().carved.is_some());
        drop(quarter);
    }
}
