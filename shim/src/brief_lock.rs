//! A lock for state held a few instructions at a time and almost never contended: the table of
//! a kernel's arguments (`kernel_args`: the values that have no lock-free cell), which OpenCL
//! does not let two threads set at once.
//!
//! Taking it is one atomic exchange and leaving it one plain release store, where
//! `std::sync::Mutex` pays a locked instruction on both sides (its unlock swaps, to learn whether
//! anyone sleeps). Against NVIDIA's 10 ns `clSetKernelArg` that second locked instruction is a
//! visible share of the cage's cost. A thread that finds it taken spins briefly, then yields
//! its core: nothing holds it across a call to the worker or the driver.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins before yielding: the holder is a few hundred instructions from leaving.
const SPINS: u32 = 64;

#[derive(Default)]
pub struct BriefLock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `BriefGuard`, of which `held` lets one exist at a
// time, so sharing the lock between threads hands the value from one thread to another (`Send`).
unsafe impl<T: Send> Sync for BriefLock<T> {}

impl<T> BriefLock<T> {
    pub const fn new(value: T) -> Self {
        BriefLock { held: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock, waiting while another thread holds it. Not poisoned by a panic: its
    /// holders leave the value consistent at every step that can panic (an allocation).
    #[inline]
    pub fn lock(&self) -> BriefGuard<'_, T> {
        if self.held.swap(true, Ordering::Acquire) {
            self.wait();
        }
        BriefGuard { lock: self }
    }

    #[cold]
    fn wait(&self) {
        let mut spins = 0;
        loop {
            if !self.held.load(Ordering::Relaxed) && !self.held.swap(true, Ordering::Acquire) {
                return;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// The held lock: the value, until dropped.
pub struct BriefGuard<'a, T> {
    lock: &'a BriefLock<T>,
}

impl<T> Deref for BriefGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (`held`), so nothing else reaches the value.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for BriefGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for BriefGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::BriefLock;
    use std::sync::Arc;

    #[test]
    fn one_holder_at_a_time_under_contention() {
        // Each thread adds non-atomically (read, then write): a second holder would lose updates.
        let lock = Arc::new(BriefLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        let mut g = lock.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*lock.lock(), 200_000);
    }

    #[test]
    fn released_by_a_panicking_holder() {
        let lock = Arc::new(BriefLock::new(vec![1u8]));
        let l = lock.clone();
        let r = std::thread::spawn(move || {
            let mut g = l.lock();
            g.push(2);
            panic!("holder panics");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.lock(), vec![1, 2]);
    }
}
