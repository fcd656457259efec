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
pub fn read_segment(region: &SharedRegion, len: u64) -> Option<Vec<u8>> {
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
pub fn write_segment(region: &SharedRegion, bytes: &[u8]) -> bool {
    let Some(dst) = region.slice_ptr(0, bytes.len() as u64) else { return false };
    // SAFETY: `dst` has room for `bytes.len()` bytes (checked by slice_ptr); a segment never
    // overlaps our own heap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    true
}

/// The worker's side of one lane: the reply it holds for the shim to fetch.
#[derive(Default)]
pub struct LaneSpill {
    held: Option<Vec<u8>>,
}

impl LaneSpill {
    /// Answers one lane message: `serve` runs the request's encoded bytes and returns the
    /// encoded reply, of any size; `segment` finds a segment the shim sent. Returns the frame
    /// to post, or why this lane cannot answer (the worker treats that as its own fault).
    /// A `TimeIt` request is answered `Timed`, with the time `serve` took: the only clock reads
    /// are for requests that ask.
    pub fn serve<S: std::ops::Deref<Target = SharedRegion>>(
        &mut self,
        msg: &[u8],
        segment: impl Fn(u64) -> Option<S>,
        serve: impl FnOnce(&[u8]) -> Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let frame = decode(msg);
        let Ok(Frame::TimeIt(RawBytes(inner))) = frame else { return self.answer(frame, segment, serve) };
        let mut worker_ns = 0u64;
        let framed = self.answer(decode(inner), segment, |request| {
            let start = std::time::Instant::now();
            let reply = serve(request);
            worker_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            reply
        })?;
        Ok(encode(&Frame::Timed { worker_ns, inner: RawBytes(&framed) }))
    }

    /// `serve` without the timing, for the decoded `frame` (a `TimeIt` in it is no request).
    fn answer<S: std::ops::Deref<Target = SharedRegion>>(
        &mut self,
        frame: Result<Frame<'_>, IpcError>,
        segment: impl Fn(u64) -> Option<S>,
        serve: impl FnOnce(&[u8]) -> Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        // A held reply is fetched by the very next message, or never (the shim gave up on it).
        let held = self.held.take();
        let reply = match frame {
            Ok(Frame::Inline(RawBytes(request))) => serve(request),
            Ok(Frame::InSegment { segment: id, len }) => {
                let region = segment(id).ok_or_else(|| format!("request segment {id} never arrived"))?;
                let request = read_segment(&region, len)
                    .ok_or_else(|| format!("request of {len} bytes does not fit segment {id}"))?;
                serve(&request)
            }
            Ok(Frame::Fetch { segment: id }) => {
                let held = held.ok_or("asked to fetch a reply it does not hold")?;
                let region = segment(id).ok_or_else(|| format!("reply segment {id} never arrived"))?;
                if !write_segment(&region, &held) {
                    return Err(format!("a reply of {} bytes does not fit segment {id}", held.len()));
                }
                return Ok(encode(&Frame::Fetched { len: held.len() as u64 }));
            }
            // Not a request: answered with no reply at all, which the shim reads as a fault.
            Ok(Frame::Held { .. } | Frame::Fetched { .. } | Frame::TimeIt(_) | Frame::Timed { .. }) | Err(_) => {
                return Ok(inline(&[]))
            }
        };
        if reply.len() <= INLINE_MAX {
            return Ok(inline(&reply));
        }
        let len = reply.len() as u64;
        if len > max_reply() {
            return Err(format!("a reply of {len} bytes is over the limit of {} bytes", max_reply()));
        }
        self.held = Some(reply);
        Ok(encode(&Frame::Held { len }))
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
        let out = lane.serve(&inline(b"ping"), find, |req| [req, b"-pong"].concat()).unwrap();
        assert_eq!(decode(&out).unwrap(), Frame::Inline(RawBytes(b"ping-pong")));
        // A request in a segment, its large reply held, then fetched into the segment.
        let big: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        assert!(write_segment(&seg, &big));
        let frame = encode(&Frame::InSegment { segment: 9, len: big.len() as u64 });
        let out = lane.serve(&frame, find, |req| req.iter().rev().copied().collect()).unwrap();
        assert_eq!(decode(&out).unwrap(), Frame::Held { len: big.len() as u64 });
        let out = lane.serve(&encode(&Frame::Fetch { segment: 9 }), find, |_| unreachable!()).unwrap();
        assert_eq!(decode(&out).unwrap(), Frame::Fetched { len: big.len() as u64 });
        let back = read_segment(&seg, big.len() as u64).unwrap();
        assert!(back.iter().eq(big.iter().rev()));
        // Held once: a second fetch, or one into a missing or too small segment, cannot answer.
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 9 }), find, |_| unreachable!()).is_err());
        let small = SharedRegion::create("small", 4096).unwrap();
        let _ = lane.serve(&frame, find, |req| req.to_vec()).unwrap();
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 1 }), |_| Some(&small), |_| unreachable!()).is_err());
        assert!(lane.serve(&encode(&Frame::Fetch { segment: 2 }), find, |_| unreachable!()).is_err());
        // A request past its segment's end is refused, not read.
        let past = encode(&Frame::InSegment { segment: 9, len: (8 << 20) + 1 });
        assert!(lane.serve(&past, find, |_| unreachable!()).is_err());
        // Garbage, or a reply-only frame, is answered with an empty reply (a fault in the shim).
        for junk in [vec![0xFF; 9], encode(&Frame::Held { len: 5 })] {
            let out = lane.serve(&junk, find, |_| unreachable!()).unwrap();
            assert_eq!(decode(&out).unwrap(), Frame::Inline(RawBytes(b"")));
        }
    }

    #[test]
    fn a_timed_request_is_answered_with_the_time_its_serving_took() {
        let mut lane = LaneSpill::default();
        let none = |_: u64| None::<&SharedRegion>;
        let asked = inline(b"ping");
        let out = lane
            .serve(&encode(&Frame::TimeIt(RawBytes(&asked))), none, |req| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                [req, b"-pong"].concat()
            })
            .unwrap();
        let Frame::Timed { worker_ns, inner: RawBytes(inner) } = decode(&out).unwrap() else { panic!("not timed") };
        assert!((20_000_000..2_000_000_000).contains(&worker_ns), "{worker_ns} ns");
        assert_eq!(decode(inner).unwrap(), Frame::Inline(RawBytes(b"ping-pong")));
        // An untimed request gets no time; a timed one inside another is no request.
        let out = lane.serve(&asked, none, |req| req.to_vec()).unwrap();
        assert_eq!(decode(&out).unwrap(), Frame::Inline(RawBytes(b"ping")));
        let twice = encode(&Frame::TimeIt(RawBytes(&encode(&Frame::TimeIt(RawBytes(&asked))))));
        let out = lane.serve(&twice, none, |_| unreachable!()).unwrap();
        let Frame::Timed { inner: RawBytes(inner), .. } = decode(&out).unwrap() else { panic!("not timed") };
        assert_eq!(decode(inner).unwrap(), Frame::Inline(RawBytes(b"")));
    }

    #[test]
    fn frames_reject_trailing_bytes() {
        let mut f = inline(b"abc");
        assert!(decode(&f).is_ok());
        f.push(0);
        assert!(decode(&f).is_err());
    }
}
