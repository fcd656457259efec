//! Arguments as a reader wants them: handles as stable names (`ctx#1`, `mem#7`: numbered per
//! kind in creation order), enums and flags by name, strings by their first bytes.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};

/// One argument of an entry point, as the API table declares it.
pub struct Arg {
    pub name: &'static str,
    pub ty: &'static str,
    pub raw: u64,
}

/// An argument's bits as a number (handles and pointers as their address).
pub trait AsRaw {
    fn raw(&self) -> u64;
}

macro_rules! as_raw_number {
    ($($t:ty),*) => { $( impl AsRaw for $t { fn raw(&self) -> u64 { *self as u64 } } )* };
}
as_raw_number!(u32, i32, u64, usize, isize);

impl<T> AsRaw for *mut T {
    fn raw(&self) -> u64 {
        *self as usize as u64
    }
}

impl<T> AsRaw for *const T {
    fn raw(&self) -> u64 {
        *self as usize as u64
    }
}

impl AsRaw for () {
    fn raw(&self) -> u64 {
        0
    }
}

/// A type as the API table spells it (`*const c_char`): macro expansion may have spaced it out
/// (`* const c_char`). Normalized once per spelling; there are a few dozen.
pub fn spelled(ty: &'static str) -> &'static str {
    if !ty.contains("* ") {
        return ty;
    }
    thread_local! {
        static SEEN: std::cell::RefCell<HashMap<(usize, usize), &'static str>> = Default::default();
    }
    SEEN.with(|seen| {
        *seen
            .borrow_mut()
            .entry((ty.as_ptr() as usize, ty.len()))
            .or_insert_with(|| Box::leak(ty.replace("* ", "*").into_boxed_str()))
    })
}

/// The short name of a handle type (`cl_mem` → `mem`); `None` for other types.
pub fn kind_of(ty: &str) -> Option<&'static str> {
    Some(match ty {
        "cl_platform_id" => "platform",
        "cl_device_id" => "dev",
        "cl_context" => "ctx",
        "cl_command_queue" => "queue",
        "cl_mem" => "mem",
        "cl_program" => "prog",
        "cl_kernel" => "kernel",
        "cl_event" => "ev",
        "cl_sampler" => "sampler",
        "cl_command_buffer_khr" => "cmdbuf",
        "cl_mutable_command_khr" => "mutable",
        _ => return None,
    })
}

#[derive(Default)]
struct Names {
    by_handle: HashMap<u64, (&'static str, u32)>,
    next: HashMap<&'static str, u32>,
}

fn names() -> &'static Mutex<Names> {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    NAMES.get_or_init(Default::default)
}

/// A fresh name for a handle just created (an address reused after a release gets a new one).
fn name_new(kind: &'static str, h: u64) {
    let mut n = names().lock().unwrap_or_else(|e| e.into_inner());
    let next = n.next.entry(kind).or_insert(0);
    *next += 1;
    let number = *next;
    n.by_handle.insert(h, (kind, number));
}

/// `kind#N`; a handle never seen created (platforms, devices, a garbage handle) is named at
/// first sight, so it keeps one name too.
pub fn name_of(kind: &'static str, h: u64) -> String {
    if h == 0 {
        return "NULL".into();
    }
    let mut n = names().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, i)) = n.by_handle.get(&h) {
        return format!("{k}#{i}");
    }
    let next = n.next.entry(kind).or_insert(0);
    *next += 1;
    let number = *next;
    n.by_handle.insert(h, (kind, number));
    format!("{kind}#{number}")
}

/// The name a live handle was given, if any (for the leak report).
pub fn known_name(h: u64) -> Option<String> {
    let n = names().lock().unwrap_or_else(|e| e.into_inner());
    n.by_handle.get(&h).map(|(k, i)| format!("{k}#{i}"))
}

/// After a successful call: names the handle it returned and the event it wrote out.
pub fn note_created(ret_ty: &str, result: u64, args: &[Arg]) {
    if let Some(kind) = kind_of(ret_ty) {
        if result != 0 {
            name_new(kind, result);
        }
    }
    for a in args {
        if a.name == "event" && a.raw != 0 && spelled(a.ty) == "*mut cl_event" {
            // SAFETY: a successful call with a non-NULL `event` has written a handle there.
            let ev = unsafe { *(a.raw as usize as *const u64) };
            if ev != 0 {
                name_new("ev", ev);
            }
        }
    }
}

/// The constants of `cloister_ipc::cl`, parsed from its source once: (name, type, value).
fn constants() -> &'static [(&'static str, &'static str, i64)] {
    static TABLE: OnceLock<Vec<(&'static str, &'static str, i64)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SOURCE: &str = include_str!("../../../ipc/src/cl.rs");
        SOURCE
            .lines()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix("pub const ")?;
                let (name, rest) = rest.split_once(':')?;
                let (ty, value) = rest.split_once('=')?;
                let value = value.trim().trim_end_matches(';').replace('_', "");
                let v = if let Some((a, b)) = value.split_once("<<") {
                    a.trim().parse::<i64>().ok()? << b.trim().parse::<u32>().ok()?
                } else if let Some(hex) = value.strip_prefix("0x") {
                    i64::from_str_radix(hex, 16).ok()?
                } else {
                    value.parse::<i64>().ok()?
                };
                Some((name.trim(), ty.trim(), v))
            })
            .chain(EXTRA.iter().copied())
            .collect()
    })
}

/// Names the log shows that `cloister_ipc::cl` does not need.
const EXTRA: &[(&str, &str, i64)] = &[
    ("CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE", "cl_bitfield", 1),
    ("CL_QUEUE_PROFILING_ENABLE", "cl_bitfield", 2),
    ("CL_PROFILING_COMMAND_QUEUED", "cl_uint", 0x1280),
    ("CL_PROFILING_COMMAND_SUBMIT", "cl_uint", 0x1281),
    ("CL_PROFILING_COMMAND_START", "cl_uint", 0x1282),
    ("CL_PROFILING_COMMAND_END", "cl_uint", 0x1283),
    ("CL_PROFILING_COMMAND_COMPLETE", "cl_uint", 0x1284),
    ("CL_PROGRAM_BUILD_OPTIONS", "cl_uint", 0x1182),
    ("CL_PROGRAM_BUILD_LOG", "cl_uint", 0x1183),
    ("CL_PROGRAM_BINARY_TYPE", "cl_uint", 0x1184),
    ("CL_DEVICE_VENDOR", "cl_uint", 0x102C),
    ("CL_DEVICE_VERSION", "cl_uint", 0x102F),
    ("CL_DEVICE_MAX_COMPUTE_UNITS", "cl_uint", 0x1002),
    ("CL_DEVICE_GLOBAL_MEM_SIZE", "cl_uint", 0x101F),
    ("CL_DEVICE_MAX_WORK_GROUP_SIZE", "cl_uint", 0x1004),
    ("CL_KERNEL_WORK_GROUP_SIZE", "cl_uint", 0x11B0),
];

/// The name of enum value `v` among the constants starting with `prefix`.
fn enum_name(prefix: &str, v: i64) -> Option<&'static str> {
    constants().iter().find(|(n, ty, value)| *value == v && n.starts_with(prefix) && *ty == "cl_uint").map(|c| c.0)
}

/// `CL_A|CL_B|0x40` for a bitfield, with the flags of `prefix`.
fn flag_names(prefix: &str, v: u64) -> String {
    if v == 0 {
        return "0".into();
    }
    if let Some((n, _, _)) =
        constants().iter().find(|(n, ty, value)| *ty == "cl_bitfield" && n.starts_with(prefix) && *value as u64 == v)
    {
        return n.to_string();
    }
    let mut out = String::new();
    let mut left = v;
    for (n, ty, value) in constants() {
        let bit = *value as u64;
        if *ty == "cl_bitfield" && n.starts_with(prefix) && bit.is_power_of_two() && left & bit != 0 {
            left &= !bit;
            out.push_str(n);
            out.push('|');
        }
    }
    if left != 0 {
        let _ = write!(out, "{left:#x}");
    } else {
        out.pop();
    }
    out
}

/// An error code's name, or its number.
pub fn status_name(s: i32) -> String {
    match s {
        0 => "CL_SUCCESS".into(),
        _ => cloister_ipc::cl::error_name(s).map(str::to_string).unwrap_or_else(|| s.to_string()),
    }
}

/// The prefix of `param_name`'s constants for an info query.
fn param_prefix(function: &str) -> &'static str {
    match function {
        "clGetPlatformInfo" => "CL_PLATFORM_",
        "clGetDeviceInfo" => "CL_DEVICE_",
        "clGetContextInfo" => "CL_CONTEXT_",
        "clGetCommandQueueInfo" => "CL_QUEUE_",
        "clGetMemObjectInfo" => "CL_MEM_",
        "clGetImageInfo" => "CL_IMAGE_",
        "clGetSamplerInfo" => "CL_SAMPLER_",
        "clGetProgramInfo" => "CL_PROGRAM_",
        "clGetProgramBuildInfo" => "CL_PROGRAM_BUILD_",
        "clGetKernelArgInfo" => "CL_KERNEL_ARG_",
        "clGetKernelInfo" | "clGetKernelWorkGroupInfo" => "CL_KERNEL_",
        "clGetEventInfo" => "CL_EVENT_",
        "clGetEventProfilingInfo" => "CL_PROFILING_",
        _ => "CL_",
    }
}

/// Up to `max` bytes of a string, escaped, stopping at a NUL; `...` when it goes on (looked at
/// only where the byte after `max` may be read: `may_peek`).
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string, or at `max` readable bytes (and one more
/// with `may_peek`), as the API contract of the argument says.
unsafe fn c_string(p: u64, max: usize, may_peek: bool) -> String {
    if p == 0 {
        return "NULL".into();
    }
    let at = p as usize as *const u8;
    let mut bytes = Vec::new();
    // SAFETY: reads stop at the terminator or at `max`, which the caller guarantees readable.
    while bytes.len() < max && unsafe { *at.add(bytes.len()) } != 0 {
        bytes.push(unsafe { *at.add(bytes.len()) });
    }
    // SAFETY: one byte further, only where the caller says it may be read.
    let more = bytes.len() == max && may_peek && unsafe { *at.add(max) } != 0;
    format!("\"{}{}\"", bytes.escape_ascii(), if more { "..." } else { "" })
}

/// Writes `f(args)`'s argument list for the call log. Out-parameters are read only when the call
/// succeeded (`ok`): the API guarantees they were written then.
pub fn format_args(out: &mut String, function: &str, args: &[Arg], ok: bool) {
    for (i, a) in args.iter().enumerate() {
        if a.name == "errcode_ret" {
            continue;
        }
        // Types as the API table spells them (macro expansion may space them out).
        let ty = spelled(a.ty);
        if !out.ends_with('(') {
            out.push_str(", ");
        }
        out.push_str(a.name);
        out.push('=');
        let prev_count = i.checked_sub(1).map(|j| &args[j]).filter(|p| p.name.starts_with("num_")).map(|p| p.raw);
        // SAFETY (for the reads below): each pointer argument is read as the API contract of the
        // entry point says it is laid out, and only when non-NULL.
        match (a.name, ty) {
            (_, ty) if kind_of(ty).is_some() => out.push_str(&name_of(kind_of(ty).unwrap_or("?"), a.raw)),
            ("param_name", _) => match enum_name(param_prefix(function), a.raw as i64) {
                Some(n) => out.push_str(n),
                None => {
                    let _ = write!(out, "{:#x}", a.raw);
                }
            },
            ("flags", "cl_bitfield") => out.push_str(&flag_names("CL_MEM_", a.raw)),
            ("map_flags", _) => out.push_str(&flag_names("CL_MAP_", a.raw)),
            ("device_type", _) => out.push_str(&flag_names("CL_DEVICE_TYPE_", a.raw)),
            ("properties", "cl_bitfield") => out.push_str(&flag_names("CL_QUEUE_", a.raw)),
            (_, "cl_bool") => out.push_str(if a.raw != 0 { "CL_TRUE" } else { "CL_FALSE" }),
            (_, "*const c_char") => out.push_str(&unsafe { c_string(a.raw, 48, true) }),
            ("strings", _) if a.raw != 0 && args.iter().find(|c| c.name == "count").is_none_or(|c| c.raw > 0) => {
                let first = unsafe { *(a.raw as usize as *const u64) };
                // A string with a length need not be NUL-terminated: read no further than it.
                let length = args
                    .iter()
                    .find(|l| l.name == "lengths" && l.raw != 0)
                    .map(|l| unsafe { *(l.raw as usize as *const usize) })
                    .filter(|n| *n > 0);
                out.push('[');
                out.push_str(&match length {
                    Some(n) => unsafe { c_string(first, n.min(48), n > 48) },
                    None => unsafe { c_string(first, 48, true) },
                });
                out.push(']');
            }
            (_, ty) if ty.starts_with("*const cl_") && kind_of(&ty[7..]).is_some() && a.raw != 0 => {
                let n = prev_count.unwrap_or(1).min(8) as usize;
                handle_list(out, kind_of(&ty[7..]).unwrap_or("?"), a.raw, n, prev_count.unwrap_or(1) as usize);
            }
            (_, ty) if ok && ty.starts_with("*mut cl_") && kind_of(&ty[5..]).is_some() && a.raw != 0 => {
                // An out-array: as many as the call says it wrote (the next argument), at most
                // what was asked for.
                let kind = kind_of(&ty[5..]).unwrap_or("?");
                let asked = prev_count.unwrap_or(1);
                let wrote = args
                    .get(i + 1)
                    .filter(|n| spelled(n.ty) == "*mut cl_uint" && n.raw != 0)
                    .map(|n| unsafe { *(n.raw as usize as *const u32) } as u64)
                    .unwrap_or(asked);
                let n = asked.min(wrote);
                out.push('&');
                handle_list(out, kind, a.raw, n.min(8) as usize, n as usize);
            }
            (
                "global_work_size" | "local_work_size" | "global_work_offset" | "origin" | "region" | "src_origin"
                | "dst_origin" | "buffer_origin" | "host_origin",
                "*const size_t",
            ) if a.raw != 0 => {
                let dims = args.iter().find(|d| d.name == "work_dim").map(|d| d.raw.min(3)).unwrap_or(3) as usize;
                let v = unsafe { std::slice::from_raw_parts(a.raw as usize as *const usize, dims) };
                let _ = write!(out, "{v:?}");
            }
            (_, "size_t" | "cl_uint" | "cl_ulong" | "cl_int") => {
                let _ = write!(out, "{}", a.raw as i64);
            }
            (_, _) if a.raw == 0 => out.push_str("NULL"),
            _ => {
                let _ = write!(out, "{:#x}", a.raw);
            }
        }
    }
}

/// `[kind#1, kind#2, ...]` from an array of `n` handles (of `total`).
fn handle_list(out: &mut String, kind: &'static str, array: u64, n: usize, total: usize) {
    // SAFETY: the caller passes an array the API contract says holds at least `n` handles.
    let hs = unsafe { std::slice::from_raw_parts(array as usize as *const u64, n) };
    out.push('[');
    for (j, h) in hs.iter().enumerate() {
        if j > 0 {
            out.push_str(", ");
        }
        out.push_str(&name_of(kind, *h));
    }
    if total > n {
        let _ = write!(out, ", ... {total} in all");
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_parse_from_the_ipc_table() {
        assert!(constants().contains(&("CL_DEVICE_NAME", "cl_uint", 0x102B)));
        assert!(constants().contains(&("CL_MEM_ALLOC_HOST_PTR", "cl_bitfield", 1 << 4)));
        assert!(constants().contains(&("CL_DEVICE_TYPE_ALL", "cl_bitfield", 0xFFFF_FFFF)));
        assert!(constants().contains(&("CL_INVALID_VALUE", "cl_int", -30)));
    }

    #[test]
    fn flags_and_enums_are_named_and_unknown_bits_kept() {
        assert_eq!(flag_names("CL_MEM_", 1 | (1 << 5)), "CL_MEM_READ_WRITE|CL_MEM_COPY_HOST_PTR");
        assert_eq!(flag_names("CL_MEM_", (1 << 4) | (1 << 40)), "CL_MEM_ALLOC_HOST_PTR|0x10000000000");
        assert_eq!(flag_names("CL_DEVICE_TYPE_", 0xFFFF_FFFF), "CL_DEVICE_TYPE_ALL");
        assert_eq!(flag_names("CL_QUEUE_", 2), "CL_QUEUE_PROFILING_ENABLE");
        assert_eq!(enum_name(param_prefix("clGetDeviceInfo"), 0x102B), Some("CL_DEVICE_NAME"));
        assert_eq!(enum_name(param_prefix("clGetEventProfilingInfo"), 0x1283), Some("CL_PROFILING_COMMAND_END"));
        assert_eq!(status_name(-30), "CL_INVALID_VALUE");
        assert_eq!(status_name(-12345), "-12345");
    }

    #[test]
    fn arguments_read_as_the_api_declares_them() {
        let s = c"__kernel void x() {}".as_ptr() as u64;
        let strings = [s];
        let sizes = [64usize, 2];
        let args = [
            Arg { name: "context", ty: "cl_context", raw: 0 },
            Arg { name: "count", ty: "cl_uint", raw: 1 },
            Arg { name: "strings", ty: "*mut * const c_char", raw: strings.as_ptr() as u64 },
            Arg { name: "work_dim", ty: "cl_uint", raw: 2 },
            Arg { name: "global_work_size", ty: "* const size_t", raw: sizes.as_ptr() as u64 },
            Arg { name: "blocking", ty: "cl_bool", raw: 1 },
        ];
        let mut out = String::from("f(");
        format_args(&mut out, "f", &args, true);
        assert_eq!(
            out,
            "f(context=NULL, count=1, strings=[\"__kernel void x() {}\"], work_dim=2, global_work_size=[64, 2], blocking=CL_TRUE"
        );
    }
}
