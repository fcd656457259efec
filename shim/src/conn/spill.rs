//! The shim's side of `cloister_ipc::spill`: lane messages of any size, both ways. Part of the
//! transport (`conn`).

use cloister_ipc::cl::{cl_int, CL_OUT_OF_HOST_MEMORY};
use cloister_ipc::spill::{self, INLINE_MAX};
use cloister_ipc::{Frame, RawBytes};

use super::{Conn, Segment};

/// Sends one encoded request and hands its encoded reply to `then`, whatever their sizes.
/// `round_trip` posts one frame, given in parts, on the calling thread's lane and waits for
/// the answer's frame into the buffer it is given (with the call's deadline); `reply` is that
/// buffer, which the caller may keep between calls. `call` names the call in warnings.
pub(crate) fn exchange<R>(
    conn: &Conn,
    call: &str,
    request: &[u8],
    reply: &mut Vec<u8>,
    mut round_trip: impl FnMut(&[&[u8]], &mut Vec<u8>) -> Result<(), cl_int>,
    then: impl FnOnce(&[u8]) -> R,
) -> Result<R, cl_int> {
    // While the timing report is on, the worker is asked for its own time (`Frame::TimeIt`).
    let timed = conn.above().timing();
    let mut send = |frame: &[&[u8]], reply: &mut Vec<u8>| {
        if !timed {
            return round_trip(frame, reply);
        }
        let start = std::time::Instant::now();
        round_trip(&[&spill::encode(&Frame::TimeIt(RawBytes(&frame.concat())))], reply)?;
        let waited = start.elapsed();
        match spill::decode(reply) {
            Ok(Frame::Timed { worker_ns, inner: RawBytes(inner) }) => {
                conn.above().worker_time(worker_ns, waited);
                *reply = inner.to_vec();
                Ok(())
            }
            _ => Err(conn.reject(call, "an untimed answer to a timed request")),
        }
    };
    if request.len() <= INLINE_MAX {
        send(&[spill::inline_header(request.len()).as_bytes(), request], reply)?;
    } else {
        let seg = conn.acquire_segment(request.len())?;
        let posted = if spill::write_segment(&*seg.region, request) {
            send(&[&spill::encode(&Frame::InSegment { segment: seg.id, len: request.len() as u64 })], reply)
        } else {
            Err(CL_OUT_OF_HOST_MEMORY)
        };
        give_back(conn, seg);
        posted?;
    }
    match spill::decode(reply) {
        Ok(Frame::Inline(RawBytes(bytes))) => Ok(then(bytes)),
        Ok(Frame::Held { len }) => fetch(conn, call, len, round_trip).map(|held| then(&held)),
        _ => Err(conn.reject(call, "a reply that is no lane frame")),
    }
}

/// Fetches a reply of `len` bytes the worker holds, into a segment this side makes: the worker
/// never sizes memory here, only says how much it has, and that is checked first.
fn fetch(
    conn: &Conn,
    call: &str,
    len: u64,
    mut round_trip: impl FnMut(&[&[u8]], &mut Vec<u8>) -> Result<(), cl_int>,
) -> Result<Vec<u8>, cl_int> {
    if len <= INLINE_MAX as u64 || len > spill::max_reply() {
        return Err(conn.reject(call, &format!("a held reply of {len} bytes (limit {} bytes)", spill::max_reply())));
    }
    let seg = conn.acquire_segment(len as usize)?;
    let mut answer = Vec::new();
    let asked = round_trip(&[&spill::encode(&Frame::Fetch { segment: seg.id })], &mut answer);
    let fetched = match asked.map(|()| spill::decode(&answer)) {
        Ok(Ok(Frame::Fetched { len: got })) if got == len => spill::read_segment(&*seg.region, len),
        Ok(_) => None,
        Err(e) => {
            give_back(conn, seg);
            return Err(e);
        }
    };
    give_back(conn, seg);
    fetched.ok_or_else(|| conn.reject(call, "no held reply where it said"))
}

/// A spill segment goes back to the pool once its message is through (a dead worker's pool
/// goes with its connection).
fn give_back(conn: &Conn, seg: Segment) {
    if !conn.is_dead() {
        conn.release_segment(seg);
    }
}
