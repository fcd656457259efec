//! The hang watchdog: reads each worker's calls in flight from its flight recorder and kills a
//! worker whose call has run past the deadline of its class. The report then names the call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cloister_ipc::recorder::{now_ns, FlightRecorder};

/// Deadlines per call class, in milliseconds; `CLOISTER_DEADLINE_{INFO,BUILD,WAIT,OTHER}_MS`
/// override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub info_ms: u64,
    pub build_ms: u64,
    pub wait_ms: u64,
    pub other_ms: u64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self { info_ms: 10_000, build_ms: 600_000, wait_ms: 600_000, other_ms: 120_000 }
    }
}

impl Deadlines {
    pub fn from_env() -> Self {
        let d = Self::default();
        let get = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        Self {
            info_ms: get("CLOISTER_DEADLINE_INFO_MS", d.info_ms),
            build_ms: get("CLOISTER_DEADLINE_BUILD_MS", d.build_ms),
            wait_ms: get("CLOISTER_DEADLINE_WAIT_MS", d.wait_ms),
            other_ms: get("CLOISTER_DEADLINE_OTHER_MS", d.other_ms),
        }
    }

    /// The deadline for a call, by its class.
    pub fn for_op(&self, op: &str) -> u64 {
        match op {
            "GetInfo" | "GetDeviceIds" => self.info_ms,
            "BuildProgram" => self.build_ms,
            "FlushOrFinish" | "WaitForEvents" | "EnqueueReadBuffer" | "EnqueueWriteBuffer" | "EnqueueMapBuffer" => {
                self.wait_ms
            }
            _ => self.other_ms,
        }
    }
}

/// Watches `recorder` until `exited` is set; kills `pid` if a call outlives its deadline, after
/// noting the call in the recorder for the report.
pub fn watch(pid: u32, recorder: Arc<FlightRecorder>, exited: Arc<AtomicBool>, deadlines: Deadlines) {
    let tick = Duration::from_millis(50.min(deadlines.info_ms.max(1)));
    while !exited.load(Ordering::Acquire) {
        std::thread::sleep(tick);
        let now = now_ns();
        let hung = recorder
            .in_flight()
            .into_iter()
            .find(|c| now.saturating_sub(c.start_ns) / 1_000_000 > deadlines.for_op(c.op));
        if let Some(call) = hung {
            let index = cloister_ipc::OP_NAMES.iter().position(|&n| n == call.op).map_or(0, |i| i as u32 + 1);
            recorder.header().hung_op.store(index, Ordering::Release);
            // SAFETY: killing our own child, not yet reaped (the reaper sets `exited` first).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_fall_into_classes() {
        let d = Deadlines { info_ms: 1, build_ms: 2, wait_ms: 3, other_ms: 4 };
        assert_eq!(d.for_op("GetInfo"), 1);
        assert_eq!(d.for_op("BuildProgram"), 2);
        assert_eq!(d.for_op("FlushOrFinish"), 3);
        assert_eq!(d.for_op("CreateBuffer"), 4);
    }
}
