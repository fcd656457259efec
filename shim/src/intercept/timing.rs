//! Host timing per entry point (the Intercept Layer's HostPerformanceTiming): count, total, min,
//! mean and max of the time each call took in the application's thread, printed at exit.
//!
//! This is the whole of what the application waited for: shim, transport and the driver's work
//! in the worker together. The worker's own share is not measured separately yet (it would need
//! a time in every reply).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::output::Sink;

#[derive(Clone, Copy)]
struct Stat {
    count: u64,
    total: Duration,
    min: Duration,
    max: Duration,
}

fn stats() -> &'static Mutex<HashMap<&'static str, Stat>> {
    static STATS: OnceLock<Mutex<HashMap<&'static str, Stat>>> = OnceLock::new();
    STATS.get_or_init(Default::default)
}

pub fn add(name: &'static str, d: Duration) {
    let mut s = stats().lock().unwrap_or_else(|e| e.into_inner());
    let e = s.entry(name).or_insert(Stat { count: 0, total: Duration::ZERO, min: Duration::MAX, max: Duration::ZERO });
    e.count += 1;
    e.total += d;
    e.min = e.min.min(d);
    e.max = e.max.max(d);
}

/// The table, most total time first.
pub fn report(sink: &Sink) {
    let mut rows: Vec<(&str, Stat)> =
        stats().lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, *v)).collect();
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    let calls: u64 = rows.iter().map(|r| r.1.count).sum();
    let wall = super::epoch().elapsed().as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cloister timing: {calls} calls in {wall:.3} s ({:.0} calls/s); host time per entry point (shim + transport + driver)",
        calls as f64 / wall.max(1e-9)
    );
    let _ = writeln!(
        out,
        "{:<40} {:>9} {:>13} {:>11} {:>11} {:>11}",
        "entry point", "calls", "total ms", "min us", "mean us", "max us"
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, s) in rows {
        let _ = writeln!(
            out,
            "{name:<40} {:>9} {:>13.3} {:>11.1} {:>11.1} {:>11.1}",
            s.count,
            us(s.total) / 1e3,
            us(s.min),
            us(s.total) / s.count as f64,
            us(s.max)
        );
    }
    sink.write(out.as_bytes());
    sink.flush();
}
