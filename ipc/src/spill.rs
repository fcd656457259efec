//! Lane messages of any size. A lane's message area is bounded, but a program binary, a
//! source, an IL, an info value or a build log is not: every lane message travels in a
//! `Frame`, inline when it is small, else through a sealed shared segment.
//!
//! - A request above `INLINE_MAX` is written by the shim into a segment it created (sealed,
//!   sent with `NewSegment`), and the frame says `InSegment { segment, len }`.
//! - A reply above `INLINE_MAX` is never sized by the worker in memory the shim trusts: the
//!   worker answers `Held { len }` and keeps the bytes; the shim checks `len` against its limit,
//!   makes a segment of that size itself and asks `Fetch { segment }`; the worker copies the
//!   reply there and answers `Fetched { len }`. The reply is then decoded and checked as usual.
//!
//! Both sides copy a spilled message out of the segment before decoding it (the peer still has
//! the segment mapped). Over a byte stream every frame would simply be `Inline`.

use crate::shm::Mapped;
#[cfg(test)]
use crate::shm::SharedRegion;
use crate::{Frame, IpcError, RawBytes};

/// Messages up to this size travel inline, in the lane's message area.
pub const INLINE_MAX: usize = 1 << 20;
// The frame's own header (variant and length) must fit next to the largest inline message, twice
// over for a timed one (`TimeIt` or `Timed`, with its time: up to 10 bytes more).
const _: () = assert!(INLINE_MAX + 48 <= crate::lane::MSG_CAP);

/// The worker's exit status when a lane cannot post its reply (see the worker's `cannot_reply`).
pub const EXIT_CANNOT_REPLY: i32 = 70;

/// The default limit on a reply the shim fetches (1 GiB): the largest program binary, source or
/// info value an application is expected to read back.
const DEFAULT_MAX_REPLY: u64 = 1 << 30;

/// The largest reply a worker may hold and the shim fetches, in bytes
/// (`CLOISTER_MAX_REPLY_MB` overrides the default; both sides read it). A worker whose reply
/// is larger cannot answer, which is a fault; a shim told of a larger one treats the worker as
/// misbehaving.
pub fn max_reply() -> u64 {
    static MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| match crate::settings::number("max_reply_mb", None) {
        0 => DEFAULT_MAX_REPLY,
        mb => mb.saturating_mul(1 << 20),
    })
}

/// Encodes a frame (encoding a frame cannot fail: it holds only integers and bytes).
pub fn encode(frame: &Frame) -> Vec<u8> {
    postcard::to_allocvec(frame).unwrap_or_default()
}

/// The frame of a message that travels inline.
pub fn inline(msg: &[u8]) -> Vec<u8> {
    encode(&Frame::Inline(RawBytes(msg)))
}

/// Decodes a frame; trailing bytes are an error.
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, IpcError> {
    let (frame, rest) = postcard::take_from_bytes(bytes).map_err(IpcError::Decode)?;
    if !rest.is_empty() {
        return Err(IpcError::Protocol("trailing bytes after a lane frame"));
    }
    Ok(frame)
}

/// A copy of the first `len` bytes of `region`, if it holds that many.
pub fn read_segment(region: &impl Mapped, len: u64) -> Option<Vec<u8>> {
    let src = region.slice_ptr(0, len)?;
    let len = usize::try_from(len).ok()?;
    let mut out = Vec::new();
    out.try_reserve_exact(len).ok()?;
    // SAFETY: `src` has `len` readable bytes (checked by slice_ptr); `out` has capacity `len`,
    // and its length is set once they are copied.
    unsafe {
        std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len);
        out.set_len(len);
    }
    Some(out)
}

/// Writes `bytes` to the start of `region`; false if it does not fit.
pub fn write_segment(region: &impl Mapped, bytes: &[u8]) -> bool {
    let Some(dst) = region.slice_ptr(0, bytes.len() as u64) else { return false };
    // SAFETY: `dst` has room for `bytes.len()` bytes (checked by slice_ptr); a segment never
    // overlaps our own heap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    true
}

/// The header `inline` puts before a message of `len` bytes (postcard: the variant's index,
/// then the length, both as varints): a side that has its message encoded already sends the
/// two parts without joining them.
pub fn inline_header(len: usize) -> InlineHeader {
    let mut h = InlineHeader { bytes: [0; INLINE_HEADER_MAX], len: 1 };
    // Index 0 is `Frame::Inline`, one byte; then the length in 7-bit groups, low first.
    let mut rest = len as u64;
    loop {
        let low = (rest & 0x7F) as u8;
        rest >>= 7;
        h.bytes[h.len] = low | if rest > 0 { 0x80 } else { 0 };
        h.len += 1;
        if rest == 0 {
            return h;
        }
    }
}

/// The longest `inline_header`: the variant's byte and a 64-bit varint.
pub const INLINE_HEADER_MAX: usize = 11;

/// An `Inline` frame's header (`inline_header`).
pub struct InlineHeader {
    bytes: [u8; INLINE_HEADER_MAX],
    len: usize,
}

impl InlineHeader {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The most a scratch buffer kept between messages (`LaneSpill`'s, the shim's per thread)
/// holds on to: one large message does not pin its memory for the lane's life.
pub const SCRATCH_KEEP: usize = 64 << 10;

/// Empties `buf`, and lets its memory go if a large message grew it past `SCRATCH_KEEP`.
pub fn reset_scratch(buf: &mut Vec<u8>) {
    if buf.capacity() > SCRATCH_KEEP {
        *buf = Vec::new();
    }
    buf.clear();
}

/// The worker's side of one lane: the reply it holds for the shim to fetch, and the answer it
/// builds, kept between messages so that answering allocates nothing once it has grown.
#[derive(Default)]
pub struct LaneSpill {
    held: Option<Vec<u8>>,
    /// `INLINE_HEADER_MAX` bytes of room for the frame's header, then the reply as `serve`
    /// encoded it; or another frame.
    out: Vec<u8>,
    /// A `Timed` answer.
    timed: Vec<u8>,
}

impl LaneSpill {
    /// Answers one lane message: `serve` runs the request's encoded bytes and appends the
    /// encoded reply, of any size, to the buffer it is given; `segment` finds a segment the
    /// shim sent. Returns the frame to post, or why this lane cannot answer (the worker treats
    /// that as its own fault). A `TimeIt` request is answered `Timed`, with the time `serve`
    /// took: the only clock reads are for requests that ask.
    pub fn serve<S: std::ops::Deref<Target = M>, M: Mapped>(
        &mut self,
        msg: &[u8],
        segment: impl Fn(u64) -> Option<S>,
        serve: impl FnOnce(&[u8], &mut Vec<u8>),
    ) -> Result<&[u8], String> {
        let frame = decode(msg);
        let Ok(Frame::TimeIt(RawBytes(inner))) = frame else {
            let at = self.answer(frame, segment, serve)?;
            return Ok(&self.out[at..]);
        };
        let mut worker_ns = 0u64;
        let at = self.answer(decode(inner), segment, |request, out| {
            let start = std::time::Instant::now();
            serve(request, out);
            worker_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        })?;
        self.timed = encode(&Frame::Timed { worker_ns, inner: RawBytes(&self.out[at..]) });
        Ok(&self.timed)
    }

    /// `serve` without the timing, for the decoded `frame` (a `TimeIt` in it is no request):
    /// the answer is `self.out` from the offset returned.
    fn answer<S: std::ops::Deref<Target = M>, M: Mapped>(
        &mut self,
        frame: Result<Frame<'_>, IpcError>,
        segment: impl Fn(u64) -> Option<S>,
        serve: impl FnOnce(&[u8], &mut Vec<u8>),
    ) -> Result<usize, String> {
        // A held reply is fetched by the very next message, or never (the shim gave up on it).
        let held = self.held.take();
        reset_scratch(&mut self.out);
        self.out.resize(INLINE_HEADER_MAX, 0);
        match frame {
            Ok(Frame::Inline(RawBytes(request))) => serve(request, &mut self.out),
            Ok(Frame::InSegment { segment: id, len }) => {
                let region = segment(id).ok_or_else(|| format!("request segment {id} never arrived"))?;
                let request = read_segment(&*region, len)
                    .ok_or_else(|| format!("request of {len} bytes does not fit segment {id}"))?;
                serve(&request, &mut self.out)
            }
            Ok(Frame::Fetch { segment: id }) => {
                let held = held.ok_or("asked to fetch a reply it does not hold")?;
                let region = segment(id).ok_or_else(|| format!("reply segment {id} never arrived"))?;
                if !write_segment(&*region, &held) {
                    return Err(format!("a reply of {} bytes does not fit segment {id}", held.len()));
                }
                return Ok(self.put(&Frame::Fetched { len: held.len() as u64 }));
            }
            // Not a request: answered with no reply at all, which the shim reads as a fault.
            Ok(Frame::Held { .. } | Frame::Fetched { .. } | Frame::TimeIt(_) | Frame::Timed { .. }) | Err(_) => {
                return Ok(self.put(&Frame::Inline(RawBytes(&[]))))
            }
        }
        let len = self.out.len() - INLINE_HEADER_MAX;
        if len <= INLINE_MAX {
            // The header goes right before the reply, in the room left for it.
            let header = inline_header(len);
            let at = INLINE_HEADER_MAX - header.as_bytes().len();
            self.out[at..INLINE_HEADER_MAX].copy_from_slice(header.as_bytes());
            return Ok(at);
        }
        if len as u64 > max_reply() {
            return Err(format!("a reply of {len} bytes is over the limit of {} bytes", max_reply()));
        }
        let mut reply = std::mem::take(&mut self.out);
        reply.drain(..INLINE_HEADER_MAX);
        self.held = Some(reply);
        Ok(self.put(&Frame::Held { len: len as u64 }))
    }

    /// Makes `frame` the whole answer.
    fn put(&mut self, frame: &Frame) -> usize {
        self.out.clear();
        // Encoding a frame cannot fail: it holds only integers and bytes.
        let _ = crate::encode_into(frame, &mut self.out);
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_travel_inline_and_large_ones_both_ways_through_segments() {
        let mut lane = LaneSpill::default();
        let seg = SharedRegion::create("test", 8 << 20).unwrap();
        let find = |id: u64| (id == 9).then_some(&seg);
        // Inline both ways.
        let out = lane.serve(&inline(b"ping"), find, |req, out| out.extend([req, b"-pong"].concat())).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Inline(RawBytes(b"ping-pong")));
        // A request in a segment, its large reply held, then fetched into the segment.
        let big: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        assert!(write_segment(&seg, &big));
        let frame = encode(&Frame::InSegment { segment: 9, len: big.len() as u64 });
        let out = lane.serve(&frame, find, |req, out| out.extend(req.iter().rev())).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Held { len: big.len() as u64 });
        let out = lane.serve(&encode(&Frame::Fetch { segment: 9 }), find, |_, _| unreachable!()).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Fetched { len: big.len() as u64 });
        let back = read_segment(&seg, big.len() as u64).unwrap();
        assert!(back.iter().eq(big.iter().rev()));
        // Held once: a second fetch, or one into a missing or too small segment, cannot answer.
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 9 }), find, |_, _| unreachable!()).is_err());
        let small = SharedRegion::create("small", 4096).unwrap();
        let _ = lane.serve(&frame, find, |req, out| out.extend(req)).unwrap();
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 1 }), |_| Some(&small), |_, _| unreachable!()).is_err());
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 2 }), find, |_, _| unreachable!()).is_err());
        // A request past its segment's end is refused, not read.
        let past = encode(&Frame::InSegment { segment: 9, len: (8 << 20) + 1 });
        assert!(lane.serve(&past, find, |_, _| unreachable!()).is_err());
        // Garbage, or a reply-only frame, is answered with an empty reply (a fault in the shim).
        for junk in [vec![0xFF; 9], encode(&Frame::Held { len: 5 })] {
            let out = lane.serve(&junk, find, |_, _| unreachable!()).unwrap();
            assert_eq!(decode(out).unwrap(), Frame::Inline(RawBytes(b"")));
        }
    }

    #[test]
    fn a_timed_request_is_answered_with_the_time_its_serving_took() {
        let mut lane = LaneSpill::default();
        let none = |_: u64| None::<&SharedRegion>;
        let asked = inline(b"ping");
        let out = lane
            .serve(&encode(&Frame::TimeIt(RawBytes(&asked))), none, |req, out| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                out.extend([req, b"-pong"].concat())
            })
            .unwrap();
        let Frame::Timed { worker_ns, inner: RawBytes(inner) } = decode(out).unwrap() else { panic!("not timed") };
        assert!((20_000_000..2_000_000_000).contains(&worker_ns), "{worker_ns} ns");
        assert_eq!(decode(inner).unwrap(), Frame::Inline(RawBytes(b"ping-pong")));
        // An untimed request gets no time; a timed one inside another is no request.
        let out = lane.serve(&asked, none, |req, out| out.extend(req)).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Inline(RawBytes(b"ping")));
        let twice = encode(&Frame::TimeIt(RawBytes(&encode(&Frame::TimeIt(RawBytes(&asked))))));
        let out = lane.serve(&twice, none, |_, _| unreachable!()).unwrap();
        let Frame::Timed { inner: RawBytes(inner), .. } = decode(out).unwrap() else { panic!("not timed") };
        assert_eq!(decode(inner).unwrap(), Frame::Inline(RawBytes(b"")));
    }

    #[test]
    fn an_inline_header_is_what_inline_puts_before_the_message() {
        for len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000, INLINE_MAX] {
            let msg = vec![7u8; len];
            assert_eq!([inline_header(len).as_bytes(), &msg].concat(), inline(&msg), "{len} bytes");
        }
        assert_eq!(inline_header(usize::MAX).as_bytes().len(), INLINE_HEADER_MAX);
    }

    /// A kept buffer a large message grew is let go; a small one keeps its memory.
    #[test]
    fn scratch_buffers_let_large_growth_go() {
        let mut small = Vec::with_capacity(1024);
        small.extend_from_slice(b"old");
        reset_scratch(&mut small);
        assert!(small.is_empty() && small.capacity() >= 1024);
        let mut large = vec![1u8; SCRATCH_KEEP + 1];
        reset_scratch(&mut large);
        assert!(large.is_empty() && large.capacity() == 0);
        // The worker's answer buffer after a held (large) reply starts small again.
        let mut lane = LaneSpill::default();
        let none = |_: u64| None::<&SharedRegion>;
        let out = lane.serve(&inline(b"x"), none, |_, out| out.resize(out.len() + INLINE_MAX + 1, 7)).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Held { len: INLINE_MAX as u64 + 1 });
        assert!(lane.out.capacity() <= SCRATCH_KEEP);
        let out = lane.serve(&inline(b"x"), none, |_, out| out.extend_from_slice(b"ok")).unwrap();
        assert_eq!(decode(out).unwrap(), Frame::Inline(RawBytes(b"ok")));
    }

    #[test]
    fn frames_reject_trailing_bytes() {
        let mut f = inline(b"abc");
        assert!(decode(&f).is_ok());
        f.push(0);
        assert!(decode(&f).is_err());
    }
}
