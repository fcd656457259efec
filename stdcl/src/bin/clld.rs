//! stdcl-clld: embeds CL program sources and binaries into a host executable, as STDCL's `clld`
//! does, so that `clopen(cp, NULL, flags)` loads them.
//!
//! `stdcl-clld [-o OUT] FILE...` writes a C file (or, for OUT ending in `.o`, compiles it with
//! `$CC`, default `cc`) holding each file's bytes and a table of them, and a constructor that
//! hands the table to libstdcl (`stdcl_register_embedded`) when the program starts. Link the
//! output with the program: `cc main.c kernels.o -lstdcl`. A file is a binary when it holds a
//! NUL byte or is ELF, else a source; all sources make one program, each binary its own.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn usage() -> ExitCode {
    eprintln!("usage: stdcl-clld [-o OUT.c|OUT.o] FILE...");
    ExitCode::from(2)
}

/// The C file embedding `files` (name, bytes).
fn generate(files: &[(String, Vec<u8>)]) -> String {
    let mut c = String::from("/* written by stdcl-clld: CL programs embedded for clopen(cp, NULL, flags) */\n");
    c += "#include <stddef.h>\n";
    c += "struct __stdcl_embedded { const char* name; const unsigned char* data; size_t size; int kind; };\n";
    c += "extern int stdcl_register_embedded(const struct __stdcl_embedded* table, size_t n);\n";
    for (i, (_, data)) in files.iter().enumerate() {
        let _ = write!(c, "static const unsigned char __stdcl_clprg{i}[{}] = {{", data.len() + 1);
        for (j, b) in data.iter().chain(std::iter::once(&0u8)).enumerate() {
            if j % 16 == 0 {
                c += "\n ";
            }
            let _ = write!(c, " 0x{b:02x},");
        }
        c += "\n};\n";
    }
    c += "static const struct __stdcl_embedded __stdcl_clprgs[] = {\n";
    for (i, (name, data)) in files.iter().enumerate() {
        let kind = i32::from(stdcl::looks_binary(data));
        let _ = writeln!(c, "  {{ \"{}\", __stdcl_clprg{i}, {}, {kind} }},", name.escape_default(), data.len());
    }
    c += "};\n";
    c += "__attribute__((constructor)) static void __stdcl_clld_register(void) {\n";
    let _ = writeln!(c, "  stdcl_register_embedded(__stdcl_clprgs, {});\n}}", files.len());
    c
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut out = PathBuf::from("clprgs.c");
    let mut inputs = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => match args.next() {
                Some(o) => out = PathBuf::from(o),
                None => return usage(),
            },
            "-h" | "--help" => return usage(),
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    if inputs.is_empty() {
        return usage();
    }
    let mut files = Vec::new();
    for f in &inputs {
        match std::fs::read(f) {
            Ok(d) => {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                files.push((name, d));
            }
            Err(e) => {
                eprintln!("stdcl-clld: cannot read {}: {e}", f.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let c = generate(&files);
    let object = out.extension().is_some_and(|e| e == "o");
    let c_path = if object { out.with_extension("clld.c") } else { out.clone() };
    if let Err(e) = std::fs::write(&c_path, c) {
        eprintln!("stdcl-clld: cannot write {}: {e}", c_path.display());
        return ExitCode::FAILURE;
    }
    if object {
        let ok = compile(&c_path, &out);
        let _ = std::fs::remove_file(&c_path);
        if !ok {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn compile(src: &Path, obj: &Path) -> bool {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc).arg("-c").arg("-fPIC").arg(src).arg("-o").arg(obj).status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            eprintln!("stdcl-clld: {cc} failed ({s})");
            false
        }
        Err(e) => {
            eprintln!("stdcl-clld: cannot run {cc}: {e}");
            false
        }
    }
}
