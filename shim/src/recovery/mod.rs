//! Recovery by replay (`CLOISTER_RECOVERY=replay`, or `auto`, the default, for a driver whose
//! devices share the host's memory): the application's objects and memory contents are
//! rebuilt in the replacement of a worker that died, under the same handles and the same ids,
//! and the commands the dead worker may have lost are run again, so an application that never
//! recreates its context carries on (DESIGN.md, Faults).
//!
//! What is kept, per worker (`Journal`, in the connection):
//! - a recipe per object the shim can rebuild (the creating request, the program's build, a
//!   context's `pfn_notify`, a user event's status); the shim allocates object ids, so the
//!   same requests create the same ids in the replacement, and only device and platform ids
//!   (the worker's own) are translated;
//! - per buffer, its contents at the last checkpoint (`Base`), and the commands enqueued since
//!   (`Cmd`): writes with their data, kernels with all their arguments, copies, fills, markers.
//!
//! A checkpoint makes every buffer's contents known at one point, so the journal before it can
//! go: taken when it costs nothing (the application's blocking read of a whole buffer, when
//! nothing else was written since), or when the journal grows long (the shim reads back what
//! commands wrote, at a blocking read or `clFinish`). Everything is bounded by
//! `CLOISTER_RECOVERY_BUDGET_MB`: a buffer whose contents do not fit is lost (it answers
//! `CL_DEVICE_NOT_AVAILABLE` after a crash, as today) until a checkpoint reads it back.
//!
//! Replay restores every buffer to its checkpoint before any command runs again, so a kernel
//! that ran partly before the crash is rerun on its inputs, never on half-updated memory.
//! A step that crashes the replacement worker too is tried `RETRIES` more times at most, then
//! dropped: its event fails, what it writes is lost, and the context's `pfn_notify` says so.
//!
//! `journal` keeps the record (recipes, contents, the journal, checkpoints); `rebuild` makes it
//! again in a replacement and carries the handles over; this module has the mode, the retry of
//! calls that met a death, and the creating calls' recording.
//!
//! Layer: above the handle table, below the runtime. It imports `conn`, `handle` and the
//! leaves, never `pending` or `runtime` (the account for the broker is handed to
//! `carry_over`); the journal is per-connection state (`journal_of`), and the layers below
//! tell it what it records through `conn::Above`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cloister_ipc::cl::*;
use cloister_ipc::Call;

use crate::conn::{any_death_met, met_death, take_met_death, Conn};

mod gated;
mod journal;
mod rebuild;

pub use journal::{image_box, Journal, Unmapping, WriteDone};
pub use rebuild::{carry_over, fire_kept_callbacks, keep_event_callback, rebuild, write_buffer, write_image, Outcome};

/// What replay mode keeps of `conn`'s objects, kept there (`Conn::state`).
pub fn journal_of(conn: &Conn) -> &Journal {
    conn.state()
}

/// How many times a step that crashed the driver is run again before it is dropped.
pub const RETRIES: u32 = 2;

/// Whether any worker of this process may be replayed (`base` has it, as the layers below
/// read it too). Whether a given worker's objects are recorded and rebuilt is
/// `Conn::replays` (settled under `auto` by `api::device::decide_recovery`).
pub use crate::base::replay as on;

fn budget() -> u64 {
    static B: OnceLock<u64> = OnceLock::new();
    *B.get_or_init(|| cloister_ipc::settings::recovery_budget_mb().saturating_mul(1 << 20))
}

/// Dead workers whose deaths the shim has dealt with, by serial: whether their objects were
/// carried over to a replacement.
#[derive(Default)]
struct Concluded {
    deaths: Mutex<HashMap<u64, bool>>,
    changed: std::sync::Condvar,
}

fn concluded() -> &'static Concluded {
    static C: OnceLock<Concluded> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The death of worker `serial` has been dealt with (its objects carried over or not): calls
/// that met it (`retrying`) stop waiting.
pub fn conclude(serial: u64) {
    let c = concluded();
    c.deaths.lock().unwrap_or_else(|e| e.into_inner()).entry(serial).or_insert(false);
    c.changed.notify_all();
}

/// Waits (boundedly) until the death of worker `serial` has been dealt with; returns whether
/// its objects were carried over. A call can meet a death before the shim has noticed it (a
/// send on the worker's closed socket), so the restart may not have begun yet.
fn carried_over(serial: u64) -> bool {
    let c = concluded();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut deaths = c.deaths.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(&carried) = deaths.get(&serial) {
            return carried;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        deaths = c.changed.wait_timeout(deaths, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// Runs an entry point; in replay mode, one that failed because its worker died runs again
/// once the objects are carried over (at most `RETRIES` + 1 times in all). Until some call of
/// the process meets a death this is the call and two loads of one flag: every entry point
/// goes through here.
#[inline(always)]
pub fn retrying<R>(failed: impl Fn(&R) -> bool, f: impl Fn() -> R) -> R {
    if any_death_met() {
        return retrying_after_deaths(failed, f);
    }
    let r = f();
    match any_death_met() {
        false => r,
        // This call may have met the first death: as `retrying_after_deaths` would have had
        // it, with no earlier death of this thread's to keep.
        true => retried(failed, f, r, None),
    }
}

#[cold]
#[inline(never)]
fn retrying_after_deaths<R>(failed: impl Fn(&R) -> bool, f: impl Fn() -> R) -> R {
    if !on() {
        return f();
    }
    let outer = take_met_death();
    let r = f();
    retried(failed, f, r, outer)
}

/// `r` came from a call made once; runs it again while it failed because its worker died and
/// the objects were carried over, then restores the death an outer call met (`outer`).
#[cold]
#[inline(never)]
fn retried<R>(failed: impl Fn(&R) -> bool, f: impl Fn() -> R, mut r: R, outer: Option<u64>) -> R {
    if !on() {
        return r;
    }
    let mut tries = 0;
    while let Some(serial) = take_met_death() {
        if !failed(&r) || tries >= RETRIES || !carried_over(serial) {
            break;
        }
        tries += 1;
        r = f();
    }
    if let Some(o) = outer {
        met_death(o);
    }
    r
}

/// Makes a creating call, and records it if it succeeded in replay mode (nothing is copied
/// otherwise).
pub fn recorded<C: Call<Reply = i32> + Clone>(conn: &Conn, req: C) -> Result<i32, i32> {
    let copy = conn.replays().then(|| req.clone());
    let rc = conn.call(req);
    if let (Some(c), Ok(CL_SUCCESS)) = (copy, &rc) {
        journal_of(conn).created(c.into_request());
    }
    rc
}

/// Records a successful creating call made otherwise (replay mode only).
pub fn note<C: Call + Clone>(conn: &Conn, req: &C) {
    if conn.replays() {
        journal_of(conn).created(req.clone().into_request());
    }
}
