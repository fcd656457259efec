//! Deadlines per call class, shared by the broker's watchdog (which kills a worker stuck in a
//! call) and the shim (which stops waiting for a worker that does not answer at all).
//!
//! Every call the shim waits for falls in one class, by the name the flight recorder notes it
//! under. Besides the lane calls (`OP_NAMES`) the recorder knows the steps in `EXTRA_OPS`: the
//! worker's start (loading the driver and enumerating, before its welcome) and program binary
//! size queries (the driver generates code for them, as a build does).

use crate::cl::CL_PROGRAM_BINARY_SIZES;
use crate::{InfoTarget, Request};

/// Deadlines per call class, in milliseconds; `CLOISTER_DEADLINE_{INFO,BUILD,WAIT,OTHER}_MS`
/// override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub info_ms: u64,
    pub build_ms: u64,
    pub wait_ms: u64,
    pub other_ms: u64,
}

/// A call's deadline class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Queries that only read what the driver knows.
    Info,
    /// Anything that may compile: builds, compiles, links, binaries.
    Build,
    /// Anything that may wait for the device: finish, waits, blocking transfers and maps, and
    /// releases (a queue's last release finishes it).
    Wait,
    Other,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::Info, Class::Build, Class::Wait, Class::Other];

    /// The class's name, as the README's table lists it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Info => "info",
            Class::Build => "build",
            Class::Wait => "wait",
            Class::Other => "other",
        }
    }
}

/// The worker's start, from loading the driver to its welcome.
pub const INITIALIZE: &str = "Initialize";
/// `clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)`.
pub const PROGRAM_BINARY_SIZES: &str = "GetProgramBinarySizes";
/// Steps the flight recorder notes besides the lane calls; their recorder index follows
/// `OP_NAMES`'.
pub const EXTRA_OPS: &[&str] = &[INITIALIZE, PROGRAM_BINARY_SIZES];

/// Every recordable step's name, lane calls first, in recorder index order.
pub fn all_ops() -> impl Iterator<Item = &'static str> {
    crate::OP_NAMES.iter().chain(EXTRA_OPS).copied()
}

/// The recorder index (`all_ops` position) of `name`.
pub fn op_index(name: &str) -> Option<u32> {
    all_ops().position(|n| n == name).map(|i| i as u32)
}

/// The name a request is recorded and timed under: its call's, except that a program binary
/// size query is timed as the code generation it triggers.
pub fn recorded_name(req: &Request) -> &'static str {
    match is_binary_sizes(req) {
        true => PROGRAM_BINARY_SIZES,
        false => req.op_name(),
    }
}

/// `op_index(recorded_name(req))`, without looking the name up among every call's: the worker
/// asks for each call it serves.
pub fn recorded_index(req: &Request) -> u32 {
    match is_binary_sizes(req) {
        // `EXTRA_OPS` follow `OP_NAMES`.
        true => (crate::OP_NAMES.len() + 1) as u32,
        false => req.op_index(),
    }
}

fn is_binary_sizes(req: &Request) -> bool {
    matches!(req, Request::GetInfo(q) if q.target == InfoTarget::Program && q.param == CL_PROGRAM_BINARY_SIZES)
}

/// The class of each step. Anything not named here is `Other`.
pub fn class_of(op: &str) -> Class {
    match op {
        "GetInfo" | "GetDeviceIds" | "GetSupportedImageFormats" | "GetTimers" | "EventStatuses" | "EventProfiles" => {
            Class::Info
        }
        "BuildProgram"
        | "CompileProgram"
        | "LinkProgram"
        | "GetProgramBinaries"
        | "CreateProgramWithIl"
        | PROGRAM_BINARY_SIZES => Class::Build,
        "FlushOrFinish"
        | "WaitForEvents"
        | "EnqueueReadBuffer"
        | "EnqueueWriteBuffer"
        | "EnqueueMapBuffer"
        | "EnqueueRegionTransfer"
        | "EnqueueMapImage"
        | "EnqueueUnmapMemObject"
        | "FillMapping"
        | "ReadBack"
        | "Release" => Class::Wait,
        _ => Class::Other,
    }
}

/// The table the README's "hang watchdog" paragraph shows: one row per class, its default
/// deadline and every call in it (lane calls by their wire name).
pub fn readme_table() -> String {
    let d = Deadlines::default();
    let mut out = String::from("| class | default | calls |\n|---|---|---|\n");
    for class in Class::ALL {
        let ops: Vec<String> = all_ops().filter(|op| class_of(op) == class).map(|op| format!("`{op}`")).collect();
        out += &format!("| {} | {} s | {} |\n", class.name(), d.for_class(class) / 1000, ops.join(", "));
    }
    out
}

impl Default for Deadlines {
    fn default() -> Self {
        Self { info_ms: 10_000, build_ms: 600_000, wait_ms: 600_000, other_ms: 120_000 }
    }
}

impl Deadlines {
    /// The deadlines in effect for `driver` (a driver's section of the configuration may set its
    /// own), or for every driver; each 1 ms to a day (the settings table checks it).
    pub fn for_driver(driver: Option<&str>) -> Self {
        let get = |key: &str| crate::settings::number(key, driver);
        Self {
            info_ms: get("deadline_info_ms"),
            build_ms: get("deadline_build_ms"),
            wait_ms: get("deadline_wait_ms"),
            other_ms: get("deadline_other_ms"),
        }
    }

    pub fn for_class(&self, class: Class) -> u64 {
        match class {
            Class::Info => self.info_ms,
            Class::Build => self.build_ms,
            Class::Wait => self.wait_ms,
            Class::Other => self.other_ms,
        }
    }

    /// The deadline for a call, by its class.
    pub fn for_op(&self, op: &str) -> u64 {
        self.for_class(class_of(op))
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

    /// Every call, one by one, against the class it must have. A new call must be added here
    /// (the walk fails on a call this table does not name), and the README must list it.
    #[test]
    fn every_call_has_its_documented_class() {
        use Class::*;
        let expected: &[(&str, Class)] = &[
            ("GetInfo", Info),
            ("GetDeviceIds", Info),
            ("Release", Wait),
            ("CreateContext", Other),
            ("CreateContextFromType", Other),
            ("CreateCommandQueue", Other),
            ("CreateCommandQueueWithProperties", Other),
            ("CreateBuffer", Other),
            ("CreateSubBuffer", Other),
            ("CreateImage", Other),
            ("CreatePipe", Other),
            ("GetSupportedImageFormats", Info),
            ("CreateSampler", Other),
            ("CreateProgramWithSource", Other),
            ("BuildProgram", Build),
            ("CreateProgramWithBinary", Other),
            ("CreateProgramWithIl", Build),
            ("CreateProgramWithBuiltInKernels", Other),
            ("CompileProgram", Build),
            ("LinkProgram", Build),
            ("GetProgramBinaries", Build),
            ("SetProgramSpecializationConstant", Other),
            ("UnloadPlatformCompiler", Other),
            ("CreateKernel", Other),
            ("CreateKernelsInProgram", Other),
            ("CloneKernel", Other),
            ("GetKernelSubGroupInfo", Other),
            ("CreateSubDevices", Other),
            ("SetDefaultDeviceCommandQueue", Other),
            ("EnqueueNdRange", Other),
            ("EnqueueWriteBuffer", Wait),
            ("EnqueueReadBuffer", Wait),
            ("EnqueueCopyBuffer", Other),
            ("EnqueueFillBuffer", Other),
            ("EnqueueMapBuffer", Wait),
            ("FillMapping", Wait),
            ("EnqueueUnmapMemObject", Wait),
            ("EnqueueRegionTransfer", Wait),
            ("EnqueueCopyRegion", Other),
            ("EnqueueFillImage", Other),
            ("EnqueueMapImage", Wait),
            ("EnqueueMigrateMemObjects", Other),
            ("EnqueueMarkerOrBarrier", Other),
            ("EnqueueDone", Other),
            ("FlushOrFinish", Wait),
            ("WaitForEvents", Wait),
            ("CreateUserEvent", Other),
            ("SetUserEventStatus", Other),
            ("SetEventCallback", Other),
            ("GetTimers", Info),
            ("DropSegment", Other),
            ("RetireSlab", Other),
            ("ReadBack", Wait),
            ("SetKernelArg", Other),
            ("ProbeProgramReleaseCallback", Other),
            ("CreateCommandBuffer", Other),
            ("FinalizeCommandBuffer", Other),
            ("RecordCommand", Other),
            ("EnqueueCommandBuffer", Other),
            ("EventStatuses", Info),
            ("EventProfiles", Info),
            (INITIALIZE, Other),
            (PROGRAM_BINARY_SIZES, Build),
        ];
        for op in all_ops() {
            let Some(&(_, want)) = expected.iter().find(|(n, _)| *n == op) else {
                panic!("{op} has no expected class in this test: decide its class, and add it here");
            };
            assert_eq!(class_of(op), want, "{op}");
        }
        assert_eq!(expected.len(), all_ops().count(), "the expected table names a call that does not exist");
    }

    /// The README's table (between its `deadline-classes` markers) is `readme_table()`.
    #[test]
    fn the_readme_lists_every_call_in_its_class() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let begin = "<!-- deadline-classes:begin (generated: ipc/src/deadlines.rs readme_table) -->\n";
        let end = "<!-- deadline-classes:end -->";
        let table =
            readme.split_once(begin).and_then(|(_, rest)| rest.split_once(end)).map(|(t, _)| t).unwrap_or_else(|| {
                panic!("README.md has no deadline class table; put this there:\n{begin}{}{end}", readme_table())
            });
        assert_eq!(
            table,
            readme_table(),
            "README.md's deadline class table is out of date; it should read:\n{}",
            readme_table()
        );
    }

    #[test]
    fn binary_size_queries_are_timed_as_builds() {
        let q = crate::GetInfo { target: InfoTarget::Program, object: 1, aux: 0, param: CL_PROGRAM_BINARY_SIZES };
        assert_eq!(recorded_name(&Request::GetInfo(q.clone())), PROGRAM_BINARY_SIZES);
        assert_eq!(class_of(recorded_name(&Request::GetInfo(q.clone()))), Class::Build);
        let other = crate::GetInfo { target: InfoTarget::Device, object: 1, aux: 0, param: CL_PROGRAM_BINARY_SIZES };
        assert_eq!(recorded_name(&Request::GetInfo(other.clone())), "GetInfo");
        for req in [
            Request::GetInfo(q),
            Request::GetInfo(other),
            crate::Call::into_request(crate::FlushOrFinish { queue: 1, finish: true }),
        ] {
            assert_eq!(Some(recorded_index(&req)), op_index(recorded_name(&req)), "{}", req.op_name());
        }
    }
}
