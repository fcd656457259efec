//! A kernel's recorded arguments: what `clSetKernelArg` set, shipped with the next enqueue.
//!
//! Applications set arguments before every enqueue, often in their tightest loops, against a
//! driver call of a few nanoseconds. So the loop case (a value of the shape the driver accepted
//! at that index before) takes no lock for the common values: a scalar of at most 8 bytes, or
//! a memory object or sampler, at one of the first `CELLS` indices lives in a cell of atomics
//! that the loop case writes with plain stores. The lock it replaced was one locked
//! instruction per call, measured at 60% of the caged call's time on an EPYC VM. Other values
//! (`__local` sizes, larger structs, later indices) and the shapes the driver has accepted sit
//! in a table behind a `BriefLock`.
//!
//! OpenCL does not let two threads set one kernel's arguments at once, nor set them while
//! another thread enqueues that kernel. An application that does gets some mix of its values,
//! as a driver would give it, never a torn structure: the cells are atomics, the table is locked,
//! and every value in a cell was recorded in its shape under the table's lock.
//!
//! Layer: a leaf (the wire's `ArgValue`, `brief_lock`, `fast_hash`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

use cloister_ipc::fast_hash::FastSet;
use cloister_ipc::{ArgBytes, ArgValue, ObjectId};

use crate::brief_lock::BriefLock;

/// The indices that have a cell. Kernels rarely have more arguments; a later index goes to the
/// table, with its lock. The cells are sized from the kernel's argument count, at most this.
const CELLS: usize = 32;

/// A cell's shape: which value it holds, so the loop case can tell a value of the same shape
/// with one comparison. `EMPTY`: none (the index's value, if any, is in the table).
const EMPTY: u8 = 0;
/// `BYTES | n`: `n` (1 to 8) bytes, packed into the value's low-addressed bytes.
const BYTES: u8 = 0x10;
const MEM: u8 = 0x20;
const SAMPLER: u8 = 0x30;
/// A pointer-sized zero: a NULL buffer, or a value of 0. A shape of its own: the driver taking
/// NULL at an index says nothing of a non-zero value there, which a buffer argument refuses
/// (it takes no address but an object's, and the worker checks that: `object_arg`).
const NULL_WORD: u8 = 0x40;

/// Whether `b` is a pointer-sized zero (`NULL_WORD`).
#[inline(always)]
fn is_null_word(b: &[u8]) -> bool {
    b.len() == std::mem::size_of::<usize>() && pack(b) == 0
}

/// An argument as `clSetKernelArg` received it, before anything is allocated for it.
pub enum Incoming<'a> {
    /// `arg_value == NULL`: a `__local` buffer of this many bytes.
    Local(u64),
    /// One of our memory objects or samplers, of the kernel's worker: its id, and whether it
    /// is a sampler.
    Object {
        id: ObjectId,
        sampler: bool,
    },
    Bytes(&'a [u8]),
}

impl Incoming<'_> {
    /// What the driver's checks depend on besides the index and the size: the kind of value.
    fn shape_kind(&self) -> u8 {
        match self {
            Incoming::Local(_) => 0,
            Incoming::Bytes(b) if is_null_word(b) => 4,
            Incoming::Bytes(_) => 1,
            Incoming::Object { sampler: false, .. } => 2,
            Incoming::Object { sampler: true, .. } => 3,
        }
    }

    pub fn to_value(&self) -> ArgValue {
        match *self {
            Incoming::Local(n) => ArgValue::Local(n),
            Incoming::Object { id, .. } => ArgValue::Object(id),
            Incoming::Bytes(b) => ArgValue::Bytes(ArgBytes::from(b)),
        }
    }

    /// The cell shape and value of a value a cell can hold.
    #[inline(always)]
    fn in_cell(&self) -> Option<(u8, u64)> {
        match *self {
            Incoming::Bytes(b) if is_null_word(b) => Some((NULL_WORD, 0)),
            Incoming::Bytes(b) if (1..=8).contains(&b.len()) => Some((BYTES | b.len() as u8, pack(b))),
            Incoming::Object { id, sampler } => Some((if sampler { SAMPLER } else { MEM }, id)),
            _ => None,
        }
    }

    /// Records the value in `slot` if `slot` (a recorded value, which the driver accepted) has
    /// this value's shape, the same size of bytes, the same `__local` size or the same object,
    /// reusing its storage: whether the value changed. `None`: a new shape, not recorded.
    #[inline]
    fn update(&self, slot: Option<&mut ArgValue>) -> Option<bool> {
        match (self, slot?) {
            (Incoming::Bytes(new), ArgValue::Bytes(old))
                if old.len() == new.len() && is_null_word(old) == is_null_word(new) =>
            {
                Some(overwrite(old, new))
            }
            (Incoming::Local(n), ArgValue::Local(old)) if old == n => Some(false),
            (Incoming::Object { id, .. }, ArgValue::Object(old)) if old == id => Some(false),
            _ => None,
        }
    }
}

/// Up to 8 bytes as one word, in their order in memory (`unpack` gives them back). The common
/// sizes are one load of their own width each. A copy of a run-time length becomes a `memcpy`
/// call whose narrow stores the word's load then waits on (measured on the H100 host: 30% of the
/// caged `clSetKernelArg`'s samples on that load), and a word assembled from an array of bytes
/// compiles to one load, shift and or per byte.
#[inline(always)]
fn pack(b: &[u8]) -> u64 {
    /// `v`, `width` bytes wide, placed where its bytes lie in a word read from the same memory.
    #[inline(always)]
    fn at_start(v: u64, width: u32) -> u64 {
        if cfg!(target_endian = "big") {
            v << (64 - 8 * width)
        } else {
            v
        }
    }
    if let Ok(w) = <[u8; 8]>::try_from(b) {
        u64::from_ne_bytes(w)
    } else if let Ok(w) = <[u8; 4]>::try_from(b) {
        at_start(u64::from(u32::from_ne_bytes(w)), 4)
    } else if let Ok(w) = <[u8; 2]>::try_from(b) {
        at_start(u64::from(u16::from_ne_bytes(w)), 2)
    } else {
        let mut w = [0u8; 8];
        for (to, from) in w.iter_mut().zip(b) {
            *to = *from;
        }
        u64::from_ne_bytes(w)
    }
}

fn unpack(shape: u8, value: u64) -> ArgValue {
    match shape & 0xf0 {
        BYTES => ArgValue::Bytes(ArgBytes::from(&value.to_ne_bytes()[..usize::from(shape & 0x0f)])),
        NULL_WORD => ArgValue::Bytes(ArgBytes::from(&[0u8; std::mem::size_of::<usize>()][..])),
        _ => ArgValue::Object(value),
    }
}

/// Copies `new` over `old` (of the same length): whether anything changed. The common sizes are
/// one load and store each; arguments are a few bytes, where a memcmp and a memcpy call each
/// cost more than the comparison.
#[inline]
fn overwrite(old: &mut [u8], new: &[u8]) -> bool {
    if let (Ok(o), Ok(n)) = (<&mut [u8; 4]>::try_from(&mut *old), <&[u8; 4]>::try_from(new)) {
        return std::mem::replace(o, *n) != *n;
    }
    if let (Ok(o), Ok(n)) = (<&mut [u8; 8]>::try_from(&mut *old), <&[u8; 8]>::try_from(new)) {
        return std::mem::replace(o, *n) != *n;
    }
    let mut changed = false;
    for (o, n) in old.iter_mut().zip(new.iter()) {
        changed |= *o != *n;
        *o = *n;
    }
    changed
}

/// One index's value when it fits a word. Written by the loop case without a lock; its shape
/// is changed only under the table's lock.
#[derive(Default)]
struct ArgCell {
    shape: AtomicU8,
    /// Changed since it was last shipped.
    dirty: AtomicBool,
    value: AtomicU64,
}

impl ArgCell {
    fn get(&self) -> Option<ArgValue> {
        match self.shape.load(Relaxed) {
            EMPTY => None,
            shape => Some(unpack(shape, self.value.load(Relaxed))),
        }
    }

    fn is_set(&self) -> bool {
        self.shape.load(Relaxed) != EMPTY
    }
}

/// The values that have no cell, and what the driver has accepted.
#[derive(Default, Clone)]
struct ArgTable {
    /// By index; `None`: not set, or in its cell.
    values: Vec<Option<ArgValue>>,
    /// Indices of `values` changed since they were last shipped.
    dirty: Vec<u32>,
    /// The argument shapes (index, size, `Incoming::shape_kind`) the driver has accepted: a
    /// value of a known shape is recorded and sent with the next enqueue; a new one is checked
    /// with the driver at once.
    accepted: FastSet<(u32, u64, u8)>,
}

impl ArgTable {
    fn mark_dirty(&mut self, index: u32) {
        if !self.dirty.contains(&index) {
            self.dirty.push(index);
        }
    }
}

pub struct KernelArgs {
    cells: Box<[ArgCell]>,
    table: BriefLock<ArgTable>,
}

impl KernelArgs {
    /// A kernel's arguments, none set. The cells are sized from the worker's argument count,
    /// at most `CELLS`: nothing larger is allocated from it.
    pub fn new(num_args: u32) -> Self {
        let cells = (0..(num_args as usize).min(CELLS)).map(|_| ArgCell::default()).collect();
        KernelArgs { cells, table: BriefLock::default() }
    }

    /// The loop case: records `incoming` at `index` if the value recorded there has its shape
    /// (which the driver accepted), without a lock for a value in a cell; else if the driver
    /// accepted its shape at `index` before. `false`: a new shape, nothing recorded.
    #[inline(always)]
    pub fn record_in_shape(&self, index: u32, size: usize, incoming: &Incoming) -> bool {
        if let (Some(cell), Some((shape, value))) = (self.cells.get(index as usize), incoming.in_cell()) {
            if cell.shape.load(Relaxed) == shape {
                if cell.value.load(Relaxed) != value {
                    cell.value.store(value, Relaxed);
                    cell.dirty.store(true, Relaxed);
                }
                return true;
            }
        }
        self.record_in_table(index, size, incoming)
    }

    /// `record_in_shape` for a value the cells do not hold, or of another shape than the one
    /// in its cell.
    #[inline(never)]
    fn record_in_table(&self, index: u32, size: usize, incoming: &Incoming) -> bool {
        let mut t = self.table.lock();
        match incoming.update(t.values.get_mut(index as usize).and_then(Option::as_mut)) {
            Some(false) => true,
            Some(true) => {
                t.mark_dirty(index);
                true
            }
            None if t.accepted.contains(&(index, size as u64, incoming.shape_kind())) => {
                self.set(&mut t, index, incoming);
                true
            }
            None => false,
        }
    }

    /// Records a value whose shape the driver has just accepted.
    pub fn accept(&self, index: u32, size: usize, incoming: &Incoming) {
        let mut t = self.table.lock();
        t.accepted.insert((index, size as u64, incoming.shape_kind()));
        self.set(&mut t, index, incoming);
    }

    /// Sets the value at `index`, in its cell if it fits one, else in the table (emptying the
    /// cell), to ship with the next enqueue. `t` is the held table: shapes change under it.
    fn set(&self, t: &mut ArgTable, index: u32, incoming: &Incoming) {
        let cell = self.cells.get(index as usize);
        if let (Some(cell), Some((shape, value))) = (cell, incoming.in_cell()) {
            if let Some(v) = t.values.get_mut(index as usize) {
                *v = None;
            }
            cell.value.store(value, Relaxed);
            cell.shape.store(shape, Relaxed);
            cell.dirty.store(true, Relaxed);
            return;
        }
        if let Some(cell) = cell {
            cell.shape.store(EMPTY, Relaxed);
            cell.dirty.store(false, Relaxed);
        }
        let i = index as usize;
        if t.values.len() <= i {
            t.values.resize(i + 1, None);
        }
        t.values[i] = Some(incoming.to_value());
        t.mark_dirty(index);
    }

    /// Takes the arguments set since the last enqueue, to ship with the next one. A cell's
    /// flag is read, then cleared, with plain accesses: only a setter racing this enqueue on the
    /// same kernel, which OpenCL forbids, could be missed.
    pub fn take_dirty(&self) -> Vec<(u32, ArgValue)> {
        let mut t = self.table.lock();
        let mut out = Vec::new();
        for (i, cell) in self.cells.iter().enumerate() {
            if cell.dirty.load(Relaxed) {
                cell.dirty.store(false, Relaxed);
                out.extend(cell.get().map(|v| (i as u32, v)));
            }
        }
        let dirty = std::mem::take(&mut t.dirty);
        out.extend(dirty.into_iter().filter_map(|i| t.values.get(i as usize).cloned().flatten().map(|v| (i, v))));
        out
    }

    /// Puts arguments back as unsent after a failed enqueue, so the next one ships them again.
    pub fn restore_dirty(&self, sent: &[(u32, ArgValue)]) {
        let mut t = self.table.lock();
        for &(i, _) in sent {
            match self.cells.get(i as usize).filter(|c| c.is_set()) {
                Some(cell) => cell.dirty.store(true, Relaxed),
                None => t.mark_dirty(i),
            }
        }
    }

    /// Every argument set so far, by index (for `recovery`, which replays an enqueue with all
    /// of them).
    pub fn all(&self) -> Vec<(u32, ArgValue)> {
        let t = self.table.lock();
        let n = self.cells.len().max(t.values.len());
        let mut all = Vec::with_capacity(n);
        for i in 0..n {
            let value = self.cells.get(i).and_then(ArgCell::get).or_else(|| t.values.get(i).cloned().flatten());
            all.extend(value.map(|v| (i as u32, v)));
        }
        all
    }

    /// Visits the id of every memory object or sampler set as an argument, allocating nothing
    /// (replay's journal asks before each enqueue which buffers the kernel may write).
    pub fn each_object(&self, mut f: impl FnMut(ObjectId)) {
        for cell in self.cells.iter() {
            if matches!(cell.shape.load(Relaxed), MEM | SAMPLER) {
                f(cell.value.load(Relaxed));
            }
        }
        let t = self.table.lock();
        for v in t.values.iter().flatten() {
            if let ArgValue::Object(id) = v {
                f(*id);
            }
        }
    }

    /// Whether each of the first `num_args` arguments has a value.
    pub fn all_set(&self, num_args: u32) -> bool {
        let t = self.table.lock();
        (0..num_args as usize)
            .all(|i| self.cells.get(i).is_some_and(ArgCell::is_set) || t.values.get(i).is_some_and(Option::is_some))
    }

    /// A copy, for a kernel cloned from this one or rebuilt for a new worker. `all_dirty`:
    /// every value set ships with the next enqueue (the rebuilt kernel has those of the last
    /// command replayed, not necessarily the latest); else what is unshipped here is unshipped
    /// there.
    pub fn copy(&self, all_dirty: bool) -> KernelArgs {
        let t = self.table.lock();
        let cells = self
            .cells
            .iter()
            .map(|c| {
                let shape = c.shape.load(Relaxed);
                let dirty = if all_dirty { shape != EMPTY } else { c.dirty.load(Relaxed) };
                ArgCell {
                    shape: AtomicU8::new(shape),
                    dirty: AtomicBool::new(dirty),
                    value: AtomicU64::new(c.value.load(Relaxed)),
                }
            })
            .collect();
        let mut table = t.clone();
        if all_dirty {
            table.dirty = (0..t.values.len() as u32).filter(|&i| t.values[i as usize].is_some()).collect();
        }
        KernelArgs { cells, table: BriefLock::new(table) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u8]) -> ArgValue {
        ArgValue::Bytes(ArgBytes::from(v))
    }

    #[test]
    fn a_value_is_recorded_only_in_a_shape_the_driver_accepted() {
        let args = KernelArgs::new(2);
        let four = 7u32.to_ne_bytes();
        assert!(!args.record_in_shape(0, 4, &Incoming::Bytes(&four)), "nothing accepted yet");
        assert!(args.take_dirty().is_empty());
        args.accept(0, 4, &Incoming::Bytes(&four));
        assert!(args.record_in_shape(0, 4, &Incoming::Bytes(&9u32.to_ne_bytes())));
        assert!(!args.record_in_shape(0, 8, &Incoming::Bytes(&9u64.to_ne_bytes())), "another size");
        assert!(!args.record_in_shape(0, 8, &Incoming::Object { id: 5, sampler: false }), "another kind");
        assert!(!args.record_in_shape(1, 4, &Incoming::Bytes(&four)), "another index");
        assert_eq!(args.take_dirty(), vec![(0, bytes(&9u32.to_ne_bytes()))]);
    }

    #[test]
    fn a_null_word_accepted_says_nothing_of_other_words() {
        // In a cell (index 0) and in the table (index CELLS, which has no cell).
        for index in [0, CELLS as u32] {
            let args = KernelArgs::new(CELLS as u32 + 1);
            let null = 0usize.to_ne_bytes();
            let word = 0x1000usize.to_ne_bytes();
            let size = null.len();
            args.accept(index, size, &Incoming::Bytes(&null));
            assert!(args.record_in_shape(index, size, &Incoming::Bytes(&null)));
            assert!(!args.record_in_shape(index, size, &Incoming::Bytes(&word)), "the driver must see it");
            args.accept(index, size, &Incoming::Bytes(&word));
            assert!(args.record_in_shape(index, size, &Incoming::Bytes(&0x2000usize.to_ne_bytes())));
            assert!(args.record_in_shape(index, size, &Incoming::Bytes(&null)), "both accepted now");
            assert_eq!(args.all(), vec![(index, bytes(&null))]);
        }
    }

    #[test]
    fn only_changed_values_ship_and_a_failed_enqueue_ships_them_again() {
        let args = KernelArgs::new(3);
        args.accept(0, 8, &Incoming::Object { id: 11, sampler: false });
        args.accept(1, 4, &Incoming::Bytes(&1u32.to_ne_bytes()));
        args.accept(2, 0, &Incoming::Local(64));
        let first = args.take_dirty();
        assert_eq!(first, vec![(0, ArgValue::Object(11)), (1, bytes(&1u32.to_ne_bytes())), (2, ArgValue::Local(64))]);
        assert!(args.record_in_shape(0, 8, &Incoming::Object { id: 11, sampler: false }));
        assert!(args.record_in_shape(1, 4, &Incoming::Bytes(&1u32.to_ne_bytes())));
        assert!(args.record_in_shape(2, 0, &Incoming::Local(64)));
        assert!(args.take_dirty().is_empty(), "the same values again: nothing to ship");
        assert!(args.record_in_shape(0, 8, &Incoming::Object { id: 12, sampler: false }));
        let sent = args.take_dirty();
        assert_eq!(sent, vec![(0, ArgValue::Object(12))]);
        args.restore_dirty(&sent);
        assert_eq!(args.take_dirty(), sent);
        args.restore_dirty(&first);
        assert_eq!(args.take_dirty().len(), 3);
    }

    #[test]
    fn every_size_up_to_a_word_round_trips_through_a_cell() {
        let args = KernelArgs::new(CELLS as u32);
        let data: Vec<u8> = (1..=8).collect();
        for n in 1..=8usize {
            args.accept(n as u32, n, &Incoming::Bytes(&data[..n]));
        }
        let all = args.all();
        assert_eq!(all.len(), 8);
        for (i, v) in all {
            assert_eq!(v, bytes(&data[..i as usize]));
        }
    }

    #[test]
    fn a_value_moves_between_its_cell_and_the_table_with_its_shape() {
        let args = KernelArgs::new(1);
        let big = [3u8; 16];
        args.accept(0, 16, &Incoming::Bytes(&big));
        args.accept(0, 4, &Incoming::Bytes(&[1, 2, 3, 4]));
        assert_eq!(args.all(), vec![(0, bytes(&[1, 2, 3, 4]))]);
        assert_eq!(args.take_dirty(), vec![(0, bytes(&[1, 2, 3, 4]))], "the table's old value does not ship");
        // Both shapes were accepted: each is recorded without the driver.
        assert!(args.record_in_shape(0, 16, &Incoming::Bytes(&big)));
        assert_eq!(args.all(), vec![(0, bytes(&big))]);
        assert_eq!(args.take_dirty(), vec![(0, bytes(&big))], "the emptied cell does not ship");
        assert!(args.record_in_shape(0, 4, &Incoming::Bytes(&[5, 6, 7, 8])));
        assert_eq!(args.take_dirty(), vec![(0, bytes(&[5, 6, 7, 8]))]);
    }

    #[test]
    fn indices_past_the_cells_live_in_the_table() {
        let n = CELLS as u32 + 2;
        let args = KernelArgs::new(n);
        assert!(!args.all_set(n));
        for i in 0..n {
            args.accept(i, 4, &Incoming::Bytes(&i.to_ne_bytes()));
        }
        assert!(args.all_set(n));
        assert!(!args.all_set(n + 1));
        assert!(args.record_in_shape(n - 1, 4, &Incoming::Bytes(&99u32.to_ne_bytes())));
        let all = args.all();
        assert_eq!(all.len(), n as usize);
        assert_eq!(all.last(), Some(&(n - 1, bytes(&99u32.to_ne_bytes()))));
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "by index");
    }

    /// An application that breaks OpenCL's rule (two threads setting one kernel's arguments,
    /// a third enqueueing it) gets values it set, or after a change of shape mid-race a value
    /// of a shape it set: never a crash or a torn value.
    #[test]
    fn racing_setters_and_enqueues_ship_only_whole_values() {
        let args = std::sync::Arc::new(KernelArgs::new(2));
        args.accept(0, 4, &Incoming::Bytes(&0u32.to_ne_bytes()));
        args.accept(1, 4, &Incoming::Bytes(&0u32.to_ne_bytes()));
        args.accept(1, 16, &Incoming::Bytes(&[0; 16]));
        let setters: Vec<_> = (0..2u32)
            .map(|t| {
                let args = args.clone();
                std::thread::spawn(move || {
                    for n in 0..100_000u32 {
                        // Index 0: same shape, values tagged by thread. Index 1: shapes flip.
                        assert!(args.record_in_shape(0, 4, &Incoming::Bytes(&(t << 31 | n).to_ne_bytes())));
                        match n % 3 {
                            0 => assert!(args.record_in_shape(1, 16, &Incoming::Bytes(&[t as u8 + 1; 16]))),
                            _ => assert!(args.record_in_shape(1, 4, &Incoming::Bytes(&[t as u8 + 1; 4]))),
                        }
                    }
                })
            })
            .collect();
        let mut shipped = 0;
        while !setters.iter().all(|s| s.is_finished()) {
            for (i, v) in args.take_dirty().into_iter().chain(args.all()) {
                let ArgValue::Bytes(b) = v else { panic!("index {i}: {v:?}") };
                match i {
                    0 => assert_eq!(b.len(), 4),
                    1 => assert!(b.len() == 4 || b.len() == 16, "index 1: {b:?}"),
                    _ => panic!("index {i}"),
                }
                shipped += 1;
            }
        }
        setters.into_iter().for_each(|s| s.join().unwrap());
        assert!(shipped > 0);
        let last = args.all();
        assert_eq!(last.len(), 2, "both indices keep a value: {last:?}");
    }

    #[test]
    fn a_copy_keeps_values_and_says_what_ships() {
        let args = KernelArgs::new(CELLS as u32 + 1);
        args.accept(0, 4, &Incoming::Bytes(&1u32.to_ne_bytes()));
        args.accept(CELLS as u32, 4, &Incoming::Bytes(&2u32.to_ne_bytes()));
        args.take_dirty();
        args.record_in_shape(0, 4, &Incoming::Bytes(&3u32.to_ne_bytes()));
        let unshipped = args.copy(false);
        assert_eq!(unshipped.take_dirty(), vec![(0, bytes(&3u32.to_ne_bytes()))]);
        let rebuilt = args.copy(true);
        assert_eq!(rebuilt.take_dirty(), args.all());
        assert!(
            rebuilt.record_in_shape(CELLS as u32, 4, &Incoming::Bytes(&5u32.to_ne_bytes())),
            "accepted shapes are copied"
        );
    }
}
