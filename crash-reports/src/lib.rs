//! Crash reports: what the broker writes when a worker dies, and where it keeps them.
//! (The flight recorder and the writer arrive with the crash-resilience work; the model and the
//! storage location are fixed here so the CLI and tests share them.)

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Why a worker ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    Signal { signal: i32, fault_address: Option<u64> },
    TrappedSyscall { number: i64, name: Option<String> },
    Exit { status: i32 },
    Hang { call: String, deadline_ms: u64 },
    MemoryLimit,
}

/// One call as the flight recorder saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedCall {
    pub op: String,
    pub lane: u64,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    pub driver: String,
    pub device: Option<String>,
    pub cause: Cause,
    pub in_flight: Option<RecordedCall>,
    pub last_calls: Vec<RecordedCall>,
    /// Groups repeats of the same crash.
    pub signature: String,
}

/// `$XDG_STATE_HOME/cloister/crashes` (default `~/.local/state/cloister/crashes`).
pub fn crash_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("cloister").join("crashes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_through_json() {
        let r = CrashReport {
            driver: "pocl".into(),
            device: Some("cpu".into()),
            cause: Cause::Signal { signal: 11, fault_address: Some(0x10) },
            in_flight: Some(RecordedCall { op: "BuildProgram".into(), lane: 1, start_ns: 5, end_ns: None }),
            last_calls: vec![],
            signature: "pocl:SIGSEGV:BuildProgram".into(),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"signal\""), "{json}");
        assert_eq!(serde_json::from_str::<CrashReport>(&json).unwrap(), r);
    }
}
