//! Large copies between application memory and shared memory, split across threads.
//!
//! Every caged transfer costs one copy the direct path does not have (or, with zero-copy
//! buffers, the copy the driver would have made, made by the shim instead). One thread's memcpy
//! reaches 7-10 GB/s on a server core (an H100 host: `clpeak`'s "memcpy to mapped ptr" 10.8
//! GB/s), while a discrete GPU's DMA from pinned pages reaches 55 GB/s: the copy is the
//! bottleneck, and memory bandwidth allows several threads at once. Copies of at least
//! `PARALLEL_MIN` bytes are split into page-aligned pieces that the calling thread and a pool
//! of `threads() - 1` helpers take in turn; smaller ones, and machines with few cores, copy on
//! the calling thread.
//!
//! The helpers are started once, at the first large copy, and sleep between copies: starting
//! threads for every copy (as this module did) cost about as much as a 1 MiB copy saves, so
//! copies under 2 MiB were never split. The caller takes pieces itself and waits only for the
//! pieces a helper has taken, so a helper that wakes late costs speed, never progress. A copy
//! that finds the pool busy (another thread's copy), or runs in a child forked from the process
//! that started the pool (whose helpers did not survive the fork), copies alone.

use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, TryLockError};

/// Below this, waking helpers costs more than it saves.
pub const PARALLEL_MIN: usize = 512 << 10;

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

/// `copy` with an explicit thread count (tests pin it; the pool has `threads - 1` helpers at
/// most, as many as the first large copy asked for).
///
/// # Safety
/// As `copy`.
pub unsafe fn copy_with(threads: usize, dst: *mut u8, src: *const u8, len: usize) {
    if threads > 1 && len >= PARALLEL_MIN {
        if let Some(mut job) = Pool::get(threads - 1).and_then(Pool::take) {
            // SAFETY: forwarded: the ranges stay valid until `run` returns, which it does only
            // once every piece is copied.
            unsafe { job.run(threads, dst, src, len) };
            return;
        }
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// One copy, as the pool's threads see it: addresses as integers (a piece is copied between
/// `src + start` and `dst + start`).
#[derive(Clone, Copy, Default)]
struct Work {
    dst: usize,
    src: usize,
    len: usize,
    piece: usize,
    pieces: usize,
}

impl Work {
    /// Copies piece `i`.
    ///
    /// # Safety
    /// The copy this describes is still running (its caller waits for `done`).
    unsafe fn copy_piece(&self, i: usize) {
        let start = i * self.piece;
        let n = self.piece.min(self.len - start);
        // SAFETY: [start, start + n) lies within both ranges (i < pieces, so start < len), which
        // the caller of `copy_with` keeps valid until every piece is done.
        unsafe { std::ptr::copy_nonoverlapping((self.src + start) as *const u8, (self.dst + start) as *mut u8, n) };
    }
}

#[derive(Default)]
struct Board {
    work: Work,
    /// Bumped for every copy, so a helper takes part once in each.
    serial: u64,
    /// Pieces taken so far (by the caller or a helper).
    taken: usize,
    /// Pieces copied so far.
    done: usize,
}

struct Pool {
    /// The process that started the helpers: a forked child has none.
    pid: u32,
    /// Held by the one copy the pool runs at a time.
    busy: Mutex<()>,
    board: Mutex<Board>,
    /// Helpers wait here for a copy.
    posted: Condvar,
    /// The caller waits here for the pieces helpers took.
    finished: Condvar,
}

/// The pool, held for one copy.
struct Job {
    pool: &'static Pool,
    _busy: MutexGuard<'static, ()>,
}

impl Pool {
    /// The pool, started with `helpers` threads at the first call; `None` in a forked child, or
    /// where no thread could be started.
    fn get(helpers: usize) -> Option<&'static Pool> {
        static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
        let pool = (*POOL.get_or_init(|| Pool::start(helpers)))?;
        (pool.pid == std::process::id()).then_some(pool)
    }

    fn start(helpers: usize) -> Option<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            pid: std::process::id(),
            busy: Mutex::new(()),
            board: Mutex::new(Board::default()),
            posted: Condvar::new(),
            finished: Condvar::new(),
        }));
        let started = (0..helpers)
            .filter(|i| {
                std::thread::Builder::new()
                    .name(format!("cloister-copy-{i}"))
                    .stack_size(64 << 10)
                    .spawn(move || pool.help())
                    .is_ok()
            })
            .count();
        (started > 0).then_some(pool)
    }

    /// The pool for one copy, unless another copy holds it.
    fn take(&'static self) -> Option<Job> {
        match self.busy.try_lock() {
            Ok(g) => Some(Job { pool: self, _busy: g }),
            Err(TryLockError::Poisoned(e)) => Some(Job { pool: self, _busy: e.into_inner() }),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A helper's life: take pieces of each copy posted until none is left, then sleep.
    fn help(&self) {
        let mut seen = 0;
        let mut board = self.board();
        loop {
            while board.serial == seen {
                board = self.posted.wait(board).unwrap_or_else(|e| e.into_inner());
            }
            seen = board.serial;
            board = self.take_pieces(board);
        }
    }

    /// Takes pieces of the posted copy until none is left, copying each with the board unlocked
    /// (the caller and the helpers take them in turn); the piece that completes the copy wakes
    /// its caller.
    fn take_pieces<'a>(&'a self, mut board: MutexGuard<'a, Board>) -> MutexGuard<'a, Board> {
        while board.taken < board.work.pieces {
            let (work, i) = (board.work, board.taken);
            board.taken += 1;
            drop(board);
            // SAFETY: `work` is the copy running now (a finished one leaves no pieces), whose
            // caller waits until `done` counts this piece.
            unsafe { work.copy_piece(i) };
            board = self.board();
            board.done += 1;
            if board.done == board.work.pieces {
                self.finished.notify_one();
            }
        }
        board
    }
}

impl Job {
    /// Copies in page-aligned pieces (two per thread, so a late helper leaves less to wait
    /// for), taking pieces on this thread until none is left, then waiting for the helpers'.
    ///
    /// # Safety
    /// As `copy_with`.
    unsafe fn run(&mut self, threads: usize, dst: *mut u8, src: *const u8, len: usize) {
        let piece = len.div_ceil(2 * threads).next_multiple_of(4096);
        let work = Work { dst: dst as usize, src: src as usize, len, piece, pieces: len.div_ceil(piece) };
        let pool = self.pool;
        let mut board = pool.board();
        *board = Board { work, serial: board.serial + 1, taken: 0, done: 0 };
        pool.posted.notify_all();
        board = pool.take_pieces(board);
        while board.done < work.pieces {
            board = pool.finished.wait(board).unwrap_or_else(|e| e.into_inner());
        }
        // Nothing of this copy is left for a helper that wakes now.
        board.work = Work::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(threads: usize, len: usize) {
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut dst = vec![0u8; len + 2];
        // SAFETY: distinct vectors, each large enough.
        unsafe { copy_with(threads, dst.as_mut_ptr().add(1), src.as_ptr(), len) };
        assert!(dst[1..=len] == src[..], "threads {threads} len {len}: bytes differ");
        assert_eq!((dst[0], dst[len + 1]), (0, 0), "wrote outside the range");
    }

    #[test]
    fn every_byte_arrives_whatever_the_split() {
        for (threads, len) in [
            (1, PARALLEL_MIN + 3),
            (3, PARALLEL_MIN + 4097),
            (4, PARALLEL_MIN),
            (7, 3 * PARALLEL_MIN - 1),
            (2, PARALLEL_MIN - 1),
            (4, 64 << 20),
        ] {
            check(threads, len);
        }
    }

    #[test]
    fn copies_from_many_threads_at_once_each_arrive_whole() {
        // One of them holds the pool; the others copy alone: every copy is whole either way.
        std::thread::scope(|s| {
            for t in 0..6 {
                s.spawn(move || {
                    for round in 0..20 {
                        check(4, PARALLEL_MIN + 4096 * (t + round) + t);
                    }
                });
            }
        });
    }

    #[test]
    fn a_forked_child_copies_alone() {
        // Starts the pool in this process, then copies in a child, which has no helpers.
        check(4, PARALLEL_MIN);
        // SAFETY: the child only copies, checks and exits; it never returns into the harness.
        match unsafe { libc::fork() } {
            0 => {
                let ok = std::panic::catch_unwind(|| check(4, 2 * PARALLEL_MIN + 5)).is_ok();
                // SAFETY: ends the child at once, without running the parent's exit handlers.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            pid => {
                assert!(pid > 0, "fork failed");
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
            }
        }
    }
}
