//! The start-up check of `cloister run`: before the application starts, each chosen driver is
//! started once in its cage and greeted, exactly as the shim will greet it. A library that is
//! not a driver, does not load, finds no platform, or dies in the cage, is one clear message
//! before anything runs, instead of three restarts, three crash reports and an application
//! without OpenCL that exits 0. The check's worker is ended as soon as it answered.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use cloister_ipc::handshake::Hello;
use cloister_ipc::{channel, ShimMessage, WorkerMessage};

use crate::broker::{self, WorkerOptions};
use crate::drivers::Driver;

/// A driver that answered: the profile it runs under, and the cage layers that are not on.
pub struct Checked {
    pub driver: Driver,
    pub weaker: Vec<String>,
}

/// Why a check failed: the worker refused its driver (a setup mistake, said by the worker), or
/// it died or hung while it started (a driver fault, reported by the broker).
enum Failure {
    Refused(String),
    Died(String),
    /// The cage killed it for a forbidden call: the same driver would do it again.
    Violated(String),
}

/// Starts `driver`'s worker in its cage, greets it, and ends it. A worker that dies while it
/// starts is replaced up to the crash-loop limit, as the shim does for an application (a crash
/// that does not come back is no reason to stop the run); one that hung until the `Initialize`
/// deadline, or that the cage killed for a forbidden call, is not (it would do it again).
pub fn check(options: &WorkerOptions, driver: &Driver) -> Result<Checked, String> {
    let (limit, _) = cloister_ipc::settings::crash_loop(Some(&driver.name));
    let patience = Duration::from_millis(initialize_ms(driver));
    let started = Instant::now();
    let mut tries = 1;
    loop {
        match check_once(options, driver) {
            Ok(c) => return Ok(c),
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Died(e)) if tries >= limit || started.elapsed() >= patience => {
                return Err(if tries > 1 { format!("{e} (after {tries} tries)") } else { e })
            }
            Err(Failure::Died(_)) => eprintln!("cloister: driver {}: starting another worker", driver.name),
            Err(Failure::Violated(e)) => return Err(e),
        }
        tries += 1;
    }
}

fn check_once(options: &WorkerOptions, driver: &Driver) -> Result<Checked, Failure> {
    let options = WorkerOptions { probe: true, ..options.clone() };
    let (sock, note, dismissal) = broker::spawn_worker(&options, driver, broker::ForApp::default())
        .map_err(|e| Failure::Refused(format!("cannot start its worker: {e}")))?;
    let greeted = greet(&sock, initialize_ms(driver) + 2000);
    drop(sock);
    if greeted.is_err() {
        // The worker died or refused: its reaper says why (the cage's verdict, a signal, an
        // exit status), unless it is still alive and hung.
        let end = Instant::now() + Duration::from_secs(2);
        while note.said().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if let Some(d) = &dismissal {
        d.now();
    }
    let died = note.said();
    match greeted {
        Ok(layers) => Ok(Checked {
            driver: driver.clone(),
            weaker: layers.into_iter().filter(|l| !l.ends_with(": on")).collect(),
        }),
        Err(e) if e.starts_with("refused") => Err(Failure::Refused(e)),
        // The broker said it already, with the report's path.
        Err(_) if died.as_deref().is_some_and(|d| d.contains("seccomp trapped")) => {
            Err(Failure::Violated("its worker broke the cage at start-up (above)".into()))
        }
        Err(_) if died.is_some() => Err(Failure::Died("its worker died at start-up (above)".into())),
        Err(e) => Err(Failure::Died(e)),
    }
}

/// The driver's `Initialize` deadline, in ms.
fn initialize_ms(driver: &Driver) -> u64 {
    cloister_ipc::deadlines::Deadlines::for_driver(Some(&driver.name)).for_op(cloister_ipc::deadlines::INITIALIZE)
}

/// Says hello and waits for the welcome (within `limit` ms): the cage's layers.
fn greet(sock: &OwnedFd, limit: u64) -> Result<Vec<String>, String> {
    channel::send(sock, &ShimMessage::Hello(Hello::new()), &[]).map_err(|e| e.to_string())?;
    if !channel::readable_within(sock, Duration::from_millis(limit)) {
        return Err(format!("its worker did not answer within {limit} ms"));
    }
    match channel::recv::<WorkerMessage>(sock) {
        Ok((WorkerMessage::Welcome { version, layers, .. }, _)) => {
            if version != cloister_ipc::handshake::PROTOCOL_VERSION {
                return Err(format!("its worker speaks protocol v{version} (a different cloister-worker?)"));
            }
            Ok(layers)
        }
        Ok((WorkerMessage::Refused { reason }, _)) => Err(format!("refused: {reason}")),
        Ok((WorkerMessage::Notify(_), _)) => Err("its worker sent a notification before its welcome".into()),
        Err(e) => Err(format!("its worker ended without a welcome ({e})")),
    }
}

/// The drivers an application runs with. Each is checked (at once, in parallel). A driver the
/// user named (`explicit`) must pass; of the registered ones, those that fail are left out with
/// one warning each (a stale `.icd` the ICD loader would skip in silence), and none left is an
/// error. A cage weaker than its profile asks for is said once per driver.
pub fn usable(options: &WorkerOptions, drivers: Vec<Driver>, explicit: bool) -> Result<Vec<Driver>, String> {
    let results: Vec<(Driver, Result<Checked, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = drivers.iter().map(|d| (d.clone(), s.spawn(move || check(options, d)))).collect();
        handles.into_iter().map(|(d, h)| (d, h.join().unwrap_or_else(|_| Err("its check panicked".into())))).collect()
    });
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (d, r) in results {
        match r {
            Ok(c) => {
                if !c.weaker.is_empty() && !options.no_sandbox {
                    // The layer names come from the worker: escaped before they reach a terminal.
                    let weaker = cloister_crash_reports::escape(&c.weaker.join("; "), false);
                    eprintln!("cloister: note: driver {} runs in a weaker cage: {weaker}", d.name);
                }
                ok.push(c.driver);
            }
            Err(e) => failed.push(format!("driver {} ({}) cannot be used: {e}", d.name, d.library)),
        }
    }
    if explicit || ok.is_empty() {
        if let Some(first) = failed.first() {
            return Err(if failed.len() == 1 { first.clone() } else { failed.join("\ncloister: ") });
        }
    }
    for f in failed {
        eprintln!("cloister: warning: {f}; it is left out");
    }
    Ok(ok)
}
