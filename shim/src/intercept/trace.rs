//! The Chrome/Perfetto trace (`ui.perfetto.dev`, `chrome://tracing`): one complete ("X") event
//! per host call on its thread's track. Each event is formatted whole, then written under the
//! sink's lock: events of different threads never interleave.

use std::cell::Cell;
use std::fmt::Write;
use std::time::{Duration, Instant};

use super::output::Sink;

fn pid() -> u32 {
    std::process::id()
}

/// The trace's start: the object, its array, and the process's name.
pub fn start(sink: &Sink) {
    let app = std::env::args().next().unwrap_or_default();
    let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let _ = write!(
        out,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
        pid(),
        json_escape(&app)
    );
    sink.write(out.as_bytes());
}

pub fn host_call(sink: &Sink, name: &str, start: Instant, elapsed: Duration, status: Option<i32>) {
    thread_local!(static NAMED: Cell<bool> = const { Cell::new(false) });
    let tid = super::thread_id();
    let mut out = String::with_capacity(160);
    if !NAMED.with(|n| n.replace(true)) {
        let thread = std::thread::current().name().map(str::to_string).unwrap_or_else(|| format!("thread {tid}"));
        let _ = write!(
            out,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":\"{}\"}}}}",
            pid(),
            json_escape(&thread)
        );
    }
    let _ = write!(
        out,
        ",\n{{\"name\":\"{name}\",\"cat\":\"host\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{},\"tid\":{tid}",
        super::micros(start),
        elapsed.as_secs_f64() * 1e6,
        pid()
    );
    if let Some(s) = status {
        let _ = write!(out, ",\"args\":{{\"status\":\"{}\"}}", super::names::status_name(s));
    }
    out.push('}');
    sink.write(out.as_bytes());
}

/// The end of the array and object; the file is complete JSON from here on.
pub fn finish(sink: &Sink) {
    sink.write(b"\n]}\n");
    sink.flush();
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}
