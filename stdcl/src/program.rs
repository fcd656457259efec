//! The dynamic CL program loader: `clopen`/`clsopen` load sources or binaries into a context
//! and give a reference-counted handle, `clbuild` builds (default options first), `clsym` finds
//! kernels, `clclose` unloads. Programs embedded in the executable by `stdcl-clld` register
//! themselves at start-up ([`register_embedded`]) and are what `clopen(cp, NULL, ...)` loads.

use crate::context::{lock_ignoring_poison, Context};
use crate::error::{check, Error, Res};
use opencl_sys::*;
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;
use std::sync::Mutex;

pub const CLLD_LAZY: i32 = 1;
pub const CLLD_NOBUILD: i32 = 4;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Built,
    /// Built by the first clsym (CLLD_LAZY).
    Lazy,
    /// Waits for clbuild (CLLD_NOBUILD).
    Unbuilt,
}

#[derive(Debug)]
struct Program {
    ctx: usize,
    /// The file it came from (`None` for clsopen); clopen of the same file shares the handle.
    key: Option<String>,
    refc: u32,
    progs: Vec<cl_program>,
    state: State,
    kernels: Vec<(String, cl_kernel)>,
}

// SAFETY: OpenCL handles may be used from any thread (OpenCL 1.2, appendix A.2).
unsafe impl Send for Program {}

/// Open handles by id (the `void*` the program sees).
static PROGRAMS: Mutex<BTreeMap<usize, Program>> = Mutex::new(BTreeMap::new());
static NEXT: Mutex<usize> = Mutex::new(1);

/// One program embedded by stdcl-clld.
#[derive(Clone)]
pub struct Embedded {
    pub data: Vec<u8>,
    pub binary: bool,
}

static EMBEDDED: Mutex<Vec<Embedded>> = Mutex::new(Vec::new());

pub fn register_embedded(items: Vec<Embedded>) {
    lock_ignoring_poison(&EMBEDDED).extend(items);
}

/// A source has no NUL byte; a binary (ELF, pocl's own format, SPIR-V) almost surely has.
pub fn looks_binary(data: &[u8]) -> bool {
    data.starts_with(b"\x7fELF") || data.contains(&0)
}

/// A source or binary to make a program from.
enum Piece<'a> {
    Sources(Vec<&'a [u8]>),
    Binary(&'a [u8]),
}

fn create(c: &Context, piece: &Piece) -> Res<cl_program> {
    let mut err = 0;
    let prog = match piece {
        Piece::Sources(srcs) => {
            let ptrs: Vec<*const libc::c_char> = srcs.iter().map(|s| s.as_ptr() as *const libc::c_char).collect();
            let lens: Vec<usize> = srcs.iter().map(|s| s.len()).collect();
            // SAFETY: `srcs.len()` strings with their lengths (no NUL needed).
            unsafe { clCreateProgramWithSource(c.ctx, ptrs.len() as cl_uint, ptrs.as_ptr(), lens.as_ptr(), &mut err) }
        }
        Piece::Binary(bin) => {
            let n = c.devices.len();
            let ptrs = vec![bin.as_ptr(); n];
            let lens = vec![bin.len(); n];
            let mut status = vec![0; n];
            // SAFETY: one binary (the same) per device of the context.
            unsafe {
                clCreateProgramWithBinary(
                    c.ctx,
                    n as cl_uint,
                    c.devices.as_ptr(),
                    lens.as_ptr(),
                    ptrs.as_ptr(),
                    status.as_mut_ptr(),
                    &mut err,
                )
            }
        }
    };
    check(err, "clCreateProgramWith{Source,Binary}")?;
    Ok(prog)
}

fn release_programs(progs: &[cl_program]) {
    for p in progs {
        // SAFETY: programs this module made, released once.
        unsafe { clReleaseProgram(*p) };
    }
}

/// The default options (defines, `-I` the working folder, kernel argument info for clforka),
/// then the caller's.
fn options(c: &Context, extra: Option<&str>) -> String {
    let mut o = c.defines.clone();
    if let Ok(cwd) = std::env::current_dir() {
        let cwd = cwd.to_string_lossy();
        // A folder with blanks would need quotes, which drivers read differently: left out.
        if !cwd.contains(char::is_whitespace) {
            o += &format!(" -I {cwd}");
        }
    }
    o += " -cl-kernel-arg-info";
    if let Some(e) = extra.filter(|e| !e.trim().is_empty()) {
        o += " ";
        o += e;
    }
    o
}

fn build(c: &Context, p: &mut Program, extra: Option<&str>) -> Res<()> {
    let opts = CString::new(options(c, extra)).map_err(|_| Error::new(libc::EINVAL, "build options contain NUL"))?;
    for prog in &p.progs {
        // SAFETY: a program of this context, its devices, NUL-terminated options.
        let err = unsafe {
            clBuildProgram(*prog, c.devices.len() as cl_uint, c.devices.as_ptr(), opts.as_ptr(), None, null_mut())
        };
        if err != 0 {
            let mut e = Error::cl(err, "clBuildProgram");
            e.msg += &format!(" with options \"{}\"", opts.to_string_lossy());
            let log = build_log(c, *prog);
            if !log.trim().is_empty() {
                let cut: String = log.chars().take(2000).collect();
                e.msg += &format!("; build log:\n{}", cut.trim_end());
            }
            return Err(e);
        }
    }
    p.state = State::Built;
    Ok(())
}

fn build_log(c: &Context, prog: cl_program) -> String {
    let mut out = String::new();
    for d in &c.devices {
        let mut len = 0;
        // SAFETY: a size query.
        if unsafe { clGetProgramBuildInfo(prog, *d, CL_PROGRAM_BUILD_LOG, 0, null_mut(), &mut len) } != 0 {
            continue;
        }
        let mut buf = vec![0u8; len.min(1 << 20)];
        // SAFETY: a buffer of buf.len() bytes.
        if unsafe {
            clGetProgramBuildInfo(
                prog,
                *d,
                CL_PROGRAM_BUILD_LOG,
                buf.len(),
                buf.as_mut_ptr() as *mut c_void,
                null_mut(),
            )
        } == 0
        {
            out += String::from_utf8_lossy(buf.split(|b| *b == 0).next().unwrap_or(&[])).as_ref();
        }
    }
    out
}

fn new_handle(p: Program) -> *mut c_void {
    let mut next = lock_ignoring_poison(&NEXT);
    let id = *next;
    *next += 1;
    lock_ignoring_poison(&PROGRAMS).insert(id, p);
    // Handles are small integers shifted into pointer shape; they are only ever looked up.
    (id << 4) as *mut c_void
}

fn id_of(handle: *mut c_void) -> usize {
    handle as usize >> 4
}

/// Loads `pieces` as a new handle (or, for a keyed file already open, one more reference).
fn open(cp: *mut Context, c: &Context, key: Option<String>, pieces: &[Piece], flags: i32) -> Res<*mut c_void> {
    if let Some(k) = &key {
        let mut all = lock_ignoring_poison(&PROGRAMS);
        if let Some((id, p)) = all.iter_mut().find(|(_, p)| p.ctx == cp as usize && p.key.as_ref() == Some(k)) {
            // Opened before without building: this opening asks for it now.
            if flags & (CLLD_NOBUILD | CLLD_LAZY) == 0 && p.state != State::Built && p.kernels.is_empty() {
                build(c, p, None)?;
            }
            p.refc += 1;
            return Ok((id << 4) as *mut c_void);
        }
    }
    let mut progs = Vec::new();
    for piece in pieces {
        match create(c, piece) {
            Ok(p) => progs.push(p),
            Err(e) => {
                release_programs(&progs);
                return Err(e);
            }
        }
    }
    let state = if flags & CLLD_NOBUILD != 0 {
        State::Unbuilt
    } else if flags & CLLD_LAZY != 0 {
        State::Lazy
    } else {
        State::Built
    };
    let mut p = Program { ctx: cp as usize, key, refc: 1, progs, state, kernels: Vec::new() };
    if state == State::Built {
        if let Err(e) = build(c, &mut p, None) {
            release_programs(&p.progs);
            return Err(e);
        }
    }
    Ok(new_handle(p))
}

pub fn clopen(cp: *mut Context, filename: Option<&str>, flags: i32) -> Res<*mut c_void> {
    let c = crate::context::lookup(cp)?;
    match filename {
        None => {
            let emb = lock_ignoring_poison(&EMBEDDED).clone();
            if emb.is_empty() {
                return Err(Error::new(
                    libc::ENOENT,
                    "no CL programs are embedded in this executable (see stdcl-clld)",
                ));
            }
            let srcs: Vec<&[u8]> = emb.iter().filter(|e| !e.binary).map(|e| e.data.as_slice()).collect();
            let mut pieces: Vec<Piece> = emb.iter().filter(|e| e.binary).map(|e| Piece::Binary(&e.data)).collect();
            if !srcs.is_empty() {
                pieces.insert(0, Piece::Sources(srcs));
            }
            open(cp, c, Some("\0embedded".into()), &pieces, flags)
        }
        Some(f) => {
            let data = std::fs::read(f)
                .map_err(|e| Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("cannot read {f}: {e}")))?;
            let piece = if looks_binary(&data) { Piece::Binary(&data) } else { Piece::Sources(vec![&data]) };
            open(cp, c, Some(f.to_string()), &[piece], flags)
        }
    }
}

pub fn clsopen(cp: *mut Context, src: &[u8], flags: i32) -> Res<*mut c_void> {
    let c = crate::context::lookup(cp)?;
    open(cp, c, None, &[Piece::Sources(vec![src])], flags)
}

pub fn clbuild(cp: *mut Context, handle: *mut c_void, extra: Option<&str>) -> Res<*mut c_void> {
    let c = crate::context::lookup(cp)?;
    let mut all = lock_ignoring_poison(&PROGRAMS);
    let p = program_of(&mut all, cp, handle)?;
    if !p.kernels.is_empty() {
        return Err(Error::new(libc::EBUSY, "the program has kernels in use (clsym); it cannot be rebuilt"));
    }
    build(c, p, extra)?;
    Ok(handle)
}

fn program_of(all: &mut BTreeMap<usize, Program>, cp: *mut Context, handle: *mut c_void) -> Res<&mut Program> {
    match all.get_mut(&id_of(handle)) {
        Some(p) if p.ctx == cp as usize && handle as usize & 0xf == 0 => Ok(p),
        Some(_) => Err(Error::new(libc::EINVAL, "the handle belongs to another context")),
        None => Err(Error::new(libc::EINVAL, format!("{handle:p} is not an open CL program handle"))),
    }
}

/// The kernel `name` of one program (made once, then the same kernel every time).
fn find_in(c: &Context, p: &mut Program, name: &str) -> Res<Option<cl_kernel>> {
    if let Some((_, k)) = p.kernels.iter().find(|(n, _)| n == name) {
        return Ok(Some(*k));
    }
    match p.state {
        State::Built => {}
        State::Lazy => build(c, p, None)?,
        State::Unbuilt => return Ok(None),
    }
    let cname = CString::new(name).map_err(|_| Error::new(libc::EINVAL, "kernel name contains NUL"))?;
    for prog in &p.progs {
        let mut err = 0;
        // SAFETY: a built program and a NUL-terminated name.
        let k = unsafe { clCreateKernel(*prog, cname.as_ptr(), &mut err) };
        if err == 0 {
            p.kernels.push((name.to_string(), k));
            return Ok(Some(k));
        }
        if err != CL_INVALID_KERNEL_NAME {
            check(err, "clCreateKernel")?;
        }
    }
    Ok(None)
}

pub fn clsym(cp: *mut Context, handle: *mut c_void, name: &str) -> Res<cl_kernel> {
    let c = crate::context::lookup(cp)?;
    let mut all = lock_ignoring_poison(&PROGRAMS);
    if handle.is_null() {
        let mut unbuilt = false;
        for p in all.values_mut().filter(|p| p.ctx == cp as usize) {
            unbuilt |= p.state == State::Unbuilt;
            if let Some(k) = find_in(c, p, name)? {
                return Ok(k);
            }
        }
        let hint = if unbuilt { " (some programs wait for clbuild)" } else { "" };
        return Err(Error::new(libc::ENOENT, format!("no kernel named \"{name}\" in this context's programs{hint}")));
    }
    let p = program_of(&mut all, cp, handle)?;
    if p.state == State::Unbuilt {
        return Err(Error::new(libc::ENOEXEC, "the program was opened with CLLD_NOBUILD: call clbuild first"));
    }
    find_in(c, p, name)?.ok_or_else(|| Error::new(libc::ENOENT, format!("no kernel named \"{name}\" in the program")))
}

pub fn clclose(cp: *mut Context, handle: *mut c_void) -> Res<i32> {
    crate::context::lookup(cp)?;
    let mut all = lock_ignoring_poison(&PROGRAMS);
    let p = program_of(&mut all, cp, handle)?;
    p.refc -= 1;
    let left = p.refc;
    if left == 0 {
        if let Some(p) = all.remove(&id_of(handle)) {
            unload(p);
        }
    }
    Ok(left as i32)
}

fn unload(p: Program) {
    for (_, k) in p.kernels {
        // SAFETY: kernels made by find_in, released once.
        unsafe { clReleaseKernel(k) };
    }
    release_programs(&p.progs);
}

/// At exit: unloads every program of context `cp`.
pub fn release_context(cp: usize) {
    let mut all = lock_ignoring_poison(&PROGRAMS);
    let ids: Vec<usize> = all.iter().filter(|(_, p)| p.ctx == cp).map(|(id, _)| *id).collect();
    for id in ids {
        if let Some(p) = all.remove(&id) {
            unload(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_binaries_are_told_apart() {
        assert!(!looks_binary(b"__kernel void k(__global int* x) { x[0] = 1; }\n"));
        assert!(looks_binary(b"\x7fELF\x02\x01"));
        assert!(looks_binary(b"POCLBIN\0\x01"));
        assert!(!looks_binary(b""));
    }

    #[test]
    fn handles_round_trip_and_reject_made_up_pointers() {
        let mut all = BTreeMap::new();
        all.insert(
            3,
            Program { ctx: 0x1000, key: None, refc: 1, progs: Vec::new(), state: State::Unbuilt, kernels: Vec::new() },
        );
        let cp = 0x1000 as *mut Context;
        assert!(program_of(&mut all, cp, (3usize << 4) as *mut c_void).is_ok());
        assert_eq!(program_of(&mut all, cp, ((3usize << 4) | 1) as *mut c_void).unwrap_err().errno, libc::EINVAL);
        assert_eq!(program_of(&mut all, cp, (4usize << 4) as *mut c_void).unwrap_err().errno, libc::EINVAL);
        assert_eq!(
            program_of(&mut all, 0x2000 as *mut Context, (3usize << 4) as *mut c_void).unwrap_err().errno,
            libc::EINVAL
        );
    }
}
