//! Pinned staging for discrete GPUs.
//!
//! Bulk data reaches the worker in shared memory (a lane's bulk area or a segment), and the
//! driver copies it to or from the device. A discrete GPU's driver copies pageable memory through
//! its own bounce buffers: on an H100 (driver 580) 9-15 GB/s, where page-locked memory goes at
//! the link's speed (55 GB/s). Creating a `CL_MEM_USE_HOST_PTR` buffer over host memory makes
//! NVIDIA's driver register (pin) those pages for the context, and its later transfers from or to
//! anywhere inside them take the fast path (measured: plain `clEnqueueWriteBuffer` from memfd
//! pages, 15 GB/s before, 55 GB/s after such a buffer exists). So the second transfer through a
//! shared region in a context pins the whole region there, once (see `seen_once`); the buffer is never used for
//! anything else and is released before the region is unmapped, the context released, or the
//! queue's handle forgotten.
//!
//! Host-unified devices (pocl) gain nothing and are left alone; `CLOISTER_STAGING=plain` turns
//! pinning off, `=pinned` forces it on every device (tests use that to run the path on pocl).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cloister_ipc::cl::*;
use cloister_ipc::fast_hash::{FastMap, FastSet};

/// Whether regions are pinned: on discrete devices only (the default), never, or always.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Plain,
    Pinned,
}

impl Mode {
    pub fn from_env() -> Mode {
        match cloister_ipc::settings::staging().as_str() {
            "plain" => Mode::Plain,
            "pinned" => Mode::Pinned,
            _ => Mode::Auto,
        }
    }
}

#[derive(Default)]
struct State {
    /// Queue handle -> the context to pin in, or None when its device gains nothing.
    queues: FastMap<usize, Option<usize>>,
    /// (context, region base) -> the buffer that keeps the region pinned there (0: the driver
    /// refused, do not ask again).
    pinned: FastMap<(usize, usize), usize>,
    /// Regions used once in a context and not pinned yet: pinning costs about as much as one
    /// pageable copy (the driver locks every page), so only a region used again is pinned (a
    /// lane's bulk area and pooled segments are; a one-off segment for a huge non-blocking
    /// transfer is not, and would cost more pinned than it saves).
    seen_once: FastSet<(usize, usize)>,
    /// Context -> the queue of its own a new buffer's contents are uploaded on (`upload_queue`),
    /// or None when the context's device gains nothing.
    uploads: FastMap<usize, Option<usize>>,
}

/// The regions pinned so far, per context.
pub struct Staging {
    mode: Mode,
    /// `CLOISTER_DEBUG`: say on stderr what was pinned (tests look for it).
    debug: bool,
    state: Mutex<State>,
    /// Moves whenever a pinning buffer or a queue's context is forgotten: a `PinMemo` taken
    /// before says nothing any more.
    generation: AtomicU64,
}

/// A lane's memory of `Staging::pin`'s lasting answers (a region pinned, the driver's refusal,
/// a queue whose device gains nothing), so that a stream of transfers through the same regions
/// (the lane's bulk area, the pooled segments it takes turns with) asks the shared state once
/// per region, not once per transfer (a lock and three hash lookups: a third of the worker's
/// own work per 4 KiB write). Valid while the staging's generation stays where it was.
#[derive(Debug, Default)]
pub struct PinMemo {
    generation: u64,
    /// Answers about a queue, whatever the region.
    queues: FastMap<usize, bool>,
    /// Answers about a region (by its base) on a queue.
    regions: FastMap<(usize, usize), bool>,
}

/// The most region answers a `PinMemo` keeps (it starts again when full): a lane's bulk area
/// and more than a segment pool's worth (63 transfers in flight take as many segments).
const MEMO_ANSWERS: usize = 256;

/// How long `pin`'s answer holds (until the generation moves).
enum Lasting {
    /// Only this time (a region seen once, not pinned yet).
    Once,
    /// For this region on this queue.
    Region,
    /// For every region on this queue.
    Queue,
}

impl Default for Staging {
    fn default() -> Self {
        Self::with_mode(Mode::from_env())
    }
}

impl Staging {
    fn with_mode(mode: Mode) -> Self {
        let debug = cloister_ipc::settings::debug();
        Self { mode, debug, state: Mutex::default(), generation: AtomicU64::new(0) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure the shared region `[base, base + len)` is pinned in `queue`'s context before a
    /// transfer through it, and says whether it is. Failures only cost speed: the transfer runs
    /// from pageable memory.
    pub fn pin(&self, queue: usize, base: *mut u8, len: usize) -> bool {
        self.pin_lasting(queue, base, len).0
    }

    /// `pin`, answered from `memo` where it holds a lasting answer for `queue` and `base`, and
    /// remembered there when the answer lasts.
    pub fn pin_remembered(&self, memo: &mut PinMemo, queue: usize, base: *mut u8, len: usize) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        if memo.generation != generation {
            *memo = PinMemo { generation, ..PinMemo::default() };
        }
        let key = (queue, base as usize);
        if let Some(&pinned) = memo.queues.get(&queue).or_else(|| memo.regions.get(&key)) {
            return pinned;
        }
        let (pinned, lasting) = self.pin_lasting(queue, base, len);
        match lasting {
            Lasting::Once => {}
            Lasting::Queue => {
                memo.queues.insert(queue, pinned);
            }
            Lasting::Region => {
                if memo.regions.len() >= MEMO_ANSWERS {
                    memo.regions.clear();
                }
                memo.regions.insert(key, pinned);
            }
        }
        pinned
    }

    fn pin_lasting(&self, queue: usize, base: *mut u8, len: usize) -> (bool, Lasting) {
        if self.mode == Mode::Plain {
            return (false, Lasting::Queue);
        }
        if len == 0 {
            return (false, Lasting::Once);
        }
        let mut state = self.state();
        let Some(ctx) = self.context_for(&mut state, queue) else { return (false, Lasting::Queue) };
        let key = (ctx, base as usize);
        if !state.pinned.contains_key(&key) && state.seen_once.insert(key) {
            return (false, Lasting::Once);
        }
        state.seen_once.remove(&key);
        let debug = self.debug;
        let mem = *state.pinned.entry((ctx, base as usize)).or_insert_with(|| {
            let mut rc = CL_SUCCESS;
            // SAFETY: `ctx` is the live context of a live queue (asked of the driver); `base`
            // holds `len` bytes of shared memory that stays mapped until `forget_region` has
            // released this buffer.
            let mem = unsafe {
                match crate::driver::dispatch(ctx).clCreateBuffer {
                    Some(f) => f(ctx as _, CL_MEM_USE_HOST_PTR | CL_MEM_READ_WRITE, len, base.cast(), &mut rc),
                    None => null_mut(),
                }
            };
            if debug {
                eprintln!("cloister-worker: staging: pinning {len} bytes of shared memory: status {rc}");
            }
            if rc == CL_SUCCESS {
                mem as usize
            } else {
                0
            }
        });
        (mem != 0, Lasting::Region)
    }

    /// `CLOISTER_DEBUG`: whether to say on stderr what was staged how (tests look for it).
    pub fn debug(&self) -> bool {
        self.debug
    }

    /// Whether transfers on `queue` go through pinned shared memory (a discrete device, or
    /// `CLOISTER_STAGING=pinned`): then a map is served by a read into its segment and an unmap
    /// by a write from it, DMA both ways, with no driver mapping and no copy in between.
    pub fn pins_for(&self, queue: usize) -> bool {
        if self.mode == Mode::Plain {
            return false;
        }
        let mut state = self.state();
        self.context_for(&mut state, queue).is_some()
    }

    /// The context `queue`'s transfers are pinned in, or `None` when its device gains nothing;
    /// asked of the driver once per queue.
    fn context_for(&self, state: &mut State, queue: usize) -> Option<usize> {
        let mode = self.mode;
        *state.queues.entry(queue).or_insert_with(|| pin_context(queue, mode))
    }

    /// A queue of the worker's own in `ctx`, on its first device, for writing a new buffer's
    /// contents from pinned shared memory (`CreateBuffer`'s upload), when that device gains
    /// from pinning; made once per context, released by `forget_context`. A driver's copy of
    /// `CL_MEM_COPY_HOST_PTR` contents out of shared memory is a second copy of what the
    /// application just copied there (on the H200 the two copies together took 2.8 ms for 16 MiB
    /// against 1.6 directly); a write from pinned pages is the device's own DMA.
    pub fn upload_queue(&self, ctx: usize) -> Option<usize> {
        if self.mode == Mode::Plain {
            return None;
        }
        let mut state = self.state();
        if let Some(&queue) = state.uploads.get(&ctx) {
            return queue;
        }
        let queue = own_queue(ctx, self.mode);
        state.uploads.insert(ctx, queue);
        if let Some(q) = queue {
            // Pinned in its own context, as any queue's transfers are.
            state.queues.insert(q, Some(ctx));
        }
        queue
    }

    /// Before `base`'s region is unmapped: releases its buffers in every context.
    pub fn forget_region(&self, base: *mut u8) {
        let mut state = self.state();
        state.seen_once.retain(|(_, b)| *b != base as usize);
        state.pinned.retain(|(_, b), mem| *b != base as usize || release(*mem));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Before a context's last release: its pinning buffers would keep it alive.
    pub fn forget_context(&self, ctx: usize) {
        let mut state = self.state();
        if let Some(Some(queue)) = state.uploads.remove(&ctx) {
            state.queues.remove(&queue);
            // SAFETY: the live queue `upload_queue` made, released once.
            unsafe {
                if let Some(f) = crate::driver::dispatch(queue).clReleaseCommandQueue {
                    f(queue as _);
                }
            }
        }
        state.seen_once.retain(|(c, _)| *c != ctx);
        state.pinned.retain(|(c, _), mem| *c != ctx || release(*mem));
        state.queues.retain(|_, c| *c != Some(ctx));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// A released queue's handle may come back for another context.
    pub fn forget_queue(&self, queue: usize) {
        self.state().queues.remove(&queue);
        self.generation.fetch_add(1, Ordering::Release);
    }

    #[cfg(test)]
    fn pinned_count(&self) -> usize {
        self.state().pinned.values().filter(|m| **m != 0).count()
    }
}

/// Releases a pinning buffer (0: none was made); false, for `retain` to drop its entry.
fn release(mem: usize) -> bool {
    if mem != 0 {
        // SAFETY: `mem` is a live buffer this module created and releases once.
        unsafe {
            if let Some(f) = crate::driver::dispatch(mem).clReleaseMemObject {
                f(mem as _);
            }
        }
    }
    false
}

/// The context to pin in for `queue`: its own, when the queue's device is not host-unified (or
/// the mode forces pinning).
fn pin_context(queue: usize, mode: Mode) -> Option<usize> {
    let ctx: usize = queue_info(queue, CL_QUEUE_CONTEXT)?;
    if mode == Mode::Pinned {
        return Some(ctx);
    }
    let device: usize = queue_info(queue, CL_QUEUE_DEVICE)?;
    gains_from_pinning(device, mode).then_some(ctx)
}

/// Whether transfers on `device` gain from pinned memory: a device that does not share the
/// host's memory (or every device, `CLOISTER_STAGING=pinned`).
fn gains_from_pinning(device: usize, mode: Mode) -> bool {
    if mode == Mode::Pinned {
        return true;
    }
    // SAFETY: `device` is a live driver handle.
    let Some(info) = (unsafe { crate::driver::dispatch(device) }).clGetDeviceInfo else { return false };
    let mut unified: cl_bool = CL_TRUE;
    // SAFETY: `device` is a live device; the value is a cl_bool.
    let rc = unsafe {
        info(
            device as _,
            CL_DEVICE_HOST_UNIFIED_MEMORY,
            std::mem::size_of::<cl_bool>(),
            (&mut unified as *mut cl_bool).cast::<c_void>(),
            null_mut(),
        )
    };
    rc == CL_SUCCESS && unified == CL_FALSE
}

/// `upload_queue`'s queue for `ctx`: an in-order queue on its first device, when that device
/// gains from pinning (`gains_from_pinning`).
fn own_queue(ctx: usize, mode: Mode) -> Option<usize> {
    // SAFETY: `ctx` is a live driver handle.
    let f = unsafe { crate::driver::dispatch(ctx) };
    let mut bytes = 0usize;
    // SAFETY: `ctx` is a live context; a size query writes one size_t.
    let rc = unsafe { f.clGetContextInfo?(ctx as _, CL_CONTEXT_DEVICES, 0, null_mut(), &mut bytes) };
    let count = bytes / std::mem::size_of::<usize>();
    if rc != CL_SUCCESS || count == 0 || count > 4096 {
        return None;
    }
    let mut devices = vec![0usize; count];
    // SAFETY: `devices` holds `count` handles, the size the driver gave.
    let rc = unsafe {
        f.clGetContextInfo?(ctx as _, CL_CONTEXT_DEVICES, bytes, devices.as_mut_ptr().cast::<c_void>(), null_mut())
    };
    let device = devices[0];
    if rc != CL_SUCCESS || device == 0 || !gains_from_pinning(device, mode) {
        return None;
    }
    let mut rc = CL_SUCCESS;
    // SAFETY: a live context and one of its devices; no properties.
    let queue = unsafe { f.clCreateCommandQueue?(ctx as _, device as _, 0, &mut rc) };
    (rc == CL_SUCCESS && !queue.is_null()).then_some(queue as usize)
}

fn queue_info(queue: usize, param: cl_uint) -> Option<usize> {
    let mut v: usize = 0;
    // SAFETY: `queue` is a live queue handle; both params are handle-sized.
    let rc = unsafe {
        crate::driver::dispatch(queue).clGetCommandQueueInfo?(
            queue as _,
            param,
            std::mem::size_of::<usize>(),
            (&mut v as *mut usize).cast::<c_void>(),
            null_mut(),
        )
    };
    (rc == CL_SUCCESS && v != 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_mode_touches_no_driver() {
        // A queue handle that is not one: plain mode must not look at it.
        let s = Staging::with_mode(Mode::Plain);
        s.pin(0x10, 0x1000 as *mut u8, 4096);
        assert_eq!(s.pinned_count(), 0);
        // Nor make a queue of its own in a context that is not one.
        assert_eq!(s.upload_queue(0x20), None);
        s.forget_region(0x1000 as *mut u8);
        s.forget_context(1);
    }

    /// A remembered answer holds for its queue (and region, where it is about one) until a
    /// region, context or queue is forgotten.
    #[test]
    fn remembered_answers_hold_until_something_is_forgotten() {
        let s = Staging::with_mode(Mode::Plain);
        let mut memo = PinMemo::default();
        assert!(!s.pin_remembered(&mut memo, 0x10, 0x1000 as *mut u8, 4096));
        assert_eq!(memo.queues.get(&0x10), Some(&false), "plain: for the queue, any region");
        // An answer "pinned" is believed for its region and queue only.
        let pinned = |generation| PinMemo {
            generation,
            regions: [((0x10, 0x2000), true)].into_iter().collect(),
            ..PinMemo::default()
        };
        memo = pinned(0);
        assert!(s.pin_remembered(&mut memo, 0x10, 0x2000 as *mut u8, 4096));
        assert!(!s.pin_remembered(&mut memo, 0x10, 0x3000 as *mut u8, 4096), "another region is asked");
        memo = pinned(0);
        assert!(!s.pin_remembered(&mut memo, 0x11, 0x2000 as *mut u8, 4096), "another queue is asked");
        let forgets: [&dyn Fn(&Staging); 3] =
            [&|s| s.forget_region(0x2000 as *mut u8), &|s| s.forget_context(7), &|s| s.forget_queue(0x10)];
        for forget in forgets {
            memo = pinned(s.generation.load(Ordering::Acquire));
            forget(&s);
            assert!(!s.pin_remembered(&mut memo, 0x10, 0x2000 as *mut u8, 4096), "a forgotten answer is asked again");
        }
    }
}
