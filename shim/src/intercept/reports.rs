//! Reports on demand: while the timing report is on, the shim keeps a second connection to its
//! broker, on which a thread of its own answers the broker's `Query` with the report as it
//! stands (`cloister timing PID`), without stopping the application. The broker asks with a
//! deadline and reads at most one frame (`channel::MAX_FRAME`): a report is cut to fit.

use std::os::fd::AsRawFd;

use cloister_ipc::handshake::Hello;
use cloister_ipc::{channel, BrokerReply, BrokerRequest};

/// Room left in a frame for the message around the report's text.
const ROOM: usize = 4096;

/// Starts the thread that answers for this process on a new connection to the broker at `path`.
/// Nothing happens if the connection cannot be made: the report at exit is still written.
pub fn serve(path: &str) {
    let sock = match channel::connect_seqpacket(std::path::Path::new(path)) {
        Ok(s) => s,
        Err(e) => return crate::runtime::warn(&format!("timing reports on demand: cannot reach the broker: {e}")),
    };
    if let Err(e) = cloister_ipc::private::check_peer_is_us(sock.as_raw_fd(), std::path::Path::new(path)) {
        return crate::runtime::warn(&e);
    }
    if channel::send(&sock, &BrokerRequest::ServeReports(Hello::new()), &[]).is_err() {
        return;
    }
    let spawned = std::thread::Builder::new().name("cloister-reports".into()).spawn(move || {
        // Until the broker closes the connection, refuses us, or says something else.
        while let Ok((BrokerReply::Query, _)) = channel::recv::<BrokerReply>(&sock) {
            let timing = (super::active() & super::TIMING != 0).then(|| fit(super::timing::render()));
            if channel::send(&sock, &BrokerRequest::Report { timing }, &[]).is_err() {
                break;
            }
        }
    });
    if let Err(e) = spawned {
        crate::runtime::warn(&format!("timing reports on demand: cannot start a thread: {e}"));
    }
}

/// `text` cut (at a line) to fit one frame.
fn fit(mut text: String) -> String {
    let max = channel::MAX_FRAME - ROOM;
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = text[..end].rfind('\n').map_or(0, |i| i + 1);
        text.truncate(cut);
        text.push_str("(cut to fit one message)\n");
    }
    text
}
