//! What `cloister info` shows: each worker's driver, sandbox profile and layers, and the
//! platforms and devices it hosts, read through the same caged path an application uses.

use cloister_ipc::cl::*;
use cloister_ipc::InfoTarget;

use crate::handle::{lookup, Kind};
use crate::info;
use crate::runtime::runtime;

#[derive(Debug, Clone)]
pub struct DeviceSummary {
    pub name: String,
    pub kind: String,
    pub available: bool,
}

#[derive(Debug, Clone)]
pub struct WorkerSummary {
    pub driver: String,
    pub profile: String,
    pub layers: Vec<String>,
    pub platforms: Vec<(String, Vec<DeviceSummary>)>,
}

fn text(handle: usize, kind: Kind, target: InfoTarget, param: u32) -> String {
    lookup(handle as *const _, kind)
        .and_then(|o| info::query(&o, target, 0, param))
        .map(|v| String::from_utf8_lossy(&v).trim_end_matches('\0').to_string())
        .unwrap_or_else(|e| format!("<error {e}>"))
}

fn device(handle: usize) -> DeviceSummary {
    let obj = lookup(handle as *const _, Kind::Device);
    let word = |param| obj.as_ref().ok().and_then(|o| info::query(o, InfoTarget::Device, 0, param).ok());
    let kind = match word(CL_DEVICE_TYPE)
        .and_then(|v| v.get(..8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default())))
    {
        Some(t) if t & CL_DEVICE_TYPE_GPU != 0 => "GPU",
        Some(t) if t & CL_DEVICE_TYPE_CPU != 0 => "CPU",
        Some(t) if t & CL_DEVICE_TYPE_ACCELERATOR != 0 => "accelerator",
        Some(_) => "other",
        None => "unknown",
    };
    let available = word(CL_DEVICE_AVAILABLE).is_some_and(|v| v.first() == Some(&1));
    DeviceSummary { name: text(handle, Kind::Device, InfoTarget::Device, CL_DEVICE_NAME), kind: kind.into(), available }
}

/// Connects (if not yet connected) and describes every worker.
pub fn cage_summary() -> Vec<WorkerSummary> {
    runtime()
        .conns()
        .iter()
        .map(|c| WorkerSummary {
            driver: c.driver.clone(),
            profile: c.profile.clone(),
            layers: c.layers.clone(),
            platforms: c
                .platforms
                .get()
                .into_iter()
                .flatten()
                .map(|(p, devs)| {
                    (
                        text(*p, Kind::Platform, InfoTarget::Platform, CL_PLATFORM_NAME),
                        devs.iter().map(|&d| device(d)).collect(),
                    )
                })
                .collect(),
        })
        .collect()
}
