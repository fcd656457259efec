//! A lane: one application thread's private mailbox to its own worker thread, in shared memory.
//!
//! Layout of the memfd: a 4 KiB header (state word, lengths, sleeper flags), then the message
//! area (one postcard-encoded request, later overwritten by its reply), then the bulk area that
//! carries buffer data in both directions. Only one request is outstanding per lane, so the
//! message area needs no ring: the state word moves IDLE -> REQUEST -> REPLY -> IDLE.
//!
//! Waiting spins briefly (a round trip to a hot worker thread costs a few microseconds) and then
//! sleeps on a futex in the state word. A side only issues `FUTEX_WAKE` when the other announced
//! it was going to sleep, so the fast path costs no system call at all.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::shm::SharedRegion;
use crate::IpcError;

pub const HEADER_BYTES: usize = 4096;
/// Largest encoded request or reply.
pub const MSG_CAP: usize = 4 << 20;
/// Bulk bytes per round trip; larger transfers are split into chunks of this size.
pub const BULK_CAP: usize = 16 << 20;
pub const LANE_BYTES: usize = HEADER_BYTES + MSG_CAP + BULK_CAP;

const IDLE: u32 = 0;
const REQUEST: u32 = 1;
const REPLY: u32 = 2;
const CLOSED: u32 = 3;

#[repr(C)]
struct Header {
    state: AtomicU32,
    req_len: AtomicU32,
    rep_len: AtomicU32,
    /// Set while the application thread sleeps waiting for a reply.
    client_sleeping: AtomicU32,
    /// Set while the worker thread sleeps waiting for a request.
    server_sleeping: AtomicU32,
}

/// How long to spin before sleeping on the futex.
pub fn spin_budget() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| Duration::from_micros(crate::settings::number("CLOISTER_SPIN_US", 50, 0..=1_000_000)))
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: word points into a live shared mapping; FUTEX_WAIT (not private: the word is
    // shared between processes) only reads it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const _);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as above; FUTEX_WAKE does not access memory beyond the word's address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Why a wait ended without the expected state.
#[derive(Debug, PartialEq, Eq)]
pub enum WaitEnd {
    Closed,
    /// The `alive` probe said the peer is gone.
    PeerGone,
}

/// One side's view of a lane.
pub struct Lane {
    region: SharedRegion,
}

impl Lane {
    pub fn create() -> Result<Self, IpcError> {
        Ok(Self { region: SharedRegion::create("cloister-lane", LANE_BYTES)? })
    }

    pub fn from_region(region: SharedRegion) -> Result<Self, IpcError> {
        if region.len() < LANE_BYTES {
            return Err(IpcError::Protocol("lane region too small"));
        }
        Ok(Self { region })
    }

    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    fn header(&self) -> &Header {
        // SAFETY: the region is at least HEADER_BYTES long, page aligned, and Header is made of
        // atomics, valid for any bit pattern.
        unsafe { &*(self.region.as_ptr() as *const Header) }
    }

    /// The message area. Both sides write it only while they own the lane (by the state word).
    pub fn msg_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES lies inside the region.
        unsafe { self.region.as_ptr().add(HEADER_BYTES) }
    }

    /// The bulk area, `BULK_CAP` bytes.
    pub fn bulk_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES + MSG_CAP lies inside the region.
        unsafe { self.region.as_ptr().add(HEADER_BYTES + MSG_CAP) }
    }

    /// The bulk range `[offset, offset+len)` if it lies within the bulk area.
    pub fn bulk_range(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > BULK_CAP as u64 {
            return None;
        }
        // SAFETY: bounds checked against BULK_CAP.
        Some(unsafe { self.bulk_ptr().add(offset as usize) })
    }

    /// Copies `bytes` into the message area and hands the lane to the worker.
    pub fn post_request(&self, bytes: &[u8]) -> Result<(), IpcError> {
        if bytes.len() > MSG_CAP {
            return Err(IpcError::Protocol("request larger than the lane's message area"));
        }
        // SAFETY: bytes fits in the message area, which the client owns while state is IDLE.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.msg_ptr(), bytes.len()) };
        let h = self.header();
        h.req_len.store(bytes.len() as u32, Ordering::Relaxed);
        h.state.store(REQUEST, Ordering::SeqCst);
        if h.server_sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&h.state);
        }
        Ok(())
    }

    /// Waits for the worker's reply and returns a copy of it. `alive` is polled while sleeping.
    pub fn wait_reply(&self, alive: &dyn Fn() -> bool) -> Result<Vec<u8>, WaitEnd> {
        self.wait_for(REPLY, &self.header().client_sleeping, alive)?;
        let h = self.header();
        let len = h.rep_len.load(Ordering::Relaxed) as usize;
        // A hostile worker may write any length: never read past the message area.
        let len = len.min(MSG_CAP);
        let mut out = vec![0u8; len];
        // SAFETY: len <= MSG_CAP; the worker is done with the area once state is REPLY.
        unsafe { std::ptr::copy_nonoverlapping(self.msg_ptr(), out.as_mut_ptr(), len) };
        h.state.store(IDLE, Ordering::SeqCst);
        Ok(out)
    }

    /// Worker side: waits for the next request and returns a copy of it.
    pub fn wait_request(&self, alive: &dyn Fn() -> bool) -> Result<Vec<u8>, WaitEnd> {
        self.wait_for(REQUEST, &self.header().server_sleeping, alive)?;
        let len = (self.header().req_len.load(Ordering::Relaxed) as usize).min(MSG_CAP);
        let mut out = vec![0u8; len];
        // SAFETY: len <= MSG_CAP; the client does not touch the area while state is REQUEST.
        unsafe { std::ptr::copy_nonoverlapping(self.msg_ptr(), out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// Worker side: publishes the reply.
    pub fn post_reply(&self, bytes: &[u8]) -> Result<(), IpcError> {
        if bytes.len() > MSG_CAP {
            return Err(IpcError::Protocol("reply larger than the lane's message area"));
        }
        // SAFETY: as in post_request; the worker owns the area while state is REQUEST.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.msg_ptr(), bytes.len()) };
        let h = self.header();
        h.rep_len.store(bytes.len() as u32, Ordering::Relaxed);
        h.state.store(REPLY, Ordering::SeqCst);
        if h.client_sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&h.state);
        }
        Ok(())
    }

    /// Marks the lane closed (its thread exited, or the peer died) and wakes any sleeper.
    pub fn close(&self) {
        let h = self.header();
        h.state.store(CLOSED, Ordering::SeqCst);
        futex_wake(&h.state);
    }

    /// Wakes a sleeper without changing state, so it re-checks its `alive` probe.
    pub fn nudge(&self) {
        futex_wake(&self.header().state);
    }

    fn wait_for(&self, want: u32, sleeping: &AtomicU32, alive: &dyn Fn() -> bool) -> Result<(), WaitEnd> {
        let h = self.header();
        let start = Instant::now();
        let budget = spin_budget();
        loop {
            let s = h.state.load(Ordering::Acquire);
            if s == want {
                return Ok(());
            }
            if s == CLOSED {
                return Err(WaitEnd::Closed);
            }
            if start.elapsed() < budget {
                std::hint::spin_loop();
                continue;
            }
            sleeping.store(1, Ordering::SeqCst);
            let s = h.state.load(Ordering::SeqCst);
            if s != want && s != CLOSED {
                futex_wait(&h.state, s, Duration::from_millis(100));
            }
            sleeping.store(0, Ordering::SeqCst);
            let s = h.state.load(Ordering::Acquire);
            if s != want && s != CLOSED && !alive() {
                return Err(WaitEnd::PeerGone);
            }
        }
    }
}
