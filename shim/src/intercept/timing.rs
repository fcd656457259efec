//! Host timing per entry point (the Intercept Layer's HostPerformanceTiming): count, total, min,
//! mean and max of the time each call took in the application's thread, printed at exit; and
//! the same for device commands (DevicePerformanceTiming) per kernel name and global size, from
//! profiling events (see `device`).
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

type Table = Mutex<HashMap<String, Stat>>;

/// Host calls per entry point, and device commands per label (kernel name and global size).
fn tables() -> &'static (Table, Table) {
    static T: OnceLock<(Table, Table)> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn record(table: &Table, name: &str, d: Duration) {
    let mut s = table.lock().unwrap_or_else(|e| e.into_inner());
    let e = match s.get_mut(name) {
        Some(e) => e,
        None => s.entry(name.to_string()).or_insert(Stat {
            count: 0,
            total: Duration::ZERO,
            min: Duration::MAX,
            max: Duration::ZERO,
        }),
    };
    e.count += 1;
    e.total += d;
    e.min = e.min.min(d);
    e.max = e.max.max(d);
}

pub fn add(name: &str, d: Duration) {
    record(&tables().0, name, d);
}

/// A device command's time, from the driver's profiling (start to end).
pub fn add_device(label: &str, d: Duration) {
    record(&tables().1, label, d);
}

/// `table`'s rows, most total time first.
fn rows(table: &Table) -> Vec<(String, Stat)> {
    let mut rows: Vec<(String, Stat)> =
        table.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.clone(), *v)).collect();
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(&b.0)));
    rows
}

fn write_rows(out: &mut String, title: &str, rows: &[(String, Stat)]) {
    let _ = writeln!(
        out,
        "{title:<40} {:>9} {:>13} {:>11} {:>11} {:>11}",
        "calls", "total ms", "min us", "mean us", "max us"
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
}

/// The tables: host calls, then device commands.
pub fn report(sink: &Sink) {
    let host = rows(&tables().0);
    let calls: u64 = host.iter().map(|r| r.1.count).sum();
    let wall = super::epoch().elapsed().as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cloister timing: {calls} calls in {wall:.3} s ({:.0} calls/s); host time per entry point (shim + transport + driver)",
        calls as f64 / wall.max(1e-9)
    );
    write_rows(&mut out, "entry point", &host);
    let device = rows(&tables().1);
    if !device.is_empty() {
        let _ = writeln!(out, "cloister timing: device time per command (driver profiling, start to end)");
        write_rows(&mut out, "command", &device);
    }
    sink.write(out.as_bytes());
    sink.flush();
}
