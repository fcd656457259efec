//! The flight recorder's shared layout: a memfd the broker creates for each worker. The worker
//! notes every call before running it (op, lane, start) and after (end); the broker's watchdog
//! reads the calls in flight, and after a death the broker reads the last calls, so a report can
//! say what the worker was doing even when it died by a signal with no chance to say anything.
//! The worker may be hostile: the broker treats every field as untrusted (indexes are bounded).

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use crate::shm::SharedRegion;
use crate::IpcError;

pub const RECORDER_MAGIC: u64 = u64::from_le_bytes(*b"cloFR004");
/// The fd number the worker finds its recorder at.
pub const RECORDER_FD: i32 = 4;
/// Lanes whose calls in flight are tracked (later lanes still log to the ring).
pub const LANE_SLOTS: usize = 64;
/// Calls kept in the ring.
pub const RING: usize = 256;

/// A call in flight on one lane. `op` is `deadlines::all_ops` index + 1; 0 = idle.
#[repr(C)]
pub struct LaneSlot {
    pub op: AtomicU32,
    pub lane: AtomicU32,
    pub start_ns: AtomicU64,
}

/// One finished call.
#[repr(C)]
pub struct RingEntry {
    pub op: AtomicU32,
    pub lane: AtomicU32,
    pub start_ns: AtomicU64,
    pub end_ns: AtomicU64,
}

#[repr(C)]
pub struct RecorderHeader {
    pub magic: AtomicU64,
    /// The system call the worker's own SIGSYS handler says seccomp trapped, or -1 (reported
    /// as the worker's word only).
    pub trapped_syscall: AtomicI64,
    /// Unused by the broker (kept for the layout): the watchdog's and the seccomp supervisor's
    /// verdicts stay in broker memory, since the worker can write anything here.
    pub hung_op: AtomicU32,
    pub next_slot: AtomicU32,
    /// Entries written to the ring so far (the ring holds the last `RING`).
    pub ring_head: AtomicU64,
    pub slots: [LaneSlot; LANE_SLOTS],
    pub ring: [RingEntry; RING],
    /// What the worker hosts and was last asked to build, for the report.
    pub device: TextSlot<256>,
    pub program_source: TextSlot<16384>,
    pub build_options: TextSlot<1024>,
    /// A fatal signal the worker says was sent from outside (by `kill`, not a fault of its own
    /// code): `signal << 32 | sender pid` (pid 0: outside the worker's PID namespace), or -1.
    /// The worker's word only, like `trapped_syscall`.
    pub outside_signal: AtomicI64,
}

/// A length-prefixed text field. Written by the worker, read by the broker with the length
/// bounded by the field, so a scribbled length cannot make the reader overrun.
#[repr(C)]
pub struct TextSlot<const N: usize> {
    len: AtomicU32,
    bytes: [std::sync::atomic::AtomicU8; N],
}

impl<const N: usize> TextSlot<N> {
    /// Worker side: stores (a prefix of) `text`.
    pub fn set(&self, text: &[u8]) {
        let n = text.len().min(N);
        self.len.store(0, Ordering::Release);
        for (slot, &b) in self.bytes.iter().zip(&text[..n]) {
            slot.store(b, Ordering::Relaxed);
        }
        self.len.store(n as u32, Ordering::Release);
    }

    /// Broker side: the text, if any.
    pub fn get(&self) -> Option<String> {
        let n = (self.len.load(Ordering::Acquire) as usize).min(N);
        if n == 0 {
            return None;
        }
        let bytes: Vec<u8> = self.bytes[..n].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

pub const RECORDER_BYTES: usize = std::mem::size_of::<RecorderHeader>().next_multiple_of(4096);

/// CLOCK_MONOTONIC in nanoseconds: the same clock in the worker and the broker.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One side's mapping of a recorder.
pub struct FlightRecorder {
    region: SharedRegion,
}

/// A call as read back from the recorder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub op: &'static str,
    pub lane: u32,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
}

/// A recorded op (index + 1 into `deadlines::all_ops`, lane calls then `EXTRA_OPS`) by name.
fn op_name(op: u32) -> Option<&'static str> {
    op.checked_sub(1).and_then(|i| crate::deadlines::all_ops().nth(i as usize))
}

impl FlightRecorder {
    pub fn create() -> Result<Self, IpcError> {
        let region = SharedRegion::create("cloister-recorder", RECORDER_BYTES)?;
        let r = Self { region };
        r.header().magic.store(RECORDER_MAGIC, Ordering::Release);
        r.header().trapped_syscall.store(-1, Ordering::Release);
        r.header().outside_signal.store(-1, Ordering::Release);
        Ok(r)
    }

    pub fn from_region(region: SharedRegion) -> Result<Self, IpcError> {
        if region.len() < RECORDER_BYTES {
            return Err(IpcError::Protocol("recorder region too small"));
        }
        Ok(Self { region })
    }

    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    pub fn header(&self) -> &RecorderHeader {
        // SAFETY: the region is page aligned and at least RECORDER_BYTES long; the header is
        // atomics only, valid for any bit pattern (a hostile worker can write anything).
        unsafe { &*(self.region.as_ptr() as *const RecorderHeader) }
    }

    /// Leaks the mapping so signal handlers and every lane thread can use it for the life of
    /// the process.
    pub fn leak(self) -> &'static RecorderHeader {
        let r: &'static FlightRecorder = Box::leak(Box::new(self));
        r.header()
    }

    /// Worker side: a slot for a new lane's calls in flight (None past `LANE_SLOTS`).
    pub fn claim_slot(h: &RecorderHeader) -> Option<usize> {
        let i = h.next_slot.fetch_add(1, Ordering::AcqRel) as usize;
        (i < LANE_SLOTS).then_some(i)
    }

    /// Worker side: a call begins.
    pub fn begin(h: &RecorderHeader, slot: Option<usize>, lane: u32, op: u32) -> u64 {
        let start = now_ns();
        if let Some(s) = slot.and_then(|i| h.slots.get(i)) {
            s.lane.store(lane, Ordering::Relaxed);
            s.start_ns.store(start, Ordering::Relaxed);
            s.op.store(op + 1, Ordering::Release);
        }
        start
    }

    /// Worker side: the call ended; it goes to the ring.
    pub fn end(h: &RecorderHeader, slot: Option<usize>, lane: u32, op: u32, start: u64) {
        if let Some(s) = slot.and_then(|i| h.slots.get(i)) {
            s.op.store(0, Ordering::Release);
        }
        let i = h.ring_head.fetch_add(1, Ordering::AcqRel) as usize % RING;
        let e = &h.ring[i];
        e.op.store(op + 1, Ordering::Relaxed);
        e.lane.store(lane, Ordering::Relaxed);
        e.start_ns.store(start, Ordering::Relaxed);
        e.end_ns.store(now_ns(), Ordering::Release);
    }

    /// Broker side: the calls in flight now.
    pub fn in_flight(&self) -> Vec<CallRecord> {
        self.header()
            .slots
            .iter()
            .filter_map(|s| {
                let op = op_name(s.op.load(Ordering::Acquire))?;
                Some(CallRecord {
                    op,
                    lane: s.lane.load(Ordering::Relaxed),
                    start_ns: s.start_ns.load(Ordering::Relaxed),
                    end_ns: None,
                })
            })
            .collect()
    }

    /// Broker side: the last finished calls, oldest first.
    pub fn last_calls(&self, max: usize) -> Vec<CallRecord> {
        let h = self.header();
        let head = h.ring_head.load(Ordering::Acquire) as usize;
        let n = head.min(RING).min(max);
        (head - n..head)
            .filter_map(|i| {
                let e = &h.ring[i % RING];
                let op = op_name(e.op.load(Ordering::Acquire))?;
                Some(CallRecord {
                    op,
                    lane: e.lane.load(Ordering::Relaxed),
                    start_ns: e.start_ns.load(Ordering::Relaxed),
                    end_ns: Some(e.end_ns.load(Ordering::Relaxed)),
                })
            })
            .collect()
    }

    pub fn hung_op(&self) -> Option<&'static str> {
        op_name(self.header().hung_op.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_in_flight_and_finished_are_read_back_bounded() {
        let r = FlightRecorder::create().unwrap();
        let h = r.header();
        let slot = FlightRecorder::claim_slot(h);
        let start = FlightRecorder::begin(h, slot, 3, 0);
        assert_eq!(r.in_flight()[0].op, crate::OP_NAMES[0]);
        FlightRecorder::end(h, slot, 3, 0, start);
        assert!(r.in_flight().is_empty());
        for _ in 0..RING + 5 {
            FlightRecorder::end(h, None, 1, 1, 0);
        }
        assert_eq!(r.last_calls(10).len(), 10);
        assert_eq!(r.last_calls(10)[9].op, crate::OP_NAMES[1]);
        // A hostile worker's op index out of range is ignored, not trusted.
        h.ring[0].op.store(u32::MAX, Ordering::Release);
        h.slots[5].op.store(9999, Ordering::Release);
        assert!(r.in_flight().is_empty());
    }
}
