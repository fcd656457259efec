//! Program dump and inject (the Intercept Layer's DumpProgramSource, DumpProgramBinaries,
//! DumpProgramBuildLogs, InjectProgramSource, InjectProgramBinaries, AppendBuildOptions).
//!
//! Files are named by a hash of the application's source (`H`, 16 hex digits) and of source and
//! build options (`H-O`): in `CLOISTER_DUMP`, `H.cl` (the application's text), `H.included.cl`
//! (after the shim's include handling, when that changed it), and per build `H-O.options.txt`,
//! `H-O.log.txt`, `H-O.bin` (`H-O.devN.bin` for devices after the first). From
//! `CLOISTER_INJECT`, `H.cl` replaces the source at creation, and a `H-*.bin` (the first by
//! name) makes the program from that binary instead, so the driver's compiler never sees it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cloister_ipc::cl::*;

const CL_PROGRAM_BUILD_LOG: cl_uint = 0x1183;

fn dir(key: &str) -> Option<PathBuf> {
    cloister_ipc::settings::get(key, None).map(PathBuf::from)
}

fn dump_dir() -> Option<&'static Path> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| {
        let d = dir("dump")?;
        if let Err(e) = std::fs::create_dir_all(&d) {
            crate::runtime::warn(&format!("CLOISTER_DUMP: cannot create {}: {e}", d.display()));
            return None;
        }
        Some(d)
    })
    .as_deref()
}

fn inject_dir() -> Option<&'static Path> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| dir("inject")).as_deref()
}

/// FNV-1a, 64 bits: stable across runs and builds, which is all a file name needs.
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The application's source hash of programs whose text the driver holds differs from it
/// (injected), keyed by the hash of what the driver holds; and of programs made from an injected
/// binary, keyed by handle.
#[derive(Default)]
struct Known {
    by_text: HashMap<u64, u64>,
    by_handle: HashMap<usize, u64>,
}

fn known() -> &'static Mutex<Known> {
    static K: OnceLock<Mutex<Known>> = OnceLock::new();
    K.get_or_init(Default::default)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    if let Err(e) = std::fs::write(&path, bytes) {
        crate::runtime::warn(&format!("cannot dump {}: {e}", path.display()));
    }
}

/// At `clCreateProgramWithSource`, with the application's strings: dumps them, and replaces
/// them from the inject folder. Returns the program when it was made from an injected binary
/// instead (or the error making it).
pub fn at_source_creation(context: cl_context, sources: &mut Vec<Vec<u8>>) -> Option<Result<*mut c_void, cl_int>> {
    let (dump, inject) = (dump_dir(), inject_dir());
    if dump.is_none() && inject.is_none() {
        return None;
    }
    let text = sources.concat();
    let h = hash(&[&text]);
    if let Some(d) = dump {
        write(d, &format!("{h:016x}.cl"), &text);
        let included: Vec<Vec<u8>> =
            sources.iter().map(|s| crate::includes::relative_includes(s).unwrap_or_else(|| s.clone())).collect();
        if included.concat() != text {
            write(d, &format!("{h:016x}.included.cl"), &included.concat());
        }
    }
    let inject = inject?;
    if let Some(binary) = injected_binary(inject, h) {
        let made = from_binary(context, &binary);
        if let Ok(p) = made {
            known().lock().unwrap_or_else(|e| e.into_inner()).by_handle.insert(p as usize, h);
        }
        return Some(made);
    }
    let path = inject.join(format!("{h:016x}.cl"));
    if let Ok(replacement) = std::fs::read(&path) {
        crate::runtime::warn(&format!("injected {}", path.display()));
        known().lock().unwrap_or_else(|e| e.into_inner()).by_text.insert(hash(&[&replacement]), h);
        *sources = vec![replacement];
    }
    None
}

/// The first `H-*.bin` in the inject folder, by name.
fn injected_binary(inject: &Path, h: u64) -> Option<Vec<u8>> {
    let prefix = format!("{h:016x}-");
    let mut found: Vec<PathBuf> = std::fs::read_dir(inject)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with(&prefix) && name.ends_with(".bin") && !name.contains(".dev")
        })
        .collect();
    found.sort();
    let path = found.into_iter().next()?;
    let bytes = std::fs::read(&path).ok()?;
    crate::runtime::warn(&format!("injected {}", path.display()));
    Some(bytes)
}

/// A program from `binary` for every device of `context`.
fn from_binary(context: cl_context, binary: &[u8]) -> Result<*mut c_void, cl_int> {
    let devices = handles(|size, value, ret| {
        // SAFETY: an info query into a buffer of `size` bytes.
        unsafe { crate::api::clGetContextInfo(context, CL_CONTEXT_DEVICES, size, value, ret) }
    })?;
    let lengths = vec![binary.len(); devices.len()];
    let pointers = vec![binary.as_ptr().cast::<c_char>(); devices.len()];
    let mut err = CL_SUCCESS;
    // SAFETY: every array holds devices.len() entries; each binary holds its length in bytes.
    let p = unsafe {
        crate::api::clCreateProgramWithBinary(
            context,
            devices.len() as cl_uint,
            devices.as_ptr(),
            lengths.as_ptr(),
            pointers.as_ptr() as *mut *const c_char,
            std::ptr::null_mut(),
            &mut err,
        )
    };
    if err == CL_SUCCESS {
        Ok(p)
    } else {
        Err(err)
    }
}

type InfoFn<'a> = dyn Fn(usize, *mut c_void, *mut usize) -> cl_int + 'a;

/// An info answer's bytes (size query first).
fn info_bytes(query: &InfoFn) -> Result<Vec<u8>, cl_int> {
    let mut size = 0usize;
    match query(0, std::ptr::null_mut(), &mut size) {
        CL_SUCCESS => {}
        e => return Err(e),
    }
    let mut v = vec![0u8; size];
    match query(size, v.as_mut_ptr().cast(), std::ptr::null_mut()) {
        CL_SUCCESS => Ok(v),
        e => Err(e),
    }
}

/// An info answer that is an array of handles.
fn handles(query: impl Fn(usize, *mut c_void, *mut usize) -> cl_int) -> Result<Vec<*mut c_void>, cl_int> {
    let bytes = info_bytes(&query)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as usize as *mut c_void)
        .collect())
}

/// `CLOISTER_BUILD_OPTIONS_APPEND` added to the options of a build or a compile (as the
/// Intercept Layer's AppendBuildOptions). Not to a link's: compiler options such as `-D` are
/// invalid there (`CL_INVALID_LINKER_OPTIONS`).
pub fn build_options(options: Option<Vec<u8>>) -> Option<Vec<u8>> {
    static APPEND: OnceLock<Option<String>> = OnceLock::new();
    let append = APPEND
        .get_or_init(|| cloister_ipc::settings::get("build_options_append", None).filter(|a| !a.trim().is_empty()))
        .as_deref();
    match (options, append) {
        (o, None) => o,
        (None, Some(a)) => Some(a.trim().as_bytes().to_vec()),
        (Some(mut o), Some(a)) => {
            o.push(b' ');
            o.extend_from_slice(a.trim().as_bytes());
            Some(o)
        }
    }
}

/// After `clBuildProgram`: dumps the options, each device's build log and binary.
pub fn after_build(program: cl_program, options: Option<&[u8]>) {
    let Some(d) = dump_dir() else { return };
    let program_info = |param: cl_uint| {
        move |size: usize, value: *mut c_void, ret: *mut usize| {
            // SAFETY: an info query into a buffer of `size` bytes.
            unsafe { crate::api::clGetProgramInfo(program, param, size, value, ret) }
        }
    };
    let h = {
        let k = known().lock().unwrap_or_else(|e| e.into_inner());
        match k.by_handle.get(&(program as usize)) {
            Some(h) => *h,
            None => {
                let mut text = info_bytes(&program_info(CL_PROGRAM_SOURCE)).unwrap_or_default();
                if text.last() == Some(&0) {
                    text.pop();
                }
                let th = hash(&[&text]);
                k.by_text.get(&th).copied().unwrap_or(th)
            }
        }
    };
    let options = options.unwrap_or_default();
    let name = format!("{h:016x}-{:016x}", hash(&[&h.to_le_bytes(), options]));
    write(d, &format!("{name}.options.txt"), options);
    let Ok(devices) = handles(program_info(CL_PROGRAM_DEVICES)) else { return };
    let mut log = Vec::new();
    for dev in &devices {
        let l = info_bytes(&|size, value, ret| {
            // SAFETY: an info query into a buffer of `size` bytes.
            unsafe { crate::api::clGetProgramBuildInfo(program, *dev, CL_PROGRAM_BUILD_LOG, size, value, ret) }
        })
        .unwrap_or_default();
        log.extend(l.iter().take_while(|b| **b != 0));
    }
    write(d, &format!("{name}.log.txt"), &log);
    let Ok(sizes) = info_bytes(&program_info(CL_PROGRAM_BINARY_SIZES)) else { return };
    let sizes: Vec<usize> =
        sizes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as usize).collect();
    let mut bins: Vec<Vec<u8>> = sizes.iter().map(|s| vec![0u8; *s]).collect();
    let mut pointers: Vec<*mut u8> = bins.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let size = pointers.len() * std::mem::size_of::<*mut u8>();
    // SAFETY: CL_PROGRAM_BINARIES fills each pointer's buffer with the binary of that size.
    let rc = unsafe {
        crate::api::clGetProgramInfo(
            program,
            CL_PROGRAM_BINARIES,
            size,
            pointers.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    };
    if rc != CL_SUCCESS {
        return;
    }
    for (i, bin) in bins.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let file = if i == 0 { format!("{name}.bin") } else { format!("{name}.dev{i}.bin") };
        write(d, &file, bin);
    }
}
