//! Statistics at exit (`--leaks`): objects the application created and did not release, per
//! kind, with their names; the peak of the bytes its live buffers, images and pipes held; and
//! its calls per second.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cloister_ipc::cl::{cl_mem, CL_MEM_SIZE};

/// Every OpenCL call the application made (while the statistics are on).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// The memory objects that hold memory of their own (not sub-buffers), by handle, with their
/// sizes; the bytes they hold now and at most.
#[derive(Default)]
struct Memory {
    live: HashMap<u64, u64>,
    bytes: u64,
    peak: u64,
}

static MEMORY: Mutex<Option<Memory>> = Mutex::new(None);

/// After a call (`ok`: it succeeded): counts it, and follows the memory objects it made or
/// released.
pub fn note_call(name: &str, ret_ty: &str, result: u64, ok: bool, args: &[super::Arg]) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    if !ok {
        return;
    }
    if ret_ty == "cl_mem" && result != 0 && name != "clCreateSubBuffer" {
        let mut size: u64 = 0;
        // SAFETY: a memory object the call just returned, and an out value of the size asked.
        let rc = unsafe {
            crate::api::clGetMemObjectInfo(
                result as usize as cl_mem,
                CL_MEM_SIZE,
                std::mem::size_of::<u64>(),
                (&mut size as *mut u64).cast(),
                std::ptr::null_mut(),
            )
        };
        if rc == 0 {
            let mut memory = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
            let m = memory.get_or_insert_with(Memory::default);
            m.live.insert(result, size);
            m.bytes += size;
            m.peak = m.peak.max(m.bytes);
        }
    } else if name == "clReleaseMemObject" {
        let Some(h) = args.first().map(|a| a.raw) else { return };
        // The last release retires the handle (handles are quarantined, never reused at once), or
        // leaves it to the objects that keep it (`handle::hold`).
        let handle = h as usize as *const std::ffi::c_void;
        if crate::handle::lookup(handle, crate::handle::Kind::Mem).map_or(true, |o| o.app_refs() == 0) {
            let mut memory = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = memory.as_mut() {
                if let Some(size) = m.live.remove(&h) {
                    m.bytes -= size;
                }
            }
        }
    }
}

pub fn report() {
    let mut per_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (h, kind) in crate::handle::live_handles() {
        let name = super::names::known_name(h as u64).unwrap_or_else(|| format!("{h:#x}"));
        per_kind.entry(format!("{kind:?}")).or_default().push(name);
    }
    let mut out = String::new();
    if per_kind.is_empty() {
        out.push_str("cloister leaks: none (every object created was released)\n");
    } else {
        let total: usize = per_kind.values().map(Vec::len).sum();
        let _ = writeln!(out, "cloister leaks: {total} objects not released at exit");
        for (kind, mut names) in per_kind {
            names.sort_by_key(|n| n.split_once('#').and_then(|(_, i)| i.parse::<u64>().ok()).unwrap_or(u64::MAX));
            let _ = writeln!(out, "  {kind}: {} ({})", names.len(), names.join(", "));
        }
    }
    let (peak, held) = MEMORY.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or((0, 0), |m| (m.peak, m.bytes));
    let calls = CALLS.load(Ordering::Relaxed);
    let wall = super::epoch().elapsed().as_secs_f64();
    let _ = writeln!(
        out,
        "cloister stats: peak memory objects {peak} bytes ({:.1} MiB), {held} bytes at exit; \
         {calls} calls in {wall:.3} s ({:.0} calls/s)",
        peak as f64 / (1u64 << 20) as f64,
        calls as f64 / wall.max(1e-9),
    );
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(out.as_bytes());
}
