//! The hang watchdog: reads each worker's calls in flight from its flight recorder and kills a
//! worker whose call has run past the deadline of its class. The report then names the call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use cloister_ipc::deadlines::Deadlines;
use cloister_ipc::recorder::{now_ns, FlightRecorder};

/// Watches `recorder` until `exited` is set; kills `pid` if a call outlives its deadline, after
/// noting the call in `verdict` (broker memory: the report's cause is what the watchdog did, not
/// what the worker-writable recorder says).
pub fn watch(
    pid: u32,
    recorder: Arc<FlightRecorder>,
    exited: Arc<AtomicBool>,
    deadlines: Deadlines,
    verdict: Arc<crate::broker::Verdict>,
) {
    let tick = Duration::from_millis(50.min(deadlines.info_ms.max(1)));
    while !exited.load(Ordering::Acquire) {
        std::thread::sleep(tick);
        let now = now_ns();
        let hung = recorder
            .in_flight()
            .into_iter()
            .find(|c| now.saturating_sub(c.start_ns) / 1_000_000 > deadlines.for_op(c.op));
        if let Some(call) = hung {
            verdict.hung(call.op);
            tracing::warn!(worker = pid, call = call.op, lane = call.lane, "call past its deadline: worker killed");
            // SAFETY: killing our own child, not yet reaped (the reaper sets `exited` first).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return;
        }
    }
}
