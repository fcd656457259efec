//! Host timing per entry point (the Intercept Layer's HostPerformanceTiming): count, total, min,
//! mean and max of the time each call took in the application's thread, printed at exit; and
//! the same for device commands (DevicePerformanceTiming) per kernel name and global size, from
//! profiling events (see `device`).
//!
//! The host time is the whole of what the application waited for; each row splits it into the
//! driver's share (the worker's own time serving the calls, which it reports in every reply
//! while timing is on: `Frame::Timed`, clamped to the round trip the shim measured) and the
//! cage's (the rest: shim, transport, the worker's wake-up). A call that did not wait for a
//! reply (a posted enqueue, one the shim answers itself) is all cage: the driver's work for a
//! posted enqueue runs later, and shows in the device table and in the call that waits for it.

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
    /// The worker's time serving these calls (host table only).
    driver: Duration,
    /// How many of the calls waited for a reply from the worker.
    replies: u64,
}

type Table = Mutex<HashMap<String, Stat>>;

/// Host calls per entry point, and device commands per label (kernel name and global size).
fn tables() -> &'static (Table, Table) {
    static T: OnceLock<(Table, Table)> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn record(table: &Table, name: &str, d: Duration, driver: Option<Duration>) {
    let mut s = table.lock().unwrap_or_else(|e| e.into_inner());
    let e = match s.get_mut(name) {
        Some(e) => e,
        None => s.entry(name.to_string()).or_insert(Stat {
            count: 0,
            total: Duration::ZERO,
            min: Duration::MAX,
            max: Duration::ZERO,
            driver: Duration::ZERO,
            replies: 0,
        }),
    };
    if let Some(driver) = driver {
        e.driver += driver;
        e.replies += 1;
    }
    e.count += 1;
    e.total += d;
    e.min = e.min.min(d);
    e.max = e.max.max(d);
}

/// A host call that took `d`, of which `driver` was the worker's (when `replied`: the call
/// waited for at least one reply).
pub fn add(name: &str, d: Duration, driver: Duration, replied: bool) {
    record(&tables().0, name, d, replied.then_some(driver));
}

/// A device command's time, from the driver's profiling (start to end).
pub fn add_device(label: &str, d: Duration) {
    record(&tables().1, label, d, None);
}

/// `table`'s rows, most total time first.
fn rows(table: &Table) -> Vec<(String, Stat)> {
    let mut rows: Vec<(String, Stat)> =
        table.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.clone(), *v)).collect();
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(&b.0)));
    rows
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The host table: each entry point's time, split into the driver's and the cage's.
fn write_host_rows(out: &mut String, rows: &[(String, Stat)]) {
    let _ = writeln!(
        out,
        "{:<40} {:>9} {:>12} {:>12} {:>12} {:>7} {:>10} {:>10} {:>10}",
        "entry point", "calls", "total ms", "driver ms", "cage ms", "cage %", "min us", "mean us", "max us"
    );
    for (name, s) in rows {
        // No call of this row waited for the worker: the driver's share is unknown, not zero.
        let driver = if s.replies == 0 { "-".to_string() } else { format!("{:.3}", us(s.driver) / 1e3) };
        let cage = s.total.saturating_sub(s.driver);
        let _ = writeln!(
            out,
            "{name:<40} {:>9} {:>12.3} {driver:>12} {:>12.3} {:>7.1} {:>10.1} {:>10.1} {:>10.1}",
            s.count,
            us(s.total) / 1e3,
            us(cage) / 1e3,
            100.0 * cage.as_secs_f64() / s.total.as_secs_f64().max(1e-12),
            us(s.min),
            us(s.total) / s.count as f64,
            us(s.max)
        );
    }
}

/// The device table.
fn write_device_rows(out: &mut String, rows: &[(String, Stat)]) {
    let _ = writeln!(
        out,
        "{:<40} {:>9} {:>12} {:>10} {:>10} {:>10}",
        "command", "calls", "total ms", "min us", "mean us", "max us"
    );
    for (name, s) in rows {
        let _ = writeln!(
            out,
            "{name:<40} {:>9} {:>12.3} {:>10.1} {:>10.1} {:>10.1}",
            s.count,
            us(s.total) / 1e3,
            us(s.min),
            us(s.total) / s.count as f64,
            us(s.max)
        );
    }
}

/// The report as it stands: host calls, then device commands. Printed at exit, and sent to
/// `cloister timing` while the application runs.
pub fn render() -> String {
    let host = rows(&tables().0);
    let calls: u64 = host.iter().map(|r| r.1.count).sum();
    let total: Duration = host.iter().map(|r| r.1.total).sum();
    let driver: Duration = host.iter().map(|r| r.1.driver).sum();
    let wall = super::epoch().elapsed().as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cloister timing: {calls} calls in {wall:.3} s ({:.0} calls/s); host time per entry point: \
         {:.3} ms, of which the driver {:.3} ms and the cage {:.3} ms ({:.1} %)",
        calls as f64 / wall.max(1e-9),
        us(total) / 1e3,
        us(driver) / 1e3,
        us(total.saturating_sub(driver)) / 1e3,
        100.0 * total.saturating_sub(driver).as_secs_f64() / total.as_secs_f64().max(1e-12),
    );
    out.push_str(
        "  (driver: the worker's own time serving the calls, by its clock; cage: the rest, shim and transport; \
         posted enqueues and calls the shim answers itself wait for no reply, so their driver time (-) is not split)\n",
    );
    write_host_rows(&mut out, &host);
    let device = rows(&tables().1);
    if !device.is_empty() {
        let _ = writeln!(out, "cloister timing: device time per command (driver profiling, start to end)");
        write_device_rows(&mut out, &device);
    }
    out
}

/// Writes the report to its sink.
pub fn report(sink: &Sink) {
    sink.close(render().as_bytes());
}
