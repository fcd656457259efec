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

/// A device command the driver timed (`start`, `end`: its profiling timestamps, nanoseconds on
/// CLOCK_MONOTONIC_RAW), on its queue's track.
pub fn device_command(sink: &Sink, name: &str, queue: &str, start: u64, end: u64) {
    static NAMED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
    let track = 1_000_000 + queue.rsplit('#').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let mut out = String::with_capacity(200);
    {
        let mut named = NAMED.lock().unwrap_or_else(|e| e.into_inner());
        if !named.contains(&track) {
            named.push(track);
            let _ = write!(
                out,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{track},\"args\":{{\"name\":\"{queue} (device)\"}}}}",
                pid()
            );
        }
    }
    let origin = super::epoch_pair().1 as f64;
    let _ = write!(
        out,
        ",\n{{\"name\":\"{}\",\"cat\":\"device\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{},\"tid\":{track},\"args\":{{\"queue\":\"{queue}\"}}}}",
        json_escape(name),
        (start as f64 - origin) / 1e3,
        (end - start) as f64 / 1e3,
        pid()
    );
    sink.write(out.as_bytes());
}

/// The end of the array and object; the file is complete JSON from here on.
pub fn finish(sink: &Sink) {
    sink.close(b"\n]}\n");
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
