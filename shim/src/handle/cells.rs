//! Where handles live: cells of one range of address space, reserved at the first handle and
//! never given back. Whether a word is one of our handles is then an address check, and a cell
//! can be read without the registry's lock or this thread's `RECENT`: `clSetKernelArg`'s loop
//! case reads the kernel and the memory object it is given from their cells (`kernel`,
//! `object`). `RECENT` is a thread-local, which in a shared library costs a call into the
//! dynamic loader (`__tls_get_addr`) and a reference-count check on each call.
//!
//! A cell mirrors what the registry says of its handle, for the kinds that loop case uses
//! (kernels, memory objects, samplers), and is written only under the registry's write lock
//! (`publish`, `unpublish`). A reader may see a cell change while it reads (a release or a
//! worker's recovery in another thread, as racy as that use is in the application): what it
//! reads is then stale, never freed. A cell keeps every argument record it pointed at until
//! the cell is used again, after the quarantine (`free`), as the quarantine keeps the cell
//! itself for the ICD loader's read of a released handle.
//!
//! Where the range cannot be reserved or is full, a handle is a cell on the heap, which the
//! loop case does not read (`cell` says no): such handles take the registry's way.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cloister_ipc::dispatch::IcdDispatch;

use super::{Kind, ObjData, Object};
use crate::kernel_args::KernelArgs;

/// The address space reserved for cells: a million handles live or in the quarantine at once.
/// Pages are backed only once a cell on them is used.
const RESERVED: usize = 64 << 20;

/// What a cell stands for now (`Fast::tag`).
const NONE: u8 = 0;
const KERNEL: u8 = 1;
const MEM: u8 = 2;
const SAMPLER: u8 = 3;

/// One handle: the dispatch table's address (cl_khr_icd: the ICD loader reads it), then what
/// the loop case reads. A cache line each: no two handles share one.
#[repr(C, align(64))]
pub struct Cell {
    dispatch: *const IcdDispatch,
    fast: Fast,
}

// SAFETY: a cell is plain memory: its dispatch pointer is written once before the handle is
// handed out, and everything else is atomic.
unsafe impl Send for Cell {}
// SAFETY: as above.
unsafe impl Sync for Cell {}

/// What the registry says of a handle's object, for the loop case.
#[derive(Default)]
struct Fast {
    tag: AtomicU8,
    num_args: AtomicU32,
    id: AtomicU64,
    /// The object's worker connection's address: compared, never followed.
    conn: AtomicUsize,
    /// A kernel's argument record: a reference the cell owns (`Arc::into_raw`).
    args: AtomicPtr<KernelArgs>,
}

/// The reserved range: `LEN` is stored after `BASE` and read before it, so a reader never sees
/// a length with another base; 0 until reserved, and where it could not be.
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
struct Arena {
    tried: bool,
    /// The next never-used cell's offset.
    next: usize,
    /// Cells back from the quarantine.
    free: Vec<usize>,
    /// Argument records a cell pointed at before its object was rebuilt (`publish`), with the
    /// cell: a reader may still be writing into them; dropped when the cell is used again.
    replaced: Vec<(usize, Arc<KernelArgs>)>,
}

fn arena() -> std::sync::MutexGuard<'static, Arena> {
    static ARENA: Mutex<Arena> = Mutex::new(Arena { tried: false, next: 0, free: Vec::new(), replaced: Vec::new() });
    ARENA.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cell at `h`, if `h` is a cell of the reserved range (aligned to one): memory we own,
/// whatever the application passed.
#[inline(always)]
fn cell(h: usize) -> Option<&'static Cell> {
    let len = LEN.load(Ordering::Acquire);
    let offset = h.wrapping_sub(BASE.load(Ordering::Relaxed));
    if offset < len && offset.is_multiple_of(std::mem::size_of::<Cell>()) {
        // SAFETY: the range is reserved read-write for the process's life and never unmapped;
        // a cell there is zeroed memory (never used: its tag says `NONE`) or one `alloc` wrote.
        Some(unsafe { &*(h as *const Cell) })
    } else {
        None
    }
}

/// A new handle whose first word is `dispatch`, its cell saying nothing yet.
pub fn alloc(dispatch: *const IcdDispatch) -> usize {
    let mut a = arena();
    if !a.tried {
        a.tried = true;
        reserve();
    }
    let at = a.free.pop().or_else(|| {
        let offset = a.next;
        (offset < LEN.load(Ordering::Acquire)).then(|| {
            a.next += std::mem::size_of::<Cell>();
            BASE.load(Ordering::Relaxed) + offset
        })
    });
    drop(a);
    match at {
        Some(h) => {
            // SAFETY: `h` is a cell of the reserved range that no live handle uses (never used,
            // or back from the quarantine, where `free` reset its fast part); the dispatch
            // pointer is the one plain field, written before the handle is handed out.
            unsafe { ptr::write(ptr::addr_of_mut!((*(h as *mut Cell)).dispatch), dispatch) };
            h
        }
        None => Box::into_raw(Box::new(Cell { dispatch, fast: Fast::default() })) as usize,
    }
}

/// Reserves the range (once, under the arena's lock).
fn reserve() {
    // SAFETY: a fresh anonymous mapping the kernel places; nothing else is touched.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            RESERVED,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        BASE.store(p as usize, Ordering::Relaxed);
        LEN.store(RESERVED, Ordering::Release);
    }
}

/// Gives back a handle's cell, out of the quarantine: no registry entry leads to it.
///
/// # Safety
/// `h` came from `alloc` and is given back once.
pub unsafe fn free(h: usize) {
    let Some(c) = cell(h) else {
        // SAFETY: outside the range, `alloc` made it with Box::into_raw (the caller's contract).
        drop(unsafe { Box::from_raw(h as *mut Cell) });
        return;
    };
    c.fast.tag.store(NONE, Ordering::Release);
    let args = c.fast.args.swap(ptr::null_mut(), Ordering::AcqRel);
    if !args.is_null() {
        // SAFETY: the cell's own reference, from Arc::into_raw in `publish`, taken once.
        drop(unsafe { Arc::from_raw(args) });
    }
    let mut a = arena();
    a.replaced.retain(|(at, _)| *at != h);
    a.free.push(h);
}

/// Makes `h`'s cell say what the registry now holds under it: `obj`. Under the registry's
/// write lock.
pub fn publish(h: usize, obj: &Object) {
    let tag = match obj.kind {
        Kind::Kernel => KERNEL,
        Kind::Mem => MEM,
        Kind::Sampler => SAMPLER,
        _ => return unpublish(h),
    };
    let kernel = match &obj.data {
        ObjData::Kernel { num_args, args, .. } => Some((*num_args, args)),
        _ => None,
    };
    publish_parts(h, tag, obj.id, Arc::as_ptr(&obj.conn) as usize, kernel);
}

/// `publish`, of the parts the cell keeps.
fn publish_parts(h: usize, tag: u8, id: u64, conn: usize, kernel: Option<(u32, &Arc<KernelArgs>)>) {
    let Some(c) = cell(h) else { return };
    let f = &c.fast;
    f.tag.store(NONE, Ordering::Release);
    f.id.store(id, Ordering::Relaxed);
    f.conn.store(conn, Ordering::Relaxed);
    if let Some((num_args, args)) = kernel {
        f.num_args.store(num_args, Ordering::Relaxed);
        if !ptr::eq(f.args.load(Ordering::Acquire), Arc::as_ptr(args)) {
            let old = f.args.swap(Arc::into_raw(args.clone()).cast_mut(), Ordering::AcqRel);
            if !old.is_null() {
                // SAFETY: the cell's own reference to the record it pointed at, taken once.
                let old = unsafe { Arc::from_raw(old) };
                arena().replaced.push((h, old));
            }
        }
    }
    f.tag.store(tag, Ordering::Release);
}

/// Makes `h`'s cell say nothing: the registry holds no object under it any more. Under the
/// registry's write lock.
pub fn unpublish(h: usize) {
    if let Some(c) = cell(h) {
        c.fast.tag.store(NONE, Ordering::Release);
    }
}

/// A live kernel as its cell says.
pub struct KernelCell {
    pub args: &'static KernelArgs,
    pub num_args: u32,
    /// Its worker connection's address (`ObjectCell::conn`).
    pub conn: usize,
}

/// The live kernel behind `h`, if `h` is a cell that says so.
#[inline(always)]
pub fn kernel(h: usize) -> Option<KernelCell> {
    let f = &cell(h)?.fast;
    if f.tag.load(Ordering::Acquire) != KERNEL {
        return None;
    }
    let args = f.args.load(Ordering::Acquire);
    if args.is_null() {
        return None;
    }
    // SAFETY: the cell keeps a reference to every record it pointed at until it is used again,
    // after the quarantine (`free`, `publish`).
    let args = unsafe { &*args };
    Some(KernelCell { args, num_args: f.num_args.load(Ordering::Relaxed), conn: f.conn.load(Ordering::Relaxed) })
}

/// A live memory object or sampler as its cell says.
pub struct ObjectCell {
    pub id: u64,
    pub sampler: bool,
    pub conn: usize,
}

/// What the cell at `h` says of a kernel argument's value: `Err(())` if `h` is no cell;
/// `Ok(None)` if it is one, but not of a live memory object or sampler.
#[inline(always)]
pub fn object(h: usize) -> Result<Option<ObjectCell>, ()> {
    let f = &cell(h).ok_or(())?.fast;
    let tag = f.tag.load(Ordering::Acquire);
    if tag != MEM && tag != SAMPLER {
        return Ok(None);
    }
    Ok(Some(ObjectCell {
        id: f.id.load(Ordering::Relaxed),
        sampler: tag == SAMPLER,
        conn: f.conn.load(Ordering::Relaxed),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell of the reserved range, for a test of its own.
    fn new_cell() -> usize {
        let h = alloc(ptr::null());
        assert!(cell(h).is_some(), "the range could not be reserved here");
        h
    }

    #[test]
    fn a_cell_is_found_by_its_address_alone_and_no_other_word_is_one() {
        let h = new_cell();
        let args = Arc::new(KernelArgs::new(2));
        assert!(kernel(h).is_none(), "says nothing before it is published");
        assert_eq!(object(h).map(|o| o.is_some()), Ok(false));
        publish_parts(h, KERNEL, 7, 0x1000, Some((2, &args)));
        let k = kernel(h).expect("a published kernel");
        assert!(ptr::eq(k.args, &*args));
        assert_eq!((k.num_args, k.conn), (2, 0x1000));
        assert_eq!(object(h).map(|o| o.is_some()), Ok(false), "a kernel is no argument object");
        // Inside a cell, or outside the range: no cell, whatever the word.
        for word in [h + 1, h + 8, h + 63, h - 1, h - 8, 0, 8, usize::MAX, usize::MAX - 63] {
            assert!(kernel(word).is_none(), "{word:#x}");
            assert!(object(word).is_err(), "{word:#x}");
        }
        for word in [BASE.load(Ordering::Relaxed) - 64, BASE.load(Ordering::Relaxed) + RESERVED] {
            assert!(object(word).is_err(), "{word:#x}: the cells on either side of the range");
        }
        unpublish(h);
        assert!(kernel(h).is_none(), "says nothing once unpublished");
        // SAFETY: made by `alloc` above, given back once.
        unsafe { free(h) };
    }

    #[test]
    fn memory_objects_and_samplers_say_their_id_and_worker() {
        let h = new_cell();
        publish_parts(h, MEM, 41, 0x2000, None);
        let o = object(h).unwrap().expect("a published buffer");
        assert_eq!((o.id, o.sampler, o.conn), (41, false, 0x2000));
        assert!(kernel(h).is_none());
        publish_parts(h, SAMPLER, 42, 0x3000, None);
        let o = object(h).unwrap().expect("a published sampler");
        assert_eq!((o.id, o.sampler, o.conn), (42, true, 0x3000));
        unpublish(h);
        assert_eq!(object(h).map(|o| o.is_some()), Ok(false));
        // SAFETY: made by `alloc` above, given back once.
        unsafe { free(h) };
    }

    #[test]
    fn a_cell_keeps_every_record_it_pointed_at_until_it_is_given_back() {
        let h = new_cell();
        let (first, second) = (Arc::new(KernelArgs::new(1)), Arc::new(KernelArgs::new(1)));
        publish_parts(h, KERNEL, 1, 0x1000, Some((1, &first)));
        // The same record again (a rebind of the same object) takes no second reference.
        publish_parts(h, KERNEL, 1, 0x1000, Some((1, &first)));
        assert_eq!(Arc::strong_count(&first), 2);
        // A worker's recovery rebuilt the kernel: its new record, the old one kept.
        publish_parts(h, KERNEL, 1, 0x4000, Some((1, &second)));
        assert!(ptr::eq(kernel(h).unwrap().args, &*second));
        assert_eq!((Arc::strong_count(&first), Arc::strong_count(&second)), (2, 2));
        unpublish(h);
        assert_eq!((Arc::strong_count(&first), Arc::strong_count(&second)), (2, 2), "kept after the release");
        // SAFETY: made by `alloc` above, given back once.
        unsafe { free(h) };
        assert_eq!((Arc::strong_count(&first), Arc::strong_count(&second)), (1, 1), "let go with the cell");
    }
}
