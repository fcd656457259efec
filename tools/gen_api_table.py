#!/usr/bin/env python3
"""Regenerates ipc/src/api_table.rs from Khronos' CL/cl_icd.h.

The table is cloister's single description of the OpenCL entry points: the dispatch slot, the
C signature and cloister's status for each one. The signatures come from the header; the status
column is ours and is kept from the existing table when regenerating (new entries start as
`unimplemented`).

    python3 tools/gen_api_table.py [/usr/include/CL/cl_icd.h] > ipc/src/api_table.rs.new
"""
import os
import re
import sys

HEADER = sys.argv[1] if len(sys.argv) > 1 else "/usr/include/CL/cl_icd.h"
TABLE = os.path.join(os.path.dirname(__file__), "..", "ipc", "src", "api_table.rs")

SCALARS = {
    "cl_int", "cl_uint", "cl_ulong", "cl_bool", "cl_bitfield", "size_t", "char", "void",
    "cl_platform_id", "cl_device_id", "cl_context", "cl_command_queue", "cl_mem", "cl_program",
    "cl_kernel", "cl_event", "cl_sampler", "cl_command_buffer_khr", "cl_mutable_command_khr",
    "cl_semaphore_khr",
}
# Typedefs of the OpenCL headers that are plain integers of a known width.
ALIASES = {
    "cl_device_type": "cl_bitfield", "cl_platform_info": "cl_uint", "cl_device_info": "cl_uint",
    "cl_context_properties": "isize", "cl_context_info": "cl_uint",
    "cl_command_queue_properties": "cl_bitfield", "cl_queue_properties": "cl_bitfield",
    "cl_command_queue_info": "cl_uint", "cl_mem_flags": "cl_bitfield",
    "cl_mem_object_type": "cl_uint", "cl_mem_info": "cl_uint", "cl_image_info": "cl_uint",
    "cl_buffer_create_type": "cl_uint", "cl_addressing_mode": "cl_uint",
    "cl_filter_mode": "cl_uint", "cl_sampler_info": "cl_uint", "cl_map_flags": "cl_bitfield",
    "cl_program_info": "cl_uint", "cl_program_build_info": "cl_uint",
    "cl_kernel_info": "cl_uint", "cl_kernel_work_group_info": "cl_uint",
    "cl_kernel_arg_info": "cl_uint", "cl_kernel_sub_group_info": "cl_uint",
    "cl_event_info": "cl_uint", "cl_command_type": "cl_uint", "cl_profiling_info": "cl_uint",
    "cl_device_partition_property": "isize", "cl_mem_migration_flags": "cl_bitfield",
    "cl_pipe_info": "cl_uint", "cl_pipe_properties": "isize", "cl_sampler_properties": "cl_bitfield",
    "cl_svm_mem_flags": "cl_bitfield", "cl_kernel_exec_info": "cl_uint",
    "cl_mem_properties": "cl_bitfield", "cl_gl_context_info": "cl_uint",
    "cl_gl_object_type": "cl_uint", "cl_gl_texture_info": "cl_uint", "cl_GLuint": "cl_uint",
    "cl_GLint": "cl_int", "cl_GLenum": "cl_uint", "cl_device_partition_property_ext": "cl_ulong",
    "cl_egl_image_properties_khr": "isize", "CLeglImageKHR": "*mut c_void",
    "CLeglDisplayKHR": "*mut c_void", "CLeglSyncKHR": "*mut c_void",
    "cl_program_il_type": "cl_uint", "cl_GLsync": "*mut c_void",
}
WINDOWS_ONLY = re.compile(r"D3D|DX9")


def rust_type(ctype):
    ctype = " ".join(ctype.replace("*", " * ").split())
    ptr = ctype.count("*")
    base = ctype.replace("*", " ").split()
    const = "const" in base
    base = [b for b in base if b not in ("const", "struct")]
    name = base[-1] if base else "void"
    if name in ALIASES:
        name = ALIASES[name]
    elif name not in SCALARS:
        name = "c_void"  # structs (image formats, descriptors, regions) travel as opaque bytes
    if name == "void":
        name = "c_void"
    if name == "char":
        name = "c_char"
    if ptr == 0:
        return "()" if name == "c_void" else name
    out = name
    for i in range(ptr):
        out = ("*const " if (const and i == 0) else "*mut ") + out
    return out


def parse_args(args):
    args = re.sub(r"\s+", " ", args).strip()
    if args in ("", "void"):
        return []
    # Split on top-level commas (callbacks contain nested parentheses).
    parts, depth, cur = [], 0, ""
    for ch in args:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        m = re.search(r"\(\s*CL_CALLBACK\s*\*\s*(\w+)\s*\)", p)
        if m:  # a callback: passed as an opaque code pointer and cast where it is used
            out.append((m.group(1), "*mut c_void"))
            continue
        m = re.match(r"(.*?)(\w+)\s*(\[\s*\d*\s*\])?$", p)
        if m is None or m.group(1).strip() in ("", "const", "struct"):
            raise AttributeError(p)
        ctype, name, arr = m.group(1), m.group(2), m.group(3)
        if arr:
            ctype += "*"
        out.append((name, rust_type(ctype)))
    return out


def main():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"CL_API_SUFFIX__\w+|CL_EXT_SUFFIX__\w+|CL_API_SUFFIX_DEPRECATED|CL_EXT_PREFIX__\w+", "", text)
    sigs = {}
    # Prefer the public prototypes (they name every parameter); the typedefs fill the gaps.
    for hdr in ("cl.h", "cl_ext.h", "cl_gl.h", "cl_egl.h"):
        path = os.path.join(os.path.dirname(HEADER), hdr)
        proto = open(path).read()
        proto = re.sub(r"/\*.*?\*/", "", proto, flags=re.S)
        proto = re.sub(r"CL_API_SUFFIX__\w+|CL_EXT_SUFFIX__\w+|CL_API_SUFFIX_DEPRECATED|CL_EXT_PREFIX__\w+|CL_API_PREFIX__\w+", "", proto)
        for m in re.finditer(r"extern\s+CL_API_ENTRY\s+([\w\s\*]+?)\s*CL_API_CALL\s+(\w+)\s*\((.*?)\)\s*;", proto, re.S):
            try:
                sigs.setdefault(m.group(2), (rust_type(m.group(1)), parse_args(m.group(3))))
            except AttributeError:
                pass
    for m in re.finditer(r"typedef\s+([\w\s\*]+?)\s*\(\s*CL_API_CALL\s*\*\s*cl_api_(\w+)\s*\)\s*\((.*?)\)\s*;", text, re.S):
        ret, name, args = m.group(1), m.group(2), m.group(3)
        if name not in sigs:
            try:
                sigs[name] = (rust_type(ret), parse_args(args))
            except AttributeError:
                pass
    struct = re.search(r"struct _cl_icd_dispatch\s*\{(.*?)\}", text, re.S).group(1)
    order = re.findall(r"cl_api_(\w+)\s+\w+\s*;", struct)
    status = {}
    if os.path.exists(TABLE):
        for m in re.finditer(r"^\s*\(\s*\d+\s*,\s*(\w+)\s*,\s*(\w+)\s*,", open(TABLE).read(), re.M):
            status[m.group(1)] = m.group(2)
    print("// @generated by tools/gen_api_table.py from Khronos' CL/cl_icd.h; the status column is")
    print("// cloister's and is kept across regenerations. One line per dispatch-table slot:")
    print("// (slot, name, status, (args) -> return, error-out). Status is `forwarded` (the shim")
    print("// implements it), `unimplemented` (exported; returns CL_INVALID_OPERATION) or `windows`")
    print("// (a Windows-only slot: left empty and not exported).")
    print("#[macro_export]")
    print("macro_rules! for_each_cl_entry_point {")
    print("    ($m:ident) => {")
    print("        $m! {")
    for slot, name in enumerate(order):
        ret, args = sigs[name]
        st = "windows" if WINDOWS_ONLY.search(name) else status.get(name, "unimplemented")
        errout = "errcode_ret" if any(a == "errcode_ret" for a, _ in args) else "none"
        arglist = ", ".join(f"{a}: {t}" for a, t in args)
        print(f"            ({slot}, {name}, {st}, ({arglist}) -> {ret}, {errout});")
    print("        }")
    print("    };")
    print("}")
    print(f"\n/// Number of slots in the ICD dispatch table.\npub const DISPATCH_SLOTS: usize = {len(order)};")


if __name__ == "__main__":
    main()
