//! Deadlines per call class, shared by the broker's watchdog (which kills a worker stuck in a
//! call) and the shim (which stops waiting for a worker that does not answer at all).

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
