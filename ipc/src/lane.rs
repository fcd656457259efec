//! A lane: one application thread's private, ordered stream of requests to its own worker
//! thread, in shared memory.
//!
//! Layout of the memfd: a 4 KiB header (counters, lengths, sleeper counts), the message area (one
//! synchronous request, later overwritten by its reply), the posted ring, and the bulk area that
//! carries buffer data in both directions.
//!
//! The header's words are grouped by who writes them, each group on its own cache lines
//! (`Header`): a word one side writes while the other spins reading it costs a trip of the
//! line between their cores, and with every word on one line each of the half dozen writes of
//! an exchange made that trip (on the H200 host a bare call took 820 ns, a post and a call
//! 1 300; `ipc/examples/lane_pingpong.rs`).
//!
//! Two kinds of request travel on a lane, in the order the application made them:
//! - a **call** wants its reply. Only one is outstanding (the calling thread waits for it), so
//!   it needs no ring: the application counts its calls (`calls`), the worker the calls it
//!   answered (`replies`); a count ahead of the other's says whose turn the message area is.
//! - a **posted** request wants none (an enqueue the shim could vouch for). It is one frame in
//!   the ring (`[u32 length][postcard request]`, 8-byte aligned; a length of `WRAP` says the
//!   rest of the ring is skipped), written at `ring_head` by the application and consumed at
//!   `ring_tail` by the worker. The poster goes on at once; a full ring makes it wait for space.
//!
//! The worker drains the ring before it takes a call, and reads the call count before the ring:
//! every frame posted before a call is in the ring by the time it sees the call, so a call is
//! always answered after every earlier posted request ran. Over a byte stream the same frames
//! would travel in order, each tagged "wants a reply" or not.
//!
//! Waiting spins only while it pays (`Spin`), then sleeps on a futex. Every side that changes a
//! word the other may sleep on issues `FUTEX_WAKE` only when a sleeper announced itself, so the
//! fast path costs no system call at all.

mod spin;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::shm::SharedRegion;
use crate::IpcError;
pub use spin::{cores, spin_budget, Spin};

pub const HEADER_BYTES: usize = 4096;
/// Largest encoded request or reply.
pub const MSG_CAP: usize = 4 << 20;
/// The posted ring. A power of two, so positions wrap with a mask.
pub const RING_CAP: usize = 1 << 20;
/// Bulk bytes per round trip; larger transfers are split into chunks of this size.
pub const BULK_CAP: usize = 16 << 20;
pub const LANE_BYTES: usize = HEADER_BYTES + MSG_CAP + RING_CAP + BULK_CAP;
/// The largest frame (length word included) the ring takes; a larger request goes as a call.
pub const MAX_POSTED: usize = RING_CAP / 4;

/// The frame length that says "the rest of the ring is unused; go on at its start".
const WRAP: u32 = u32::MAX;
const FRAME_ALIGN: u32 = 8;

/// What the application's side writes on every post and call (one thread per lane), on lines of
/// its own: the worker's spin reads them and nothing else until they change.
#[repr(C, align(128))]
struct AppWords {
    /// Calls made so far, modulo 2^32: one more than `replies` while a call waits for its reply.
    calls: AtomicU32,
    req_len: AtomicU32,
    /// Bytes ever written into the ring, modulo 2^32.
    ring_head: AtomicU32,
    _pad: u32,
    /// A request of at most `INLINE_CAP` bytes, beside the count that announces it: the worker
    /// fetches both in one trip of the line (a larger one is in the message area).
    request: UnsafeCell<[u8; INLINE_CAP]>,
}

/// The worker's answer to a call, apart from its ring counters: the application spins on these,
/// and the worker's progress through the ring does not disturb it.
#[repr(C, align(128))]
struct ReplyWords {
    /// Calls answered so far (the application waits for it to reach its `calls`).
    replies: AtomicU32,
    rep_len: AtomicU32,
    _pad: [u32; 2],
    /// A reply of at most `INLINE_CAP` bytes, as `AppWords::request`.
    reply: UnsafeCell<[u8; INLINE_CAP]>,
}

/// The longest request or reply that travels in the header, beside its count (most: a
/// `clFinish`, an enqueue, a status): what fills the rest of a 128-byte group.
const INLINE_CAP: usize = 112;

/// The worker's progress through the ring, which the application reads only when it looks for
/// space or waits for what it posted to have run.
#[repr(C, align(128))]
struct RingWords {
    /// Bytes ever consumed from the ring, modulo 2^32.
    ring_tail: AtomicU32,
    /// Where the worker's last posted request that has *run* ended (`ring_tail` moves when a
    /// frame is taken, before it runs): a call from another thread waits for this.
    ring_done: AtomicU32,
}

/// Words written only around a sleep and at the end, read on every hand-over: on lines of their
/// own they stay in both sides' caches.
#[repr(C, align(128))]
struct SleepWords {
    /// Application threads asleep on `replies` (waiting for a reply).
    client_sleeping: AtomicU32,
    /// Set while the worker thread sleeps on `doorbell` (waiting for work).
    server_sleeping: AtomicU32,
    /// The worker's futex word: bumped by the application when it finds the worker asleep.
    doorbell: AtomicU32,
    /// Application threads asleep on `ring_tail` (waiting for space) or `ring_done`.
    tail_sleeping: AtomicU32,
    /// Set by the first post or call that wakes the sleeping worker, cleared by the worker
    /// before it sleeps: a stream of posts to a sleeping worker costs one `FUTEX_WAKE`, not one
    /// per post.
    bell_rung: AtomicU32,
    /// The same for the application's waits for ring space: the worker wakes a poster once the
    /// ring is down to three quarters (not after every frame it takes), once per sleep.
    space_rung: AtomicU32,
    /// Set once by either side: the lane's thread exited, or the peer died.
    closed: AtomicU32,
}

/// 128-byte groups: Intel's spatial prefetcher fetches lines in 128-byte pairs, so groups on
/// neighbouring 64-byte lines would still travel together.
#[repr(C)]
struct Header {
    app: AppWords,
    reply: ReplyWords,
    ring: RingWords,
    sleep: SleepWords,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// Byte offsets in the lane of the application's call count and of the worker's answer words:
/// for tests that play a worker writing them out of turn (`tests/src/bin/hostile_worker.rs`).
pub const CALLS_AT: usize = std::mem::offset_of!(Header, app) + std::mem::offset_of!(AppWords, calls);
pub const REPLIES_AT: usize = std::mem::offset_of!(Header, reply) + std::mem::offset_of!(ReplyWords, replies);
pub const REP_LEN_AT: usize = std::mem::offset_of!(Header, reply) + std::mem::offset_of!(ReplyWords, rep_len);
const _: () = assert!(std::mem::size_of::<AppWords>() == 128 && std::mem::size_of::<ReplyWords>() == 128);

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
    /// The peer broke the ring's rules (counters out of range, a frame past its end).
    Protocol,
}

/// What the worker's next step on a lane is.
#[derive(Debug, PartialEq, Eq)]
pub enum Work {
    /// A posted request: run it, answer nothing, then say `posted_done`.
    Posted(Vec<u8>),
    /// A call: run it and answer with `post_reply`.
    Call(Vec<u8>),
}

/// What `Lane::next_into` took.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum WorkKind {
    Posted,
    Call,
}

/// Copies `len` bytes of shared memory at `src` into `out`, replacing its contents, without
/// zeroing them first.
///
/// # Safety
/// `src` must be valid for reading `len` bytes.
unsafe fn copy_out(src: *const u8, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(len);
    // SAFETY: the caller vouches for `src`; `out` has capacity `len` and its length is set once
    // they are copied.
    unsafe {
        std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len);
        out.set_len(len);
    }
}

/// Why a post did not go into the ring.
#[derive(Debug, PartialEq, Eq)]
pub enum PostError {
    /// Larger than `MAX_POSTED`: send it as a call.
    TooLarge,
    /// The wait for space ended (worker gone or lane broken).
    Ended(WaitEnd),
}

fn align(n: u32) -> u32 {
    n.div_ceil(FRAME_ALIGN) * FRAME_ALIGN
}

/// One side's view of a lane.
pub struct Lane {
    region: SharedRegion,
    spin: Spin,
    /// Worker side: `ring_tail` after the frame `next` handed out last, published as
    /// `ring_done` once it has run (`posted_done`).
    taken: AtomicU32,
    /// Worker side: the call count of the call `next` handed out last, published as `replies`
    /// with its reply.
    answering: AtomicU32,
    /// Application side: the calls made, as `AppWords::calls` should say (the worker can
    /// scribble over that word; which reply a wait takes is decided by this one).
    asked: AtomicU32,
    /// Application side: the ring's head, as `AppWords::ring_head` should say (where the next
    /// frame goes is decided by this one, for the same reason).
    head: AtomicU32,
    /// Application side: the worker's `ring_tail` as last read (checked). The space it leaves
    /// only grows as the worker goes on, so a post reads the worker's counter (and pulls its
    /// line over) only when this one says the ring is full.
    tail_seen: AtomicU32,
}

impl Lane {
    pub fn create() -> Result<Self, IpcError> {
        Ok(Self::over(SharedRegion::create("cloister-lane", LANE_BYTES)?))
    }

    pub fn from_region(region: SharedRegion) -> Result<Self, IpcError> {
        if region.len() < LANE_BYTES {
            return Err(IpcError::Protocol("lane region too small"));
        }
        Ok(Self::over(region))
    }

    fn over(region: SharedRegion) -> Self {
        Self {
            region,
            spin: Spin::default(),
            taken: AtomicU32::new(0),
            answering: AtomicU32::new(0),
            asked: AtomicU32::new(0),
            head: AtomicU32::new(0),
            tail_seen: AtomicU32::new(0),
        }
    }

    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    fn header(&self) -> &Header {
        // SAFETY: the region is at least HEADER_BYTES long, page aligned, and Header is made of
        // atomics and byte cells, valid for any bit pattern (the cells are written only through
        // their raw pointers, by the side whose turn it is).
        unsafe { &*(self.region.as_ptr() as *const Header) }
    }

    /// The message area. Both sides write it only while they own it (by the call counts).
    fn msg_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES lies inside the region.
        unsafe { self.region.as_ptr().add(HEADER_BYTES) }
    }

    fn ring_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES + MSG_CAP lies inside the region.
        unsafe { self.region.as_ptr().add(HEADER_BYTES + MSG_CAP) }
    }

    /// The bulk area, `BULK_CAP` bytes.
    pub fn bulk_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES + MSG_CAP + RING_CAP lies inside the region.
        unsafe { self.region.as_ptr().add(HEADER_BYTES + MSG_CAP + RING_CAP) }
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

    /// Tells a sleeping worker there is something new (a post or a call, published before by a
    /// sequentially consistent store, which the worker's announcement of its sleep is ordered
    /// with: either it sees the work before it sleeps, or this sees it asleep). A spinning worker
    /// sees the work itself: nothing is written then.
    fn ring_doorbell(&self) {
        let s = &self.header().sleep;
        if s.server_sleeping.load(Ordering::SeqCst) != 0 && s.bell_rung.swap(1, Ordering::SeqCst) == 0 {
            s.doorbell.fetch_add(1, Ordering::SeqCst);
            futex_wake(&s.doorbell);
        }
    }

    /// Copies `bytes` into the message area and hands the lane to the worker.
    pub fn post_request(&self, bytes: &[u8]) -> Result<(), IpcError> {
        self.post_request_parts(&[bytes])
    }

    /// `post_request` of the concatenation of `parts` (a frame's header and the encoded request
    /// it frames, each where it was encoded: no copy joins them first).
    pub fn post_request_parts(&self, parts: &[&[u8]]) -> Result<(), IpcError> {
        let app = &self.header().app;
        let len = self
            .write_message(parts, app.request.get().cast())
            .ok_or(IpcError::Protocol("request larger than the lane's message area"))?;
        app.req_len.store(len, Ordering::Relaxed);
        let call = self.asked.load(Ordering::Relaxed).wrapping_add(1);
        self.asked.store(call, Ordering::Relaxed);
        app.calls.store(call, Ordering::SeqCst);
        self.ring_doorbell();
        Ok(())
    }

    /// Copies `parts`, one after the other, to `inline` (`INLINE_CAP` bytes in the header) if
    /// they fit there, else to the start of the message area, if they fit; returns their total
    /// length. Only the side whose turn it is (by the call counts) calls it.
    fn write_message(&self, parts: &[&[u8]], inline: *mut u8) -> Option<u32> {
        let len = parts.iter().try_fold(0usize, |n, p| n.checked_add(p.len())).filter(|&n| n <= MSG_CAP)?;
        let mut at = self.message_at(len, inline);
        for part in parts {
            // SAFETY: the parts' total fits where `message_at` put it (the message area, or the
            // header's room if at most INLINE_CAP), which this side owns while it is its turn.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                at = at.add(part.len());
            }
        }
        Some(len as u32)
    }

    /// Where a message of `len` bytes lies: in the header's `inline` room, or in the message area.
    fn message_at(&self, len: usize, inline: *mut u8) -> *mut u8 {
        match len <= INLINE_CAP {
            true => inline,
            false => self.msg_ptr(),
        }
    }

    /// Application side: the bytes in the ring not yet consumed, if the worker's counter is sane:
    /// by the tail as last read, or (`fresh`) as the worker has it now.
    fn ring_used(&self, fresh: bool) -> Result<u32, WaitEnd> {
        let h = self.header();
        let tail = match fresh {
            true => h.ring.ring_tail.load(Ordering::Acquire),
            false => self.tail_seen.load(Ordering::Relaxed),
        };
        let used = self.head.load(Ordering::Relaxed).wrapping_sub(tail);
        // A hostile worker may write any tail: never trust it beyond the ring's size.
        if used as usize > RING_CAP {
            return Err(WaitEnd::Protocol);
        }
        if fresh {
            self.tail_seen.store(tail, Ordering::Relaxed);
        }
        Ok(used)
    }

    /// Application side: appends a posted request to the ring, waiting (`alive` polled while
    /// asleep) while the ring is full. Returns its mark: `has_run` says when it has run.
    pub fn post(&self, bytes: &[u8], alive: &dyn Fn() -> bool) -> Result<u32, PostError> {
        let need = align(4 + bytes.len() as u32);
        if bytes.len() + 4 > MAX_POSTED {
            return Err(PostError::TooLarge);
        }
        let h = self.header();
        let cap = RING_CAP as u32;
        let fits = |fresh: bool| -> Option<Result<u32, WaitEnd>> {
            let used = match self.ring_used(fresh) {
                Ok(u) => u,
                Err(e) => return Some(Err(e)),
            };
            let pos = self.head.load(Ordering::Relaxed) % cap;
            let skip = if need > cap - pos { cap - pos } else { 0 };
            (used + skip + need <= cap).then_some(Ok(skip))
        };
        let skip = match fits(false).or_else(|| fits(true)) {
            Some(r) => r,
            None => {
                let (ring, sleep) = (&h.ring, &h.sleep);
                self.wait_on(
                    &ring.ring_tail,
                    &sleep.tail_sleeping,
                    alive,
                    || fits(true),
                    || sleep.space_rung.store(0, Ordering::SeqCst),
                )
            }
        }
        .map_err(PostError::Ended)?;
        let mut head = self.head.load(Ordering::Relaxed);
        let ring = self.ring_ptr();
        if skip > 0 {
            // SAFETY: pos is 8-aligned and below RING_CAP, so 4 bytes fit; the worker does not
            // read past ring_head, which has not moved yet.
            unsafe { (ring.add((head % cap) as usize) as *mut u32).write(WRAP) };
            head = head.wrapping_add(skip);
        }
        let pos = (head % cap) as usize;
        // SAFETY: `fits` made sure `need` bytes are free and contiguous from pos; the frame is
        // published by the release store of ring_head below.
        unsafe {
            (ring.add(pos) as *mut u32).write(bytes.len() as u32);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.add(pos + 4), bytes.len());
        }
        let mark = head.wrapping_add(need);
        // Sequentially consistent: ordered with the worker's announcement of a sleep
        // (`ring_doorbell`).
        self.head.store(mark, Ordering::Release);
        h.app.ring_head.store(mark, Ordering::SeqCst);
        self.ring_doorbell();
        Ok(mark)
    }

    /// Application side: whether the request posted with `mark` (and every one before it) has
    /// run in the worker. The worker's counter is taken at its word: one that claims more than
    /// it ran only hurts what it was sent.
    pub fn has_run(&self, mark: u32) -> bool {
        let behind = mark.wrapping_sub(self.header().ring.ring_done.load(Ordering::Acquire));
        behind == 0 || behind as usize > RING_CAP
    }

    /// Application side: whether every posted request has run.
    pub fn is_drained(&self) -> bool {
        let h = self.header();
        self.head.load(Ordering::Acquire) == h.ring.ring_done.load(Ordering::Acquire)
    }

    /// Application side (any thread): waits until every request posted so far has run in the
    /// worker, so a call from another thread comes after them.
    pub fn wait_drained(&self, alive: &dyn Fn() -> bool) -> Result<(), WaitEnd> {
        let h = self.header();
        let target = self.head.load(Ordering::Acquire);
        let done = || -> Option<Result<(), WaitEnd>> {
            // Reached (or, from a hostile worker, passed) the head as it was.
            let behind = target.wrapping_sub(h.ring.ring_done.load(Ordering::Acquire));
            (behind == 0 || behind as usize > RING_CAP).then_some(Ok(()))
        };
        match done() {
            Some(r) => r,
            None => self.wait_on(&h.ring.ring_done, &h.sleep.tail_sleeping, alive, done, || ()),
        }
    }

    /// Worker side: the posted request `next` handed out last has run.
    pub fn posted_done(&self) {
        let h = self.header();
        h.ring.ring_done.store(self.taken.load(Ordering::Relaxed), Ordering::SeqCst);
        if h.sleep.tail_sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&h.ring.ring_done);
        }
    }

    /// Waits for the worker's reply and copies it into `out` (replacing what it held: a caller
    /// that keeps `out` waits for replies without allocating once it has grown). `alive` is
    /// polled while sleeping.
    pub fn wait_reply_into(&self, alive: &dyn Fn() -> bool, out: &mut Vec<u8>) -> Result<(), WaitEnd> {
        let h = self.header();
        let call = self.asked.load(Ordering::Relaxed);
        let replied = || match h.reply.replies.load(Ordering::Acquire) == call {
            true => Some(Ok(())),
            false if h.sleep.closed.load(Ordering::Acquire) != 0 => Some(Err(WaitEnd::Closed)),
            false => None,
        };
        self.wait_on(&h.reply.replies, &h.sleep.client_sleeping, alive, replied, || ())?;
        // A hostile worker may write any length: never read past the message area.
        let len = (h.reply.rep_len.load(Ordering::Relaxed) as usize).min(MSG_CAP);
        // SAFETY: len <= MSG_CAP, and at most INLINE_CAP where it is the header's; the worker is
        // done with both once it answered the call.
        unsafe { copy_out(self.message_at(len, h.reply.reply.get().cast()), len, out) };
        Ok(())
    }

    /// Worker side: takes the next frame out of the ring into `out`, if there is one.
    fn take_frame(&self, out: &mut Vec<u8>) -> Option<Result<(), WaitEnd>> {
        let h = self.header();
        let cap = RING_CAP as u32;
        let mut tail = h.ring.ring_tail.load(Ordering::Relaxed);
        loop {
            let head = h.app.ring_head.load(Ordering::Acquire);
            let avail = head.wrapping_sub(tail);
            if avail == 0 {
                return None;
            }
            if avail > cap {
                return Some(Err(WaitEnd::Protocol));
            }
            let pos = tail % cap;
            // SAFETY: pos is below RING_CAP and 8-aligned (tail only advances by aligned
            // amounts from 0), so 4 bytes are readable; the frame was published by ring_head.
            let len = unsafe { (self.ring_ptr().add(pos as usize) as *const u32).read_volatile() };
            if len == WRAP {
                tail = tail.wrapping_add(cap - pos);
                h.ring.ring_tail.store(tail, Ordering::Release);
                continue;
            }
            // The application writes the frames, but the worker still never reads past the
            // ring or past what was published.
            let size = match len.checked_add(4).map(align) {
                Some(s) if s <= cap - pos && s <= avail => s,
                _ => return Some(Err(WaitEnd::Protocol)),
            };
            // SAFETY: [pos + 4, pos + 4 + len) lies within the ring (checked above).
            unsafe { copy_out(self.ring_ptr().add(pos as usize + 4), len as usize, out) };
            h.ring.ring_tail.store(tail.wrapping_add(size), Ordering::SeqCst);
            self.taken.store(tail.wrapping_add(size), Ordering::Relaxed);
            if h.sleep.tail_sleeping.load(Ordering::SeqCst) != 0
                && avail - size <= cap / 4 * 3
                && h.sleep.space_rung.swap(1, Ordering::SeqCst) == 0
            {
                futex_wake(&h.ring.ring_tail);
            }
            return Some(Ok(()));
        }
    }

    /// Worker side: the next thing to do, in the application's order: every posted request
    /// before a call (see the module's notes). Once the lane is closed, what was posted before
    /// still runs; then the lane ends with `WaitEnd::Closed`.
    pub fn next(&self, alive: &dyn Fn() -> bool) -> Result<Work, WaitEnd> {
        let mut bytes = Vec::new();
        Ok(match self.next_into(alive, &mut bytes)? {
            WorkKind::Posted => Work::Posted(bytes),
            WorkKind::Call => Work::Call(bytes),
        })
    }

    /// `next` with the request's bytes copied into `out` (replacing what it held): a worker
    /// that keeps `out` takes requests without allocating once it has grown.
    pub fn next_into(&self, alive: &dyn Fn() -> bool, out: &mut Vec<u8>) -> Result<WorkKind, WaitEnd> {
        let h = self.header();
        let out = std::cell::RefCell::new(out);
        let ready = || -> Option<Result<WorkKind, WaitEnd>> {
            let mut out = out.borrow_mut();
            // The calls first: a call seen here was made after every frame the ring holds now.
            let calls = h.app.calls.load(Ordering::Acquire);
            if let Some(frame) = self.take_frame(&mut out) {
                return Some(frame.map(|()| WorkKind::Posted));
            }
            if calls != h.reply.replies.load(Ordering::Relaxed) {
                let len = (h.app.req_len.load(Ordering::Relaxed) as usize).min(MSG_CAP);
                // SAFETY: len <= MSG_CAP, and at most INLINE_CAP where it is the header's; the
                // client touches neither until the call is answered.
                unsafe { copy_out(self.message_at(len, h.app.request.get().cast()), len, &mut out) };
                self.answering.store(calls, Ordering::Relaxed);
                return Some(Ok(WorkKind::Call));
            }
            (h.sleep.closed.load(Ordering::Acquire) != 0).then_some(Err(WaitEnd::Closed))
        };
        match ready() {
            Some(r) => r,
            None => {
                let sleep = &h.sleep;
                self.wait_on(&sleep.doorbell, &sleep.server_sleeping, alive, ready, || {
                    sleep.bell_rung.store(0, Ordering::SeqCst)
                })
            }
        }
    }

    /// Worker side: waits for the next call and returns a copy of it; posted requests before it
    /// are taken and dropped (for servers that run no posted work: test doubles, fuzzers).
    pub fn wait_request(&self, alive: &dyn Fn() -> bool) -> Result<Vec<u8>, WaitEnd> {
        loop {
            match self.next(alive)? {
                Work::Call(bytes) => return Ok(bytes),
                Work::Posted(_) => self.posted_done(),
            }
        }
    }

    /// Worker side: publishes the reply.
    pub fn post_reply(&self, bytes: &[u8]) -> Result<(), IpcError> {
        self.post_reply_parts(&[bytes])
    }

    /// `post_reply` of the concatenation of `parts`.
    pub fn post_reply_parts(&self, parts: &[&[u8]]) -> Result<(), IpcError> {
        // The worker owns the message area while the call is not answered.
        let h = self.header();
        let len = self
            .write_message(parts, h.reply.reply.get().cast())
            .ok_or(IpcError::Protocol("reply larger than the lane's message area"))?;
        h.reply.rep_len.store(len, Ordering::Relaxed);
        h.reply.replies.store(self.answering.load(Ordering::Relaxed), Ordering::SeqCst);
        if h.sleep.client_sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&h.reply.replies);
        }
        Ok(())
    }

    /// Marks the lane closed (its thread exited, or the peer died) and wakes any sleeper.
    pub fn close(&self) {
        let s = &self.header().sleep;
        s.closed.store(1, Ordering::SeqCst);
        // The sleepers' words move, so none sleeps on past it (a wake alone can come between a
        // sleeper's last look and its sleep).
        s.doorbell.fetch_add(1, Ordering::SeqCst);
        self.nudge();
    }

    /// Wakes every sleeper without changing anything, so each re-checks its `alive` probe.
    pub fn nudge(&self) {
        let h = self.header();
        futex_wake(&h.reply.replies);
        futex_wake(&h.ring.ring_tail);
        futex_wake(&h.ring.ring_done);
        futex_wake(&h.sleep.doorbell);
    }

    /// Waits until `ready` gives an answer: spins while it pays (`Spin`), then sleeps on `word`
    /// (counted in `sleepers`, so the other side wakes it; `before_sleep` runs each time) and
    /// polls `alive` every 100 ms.
    fn wait_on<T>(
        &self,
        word: &AtomicU32,
        sleepers: &AtomicU32,
        alive: &dyn Fn() -> bool,
        ready: impl Fn() -> Option<Result<T, WaitEnd>>,
        before_sleep: impl Fn(),
    ) -> Result<T, WaitEnd> {
        let start = Instant::now();
        let end = |r: Result<T, WaitEnd>| {
            self.spin.observe(start.elapsed());
            r
        };
        if let Some(r) = self.spin.spin(start, &ready) {
            return end(r);
        }
        loop {
            sleepers.fetch_add(1, Ordering::SeqCst);
            before_sleep();
            let seen = word.load(Ordering::SeqCst);
            let r = ready();
            if r.is_none() {
                futex_wait(word, seen, Duration::from_millis(100));
            }
            sleepers.fetch_sub(1, Ordering::SeqCst);
            if let Some(r) = r.or_else(&ready) {
                return end(r);
            }
            if !alive() {
                return end(Err(WaitEnd::PeerGone));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Lane, Lane) {
        let a = Lane::create().unwrap();
        let fd = a.region().fd().try_clone().unwrap();
        let b = Lane::from_region(SharedRegion::from_fd(fd, LANE_BYTES).unwrap()).unwrap();
        (a, b)
    }

    /// Posted frames and calls come out in the order they went in, across many ring wraps
    /// (the poster waits for space), and a call comes after every frame posted before it.
    #[test]
    fn posts_and_calls_keep_their_order_across_wraps() {
        let (client, server) = pair();
        let total = 20_000u32;
        let worker = std::thread::spawn(move || {
            let mut seen = Vec::new();
            loop {
                match server.next(&|| true) {
                    Ok(Work::Posted(b)) => {
                        seen.push(u32::from_le_bytes(b[..4].try_into().unwrap()));
                        server.posted_done();
                    }
                    Ok(Work::Call(b)) => {
                        let n = u32::from_le_bytes(b[..4].try_into().unwrap());
                        assert_eq!(seen.len() as u32, n, "a call overtook posted requests");
                        server.post_reply(&(seen.len() as u32).to_le_bytes()).unwrap();
                    }
                    Err(WaitEnd::Closed) => return seen,
                    Err(e) => panic!("{e:?}"),
                }
            }
        });
        for i in 0..total {
            // Frames of varying sizes, so wraps land at different offsets.
            let mut frame = i.to_le_bytes().to_vec();
            frame.resize(4 + (i as usize * 37) % 300, 0xAB);
            client.post(&frame, &|| true).unwrap();
            if i % 5000 == 4999 {
                client.post_request(&(i + 1).to_le_bytes()).unwrap();
                let mut r = Vec::new();
                client.wait_reply_into(&|| true, &mut r).unwrap();
                assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), i + 1);
            }
        }
        client.wait_drained(&|| true).unwrap();
        client.close();
        let seen = worker.join().unwrap();
        assert_eq!(seen, (0..total).collect::<Vec<_>>());
    }

    /// A message posted in parts arrives joined; a kept buffer that held a longer message
    /// holds exactly the new one; parts over the message area are refused, and the lane stays
    /// usable.
    #[test]
    fn parts_arrive_joined_into_kept_buffers() {
        let (client, server) = pair();
        let mut taken = vec![0xEE; 100];
        client.post_request_parts(&[b"head-", b"", b"body"]).unwrap();
        assert_eq!(server.next_into(&|| true, &mut taken), Ok(WorkKind::Call));
        assert_eq!(taken, b"head-body");
        server.post_reply_parts(&[b"re", b"ply"]).unwrap();
        let mut reply = vec![0xEE; 100];
        client.wait_reply_into(&|| true, &mut reply).unwrap();
        assert_eq!(reply, b"reply");
        let half = vec![0u8; MSG_CAP / 2 + 1];
        assert!(client.post_request_parts(&[&half, &half]).is_err());
        client.post(b"posted", &|| true).unwrap();
        client.post_request(b"call").unwrap();
        assert_eq!(server.next_into(&|| true, &mut taken), Ok(WorkKind::Posted));
        assert_eq!(taken, b"posted");
        assert_eq!(server.next_into(&|| true, &mut taken), Ok(WorkKind::Call));
        assert_eq!(taken, b"call");
        assert!(server.post_reply_parts(&[&half, &half]).is_err());
    }

    #[test]
    fn a_posts_mark_has_run_once_the_worker_has_run_it_and_not_before() {
        let (client, server) = pair();
        let marks: Vec<u32> = (0..3u8).map(|i| client.post(&[i; 8], &|| true).unwrap()).collect();
        assert!(marks.iter().all(|&m| !client.has_run(m)));
        for (i, &mark) in marks.iter().enumerate() {
            assert!(matches!(server.next(&|| true), Ok(Work::Posted(_))));
            assert!(!client.has_run(mark), "taken is not run");
            server.posted_done();
            assert!(client.has_run(mark));
            assert!(marks[i + 1..].iter().all(|&m| !client.has_run(m)), "later ones have not run");
        }
        // A worker's count from beyond the ring (hostile) is taken as run, never as a wait for
        // ever: it only hands back memory the worker itself was to read.
        let next = client.post(&[9; 8], &|| true).unwrap();
        server.header().ring.ring_done.store(next.wrapping_add(RING_CAP as u32 * 2), Ordering::SeqCst);
        assert!(client.has_run(next));
    }

    /// The poster reads the worker's tail only once the tail it saw last leaves no room: a
    /// hostile tail is met then, and refused, never used to place a frame.
    #[test]
    fn a_hostile_tail_is_a_protocol_error_not_a_write_out_of_bounds() {
        let (client, server) = pair();
        server.header().ring.ring_tail.store(0x8000_0000, Ordering::SeqCst);
        let frame = vec![0u8; MAX_POSTED - 4];
        let posted =
            (0..RING_CAP / MAX_POSTED).map(|_| client.post(&frame, &|| true)).take_while(Result::is_ok).count();
        assert_eq!(posted, RING_CAP / MAX_POSTED, "the ring's own room is used first");
        assert_eq!(client.post(&frame, &|| true), Err(PostError::Ended(WaitEnd::Protocol)));
        assert_eq!(
            client.header().app.ring_head.load(Ordering::SeqCst),
            RING_CAP as u32,
            "nothing placed past the ring"
        );
    }

    /// The application's own words in the header (its call count, the ring's head) are
    /// written, never believed: a worker that scribbles over them moves neither where the next
    /// frame goes nor which reply a call waits for.
    #[test]
    fn the_applications_words_are_its_own_whatever_the_worker_writes() {
        let (client, server) = pair();
        let first = client.post(&[1; 8], &|| true).unwrap();
        let app = &server.header().app;
        app.ring_head.store(0xDEAD_0000, Ordering::SeqCst);
        app.calls.store(77, Ordering::SeqCst);
        let second = client.post(&[2; 8], &|| true).unwrap();
        assert_eq!(second, first + 16, "the frame goes after the last one");
        assert_eq!(app.ring_head.load(Ordering::SeqCst), second, "and the head says so again");
        client.post_request(b"call").unwrap();
        assert_eq!(app.calls.load(Ordering::SeqCst), 1, "the first call is call 1");
        for expected in [Work::Posted(vec![1; 8]), Work::Posted(vec![2; 8]), Work::Call(b"call".to_vec())] {
            let work = server.next(&|| true).unwrap();
            if matches!(work, Work::Posted(_)) {
                server.posted_done();
            }
            assert_eq!(work, expected);
        }
        server.post_reply(b"answer").unwrap();
        let mut reply = Vec::new();
        client.wait_reply_into(&|| true, &mut reply).unwrap();
        assert_eq!(reply, b"answer");
    }

    /// A call's reply is the one the worker gave to that call, whole, whether it travels in the
    /// header (up to `INLINE_CAP` bytes) or in the message area: calls and posts one after the
    /// other (the counts move on in step), and a lane closed while a call waits ends the wait.
    #[test]
    fn each_call_gets_its_own_reply_and_a_closed_lane_ends_a_wait() {
        let (client, server) = pair();
        let mut reply = Vec::new();
        let message = |i: u32, salt: u8| -> Vec<u8> {
            let len = (i as usize * 13) % (2 * INLINE_CAP);
            (0..len).map(|k| (k as u8).wrapping_mul(31) ^ salt).chain(i.to_le_bytes()).collect()
        };
        let sizes: Vec<usize> = (0..1000).map(|i| message(i, 0).len()).collect();
        assert!(sizes.contains(&INLINE_CAP) && sizes.contains(&(INLINE_CAP + 1)), "both sides of the bound");
        for i in 0..1000u32 {
            if i % 3 == 0 {
                client.post(&i.to_le_bytes(), &|| true).unwrap();
                assert_eq!(server.next(&|| true), Ok(Work::Posted(i.to_le_bytes().to_vec())));
                server.posted_done();
            }
            client.post_request(&message(i, 0x5A)).unwrap();
            assert_eq!(server.next(&|| true), Ok(Work::Call(message(i, 0x5A))));
            server.post_reply(&message(i + 1, 0xC3)).unwrap();
            client.wait_reply_into(&|| true, &mut reply).unwrap();
            assert_eq!(reply, message(i + 1, 0xC3));
        }
        client.post_request(b"never answered").unwrap();
        assert_eq!(server.next(&|| true), Ok(Work::Call(b"never answered".to_vec())));
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            server.close();
        });
        assert_eq!(client.wait_reply_into(&|| true, &mut reply), Err(WaitEnd::Closed));
        closer.join().unwrap();
    }

    #[test]
    fn a_hostile_frame_length_is_a_protocol_error() {
        let (client, server) = pair();
        client.post(&[0; 16], &|| true).unwrap();
        // The "application" rewrites the frame's length past the published bytes.
        // SAFETY: the ring's first word, inside the mapping.
        unsafe { (client.ring_ptr() as *mut u32).write(1000) };
        assert_eq!(server.next(&|| true), Err(WaitEnd::Protocol));
    }

    #[test]
    fn a_full_ring_waits_and_gives_up_when_the_peer_is_gone() {
        let (client, _server) = pair();
        let frame = vec![0u8; MAX_POSTED - 4];
        let mut posted = 0;
        let r = loop {
            match client.post(&frame, &|| false) {
                Ok(_) => posted += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(r, PostError::Ended(WaitEnd::PeerGone));
        assert!(posted >= 3);
        assert_eq!(client.post(&vec![0u8; MAX_POSTED], &|| true), Err(PostError::TooLarge));
    }
}
